//! The physical limit of the path: raw TCP over loopback, in this process, no broker.
//!
//! Throughput: a writer thread sends frames (u32 big-endian length + payload) back to back,
//! coalescing about 256 KiB per write call like a good client would: frames up to 4 KiB are
//! copied into one buffer, larger ones are gathered without copying (`writev` of header and
//! payload slices, up to 64 frames per call). A
//! reader thread parses the frames and counts them. Latency: a ping-pong of one frame with an
//! echo thread. TCP_NODELAY on both sides; blocking sockets on OS threads (the cheapest way to
//! drive a socket). Records have `system = "tcp"`, `mode = "raw"`.
//!
//! The relay floor of throughput (`mode = "relay"`, measured beside the raw point whenever
//! the baseline is): the same writer and reader, with a relay thread between them that only
//! copies bytes from the publisher's connection to the subscriber's ([`relay_bytes`], the copy
//! loop of `bench rpc --baseline`'s relay too). Two loopback connections and a copy through
//! user space, as through any broker, and no messaging work: what no brokered design can
//! beat on this machine. The relay is a thread of this process rather than a process of its
//! own: over loopback TCP that costs it nothing a process would not (fewer address-space
//! switches if anything), so it stays a floor.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;

use crate::lat::{self, WARMUP_ROUND_TRIPS};
use crate::sampler::{Counter, Tally, sample};
use crate::thr;
use crate::{LatOptions, Record, ThrOptions};

const BATCH_BYTES: usize = 256 * 1024;
const COPY_MAX_FRAME: usize = 4 * 1024;
/// The throughput relay's copy buffer: as large as the reader's, so that the relay makes no
/// more system calls than the subscriber does.
const RELAY_BUF: usize = 1 << 20;

/// Raw TCP throughput, and its relay floor, at each of `opts.payloads` (`opts.targets` is
/// ignored).
pub fn baseline_thr(opts: &ThrOptions) -> anyhow::Result<Vec<Record>> {
    crate::thr(&ThrOptions {
        targets: Vec::new(),
        include_baseline: true,
        ..opts.clone()
    })
}

/// Raw TCP ping-pong latency (`opts.targets` is ignored).
pub fn baseline_lat(opts: &LatOptions) -> anyhow::Result<Vec<Record>> {
    Ok(vec![lat_point(opts)])
}

fn connected_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// A throughput path: the publisher's end, the subscriber's end and the relay thread between
/// them, if any.
type Ends = (TcpStream, TcpStream, Option<std::thread::JoinHandle<()>>);

/// One connection from the publisher to the subscriber.
fn thr_pair() -> anyhow::Result<Ends> {
    let (tx, rx) = connected_pair().context("loopback TCP pair")?;
    Ok((tx, rx, None))
}

/// Publisher -> relay -> subscriber: two loopback connections and the relay thread copying
/// from the first to the second (it ends, shutting the subscriber's side, at the end of the
/// publisher's stream).
fn relayed_pair() -> anyhow::Result<Ends> {
    let (tx, relay_in) = connected_pair().context("loopback TCP pair (publisher -> relay)")?;
    let (relay_out, rx) = connected_pair().context("loopback TCP pair (relay -> subscriber)")?;
    let relay = std::thread::Builder::new()
        .name("tcp-relay".into())
        .spawn(move || relay_bytes(relay_in, relay_out, RELAY_BUF))?;
    Ok((tx, rx, Some(relay)))
}

