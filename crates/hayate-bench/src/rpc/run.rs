//! [`rpc`]: every point on every target, each point in a runtime of its own, its server in
//! this process or in a child process; and the record of each point.

use std::time::Duration;

use anyhow::{Context, bail};

use super::caller::run_callers;
use super::child::ChildServer;
use super::relay::relay_point;
use super::server::start_server;
use super::{Outcome, RpcOptions, RpcPoint, ServerPlacement};
use crate::driver::point_prefix;
use crate::target::{System, Target};
use crate::{Record, with_runtime};

/// Runs every point for every target (`runs` times, rotating the order of the targets) and
/// returns one record per (point, target): the median of each figure over the runs.
pub fn rpc(opts: &RpcOptions) -> anyhow::Result<Vec<Record>> {
    let systems = opts.targets.len() + usize::from(opts.include_baseline);
    let pb = crate::progress::bar(opts.points.len() * systems * opts.runs.max(1));
    let mut out = Vec::new();
    for point in &opts.points {
        // The relay baseline, when asked for, takes its turn in the rotation after the
        // targets.
        let n = opts.targets.len() + usize::from(opts.include_baseline);
        let mut per: Vec<Vec<Record>> = vec![Vec::new(); n];
        for r in 0..opts.runs.max(1) {
            for k in 0..n {
                let i = (k + r) % n;
                let t = opts.targets.get(i);
                pb.set_message(format!(
                    "{} {} calls x{}",
                    t.map_or("tcp relay", Target::system),
                    point.calls,
                    point.concurrency
                ));
                per[i].push(match t {
                    Some(t) => rpc_point(t, *point, opts),
                    None => relay_point(*point, opts),
                });
                pb.inc(1);
            }
        }
        out.extend(per.into_iter().map(crate::lat::merge_runs));
    }
    pb.finish_and_clear();
    Ok(out)
}

/// One point on one target, in a runtime of its own.
pub(crate) fn rpc_point(target: &Target, point: RpcPoint, opts: &RpcOptions) -> Record {
    let mut r = Record::new(target.system(), method_mode(target), "rpc", 0);
    r.target = target.to_string();
    r.concurrency = Some(point.concurrency);
    let limit = opts.max_time + opts.call_timeout + Duration::from_secs(60);
    let res = with_runtime(|rt| {
        rt.block_on(async {
            tokio::time::timeout(limit, run(target, point, opts))
                .await
                .with_context(|| format!("rpc: timed out after {limit:?}"))?
        })
    });
    r.client = client_label(target, &opts.server);
    fill(&mut r, res, point, target.system(), opts);
    r
}

/// The figures of a point's outcome into its record (or its error).
pub(super) fn fill(
    r: &mut Record,
    res: anyhow::Result<Outcome>,
    point: RpcPoint,
    system: &str,
    opts: &RpcOptions,
) {
    match res {
        Ok(o) => {
            r.server_version = o.version;
            let secs = o.elapsed.as_secs_f64();
            r.msgs_per_sec = Some(o.calls as f64 / secs);
            let us = |q: f64| o.hist.value_at_quantile(q) as f64 / 1000.0;
            r.p50_us = Some(us(0.5));
            r.p99_us = Some(us(0.99));
            r.p999_us = Some(us(0.999));
            r.samples = o.calls as usize;
            if o.calls < point.calls {
                tracing::info!(
                    "rpc {system}: stopped after {} of {} calls ({:?})",
                    o.calls,
                    point.calls,
                    opts.max_time
                );
            }
        }
        Err(e) => r.error = Some(format!("{e:#}")),
    }
}

/// "brokered", or "peer-to-peer" for ZeroMQ and Zenoh in peer mode.
fn method_mode(target: &Target) -> &'static str {
    target.mode()
}

/// The client library and request/reply method, and where the server ran, for records:
/// `"tonic 0.14 (unary); server in a child process"`.
fn client_label(target: &Target, server: &ServerPlacement) -> String {
    let how = match target.system {
        System::Hayate if super::server::node_rpc(target) => {
            "request between peer nodes, one per caller"
        }
        System::Hayate if target.mode() == "peer-to-peer" => "request, direct to a PeerServer",
        System::Hayate => "request, inbox reply",
        System::Nats => "request/reply",
        System::Stomp => "temp-queue reply-to",
        System::Amqp if super::amqp_blocking(target) => "direct reply-to, blocking threads",
        System::Amqp => "direct reply-to",
        System::Zmq => "REQ -> ROUTER",
        System::Grpc => "unary",
        System::Zenoh => "get/queryable",
        System::Mqtt | System::Kafka => "pub/sub request-reply, a reply topic per caller",
    };
    format!(
        "{} ({how}); {}",
        crate::driver::client_name(target),
        server.label()
    )
}

async fn run(target: &Target, point: RpcPoint, opts: &RpcOptions) -> anyhow::Result<Outcome> {
    if point.concurrency == 0 || point.calls == 0 {
        bail!("rpc: calls and concurrency must be at least 1");
    }
    let prefix = point_prefix();
    match &opts.server {
        ServerPlacement::InProcess => {
            let server = start_server(target, &prefix).await?;
            let result = run_callers(target, &prefix, server.endpoint.as_deref(), point, opts)
                .await
                .map(|mut o| {
                    o.version = server.version();
                    o
                });
            server.stop().await;
            result
        }
        ServerPlacement::Child(exe) => {
            // Dropped on an error or a timeout of the point: the child is killed.
            let server = ChildServer::start(ChildServer::command(exe, target, &prefix)).await?;
            let result = run_callers(
                target,
                &prefix,
                server.ready.endpoint.as_deref(),
                point,
                opts,
            )
            .await
            .map(|mut o| {
                o.version = server.ready.version.clone();
                o
            });
            server.stop().await;
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn records_say_where_the_server_ran() {
        let t = Target::parse("hayate://127.0.0.1:4700").unwrap();
        assert_eq!(
            client_label(&t, &ServerPlacement::Child(PathBuf::from("hayate"))),
            concat!(
                "hayate-client ",
                env!("CARGO_PKG_VERSION"),
                " (request, inbox reply); server in a child process"
            )
        );
        assert!(client_label(&t, &ServerPlacement::InProcess).ends_with("; server in-process"));
    }
}
