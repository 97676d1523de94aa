//! Fan-out: one publisher, N subscribers in N separate processes on this host, aggregate
//! throughput (the OpenSplice chart: does delivering to more local readers cost the
//! publisher more?). Each subscriber is this program run again (`bench fanout-sub`), which
//! connects as the target says, subscribes, says it is ready, then counts what arrives
//! between the `START` and `STOP` lines it reads on stdin and prints the count.
//!
//! For Hayate's peer mode (`hayate://HOST:0?mode=peer`) the publisher is a node of this
//! process and every subscriber a node of its own that links to it (`peers=ADDR`): over
//! shared memory with `shm=require` (one copy in the ring whatever N), over TCP with
//! `shm=off` (one copy per subscriber).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use hayate_core::sync::lock;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::driver::{Conn, client_name};
use crate::size::format_size;
use crate::target::{System, Target};
use crate::{Record, progress, with_runtime};

/// Settings of [`fanout`].
#[derive(Debug, Clone)]
pub struct FanoutOptions {
    /// Systems to measure.
    pub targets: Vec<Target>,
    /// Numbers of subscriber processes, one point each.
    pub subscribers: Vec<usize>,
    /// Payload sizes.
    pub payloads: Vec<usize>,
    /// Measured time per point.
    pub duration: Duration,
    /// Publishing before the measurement starts.
    pub warmup: Duration,
    /// This program (run again as `bench fanout-sub`).
    pub exe: PathBuf,
    /// Also measure Cyclone DDS: `ddsperf sub` processes and one `ddsperf pub` (system
    /// `cyclonedds`), where ddsperf is installed.
    pub ddsperf: bool,
    /// Each subscriber reads every byte of every payload (sums it as 64-bit words), as an
    /// application that uses its data does; by default it only counts messages (what a
    /// reader of shared memory in place then never touches is not read at all).
    pub touch: bool,
}

/// What a subscriber process says, one JSON line each.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SubLine {
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    count: Option<u64>,
    #[serde(default)]
    secs: Option<f64>,
    #[serde(default)]
    error: Option<String>,
}

const READY_TIMEOUT: Duration = Duration::from_secs(30);
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the fan-out benchmark: for each payload, each number of subscribers, each target.
/// A record's `concurrency` is the number of subscriber processes, `msgs_per_sec` and
/// `bits_per_sec` the sum over them.
pub fn fanout(opts: &FanoutOptions) -> anyhow::Result<Vec<Record>> {
    crate::driver::refuse_rpc_only(&opts.targets)?;
    let systems = opts.targets.len() + usize::from(opts.ddsperf);
    let pb = progress::bar(opts.payloads.len() * opts.subscribers.len() * systems);
    let out = with_runtime(|rt| {
        let mut records = Vec::new();
        for &payload in &opts.payloads {
            for &n in &opts.subscribers {
                for target in &opts.targets {
                    pb.set_message(format!(
                        "{} fanout {} x{n}",
                        target.system(),
                        format_size(payload)
                    ));
                    let mut rec = Record::new(target.system(), target.mode(), "fanout", payload);
                    rec.target = target.to_string();
                    rec.client = client_name(target).to_string();
                    rec.concurrency = Some(n);
                    match rt.block_on(point(target, n, payload, opts)) {
                        Ok((rate, samples)) => {
                            rec.msgs_per_sec = Some(rate);
                            rec.bits_per_sec = Some(rate * payload as f64 * 8.0);
                            rec.samples = samples;
                        }
                        Err(e) => rec.error = Some(format!("{e:#}")),
                    }
                    crate::thr::report_point(&pb, &rec);
                    records.push(rec);
                    pb.inc(1);
                }
                if opts.ddsperf {
                    pb.set_message(format!("cyclonedds fanout {} x{n}", format_size(payload)));
                    let rec = ddsperf_point(n, payload, opts);
                    crate::thr::report_point(&pb, &rec);
                    records.push(rec);
                    pb.inc(1);
                }
            }
        }
        Ok(records)
    });
    pb.finish_and_clear();
    out
}

