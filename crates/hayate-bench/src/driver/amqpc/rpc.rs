//! Request/reply over direct reply-to: the server ([`RpcServer`]) and the callers
//! ([`RpcCaller`], and [`BlockingCaller`] on a blocking socket). Each end owns its socket and
//! reads and writes it itself ([`Direct`], [`Blocking`]), with the same framing ([`Framing`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use hayate_amqp::{FieldTable, Frame, FrameDecoder, Method, ShortStr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::wire::{Assembled, Assembly, encode_publish, open};
use super::{CHANNEL, Delivery, FRAME_MAX};
use crate::target::Target;

/// RabbitMQ's pseudo-queue for direct reply-to.
const REPLY_TO: &str = "amq.rabbitmq.reply-to";

/// The framing state of an RPC end: what was read and is still to be decoded, what is to be
/// written, and the delivery being put together. Shared by the Tokio end ([`Direct`]) and the
/// blocking one ([`Blocking`]), which differ only in how they read and write.
struct Framing {
    buf: BytesMut,
    out: BytesMut,
    dec: FrameDecoder,
    frame_max: usize,
    /// The delivery whose frames are arriving.
    asm: Assembly,
}

impl Framing {
    /// The next delivery complete in what was read, if any.
    fn take(&mut self) -> anyhow::Result<Option<Delivery>> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            match self.asm.frame(f) {
                Assembled::Delivery(i, body) => return Ok(Some(i.done(body))),
                Assembled::Other(Frame::Method(_, m)) => {
                    closed(m)?;
                }
                Assembled::Partial | Assembled::Other(_) => {}
            }
        }
        Ok(None)
    }

    /// The next method in what was read, if any (a synchronous method's answer).
    fn method(&mut self) -> anyhow::Result<Option<Method>> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            if let Frame::Method(_, m) = f {
                return closed(m).map(Some);
            }
        }
        Ok(None)
    }

    /// Whether what was read holds connection.close-ok.
    fn close_ok(&mut self) -> anyhow::Result<bool> {
        while let Some(f) = self.dec.decode(&mut self.buf)? {
            if let Frame::Method(_, Method::ConnectionCloseOk {}) = f {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Appends connection.close.
    fn close(&mut self) {
        Frame::Method(
            0,
            Method::ConnectionClose {
                reply_code: 200,
                reply_text: ShortStr::lit("bye"),
                class_id: 0,
                method_id: 0,
            },
        )
        .encode(&mut self.out);
    }

    /// Appends a request to `queue`, its reply-to direct reply-to.
    fn request(&mut self, queue: &ShortStr, req: &[u8]) {
        let props = hayate_amqp::BasicProperties {
            reply_to: Some(ShortStr::lit(REPLY_TO)),
            ..Default::default()
        };
        let x = ShortStr::lit("");
        encode_publish(&x, queue, &props, req, self.frame_max, &mut self.out);
    }

    /// Appends the answer to every complete request read so far (to its reply-to, through
    /// the default exchange, with its correlation id); requests without a reply-to are
    /// dropped.
    fn answer_all(&mut self, handler: fn(&[u8]) -> Bytes) -> anyhow::Result<()> {
        let x = ShortStr::lit("");
        while let Some(r) = self.take()? {
            let Some(reply_to) = r.reply_to else { continue };
            let props = hayate_amqp::BasicProperties {
                correlation_id: r.correlation_id,
                ..Default::default()
            };
            let answer = handler(&r.body);
            encode_publish(
                &x,
                &reply_to,
                &props,
                &answer,
                self.frame_max,
                &mut self.out,
            );
        }
        Ok(())
    }
}

/// An RPC end that owns its socket: no reader or writer task, so a call costs the client
/// no wake-up of another task (the method of rpc-bench: one request in flight per
/// connection, the caller writes it and reads its answer itself). Both brokers are measured
/// with it.
struct Direct {
    rd: tokio::net::tcp::OwnedReadHalf,
    wr: tokio::net::tcp::OwnedWriteHalf,
    f: Framing,
}

impl Direct {
    async fn connect(target: &Target) -> anyhow::Result<Direct> {
        let o = open(target, Duration::from_secs(10)).await?;
        Ok(Direct {
            rd: o.rd,
            wr: o.wr,
            f: Framing {
                buf: o.buf,
                out: BytesMut::with_capacity(16 << 10),
                dec: FrameDecoder::new(o.frame_max.max(FRAME_MAX)),
                frame_max: o.frame_max as usize,
                asm: Assembly::default(),
            },
        })
    }

    /// Sends what `out` holds.
    async fn send(&mut self) -> anyhow::Result<()> {
        self.wr.write_all(&self.f.out).await?;
        self.f.out.clear();
        Ok(())
    }

    /// Reads more; an error at the end of the stream.
    async fn fill(&mut self) -> anyhow::Result<()> {
        let buf = &mut self.f.buf;
        if buf.capacity() - buf.len() < 4 << 10 {
            buf.reserve(64 << 10);
        }
        if self.rd.read_buf(buf).await? == 0 {
            bail!("amqp: connection closed by the server");
        }
        Ok(())
    }

    /// A synchronous method and its answer (before any delivery can arrive).
    async fn call(&mut self, m: Method) -> anyhow::Result<Method> {
        let name = m.name();
        Frame::Method(CHANNEL, m).encode(&mut self.f.out);
        self.send().await?;
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(m) = self.f.method()? {
                    return Ok(m);
                }
                self.fill().await?;
            }
        })
        .await
        .with_context(|| format!("amqp: no answer to {name}"))?
    }

    /// Consumes `queue` with no-ack.
    async fn consume(&mut self, queue: ShortStr) -> anyhow::Result<()> {
        let tag = ShortStr::lit(&format!("c-{queue}"));
        match self
            .call(Method::BasicConsume {
                ticket: 0,
                queue,
                consumer_tag: tag,
                no_local: false,
                no_ack: true,
                exclusive: false,
                no_wait: false,
                arguments: FieldTable::default(),
            })
            .await?
        {
            Method::BasicConsumeOk { .. } => Ok(()),
            m => bail!("expected basic.consume-ok, got {}", m.name()),
        }
    }

    /// Closes the connection (connection.close, then a short wait for its answer).
    async fn close(mut self) {
        self.f.close();
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            self.send().await?;
            while !self.f.close_ok()? {
                self.fill().await?;
            }
            anyhow::Ok(())
        })
        .await;
    }
}

