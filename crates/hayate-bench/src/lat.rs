//! Latency: ping-pong with one message in flight.
//!
//! An echo connection subscribes `<prefix>/ping` and republishes each message to
//! `<prefix>/pong`; the pinger subscribes `<prefix>/pong`, sends one message, waits for it,
//! repeats. Each half round trip goes into an HDR histogram (nanoseconds, 3 significant
//! digits). Both subscriptions are confirmed by a round trip on their own connection
//! ([`Conn::flush`]) before the first ping: the echo's subscription lives on another connection
//! than the pinger's publications, and a ping routed before it is active is lost.
//! Warm-up: at least `warmup` and at least [`WARMUP_ROUND_TRIPS`] round trips.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;

use crate::driver::{Conn, Sub, Topic, client_name, point_prefix};
use crate::size::format_size;
use crate::target::Target;
use crate::thr::report_point;
use crate::{LatOptions, Record, baseline, progress, with_runtime};

/// Minimum warm-up round trips.
pub(crate) const WARMUP_ROUND_TRIPS: u64 = 1000;
/// A round trip taking longer than this fails the point.
const RTT_TIMEOUT: Duration = Duration::from_secs(5);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the latency benchmark against each target in turn (then the raw TCP baseline if asked).
pub fn lat(opts: &LatOptions) -> anyhow::Result<Vec<Record>> {
    if opts.targets.is_empty() && !opts.include_baseline {
        bail!("nothing to measure: no target and no baseline");
    }
    crate::driver::refuse_rpc_only(&opts.targets)?;
    let runs = opts.runs.max(1);
    // The baselines: raw TCP on blocking threads, and with own_threads also on Tokio.
    let baselines = usize::from(opts.include_baseline) * (1 + usize::from(opts.own_threads));
    let systems = opts.targets.len() + baselines;
    let pb = progress::bar(systems * runs);
    let out = with_runtime(|rt| {
        // per_system[i]: the records of system i (targets in order, then the baseline).
        let mut per_system: Vec<Vec<Record>> = vec![Vec::new(); systems];
        for r in 0..runs {
            for k in 0..systems {
                let i = (k + r) % systems;
                let rec = match opts.targets.get(i) {
                    Some(target) => {
                        pb.set_message(format!(
                            "{} lat {} (run {}/{runs})",
                            target.system(),
                            format_size(opts.payload),
                            r + 1
                        ));
                        if opts.own_threads {
                            own_threads_point(target, opts)
                        } else {
                            spawned_point(rt, target, opts)
                        }
                    }
                    None if i == opts.targets.len() => {
                        pb.set_message(format!("tcp lat {}", format_size(opts.payload)));
                        baseline::lat_point(opts)
                    }
                    None => {
                        pb.set_message(format!("tcp (tokio) lat {}", format_size(opts.payload)));
                        baseline::tokio_lat_point(opts)
                    }
                };
                report_point(&pb, &rec);
                per_system[i].push(rec);
                pb.inc(1);
            }
        }
        Ok(per_system.into_iter().map(merge_runs).collect())
    });
    pb.finish_and_clear();
    out
}

/// One record from several runs of one system: each figure is the median over the runs that
/// succeeded; `samples` is the total of round trips.
pub(crate) fn merge_runs(mut recs: Vec<Record>) -> Record {
    if recs.len() == 1 {
        return recs.remove(0);
    }
    let ok: Vec<&Record> = recs.iter().filter(|r| r.error.is_none()).collect();
    let mut out = recs[0].clone();
    out.runs = recs.len();
    if ok.is_empty() {
        return out;
    }
    let med = |f: fn(&Record) -> Option<f64>| {
        let v: Vec<f64> = ok.iter().filter_map(|r| f(r)).collect();
        crate::stats::median(&v)
    };
    out.error = None;
    out.p50_us = med(|r| r.p50_us);
    out.p99_us = med(|r| r.p99_us);
    out.p999_us = med(|r| r.p999_us);
    out.msgs_per_sec = med(|r| r.msgs_per_sec);
    out.samples = ok.iter().map(|r| r.samples).sum();
    out.runs = ok.len();
    out
}

/// A histogram of half round trips, in nanoseconds (1 ns .. 100 s, 3 significant digits).
pub(crate) fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 100_000_000_000, 3)?)
}

/// Records one round trip (its half) into `h`.
pub(crate) fn record_rtt(h: &mut Histogram<u64>, rtt: Duration) {
    let half = (rtt.as_nanos() / 2).clamp(1, u128::from(h.high())) as u64;
    h.saturating_record(half);
}