/// Whether subscribers of `target` are peer nodes linking to the publisher's node.
fn peer_mode(target: &Target) -> bool {
    target.system == System::Hayate && target.param("mode") == Some("peer")
}

/// `target` with `peers=VALUE` (replacing any).
fn with_peers(target: &Target, value: &str) -> Target {
    with_param(target, "peers", value)
}

/// `target` with `key=VALUE` (replacing any).
fn with_param(target: &Target, key: &str, value: &str) -> Target {
    let mut t = target.clone();
    t.params.retain(|(k, _)| k != key);
    t.params.push((key.into(), value.into()));
    t
}

struct Child {
    proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Child {
    async fn line(&mut self) -> anyhow::Result<SubLine> {
        loop {
            match self.lines.next_line().await? {
                Some(l) if l.trim_start().starts_with('{') => {
                    let s: SubLine = serde_json::from_str(&l)
                        .with_context(|| format!("a subscriber said {l:?}"))?;
                    if let Some(e) = s.error {
                        bail!("a subscriber failed: {e}");
                    }
                    return Ok(s);
                }
                Some(l) => eprintln!("fanout subscriber: {l}"),
                None => bail!("a subscriber process ended"),
            }
        }
    }

    async fn say(&mut self, what: &str) -> anyhow::Result<()> {
        self.stdin.write_all(what.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        Ok(())
    }
}

/// One point: the aggregate msg/s of `n` subscriber processes, and the messages counted.
async fn point(
    target: &Target,
    n: usize,
    payload: usize,
    opts: &FanoutOptions,
) -> anyhow::Result<(f64, usize)> {
    let key = format!("{}/fanout/{payload}/{n}", crate::driver::point_prefix());
    // The publisher first (a peer node: its address is what the subscribers link to).
    let publisher_target = if peer_mode(target) {
        with_peers(target, "")
    } else {
        target.clone()
    };
    let conn = Conn::connect(&publisher_target, "bench-fanout-pub", payload).await?;
    let sub_target = match &conn {
        Conn::HayatePeer(node) => with_peers(target, &node.local_addr().to_string()),
        // Zenoh in peer mode: every subscriber process is a peer connected to the
        // publisher's session (scouting and gossip off: they do not link to each other).
        #[cfg(feature = "peers")]
        Conn::Zenoh(z) if crate::driver::zenoh::is_peer(target) => {
            z.unpair(target);
            let ep = z
                .listen_endpoint()
                .context("zenoh peer mode: the publisher's session does not listen")?;
            with_param(target, "connect", ep)
        }
        _ => target.clone(),
    };
    let result = run(&conn, &sub_target, &key, n, payload, opts).await;
    conn.close(CLOSE_TIMEOUT).await;
    result
}

async fn run(
    conn: &Conn,
    sub_target: &Target,
    key: &str,
    n: usize,
    payload: usize,
    opts: &FanoutOptions,
) -> anyhow::Result<(f64, usize)> {
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        let mut proc = tokio::process::Command::new(&opts.exe)
            .args(["bench", "fanout-sub", "--target"])
            .arg(sub_target.to_string())
            .args(["--prefix", key, "--payload"])
            .arg(payload.to_string())
            .args(opts.touch.then_some("--touch"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("fanout: starting a subscriber process")?;
        let stdin = proc.stdin.take().context("no stdin")?;
        let stdout = proc.stdout.take().context("no stdout")?;
        children.push(Child {
            proc,
            stdin,
            lines: tokio::io::BufReader::new(stdout).lines(),
        });
    }
    for c in &mut children {
        let l = tokio::time::timeout(READY_TIMEOUT, c.line())
            .await
            .context("fanout: a subscriber was not ready in time")??;
        if !l.ready {
            bail!("fanout: a subscriber said something other than ready");
        }
    }
    if let Conn::HayatePeer(node) = conn {
        node.wait_peers(n, READY_TIMEOUT)
            .await
            .context("fanout: the subscriber nodes did not all link")?;
    }
    let topic = conn.topic(key).await?;
    conn.flush().await?;
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(std::sync::Mutex::new(None::<String>));
    let publisher = {
        let (stop, failed, conn) = (stop.clone(), failed.clone(), conn.clone());
        let data = Bytes::from(vec![0x5a_u8; payload]);
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = conn.publish(&topic, data.clone()).await {
                    *lock(&failed) = Some(format!("publish: {e:#}"));
                    return;
                }
            }
        })
    };
    tokio::time::sleep(opts.warmup).await;
    for c in &mut children {
        c.say("START").await?;
    }
    tokio::time::sleep(opts.duration).await;
    for c in &mut children {
        c.say("STOP").await?;
    }
    let mut rate = 0.0;
    let mut total = 0u64;
    for c in &mut children {
        let l = tokio::time::timeout(READY_TIMEOUT, c.line())
            .await
            .context("fanout: a subscriber did not report")??;
        let (Some(count), Some(secs)) = (l.count, l.secs) else {
            bail!("fanout: a subscriber's report has no count");
        };
        if secs > 0.0 {
            rate += count as f64 / secs;
        }
        total += count;
    }
    stop.store(true, Ordering::Relaxed);
    let abort = publisher.abort_handle();
    if tokio::time::timeout(Duration::from_secs(10), publisher)
        .await
        .is_err()
    {
        abort.abort();
    }
    for mut c in children {
        drop(c.stdin);
        if tokio::time::timeout(CLOSE_TIMEOUT, c.proc.wait())
            .await
            .is_err()
        {
            let _ = c.proc.kill().await;
        }
    }
    if let Some(e) = lock(&failed).take() {
        bail!(e);
    }
    if let Some(t) = conn.trouble() {
        bail!(t);
    }
    Ok((rate, usize::try_from(total).unwrap_or(usize::MAX)))
}

