//! The floor of a brokered call on this host (`bench rpc --baseline`, system `tcp`, mode
//! `relay`): each caller's connection goes to a relay process, which opens one to a server
//! process and copies bytes both ways; the server answers each request with the number plus
//! one. Four loopback TCP crossings and three processes per call, as through a broker, and
//! no messaging work at all: the relay copies what it reads, the server parses a number.
//! Blocking sockets on OS threads (the cheapest way to drive a socket, as the raw TCP
//! baselines of thr and lat): a thread per caller, two per relayed connection (one each
//! way), one per server connection. No broker that sleeps between messages can beat it on
//! the same host; what it cannot reach, no broker can.
//!
//! Frames both ways: a u32 big-endian length, then the number as decimal text (the payload
//! of every system's RPC point, [`super::add_one`], [`super::check_reply`]).
//!
//! With [`ServerPlacement::Child`] the relay and the server are this executable run as
//! `EXE bench rpc-relay [--to ADDR]` ([`serve_relay`], [`serve_echo`]); each writes one JSON
//! line with its address and serves until its stdin closes. With
//! [`ServerPlacement::InProcess`] both run on threads of this process.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, bail};
use hdrhistogram::Histogram;

use super::child::ChildServer;
use super::{Outcome, RpcOptions, RpcPoint, ServerPlacement, add_one, check_reply};
use crate::baseline::relay_bytes;
use crate::{Record, with_runtime};

/// A request or reply longer than this ends the connection (a number is at most 20 digits).
const MAX_FRAME: usize = 64;

/// The relay's copy buffer, per direction of a connection.
const COPY_BUF: usize = 16 << 10;

/// One point of the baseline: its record, as [`super::run::rpc_point`] makes one for a target.
pub(super) fn relay_point(point: RpcPoint, opts: &RpcOptions) -> Record {
    let mut r = Record::new("tcp", "relay", "rpc", 0);
    r.concurrency = Some(point.concurrency);
    r.client = format!(
        "std::net::TcpStream, blocking threads (caller -> relay process -> server process); {}",
        match opts.server {
            ServerPlacement::InProcess => "relay and server in-process",
            ServerPlacement::Child(_) => "relay and server in child processes",
        }
    );
    let res = run(point, opts);
    super::run::fill(&mut r, res, point, "tcp relay", opts);
    r
}

fn run(point: RpcPoint, opts: &RpcOptions) -> anyhow::Result<Outcome> {
    if point.concurrency == 0 || point.calls == 0 {
        bail!("rpc: calls and concurrency must be at least 1");
    }
    match &opts.server {
        ServerPlacement::InProcess => {
            let echo = Serving::start(None)?;
            let relay = Serving::start(Some(echo.addr))?;
            let out = call_all(relay.addr, point, opts);
            relay.stop();
            echo.stop();
            out
        }
        ServerPlacement::Child(exe) => with_runtime(|rt| {
            rt.block_on(async {
                let echo = ChildServer::start(relay_command(exe, None)).await?;
                let to = echo
                    .ready
                    .endpoint
                    .clone()
                    .context("rpc: the server said no address")?;
                let relay = ChildServer::start(relay_command(exe, Some(&to))).await?;
                let at: SocketAddr = relay
                    .ready
                    .endpoint
                    .as_deref()
                    .context("rpc: the relay said no address")?
                    .parse()
                    .context("rpc: the relay's address")?;
                let (point, opts2) = (point, opts.clone());
                let out = tokio::task::spawn_blocking(move || call_all(at, point, &opts2))
                    .await
                    .context("rpc: the callers")?;
                relay.stop().await;
                echo.stop().await;
                out
            })
        }),
    }
}

/// `EXE bench rpc-relay [--to ADDR]`.
fn relay_command(exe: &std::path::Path, to: Option<&str>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["bench", "rpc-relay"]);
    if let Some(to) = to {
        cmd.args(["--to", to]);
    }
    cmd
}

/// `point.calls` calls by `point.concurrency` threads, each with its own connection to `at`
/// and one call in flight.
fn call_all(at: SocketAddr, point: RpcPoint, opts: &RpcOptions) -> anyhow::Result<Outcome> {
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let hists = std::thread::scope(|s| {
        let callers: Vec<_> = (0..point.concurrency)
            .map(|_| s.spawn(|| caller(at, point.calls, &next, start, opts)))
            .collect();
        callers
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|_| bail!("rpc: a caller panicked")))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let elapsed = start.elapsed();
    let mut hist = crate::lat::new_histogram()?;
    for h in &hists {
        hist.add(h)?;
    }
    Ok(Outcome {
        version: None,
        calls: hist.len(),
        elapsed,
        hist,
    })
}

/// One caller: takes request numbers from `next` until `calls` are taken or the point's time
/// is up; the time of each call in nanoseconds.
fn caller(
    at: SocketAddr,
    calls: u64,
    next: &AtomicU64,
    start: Instant,
    opts: &RpcOptions,
) -> anyhow::Result<Histogram<u64>> {
    let mut s = TcpStream::connect(at).context("rpc: connecting to the relay")?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(opts.call_timeout))?;
    let mut h = crate::lat::new_histogram()?;
    let mut out = Vec::with_capacity(4 + 20);
    let mut reply = Vec::with_capacity(MAX_FRAME);
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= calls || start.elapsed() > opts.max_time {
            break;
        }
        // The request written into the reused buffer: no allocation per call in the floor.
        out.clear();
        out.extend_from_slice(&[0; 4]);
        write!(out, "{i}")?;
        let len = (out.len() - 4) as u32;
        out[..4].copy_from_slice(&len.to_be_bytes());
        let t = Instant::now();
        s.write_all(&out)?;
        read_frame(&mut s, &mut reply)?.with_context(|| format!("rpc: request {i}: closed"))?;
        h.record(t.elapsed().as_nanos().max(1) as u64)?;
        check_reply(i, &reply)?;
    }
    let _ = s.shutdown(Shutdown::Both);
    Ok(h)
}

