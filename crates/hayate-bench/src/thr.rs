//! Throughput: one publisher sends back-to-back, one subscriber on the same key counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;

use crate::driver::{Conn, client_name, point_prefix};
use crate::sampler::{Counter, Tally, sample};
use crate::size::format_size;
use crate::target::Target;
use crate::{Record, ThrOptions, baseline, progress, stats, with_runtime};

/// How long a publisher may take to notice the stop and flush.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the throughput benchmark: for each payload size, each target in turn (then, if asked,
/// the raw TCP baseline and its relay floor). A failed point yields a record with `error`
/// set; the run goes on.
pub fn thr(opts: &ThrOptions) -> anyhow::Result<Vec<Record>> {
    if opts.targets.is_empty() && !opts.include_baseline {
        anyhow::bail!("nothing to measure: no target and no baseline");
    }
    crate::driver::refuse_rpc_only(&opts.targets)?;
    let per_payload = opts.targets.len() + 2 * usize::from(opts.include_baseline);
    let pb = progress::bar(opts.payloads.len() * per_payload);
    let out = with_runtime(|rt| {
        let mut records = Vec::new();
        for &payload in &opts.payloads {
            for target in &opts.targets {
                pb.set_message(format!("{} thr {}", target.system(), format_size(payload)));
                let rec = rt.block_on(point(target, payload, opts));
                report_point(&pb, &rec);
                records.push(rec);
                pb.inc(1);
            }
            // The raw TCP baseline, then its relay floor.
            for relayed in [false, true].into_iter().filter(|_| opts.include_baseline) {
                let label = if relayed { "tcp relay" } else { "tcp" };
                pb.set_message(format!("{label} thr {}", format_size(payload)));
                let rec = rt.block_on(baseline::thr_point(payload, opts, relayed));
                report_point(&pb, &rec);
                records.push(rec);
                pb.inc(1);
            }
        }
        Ok(records)
    });
    pb.finish_and_clear();
    out
}

pub(crate) fn report_point(pb: &indicatif::ProgressBar, rec: &Record) {
    if let Some(e) = &rec.error {
        tracing::warn!(
            "{} {} {}: {e}",
            rec.label(),
            rec.test,
            format_size(rec.payload_bytes)
        );
        if !pb.is_hidden() {
            pb.println(format!(
                "{} {} {}: error: {e}",
                rec.label(),
                rec.test,
                format_size(rec.payload_bytes)
            ));
        }
    }
}

/// Fills a throughput record from rate samples (or the error).
pub(crate) fn finish(rec: &mut Record, result: anyhow::Result<Vec<f64>>) {
    match result.and_then(|rates| {
        stats::summarize(&rates).ok_or_else(|| anyhow::anyhow!("no usable samples"))
    }) {
        Ok((median, kept)) => {
            rec.msgs_per_sec = Some(median);
            rec.bits_per_sec = Some(median * rec.payload_bytes as f64 * 8.0);
            rec.samples = kept;
        }
        Err(e) => rec.error = Some(format!("{e:#}")),
    }
}

async fn point(target: &Target, payload: usize, opts: &ThrOptions) -> Record {
    let mut rec = Record::new(target.system(), target.mode(), "thr", payload);
    rec.target = target.to_string();
    rec.client = client_name(target).to_string();
    let result = run(target, payload, opts, &mut rec).await;
    finish(&mut rec, result);
    rec
}

async fn run(
    target: &Target,
    payload: usize,
    opts: &ThrOptions,
    rec: &mut Record,
) -> anyhow::Result<Vec<f64>> {
    let sub_conn = Conn::connect(target, "bench-thr-sub", payload).await?;
    let pub_conn = match Conn::connect(target, "bench-thr-pub", payload).await {
        Ok(c) => c,
        Err(e) => {
            sub_conn.close(CLOSE_TIMEOUT).await;
            return Err(e);
        }
    };
    rec.server_version = pub_conn.server_version();
    let result = run_connected(&sub_conn, &pub_conn, payload, opts).await;
    pub_conn.close(CLOSE_TIMEOUT).await;
    sub_conn.close(CLOSE_TIMEOUT).await;
    result
}

async fn run_connected(
    sub_conn: &Conn,
    pub_conn: &Conn,
    payload: usize,
    opts: &ThrOptions,
) -> anyhow::Result<Vec<f64>> {
    if let Some(max) = pub_conn.max_payload()
        && payload > max
    {
        anyhow::bail!(
            "payload of {} exceeds the server's max_payload of {}",
            format_size(payload),
            format_size(max)
        );
    }
    let key = format!("{}/thr/{payload}", point_prefix());
    let mut sub = sub_conn.subscribe(&key).await?;
    // A round trip on the subscriber's connection: the subscription is active before the
    // publisher starts.
    sub_conn.flush().await?;
    let topic = pub_conn.topic(&key).await?;
    pub_conn.flush().await?;

    let counter = Counter::new();
    let receiver = {
        let counter = counter.clone();
        tokio::spawn(async move {
            let mut tally = Tally::new(counter.clone(), payload);
            while sub.next().await.is_some() {
                tally.one();
            }
            counter.fail("the subscription ended (connection closed?)");
        })
    };
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (stop, counter, conn) = (stop.clone(), counter.clone(), pub_conn.clone());
        let data = Bytes::from(vec![0x5a_u8; payload]);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = conn.publish(&topic, data.clone()).await {
                    counter.fail(format!("publish: {e:#}"));
                    return;
                }
            }
            // No flush here: the point is measured, and a flush would wait for every
            // message still buffered (on a slow link or with a deep client queue, a long
            // time). The connection is closed (with a timeout) after the point.
        })
    };

    let check = || sub_conn.trouble().or_else(|| pub_conn.trouble());
    let result = sample(&counter, opts.warmup, opts.duration, opts.samples, check).await;

    // Stop the publisher (the subscriber keeps draining so that a blocked publisher can
    // finish), then the subscriber.
    stop.store(true, Ordering::Relaxed);
    let publisher_abort = publisher.abort_handle();
    if tokio::time::timeout(STOP_TIMEOUT, publisher).await.is_err() {
        publisher_abort.abort();
        tracing::warn!("the publisher did not stop within {STOP_TIMEOUT:?}");
    }
    receiver.abort();
    let _ = receiver.await;
    result
}