/// Copies what `from` reads to `to` until `from` ends or either fails, then shuts `to`'s
/// write side, so that the end travels through. The whole of a relay: no parsing, no
/// messaging work.
pub(crate) fn relay_bytes(mut from: TcpStream, mut to: TcpStream, buf_size: usize) {
    let mut buf = vec![0u8; buf_size];
    loop {
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A throughput point of the baseline: raw TCP (one connection, publisher to subscriber), or
/// with `relayed` its relay floor (publisher -> relay thread -> subscriber).
pub(crate) async fn thr_point(payload: usize, opts: &ThrOptions, relayed: bool) -> Record {
    let (mode, client, path): (_, _, fn() -> anyhow::Result<Ends>) = if relayed {
        let client = "std::net::TcpStream, blocking threads (publisher -> relay thread -> \
                      subscriber)";
        ("relay", client, relayed_pair)
    } else {
        ("raw", "std::net::TcpStream", thr_pair)
    };
    let mut rec = Record::new("tcp", mode, "thr", payload);
    rec.client = client.to_string();
    let result = thr_run(payload, opts, path).await;
    thr::finish(&mut rec, result);
    rec
}

/// The writer and reader threads over the connection(s) `path` makes, sampled.
async fn thr_run(
    payload: usize,
    opts: &ThrOptions,
    path: fn() -> anyhow::Result<Ends>,
) -> anyhow::Result<Vec<f64>> {
    if u32::try_from(payload).is_err() {
        anyhow::bail!("payload too large for a u32 length prefix");
    }
    let (mut tx, mut rx, relay) = path()?;
    let counter = Counter::new();
    let stop = Arc::new(AtomicBool::new(false));

    let reader = {
        let counter = counter.clone();
        std::thread::Builder::new()
            .name("tcp-reader".into())
            .spawn(move || {
                let mut tally = Tally::new(counter.clone(), payload);
                let mut parser = FrameParser::default();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match rx.read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => tally.many(parser.feed(&buf[..n])),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return counter.fail(format!("tcp read: {e}")),
                    }
                }
            })?
    };
    let writer = {
        let (counter, stop) = (counter.clone(), stop.clone());
        std::thread::Builder::new()
            .name("tcp-writer".into())
            .spawn(move || {
                if let Err(e) = write_frames(&mut tx, payload, &stop) {
                    counter.fail(format!("tcp write: {e}"));
                }
                let _ = tx.shutdown(Shutdown::Write);
            })?
    };

    let result = sample(&counter, opts.warmup, opts.duration, opts.samples, || None).await;
    stop.store(true, Ordering::Relaxed);
    // The reader ends at EOF once the writer has stopped and shut its side down (and the
    // relay, if any, has passed the end on).
    tokio::task::spawn_blocking(move || {
        let _ = writer.join();
        if let Some(relay) = relay {
            let _ = relay.join();
        }
        let _ = reader.join();
    })
    .await?;
    result
}