fn put_frame(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// Reads one frame into `body`; `None` at the end of the stream before a frame began.
fn read_frame(s: &mut TcpStream, body: &mut Vec<u8>) -> io::Result<Option<()>> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        r => r?,
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes (at most {MAX_FRAME})"),
        ));
    }
    body.resize(len, 0);
    s.read_exact(body)?;
    Ok(Some(()))
}

/// The server's side of a connection: answers each request until the caller closes.
fn echo(mut s: TcpStream) {
    let mut req = Vec::with_capacity(MAX_FRAME);
    let mut out = Vec::with_capacity(4 + 20);
    while let Ok(Some(())) = read_frame(&mut s, &mut req) {
        out.clear();
        put_frame(&mut out, &add_one(&req));
        if s.write_all(&out).is_err() {
            return;
        }
    }
}

/// The relay's side of a connection: a thread copying each way; when either side ends, the
/// other's write side is shut, so the end travels through.
fn relay(client: TcpStream, to: SocketAddr) -> io::Result<()> {
    let server = TcpStream::connect(to)?;
    server.set_nodelay(true)?;
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    std::thread::Builder::new()
        .name("relay-back".into())
        .spawn(move || relay_bytes(s2, c2, COPY_BUF))?;
    relay_bytes(client, server, COPY_BUF);
    Ok(())
}

/// A listener on 127.0.0.1 (a free port) and its accept thread: the server (`to` = `None`)
/// or a relay to `to`, a thread per connection.
struct Serving {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: std::thread::JoinHandle<()>,
}

impl Serving {
    fn start(to: Option<SocketAddr>) -> io::Result<Serving> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let accept = std::thread::Builder::new()
            .name(if to.is_some() { "relay" } else { "rpc-echo" }.into())
            .spawn(move || {
                for s in listener.incoming() {
                    if stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(s) = s else { continue };
                    if s.set_nodelay(true).is_err() {
                        continue;
                    }
                    let _ = std::thread::Builder::new()
                        .name("rpc-conn".into())
                        .spawn(move || match to {
                            Some(to) => {
                                let _ = relay(s, to);
                            }
                            None => echo(s),
                        });
                }
            })?;
        Ok(Serving { addr, stop, accept })
    }

    /// Ends the accept thread (connection threads end with their connections).
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept call, which then sees the flag.
        drop(TcpStream::connect(self.addr));
        let _ = self.accept.join();
    }
}

/// What `hayate bench rpc-relay [--to ADDR]` runs: the baseline's server (no `to`) or its
/// relay to `to`, on 127.0.0.1 (a free port). Writes one JSON line with the address
/// (`{"endpoint":"127.0.0.1:PORT"}`), then serves until stdin is closed.
pub fn serve_relay(to: Option<&str>) -> anyhow::Result<()> {
    let to = match to {
        Some(a) => Some(a.parse().with_context(|| format!("rpc-relay: --to {a}"))?),
        None => None,
    };
    let serving = Serving::start(to)?;
    {
        let mut out = io::stdout().lock();
        writeln!(
            out,
            "{}",
            serde_json::json!({ "endpoint": serving.addr.to_string() })
        )?;
        out.flush()?;
    }
    let mut buf = [0u8; 256];
    let mut stdin = io::stdin().lock();
    while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
    serving.stop();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn opts(server: ServerPlacement) -> RpcOptions {
        RpcOptions {
            server,
            max_time: Duration::from_secs(30),
            call_timeout: Duration::from_secs(5),
            ..RpcOptions::default()
        }
    }

    #[test]
    fn the_relay_baseline_answers_every_call_in_process() {
        for concurrency in [1, 4] {
            let point = RpcPoint {
                calls: 300,
                concurrency,
            };
            let r = relay_point(point, &opts(ServerPlacement::InProcess));
            assert_eq!(r.error, None);
            assert_eq!((r.system.as_str(), r.mode.as_str()), ("tcp", "relay"));
            assert_eq!(r.samples, 300);
            assert!(r.msgs_per_sec.is_some_and(|v| v > 0.0));
            assert!(r.p50_us.is_some_and(|v| v > 0.0));
        }
    }

    #[test]
    fn a_wrong_answer_fails_the_point() {
        // A server that answers the number itself instead of the number plus one.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut req = Vec::new();
            while let Ok(Some(())) = read_frame(&mut s, &mut req) {
                let mut out = Vec::new();
                put_frame(&mut out, &req);
                let _ = s.write_all(&out);
            }
        });
        let point = RpcPoint {
            calls: 5,
            concurrency: 1,
        };
        let Err(e) = call_all(addr, point, &opts(ServerPlacement::InProcess)) else {
            panic!("a wrong answer was accepted");
        };
        assert!(format!("{e:#}").contains("request 0 got 0"), "{e:#}");
    }

    #[test]
    fn an_oversized_frame_ends_the_connection() {
        let echo = Serving::start(None).unwrap();
        let mut s = TcpStream::connect(echo.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&u32::MAX.to_be_bytes()).unwrap();
        let mut buf = [0u8; 8];
        // The server's thread ends and closes the socket: end of stream, no answer.
        assert_eq!(s.read(&mut buf).unwrap(), 0);
        echo.stop();
    }
}