/// ddsperf's automatic participant indices end at 30 (our loopback config), one of them the
/// publisher's.
const DDS_MAX_SUBSCRIBERS: usize = 29;

/// One Cyclone DDS point: `n` `ddsperf sub` processes (reliable, topic KS, listener), then one
/// `ddsperf pub size S` that waits until it has matched all of them. Each subscriber reports
/// its rate every second; its figure is the median of those reports with the first (discovery
/// and warm-up) and the last (partial) dropped, and the point is their sum. ddsperf's smallest
/// sample is 12 bytes, so smaller payloads are measured at 12.
fn ddsperf_point(n: usize, payload: usize, opts: &FanoutOptions) -> Record {
    let size = payload.max(12);
    let mut rec = Record::new("cyclonedds", "brokerless", "fanout", size);
    rec.client = "ddsperf".into();
    rec.target = "ddsperf (DDS over UDP loopback)".into();
    rec.concurrency = Some(n);
    match ddsperf_run(n, size, opts) {
        Ok((rate, samples)) => {
            rec.msgs_per_sec = Some(rate);
            rec.bits_per_sec = Some(rate * size as f64 * 8.0);
            rec.samples = samples;
        }
        Err(e) => rec.error = Some(format!("{e:#}")),
    }
    rec
}

fn ddsperf_run(n: usize, size: usize, opts: &FanoutOptions) -> anyhow::Result<(f64, usize)> {
    use crate::compare::ddsperf::{ddsperf_cmd, parse_ddsperf_sub};
    use crate::compare::process::KillOnDrop;
    if n > DDS_MAX_SUBSCRIBERS {
        bail!("ddsperf: at most {DDS_MAX_SUBSCRIBERS} subscriber processes");
    }
    // Whole seconds: ddsperf reports once a second.
    let secs = (opts.warmup + opts.duration).as_secs_f64().ceil().max(3.0) as u64;
    let mut subs = Vec::with_capacity(n);
    for _ in 0..n {
        let child = ddsperf_cmd()
            .args(["-D", &(secs + 30).to_string(), "sub"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning ddsperf (bench/peers/cyclonedds.sh install)")?;
        subs.push(KillOnDrop(child));
    }
    let publisher = ddsperf_cmd()
        .args([
            "-D".to_string(),
            secs.to_string(),
            format!("-Qminmatch:{n}"),
            "-Qinitwait:25".into(),
            "pub".into(),
            "size".into(),
            size.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("running ddsperf pub")?;
    if !publisher.success() {
        bail!("ddsperf pub failed ({publisher}): did all {n} subscribers match?");
    }
    let mut rate = 0.0;
    let mut samples = 0usize;
    for mut sub in subs {
        // SIGINT: ddsperf ends cleanly and flushes what it printed (SIGKILL would lose it).
        let pid = sub.0.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while sub.0.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = sub.0.kill();
        let _ = sub.0.wait();
        let mut out = String::new();
        if let Some(mut o) = sub.0.stdout.take() {
            use std::io::Read;
            o.read_to_string(&mut out)?;
        }
        let rates: Vec<f64> = parse_ddsperf_sub(&out)
            .into_iter()
            .filter(|(s, _)| *s == size)
            .map(|(_, r)| r)
            .collect();
        if rates.len() < 3 {
            bail!(
                "a ddsperf subscriber reported {} seconds of data",
                rates.len()
            );
        }
        let kept = &rates[1..rates.len() - 1];
        rate += crate::stats::median(kept).unwrap_or(0.0);
        samples += kept.len();
    }
    Ok((rate, samples))
}

/// The subscriber process of a fan-out point (`bench fanout-sub`): subscribes to `key` on
/// `target`, prints `{"ready":true}`, counts what arrives between `START` and `STOP` on
/// stdin, prints `{"count":N,"secs":S}`, and ends when stdin closes.
/// Reads every byte of `p` (the payload summed as little-endian 64-bit words, its tail
/// bytes added one by one): [`FanoutOptions::touch`].
pub(crate) fn touch(p: &[u8]) -> u64 {
    let words = p.chunks_exact(8);
    let tail = words.remainder().iter().map(|&b| u64::from(b));
    words
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
        .chain(tail)
        .fold(0u64, u64::wrapping_add)
}

/// A subscriber process of [`fanout`]: counts what it gets on `key` (reading every byte of
/// it with `touch`), and says how many between START and STOP on its stdin.
pub fn fanout_sub(target: &Target, key: &str, payload: usize, touch: bool) -> anyhow::Result<()> {
    with_runtime(|rt| {
        rt.block_on(async {
            let say = |l: &SubLine| -> anyhow::Result<()> {
                println!("{}", serde_json::to_string(l)?);
                Ok(())
            };
            let conn = match Conn::connect(target, "bench-fanout-sub", payload).await {
                Ok(c) => c,
                Err(e) => {
                    return say(&SubLine {
                        error: Some(format!("{e:#}")),
                        ..SubLine::default()
                    });
                }
            };
            let mut sub = conn.subscribe(key).await?;
            conn.flush().await?;
            let count = Arc::new(AtomicU64::new(0));
            let counting = {
                let count = count.clone();
                tokio::spawn(async move {
                    let mut sum = 0u64;
                    while let Some(n) = sub
                        .next_many(|p| {
                            if touch {
                                sum = sum.wrapping_add(self::touch(p));
                            }
                        })
                        .await
                    {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    std::hint::black_box(sum);
                })
            };
            say(&SubLine {
                ready: true,
                ..SubLine::default()
            })?;
            let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            let mut started: Option<(Instant, u64)> = None;
            while let Some(l) = stdin.next_line().await? {
                match l.trim() {
                    "START" => started = Some((Instant::now(), count.load(Ordering::Relaxed))),
                    "STOP" => {
                        let (t0, c0) = started.take().unwrap_or((Instant::now(), 0));
                        say(&SubLine {
                            count: Some(count.load(Ordering::Relaxed) - c0),
                            secs: Some(t0.elapsed().as_secs_f64()),
                            ..SubLine::default()
                        })?;
                    }
                    _ => {}
                }
            }
            counting.abort();
            conn.close(CLOSE_TIMEOUT).await;
            Ok(())
        })
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn touch_reads_every_byte() {
        assert_eq!(super::touch(&[]), 0);
        assert_eq!(super::touch(&[1, 0, 0, 0, 0, 0, 0, 0, 5]), 6);
        let mut p = vec![0u8; 1001];
        p[1000] = 7;
        p[8] = 1;
        p[999] = 1;
        assert_eq!(super::touch(&p), 8 + (1 << 56));
    }
}