fn write_frames(s: &mut TcpStream, payload: usize, stop: &AtomicBool) -> io::Result<()> {
    let data = vec![0x5a_u8; payload];
    let header = (payload as u32).to_be_bytes();
    if payload <= COPY_MAX_FRAME {
        // Small frames: copied into one buffer, written with one call.
        let frames = (BATCH_BYTES / (payload + 4)).max(1);
        let mut batch = Vec::with_capacity(frames * (payload + 4));
        while !stop.load(Ordering::Relaxed) {
            batch.clear();
            for _ in 0..frames {
                batch.extend_from_slice(&header);
                batch.extend_from_slice(&data);
            }
            s.write_all(&batch)?;
        }
    } else {
        // Large frames: no copy, header and payload slices gathered into one writev.
        let frames = (BATCH_BYTES / payload).clamp(1, 64);
        while !stop.load(Ordering::Relaxed) {
            let mut iov: Vec<IoSlice<'_>> = (0..frames)
                .flat_map(|_| [IoSlice::new(&header), IoSlice::new(&data)])
                .collect();
            let mut slices = &mut iov[..];
            while !slices.is_empty() {
                match s.write_vectored(slices) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => IoSlice::advance_slices(&mut slices, n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// Splits a byte stream of u32-length-prefixed frames, counting complete frames.
#[derive(Debug, Default)]
pub(crate) struct FrameParser {
    header: [u8; 4],
    header_len: usize,
    /// Payload bytes still to skip in the current frame (when `in_body`).
    body_left: usize,
    in_body: bool,
}

impl FrameParser {
    /// Consumes `data`, returning how many frames it completed.
    pub(crate) fn feed(&mut self, data: &[u8]) -> u64 {
        let mut frames = 0;
        let mut i = 0;
        while i < data.len() {
            if self.in_body {
                let take = self.body_left.min(data.len() - i);
                i += take;
                self.body_left -= take;
                if self.body_left == 0 {
                    self.in_body = false;
                    frames += 1;
                }
                continue;
            }
            let len = if self.header_len == 0 && data.len() - i >= 4 {
                let mut h = [0u8; 4];
                h.copy_from_slice(&data[i..i + 4]);
                i += 4;
                u32::from_be_bytes(h)
            } else {
                let take = (4 - self.header_len).min(data.len() - i);
                self.header[self.header_len..self.header_len + take]
                    .copy_from_slice(&data[i..i + take]);
                self.header_len += take;
                i += take;
                if self.header_len < 4 {
                    continue;
                }
                self.header_len = 0;
                u32::from_be_bytes(self.header)
            };
            if len == 0 {
                frames += 1;
            } else {
                self.body_left = len as usize;
                self.in_body = true;
            }
        }
        frames
    }
}

pub(crate) fn lat_point(opts: &LatOptions) -> Record {
    let mut rec = Record::new("tcp", "raw", "lat", opts.payload);
    rec.client = "std::net::TcpStream".to_string();
    let result = lat_run(opts);
    lat::finish(&mut rec, result);
    rec
}

fn lat_run(opts: &LatOptions) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let size = opts.payload;
    let len = u32::try_from(size).context("payload too large for a u32 length prefix")?;
    let (mut client, mut server) = connected_pair().context("loopback TCP pair")?;
    client.set_read_timeout(Some(Duration::from_secs(5)))?;
    let echo =
        std::thread::Builder::new()
            .name("tcp-echo".into())
            .spawn(move || -> io::Result<()> {
                let mut frame = vec![0u8; 4 + size];
                loop {
                    match server.read_exact(&mut frame) {
                        Ok(()) => server.write_all(&frame)?,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                        Err(e) => return Err(e),
                    }
                }
            })?;

    let mut ping = vec![0x5a_u8; 4 + size];
    ping[..4].copy_from_slice(&len.to_be_bytes());
    let mut pong = vec![0u8; 4 + size];
    let mut seq = 0u64;
    let mut round_trip = || -> anyhow::Result<Duration> {
        seq += 1;
        if size >= 8 {
            ping[4..12].copy_from_slice(&seq.to_be_bytes());
        }
        let t0 = Instant::now();
        client.write_all(&ping)?;
        client.read_exact(&mut pong)?;
        let rtt = t0.elapsed();
        lat::check_pong(&pong[4..], size, seq)?;
        Ok(rtt)
    };
    let result = (|| {
        let start = Instant::now();
        let mut n = 0u64;
        while n < WARMUP_ROUND_TRIPS || start.elapsed() < opts.warmup {
            round_trip()?;
            n += 1;
        }
        let mut h = lat::new_histogram()?;
        let start = Instant::now();
        while start.elapsed() < opts.duration {
            lat::record_rtt(&mut h, round_trip()?);
        }
        Ok((h, start.elapsed()))
    })();
    let _ = client.shutdown(Shutdown::Both);
    let _ = echo.join();
    result
}

/// The raw TCP ping-pong on Tokio, as [`LatOptions::own_threads`] runs the systems: each side a
/// task on a runtime of its own with one worker thread, reading and writing a
/// `tokio::net::TcpStream`. What an epoll-driven program pays over [`lat_point`]'s blocking
/// threads, with no messaging system in between.
pub(crate) fn tokio_lat_point(opts: &LatOptions) -> Record {
    let mut rec = Record::new("tcp", "tokio", "lat", opts.payload);
    rec.client = "tokio::net::TcpStream (own threads)".to_string();
    let result = tokio_lat_run(opts);
    lat::finish(&mut rec, result);
    rec
}

fn one_worker_runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
}

fn tokio_lat_run(opts: &LatOptions) -> anyhow::Result<(Histogram<u64>, Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let size = opts.payload;
    let len = u32::try_from(size).context("payload too large for a u32 length prefix")?;
    let (client, server) = connected_pair().context("loopback TCP pair")?;
    client.set_nonblocking(true)?;
    server.set_nonblocking(true)?;
    let echo =
        std::thread::Builder::new()
            .name("tcp-echo".into())
            .spawn(move || -> io::Result<()> {
                let rt = one_worker_runtime()?;
                let task = rt.spawn(async move {
                    let mut server = tokio::net::TcpStream::from_std(server)?;
                    let mut frame = vec![0u8; 4 + size];
                    loop {
                        match server.read_exact(&mut frame).await {
                            Ok(_) => server.write_all(&frame).await?,
                            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                            Err(e) => return Err(e),
                        }
                    }
                });
                rt.block_on(task).map_err(io::Error::other)?
            })?;
    let rt = one_worker_runtime()?;
    let (warmup, duration) = (opts.warmup, opts.duration);
    let pinger = rt.spawn(async move {
        let mut client = tokio::net::TcpStream::from_std(client)?;
        let mut ping = vec![0x5a_u8; 4 + size];
        ping[..4].copy_from_slice(&len.to_be_bytes());
        let mut pong = vec![0u8; 4 + size];
        let mut seq = 0u64;
        let mut h = lat::new_histogram()?;
        let mut measured = None;
        let start = Instant::now();
        let mut n = 0u64;
        loop {
            seq += 1;
            if size >= 8 {
                ping[4..12].copy_from_slice(&seq.to_be_bytes());
            }
            let t0 = Instant::now();
            client.write_all(&ping).await?;
            tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut pong))
                .await
                .context("no pong within 5 s")??;
            let rtt = t0.elapsed();
            lat::check_pong(&pong[4..], size, seq)?;
            n += 1;
            match measured {
                None if n >= WARMUP_ROUND_TRIPS && start.elapsed() >= warmup => {
                    measured = Some(Instant::now());
                }
                None => {}
                Some(t) => {
                    lat::record_rtt(&mut h, rtt);
                    if t.elapsed() >= duration {
                        let _ = client.shutdown().await;
                        return anyhow::Ok((h, t.elapsed()));
                    }
                }
            }
        }
    });
    let result = rt
        .block_on(pinger)
        .map_err(|e| anyhow::anyhow!("the pinger task failed: {e}"))
        .and_then(|r| r);
    drop(rt);
    let _ = echo.join();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(sizes: &[usize]) -> Vec<u8> {
        let mut v = Vec::new();
        for &s in sizes {
            v.extend_from_slice(&(s as u32).to_be_bytes());
            v.extend(std::iter::repeat_n(7u8, s));
        }
        v
    }

    #[test]
    fn parser_counts_frames_across_any_split() {
        let sizes = [0, 1, 3, 4, 5, 100, 0, 70_000, 8];
        let stream = frames(&sizes);
        for chunk in [1, 2, 3, 5, 7, 64, 4096, stream.len()] {
            let mut p = FrameParser::default();
            let n: u64 = stream.chunks(chunk).map(|c| p.feed(c)).sum();
            assert_eq!(n, sizes.len() as u64, "chunk {chunk}");
            assert!(!p.in_body && p.header_len == 0);
        }
    }

    /// Frames with a sequence number in their first 8 bytes, sent through the relay by one
    /// thread, read back by another: every one arrives, in order, and then the end.
    #[test]
    fn the_relay_delivers_every_message_in_order() {
        const N: u64 = 3000;
        let size = |i: u64| [8usize, 100, 4096, 70_000][(i % 4) as usize];
        let (mut tx, mut rx, relay) = relayed_pair().unwrap();
        let writer = std::thread::spawn(move || {
            for i in 0..N {
                let mut frame = vec![0xa5u8; 4 + size(i)];
                frame[..4].copy_from_slice(&(size(i) as u32).to_be_bytes());
                frame[4..12].copy_from_slice(&i.to_be_bytes());
                tx.write_all(&frame).unwrap();
            }
            tx.shutdown(Shutdown::Write).unwrap();
        });
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut body = Vec::new();
        for i in 0..N {
            let mut len = [0u8; 4];
            rx.read_exact(&mut len).unwrap();
            assert_eq!(u32::from_be_bytes(len) as usize, size(i), "frame {i}");
            body.resize(size(i), 0);
            rx.read_exact(&mut body).unwrap();
            let seq = u64::from_be_bytes(body[..8].try_into().unwrap());
            assert_eq!(seq, i);
            assert!(body[8..].iter().all(|&b| b == 0xa5), "frame {i}");
        }
        // The publisher's end travels through the relay.
        assert_eq!(rx.read(&mut [0u8; 16]).unwrap(), 0);
        writer.join().unwrap();
        relay.unwrap().join().unwrap();
    }

    #[test]
    fn baselines_give_sane_numbers() {
        let thr_opts = ThrOptions {
            payloads: vec![64, 64 * 1024],
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(100),
            samples: 5,
            ..ThrOptions::default()
        };
        let recs = baseline_thr(&thr_opts).unwrap();
        // Per payload: raw TCP, then the relay floor.
        let modes: Vec<(&str, usize)> = recs
            .iter()
            .map(|r| (r.mode.as_str(), r.payload_bytes))
            .collect();
        assert_eq!(
            modes,
            [
                ("raw", 64),
                ("relay", 64),
                ("raw", 64 * 1024),
                ("relay", 64 * 1024)
            ]
        );
        for r in &recs {
            assert_eq!(r.error, None);
            assert_eq!((r.system.as_str(), r.test.as_str()), ("tcp", "thr"));
            // No timing assert on the relay: only that it delivered.
            let least = if r.mode == "raw" { 1000.0 } else { 0.0 };
            assert!(r.msgs_per_sec.unwrap() > least, "{r:?}");
            let bits = r.msgs_per_sec.unwrap() * r.payload_bytes as f64 * 8.0;
            assert!((r.bits_per_sec.unwrap() - bits).abs() < 1.0);
            assert!(r.samples >= 3);
        }
        let lat_opts = LatOptions {
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
            ..LatOptions::default()
        };
        let recs = baseline_lat(&lat_opts).unwrap();
        let r = &recs[0];
        assert_eq!(r.error, None);
        assert_eq!(r.test, "lat");
        let (p50, p99, p999) = (r.p50_us.unwrap(), r.p99_us.unwrap(), r.p999_us.unwrap());
        assert!(p50 > 0.0 && p50 <= p99 && p99 <= p999, "{r:?}");
        assert!(r.samples > 100);
        // The same ping-pong on Tokio, each side on a runtime of its own.
        let r = tokio_lat_point(&lat_opts);
        assert_eq!(r.error, None);
        assert_eq!((r.system.as_str(), r.mode.as_str()), ("tcp", "tokio"));
        assert!(r.p50_us.unwrap() > 0.0 && r.p50_us <= r.p99_us, "{r:?}");
        assert!(r.samples > 100);
    }
}