/// Fills a latency record from a histogram of half round trips measured over `elapsed`.
pub(crate) fn finish(rec: &mut Record, result: anyhow::Result<(Histogram<u64>, Duration)>) {
    match result {
        Ok((h, elapsed)) if !h.is_empty() => {
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            rec.p50_us = Some(us(0.5));
            rec.p99_us = Some(us(0.99));
            rec.p999_us = Some(us(0.999));
            rec.samples = h.len() as usize;
            rec.msgs_per_sec = Some(h.len() as f64 / elapsed.as_secs_f64().max(1e-9));
        }
        Ok(_) => rec.error = Some("no round trip measured".to_string()),
        Err(e) => rec.error = Some(format!("{e:#}")),
    }
}

/// A ping payload: `size` bytes, the first 8 (when they fit) carry the sequence number.
pub(crate) fn ping_payload(buf: &mut BytesMut, size: usize, seq: u64) -> Bytes {
    buf.clear();
    if size >= 8 {
        buf.put_u64(seq);
        buf.put_bytes(0x5a, size - 8);
    } else {
        buf.put_bytes(0x5a, size);
    }
    buf.split().freeze()
}

/// Checks that a pong carries the expected sequence number (when the payload holds one).
pub(crate) fn check_pong(pong: &[u8], size: usize, seq: u64) -> anyhow::Result<()> {
    if pong.len() != size {
        bail!("pong of {} bytes, expected {size}", pong.len());
    }
    if size >= 8 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&pong[..8]);
        let got = u64::from_be_bytes(b);
        if got != seq {
            bail!("pong #{got}, expected #{seq}");
        }
    }
    Ok(())
}

/// A runtime with one worker thread (the pinger's or the echo's in
/// [`LatOptions::own_threads`]). Multi-threaded in kind, as Zenoh refuses Tokio's
/// current-thread runtime.
fn single_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

/// [`point`] with each side on a thread and single-threaded runtime of its own: the echo on
/// a new thread, the pinger on this one. Each side's loop is a task spawned on its runtime
/// (not the `block_on` future, which Tokio only polls again after a non-blocking look at the
/// I/O driver: one more system call per message).
fn own_threads_point(target: &Target, opts: &LatOptions) -> Record {
    let mut rec = lat_record(
        target,
        opts,
        format!("{} (own threads)", client_name(target)),
    );
    let prefix = point_prefix();
    let (ping_key, pong_key) = (format!("{prefix}/ping"), format!("{prefix}/pong"));
    let result = (|| {
        let rt = single_thread_runtime()?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<anyhow::Result<()>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let echo = {
            let (target, opts) = (target.clone(), opts.clone());
            let (ping_key, pong_key) = (ping_key.clone(), pong_key.clone());
            std::thread::Builder::new()
                .name("bench-lat-echo".into())
                .spawn(move || echo_side(target, opts, ping_key, pong_key, ready_tx, stop_rx))?
        };
        let pinger = {
            let (target, opts) = (target.clone(), opts.clone());
            rt.spawn(async move {
                ready_rx
                    .await
                    .context("the echo thread ended before it was ready")??;
                let pinger = Conn::connect(&target, "bench-lat-ping", opts.payload).await?;
                let version = pinger.server_version();
                let r = ping_side(&pinger, &opts, &ping_key, &pong_key).await;
                pinger.close(CLOSE_TIMEOUT).await;
                r.map(|r| (r, version))
            })
        };
        let pinged = rt
            .block_on(pinger)
            .map_err(|e| anyhow::anyhow!("the pinger task failed: {e}"));
        let _ = stop_tx.send(());
        drop(rt);
        let echoed = echo
            .join()
            .map_err(|_| anyhow::anyhow!("the echo thread panicked"))?;
        let ((h, elapsed), version) = pinged??;
        echoed?;
        rec.server_version = version;
        Ok((h, elapsed))
    })();
    finish(&mut rec, result);
    rec
}