/// An RPC end on a blocking socket (`io=blocking`), for a thread of its own: a reply wakes
/// the thread blocked in `read` directly, where a Tokio end is woken by `epoll_wait` and
/// then reads. The same client calls as [`Direct`] (made by it: the handshake and the
/// consume are done before the socket is taken over), the same framing.
struct Blocking {
    s: std::net::TcpStream,
    f: Framing,
    /// What one read takes at most.
    scratch: Box<[u8]>,
    /// The read timeout set on `s`.
    timeout: Option<Duration>,
}

impl Blocking {
    /// Takes `d`'s socket over (out of the Tokio runtime), reads timing out after `timeout`.
    fn new(d: Direct, timeout: Duration) -> anyhow::Result<Blocking> {
        let s = d.rd.reunite(d.wr)?.into_std()?;
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(timeout))?;
        Ok(Blocking {
            s,
            f: d.f,
            scratch: vec![0; 64 << 10].into_boxed_slice(),
            timeout: Some(timeout),
        })
    }

    /// Sets the read timeout (a system call only when it changes).
    fn set_timeout(&mut self, t: Duration) -> std::io::Result<()> {
        if self.timeout != Some(t) {
            self.s.set_read_timeout(Some(t))?;
            self.timeout = Some(t);
        }
        Ok(())
    }

    /// Sends what `out` holds.
    fn send(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        (&self.s).write_all(&self.f.out)?;
        self.f.out.clear();
        Ok(())
    }

    /// Reads more: `Ok(false)` when the read timed out; an error at the end of the stream.
    fn fill(&mut self) -> anyhow::Result<bool> {
        use std::io::{ErrorKind, Read};
        match (&self.s).read(&mut self.scratch) {
            Ok(0) => bail!("amqp: connection closed by the server"),
            Ok(n) => {
                self.f.buf.extend_from_slice(&self.scratch[..n]);
                Ok(true)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// Closes the connection (connection.close, then up to a second for its answer).
    fn close(mut self) {
        self.f.close();
        let _ = (|| -> anyhow::Result<()> {
            self.set_timeout(Duration::from_secs(1))?;
            self.send()?;
            while !self.f.close_ok()? {
                if !self.fill()? {
                    return Ok(());
                }
            }
            Ok(())
        })();
    }
}

/// `m`, or an error when it is the server closing the channel or the connection.
fn closed(m: Method) -> anyhow::Result<Method> {
    match m {
        Method::ChannelClose {
            reply_code,
            reply_text,
            ..
        }
        | Method::ConnectionClose {
            reply_code,
            reply_text,
            ..
        } => bail!("amqp: closed by the server: {reply_code} {reply_text}"),
        m => Ok(m),
    }
}

/// The RPC server: consumes `queue` (no-ack) and publishes each answer to the request's
/// reply-to through the default exchange, with its correlation id. One task (or, with
/// `blocking`, one thread on a blocking socket) reads the requests and answers every
/// request of a read with one write.
pub(crate) struct RpcServer(ServerEnd);

enum ServerEnd {
    Task(
        tokio::task::JoinHandle<()>,
        Option<tokio::sync::oneshot::Sender<()>>,
    ),
    Thread(
        std::thread::JoinHandle<()>,
        Arc<std::sync::atomic::AtomicBool>,
    ),
}

/// How long a blocking server's read waits before it looks whether it is to stop.
const SERVER_POLL: Duration = Duration::from_millis(50);

impl RpcServer {
    pub(crate) async fn start(
        target: &Target,
        queue: &str,
        handler: fn(&[u8]) -> Bytes,
        blocking: bool,
    ) -> anyhow::Result<RpcServer> {
        let mut d = Direct::connect(target).await?;
        let q = match d
            .call(Method::QueueDeclare {
                ticket: 0,
                queue: ShortStr::lit(queue),
                passive: false,
                durable: false,
                exclusive: true,
                auto_delete: true,
                no_wait: false,
                arguments: FieldTable::default(),
            })
            .await?
        {
            Method::QueueDeclareOk { queue, .. } => queue,
            m => bail!("expected queue.declare-ok, got {}", m.name()),
        };
        d.consume(q).await?;
        if blocking {
            let mut b = Blocking::new(d, SERVER_POLL)?;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stopped = stop.clone();
            let thread = std::thread::Builder::new()
                .name("amqp-rpc-server".into())
                .spawn(move || {
                    let served = (|| -> anyhow::Result<()> {
                        loop {
                            b.f.answer_all(handler)?;
                            if !b.f.out.is_empty() {
                                b.send()?;
                            }
                            if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                                return Ok(());
                            }
                            b.fill()?;
                        }
                    })();
                    if served.is_ok() {
                        b.close();
                    }
                })?;
            return Ok(RpcServer(ServerEnd::Thread(thread, stop)));
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let served = async {
                loop {
                    d.f.answer_all(handler)?;
                    if !d.f.out.is_empty() {
                        d.send().await?;
                    }
                    tokio::select! {
                        r = d.fill() => r?,
                        _ = &mut stopped => return anyhow::Ok(()),
                    }
                }
            };
            if served.await.is_ok() {
                d.close().await;
            }
        });
        Ok(RpcServer(ServerEnd::Task(task, Some(stop))))
    }

    pub(crate) async fn close(self) {
        match self.0 {
            ServerEnd::Task(mut task, mut stop) => {
                if let Some(s) = stop.take() {
                    let _ = s.send(());
                }
                if tokio::time::timeout(Duration::from_secs(2), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
            ServerEnd::Thread(thread, stop) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                // It looks every SERVER_POLL and closes within a second.
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
        }
    }
}

/// An RPC caller: consumes `amq.rabbitmq.reply-to` (no-ack) and publishes each request to
/// the server's queue with reply-to set to it, then reads until the answer is in.
pub(crate) struct RpcCaller {
    d: Direct,
    queue: ShortStr,
}

impl RpcCaller {
    pub(crate) async fn connect(target: &Target, queue: &str) -> anyhow::Result<RpcCaller> {
        let mut d = Direct::connect(target).await?;
        d.consume(ShortStr::lit(REPLY_TO)).await?;
        Ok(RpcCaller {
            d,
            queue: ShortStr::lit(queue),
        })
    }

    pub(crate) async fn call(&mut self, req: &[u8]) -> anyhow::Result<Bytes> {
        let d = &mut self.d;
        d.f.request(&self.queue, req);
        d.send().await?;
        loop {
            if let Some(r) = d.f.take()? {
                return Ok(r.body);
            }
            d.fill().await?;
        }
    }

    pub(crate) async fn close(self) {
        self.d.close().await;
    }
}

/// [`RpcCaller`] on a blocking socket (`io=blocking`): its calls block the calling thread.
pub(crate) struct BlockingCaller {
    b: Blocking,
    queue: ShortStr,
}

impl BlockingCaller {
    pub(crate) async fn connect(target: &Target, queue: &str) -> anyhow::Result<BlockingCaller> {
        let RpcCaller { d, queue } = RpcCaller::connect(target, queue).await?;
        Ok(BlockingCaller {
            b: Blocking::new(d, Duration::from_secs(10))?,
            queue,
        })
    }

    /// One call: an error when no answer came within `timeout`.
    pub(crate) fn call(&mut self, req: &[u8], timeout: Duration) -> anyhow::Result<Bytes> {
        let b = &mut self.b;
        b.set_timeout(timeout)?;
        b.f.request(&self.queue, req);
        b.send()?;
        loop {
            if let Some(r) = b.f.take()? {
                return Ok(r.body);
            }
            if !b.fill()? {
                bail!("amqp: no answer within {timeout:?}");
            }
        }
    }

    pub(crate) fn close(self) {
        self.b.close();
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    use super::*;
    use crate::driver::amqpc::wire::frame;

    /// Reads until `dec` yields a method.
    fn method(s: &mut TcpStream, buf: &mut BytesMut, dec: &FrameDecoder) -> Method {
        loop {
            if let Some(Frame::Method(_, m)) = dec.decode(buf).unwrap() {
                return m;
            }
            let mut chunk = [0u8; 4096];
            let n = s.read(&mut chunk).unwrap();
            assert!(n > 0, "the client closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn send(s: &mut TcpStream, channel: u16, m: Method) {
        s.write_all(&frame(m, channel)).unwrap();
    }

    /// A server that does the client's handshake and consume, then `then` with its socket.
    fn server(then: fn(&mut TcpStream)) -> Target {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut header = [0u8; 8];
            s.read_exact(&mut header).unwrap();
            let (mut buf, dec) = (BytesMut::new(), FrameDecoder::new(FRAME_MAX));
            let start = Method::ConnectionStart {
                version_major: 0,
                version_minor: 9,
                server_properties: FieldTable::default(),
                mechanisms: Bytes::from_static(b"PLAIN"),
                locales: Bytes::from_static(b"en_US"),
            };
            send(&mut s, 0, start);
            method(&mut s, &mut buf, &dec); // start-ok
            let tune = Method::ConnectionTune {
                channel_max: 8,
                frame_max: FRAME_MAX,
                heartbeat: 0,
            };
            send(&mut s, 0, tune);
            for _ in 0..3 {
                method(&mut s, &mut buf, &dec); // tune-ok, open, channel.open
            }
            let hosts = ShortStr::lit("");
            send(&mut s, 0, Method::ConnectionOpenOk { known_hosts: hosts });
            let id = Bytes::new();
            send(&mut s, CHANNEL, Method::ChannelOpenOk { channel_id: id });
            method(&mut s, &mut buf, &dec); // basic.consume
            let tag = ShortStr::lit("c");
            send(
                &mut s,
                CHANNEL,
                Method::BasicConsumeOk { consumer_tag: tag },
            );
            then(&mut s);
        });
        Target::parse(&format!(
            "amqp://127.0.0.1:{port}?client=hayate&io=blocking"
        ))
        .unwrap()
    }

    /// The error of one call through a blocking caller, and how long it took.
    fn call_against(then: fn(&mut TcpStream)) -> (String, Duration) {
        let target = server(then);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut c = rt.block_on(BlockingCaller::connect(&target, "q")).unwrap();
        let t = Instant::now();
        let e = c.call(b"1", Duration::from_millis(300)).unwrap_err();
        (format!("{e:#}"), t.elapsed())
    }

    #[test]
    fn a_blocking_caller_gives_up_on_a_server_that_never_answers() {
        let (e, took) = call_against(|s| {
            // Reads the request, answers nothing, keeps the connection open a while.
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            std::thread::sleep(Duration::from_secs(3));
        });
        assert!(e.contains("no answer within"), "{e}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_blocking_caller_refuses_garbage_and_a_close() {
        let (e, _) = call_against(|s| {
            // A frame type that does not exist, with an absurd length.
            s.write_all(&[9, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xce])
                .unwrap();
            std::thread::sleep(Duration::from_secs(1));
        });
        assert!(e.contains("exceeds the maximum"), "{e}");
        let (e, took) = call_against(|s| {
            let reply_text = ShortStr::lit("NOT_FOUND - no queue 'q'");
            let close = Method::ChannelClose {
                reply_code: 404,
                reply_text,
                class_id: 60,
                method_id: 40,
            };
            send(s, CHANNEL, close);
            std::thread::sleep(Duration::from_secs(1));
        });
        assert!(e.contains("404"), "{e}");
        assert!(took < Duration::from_millis(300), "{took:?}");
        let (e, _) = call_against(|s| {
            let _ = s.shutdown(std::net::Shutdown::Both);
        });
        assert!(e.contains("closed by the server"), "{e}");
    }
}