/// The echo of [`own_threads_point`]: connects, subscribes, says it is ready, echoes until
/// told to stop.
fn echo_side(
    target: Target,
    opts: LatOptions,
    ping_key: String,
    pong_key: String,
    ready: tokio::sync::oneshot::Sender<anyhow::Result<()>>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> anyhow::Result<()> {
    let rt = single_thread_runtime()?;
    let task = rt.spawn(async move {
        let set_up = async {
            let echo = Conn::connect(&target, "bench-lat-echo", opts.payload).await?;
            let pings = echo.subscribe(&ping_key).await?;
            echo.flush().await?;
            let pong_topic = echo.topic(&pong_key).await?;
            anyhow::Ok((echo, pings, pong_topic))
        };
        let (echo, mut pings, pong_topic) = match set_up.await {
            Ok(x) => x,
            Err(e) => {
                let msg = format!("{e:#}");
                let _ = ready.send(Err(e));
                bail!(msg);
            }
        };
        let _ = ready.send(Ok(()));
        let result = loop {
            tokio::select! {
                _ = &mut stop => break Ok(()),
                p = pings.next() => match p {
                    Some(p) => {
                        if let Err(e) = echo.publish(&pong_topic, p).await {
                            break Err(e);
                        }
                    }
                    None => break Ok(()),
                },
            }
        };
        let trouble = echo.trouble();
        echo.close(CLOSE_TIMEOUT).await;
        result?;
        match trouble {
            Some(t) => bail!(t),
            None => Ok(()),
        }
    });
    rt.block_on(task)
        .map_err(|e| anyhow::anyhow!("the echo task failed: {e}"))?
}

/// [`point`] as a task on `rt`'s workers, not as the `block_on` future: the main thread
/// `block_on` runs on is not a worker, so a ping loop there would be woken from a worker
/// thread (a futex wake and a thread switch) at every pong, a hand-over that neither the
/// raw TCP ping-pong nor an application's own task pays.
fn spawned_point(rt: &tokio::runtime::Runtime, target: &Target, opts: &LatOptions) -> Record {
    let (t, o) = (target.clone(), opts.clone());
    match rt.block_on(rt.spawn(async move { point(&t, &o).await })) {
        Ok(rec) => rec,
        Err(e) => {
            let mut rec = lat_record(target, opts, client_name(target).to_string());
            rec.error = Some(format!("the ping task failed: {e}"));
            rec
        }
    }
}

/// The record of one `lat` point of `target`, measured with `client`.
fn lat_record(target: &Target, opts: &LatOptions, client: String) -> Record {
    let mut rec = Record::new(target.system(), target.mode(), "lat", opts.payload);
    rec.target = target.to_string();
    rec.client = client;
    rec
}

async fn point(target: &Target, opts: &LatOptions) -> Record {
    let mut rec = lat_record(target, opts, client_name(target).to_string());
    let result = run(target, opts, &mut rec).await;
    finish(&mut rec, result);
    rec
}

async fn run(
    target: &Target,
    opts: &LatOptions,
    rec: &mut Record,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let echo = Conn::connect(target, "bench-lat-echo", opts.payload).await?;
    let pinger = match Conn::connect(target, "bench-lat-ping", opts.payload).await {
        Ok(c) => c,
        Err(e) => {
            echo.close(CLOSE_TIMEOUT).await;
            return Err(e);
        }
    };
    rec.server_version = pinger.server_version();
    let result = run_connected(&echo, &pinger, opts).await;
    pinger.close(CLOSE_TIMEOUT).await;
    echo.close(CLOSE_TIMEOUT).await;
    result
}

async fn run_connected(
    echo: &Conn,
    pinger: &Conn,
    opts: &LatOptions,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    if let Some(max) = pinger.max_payload()
        && opts.payload > max
    {
        bail!(
            "payload exceeds the server's max_payload of {}",
            format_size(max)
        );
    }
    let prefix = point_prefix();
    let (ping_key, pong_key) = (format!("{prefix}/ping"), format!("{prefix}/pong"));
    let mut pings = echo.subscribe(&ping_key).await?;
    // A round trip on the echo connection: its subscription is active before the first ping.
    echo.flush().await?;
    let echo_task = {
        let echo = echo.clone();
        let pong_topic = echo.topic(&pong_key).await?;
        tokio::spawn(async move {
            while let Some(p) = pings.next().await {
                if echo.publish(&pong_topic, p).await.is_err() {
                    break;
                }
            }
        })
    };
    let result = ping_side(pinger, opts, &ping_key, &pong_key)
        .await
        .and_then(|r| match echo.trouble() {
            Some(t) => bail!(t),
            None => Ok(r),
        });
    echo_task.abort();
    let _ = echo_task.await;
    result
}

/// The pinger's part: subscribes the pongs, warms up, measures.
async fn ping_side(
    pinger: &Conn,
    opts: &LatOptions,
    ping_key: &str,
    pong_key: &str,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    {
        let mut pongs = pinger.subscribe(pong_key).await?;
        // The topic first: a brokerless driver (ZeroMQ) learns here who publishes pings, and
        // the flush then confirms the echo's subscription too.
        let ping_topic = pinger.topic(ping_key).await?;
        pinger.flush().await?;
        let mut pp = PingPong {
            conn: pinger,
            topic: &ping_topic,
            pongs: &mut pongs,
            buf: BytesMut::with_capacity(opts.payload.max(64)),
            size: opts.payload,
            seq: 0,
            watchdog: Box::pin(tokio::time::sleep(RTT_TIMEOUT)),
        };
        let start = Instant::now();
        let mut n = 0u64;
        while n < WARMUP_ROUND_TRIPS || start.elapsed() < opts.warmup {
            pp.round_trip().await?;
            n += 1;
        }
        let mut h = new_histogram()?;
        let start = Instant::now();
        while start.elapsed() < opts.duration {
            let rtt = pp.round_trip().await?;
            record_rtt(&mut h, rtt);
        }
        let elapsed = start.elapsed();
        if let Some(t) = pinger.trouble() {
            bail!(t);
        }
        Ok((h, elapsed))
    }
}

struct PingPong<'a> {
    conn: &'a Conn,
    topic: &'a Topic,
    pongs: &'a mut Sub,
    buf: BytesMut,
    size: usize,
    seq: u64,
    /// Fires when no pong came for a while: one timer for the run, moved on only once a
    /// quarter of [`RTT_TIMEOUT`] has passed (a timer per round trip, registered and removed
    /// in the runtime's wheel, cost a tenth of a peer node's round trip: harness overhead
    /// that raw TCP on blocking threads does not pay).
    watchdog: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl PingPong<'_> {
    async fn round_trip(&mut self) -> anyhow::Result<Duration> {
        self.seq += 1;
        let ping = ping_payload(&mut self.buf, self.size, self.seq);
        let t0 = Instant::now();
        let now = tokio::time::Instant::from_std(t0);
        if self.watchdog.deadline().saturating_duration_since(now) < RTT_TIMEOUT * 3 / 4 {
            self.watchdog.as_mut().reset(now + RTT_TIMEOUT);
        }
        self.conn.publish(self.topic, ping).await?;
        let pong = tokio::select! {
            biased;
            p = self.pongs.next() => p.context("the pong subscription ended")?,
            () = &mut self.watchdog => {
                bail!(
                    "no pong: waited {:?} to {RTT_TIMEOUT:?} since the ping",
                    RTT_TIMEOUT * 3 / 4
                )
            }
        };
        let rtt = t0.elapsed();
        check_pong(&pong, self.size, self.seq)?;
        Ok(rtt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both harnesses against peer nodes (no broker needed): every round trip checked, none
    /// lost, and the own-threads record says so in its client.
    #[test]
    fn peer_nodes_on_both_harnesses() {
        let target: Target = "hayate://127.0.0.1:0?mode=peer&shm=off".parse().unwrap();
        for own_threads in [false, true] {
            let recs = lat(&LatOptions {
                targets: vec![target.clone()],
                duration: Duration::from_millis(300),
                warmup: Duration::from_millis(50),
                own_threads,
                ..LatOptions::default()
            })
            .unwrap();
            let r = &recs[0];
            assert_eq!(r.error, None, "{r:?}");
            assert!(r.samples > 100, "{r:?}");
            assert!(r.p50_us.unwrap() > 0.0);
            assert_eq!(r.client.ends_with("(own threads)"), own_threads, "{r:?}");
        }
    }

    #[test]
    fn payloads_carry_sequence_numbers() {
        let mut buf = BytesMut::new();
        let p = ping_payload(&mut buf, 64, 7);
        assert_eq!(p.len(), 64);
        check_pong(&p, 64, 7).unwrap();
        assert!(check_pong(&p, 64, 8).is_err());
        assert!(check_pong(&p[..10], 64, 7).is_err());
        let p = ping_payload(&mut buf, 4, 7);
        check_pong(&p, 4, 99).unwrap();
    }

    #[test]
    fn histogram_in_microseconds() {
        let mut h = new_histogram().unwrap();
        for us in 1..=1000u64 {
            record_rtt(&mut h, Duration::from_micros(2 * us));
        }
        let mut rec = Record::new("x", "raw", "lat", 64);
        finish(&mut rec, Ok((h, Duration::from_secs(1))));
        let p50 = rec.p50_us.unwrap();
        assert!((p50 - 500.0).abs() < 1.0, "{p50}");
        assert!((rec.p99_us.unwrap() - 990.0).abs() < 1.0);
        assert_eq!(rec.samples, 1000);
        assert_eq!(rec.msgs_per_sec, Some(1000.0));
    }
}
