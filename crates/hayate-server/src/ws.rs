//! MQTT over WebSocket (`ws://`, subprotocol `mqtt`), as browser clients use it.
//!
//! The MQTT front-end serves a byte stream (a reader and a `WriteHalf`
//! on TCP or a Unix socket), while WebSocket carries that stream as a sequence of messages
//! whose boundaries mean nothing to MQTT. Rather than teach the front-end about frames,
//! [`accept`] performs the HTTP upgrade, creates a Unix socket pair, hands one end to the
//! caller (who serves it exactly like a Unix-socket connection) and spawns a pump task that
//! moves bytes between the WebSocket and the other end:
//!
//! - client → broker: the payload of every binary message (and, leniently, text message) is
//!   written into the pair in order, so a packet split across messages, or several packets
//!   in one message, reach the front-end as the plain stream it expects;
//! - broker → client: whatever the broker has written is read in chunks of up to 64 KiB and
//!   sent as one binary message per chunk (coalescing what is available at once).
//!
//! Each direction awaits its writes, so back-pressure holds both ways and nothing is
//! buffered beyond the socket buffers and one message. A close from either side closes the
//! other: a client close (or a failed WebSocket) shuts down the write side of the pair so
//! the broker reads end of stream; the broker's end of stream sends the client a close frame,
//! waits briefly for its reply and closes the TCP connection. Pings are answered by
//! tungstenite. Messages (and frames) larger than `max_message` close the connection with
//! status 1009.
//!
//! The cost is one extra copy and one extra hop through the kernel per chunk, which is
//! fine for browser clients; the native and MQTT TCP paths do not go through here and do
//! not pay it.

use std::io;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpStream, UnixStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{
    Callback, ErrorResponse, Request, Response,
};
use tokio_tungstenite::tungstenite::http::{HeaderValue, StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Bytes, Error as WsError, Message};

/// How long a client has to complete the HTTP upgrade.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a close frame may take to go out, and the client's reply to ours to come back.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes the broker → client direction puts in one message.
const CHUNK: usize = 64 * 1024;
/// Tungstenite's read buffer (its default of 128 KiB is a lot per idle browser connection).
const READ_BUFFER: usize = 16 * 1024;

/// Accepts a WebSocket connection on `stream` (server side of the HTTP upgrade, any path)
/// and returns the broker's end of a Unix socket pair that carries the connection's bytes;
/// a spawned task pumps between the two until either side closes (see the module docs).
///
/// If the client offers subprotocols, `subprotocol` must be among them (for `mqtt`, the
/// older `mqttv3.1` is accepted too) and the response names the one chosen; otherwise the
/// upgrade is refused with HTTP 400. A client that offers none is accepted without one.
/// Messages larger than `max_message` bytes close the connection. The handshake must finish
/// within 10 seconds.
pub async fn accept(
    stream: TcpStream,
    subprotocol: &'static str,
    max_message: usize,
) -> io::Result<UnixStream> {
    stream.set_nodelay(true)?;
    let config = WebSocketConfig::default()
        .read_buffer_size(READ_BUFFER)
        .max_message_size(Some(max_message))
        .max_frame_size(Some(max_message));
    let callback = Negotiate {
        wanted: subprotocol,
    };
    let handshake = tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config));
    let ws = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(ws)) => ws,
        Ok(Err(WsError::Io(e))) => return Err(e),
        Ok(Err(WsError::Http(r))) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("WebSocket upgrade refused: {}", r.status()),
            ));
        }
        Ok(Err(e)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("WebSocket handshake: {e}"),
            ));
        }
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "WebSocket handshake timed out",
            ));
        }
    };
    let (broker, bridge) = UnixStream::pair()?;
    tokio::spawn(pump(ws, bridge));
    Ok(broker)
}

/// Whether `offered` names `wanted`, or an older name of it.
fn acceptable(offered: &str, wanted: &str) -> bool {
    offered.eq_ignore_ascii_case(wanted)
        || (wanted.eq_ignore_ascii_case("mqtt") && offered.eq_ignore_ascii_case("mqttv3.1"))
}

/// The handshake callback: picks the subprotocol, or refuses the upgrade.
struct Negotiate {
    /// The subprotocol served.
    wanted: &'static str,
}

impl Callback for Negotiate {
    fn on_request(
        self,
        request: &Request,
        mut response: Response,
    ) -> Result<Response, ErrorResponse> {
        let wanted = self.wanted;
        let mut offered_any = false;
        let mut chosen: Option<&str> = None;
        for value in request.headers().get_all(header::SEC_WEBSOCKET_PROTOCOL) {
            let Ok(list) = value.to_str() else {
                offered_any = true;
                continue;
            };
            for p in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                offered_any = true;
                // The exact name wins over an alias, whatever the order of the offer.
                if acceptable(p, wanted) && chosen.is_none_or(|c| !c.eq_ignore_ascii_case(wanted)) {
                    chosen = Some(p);
                }
            }
        }
        match chosen.map(HeaderValue::from_str) {
            // Echo the client's own spelling: browsers fail a response naming anything else.
            Some(Ok(v)) => {
                response
                    .headers_mut()
                    .insert(header::SEC_WEBSOCKET_PROTOCOL, v);
                Ok(response)
            }
            None if !offered_any => Ok(response),
            _ => {
                let body = format!("unsupported WebSocket subprotocol (expected {wanted})\n");
                let mut refusal = ErrorResponse::new(None);
                *refusal.status_mut() = StatusCode::BAD_REQUEST;
                let h = refusal.headers_mut();
                h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
                h.insert(header::CONNECTION, HeaderValue::from_static("close"));
                h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
                *refusal.body_mut() = Some(body);
                Err(refusal)
            }
        }
    }
}

type WsSink = futures::stream::SplitSink<WebSocketStream<TcpStream>, Message>;
type WsSource = futures::stream::SplitStream<WebSocketStream<TcpStream>>;

/// Moves bytes both ways until either side closes, then closes the other.
async fn pump(ws: WebSocketStream<TcpStream>, bridge: UnixStream) {
    let (mut ws_tx, mut ws_rx) = ws.split();
    let (mut from_broker, to_broker) = bridge.into_split();
    let close = {
        let inbound = client_to_broker(&mut ws_rx, to_broker);
        let outbound = broker_to_client(&mut from_broker, &mut ws_tx);
        tokio::pin!(inbound, outbound);
        tokio::select! {
            close = &mut inbound => close,
            () = &mut outbound => {
                // Our close frame is out (or the client is gone): let the client's data up to
                // its closing reply through, but not forever.
                if tokio::time::timeout(CLOSE_TIMEOUT, &mut inbound).await.is_err() {
                    tracing::debug!("ws: no close reply from the client");
                }
                None
            }
        }
        // Dropping `inbound` here shut down the write side of the pair (if it had not already).
    };
    if let Some(frame) = close {
        let send = ws_tx.send(Message::Close(Some(frame)));
        match tokio::time::timeout(CLOSE_TIMEOUT, send).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(e)) => tracing::debug!("ws: sending close: {e}"),
        }
    }
    // Dropping both halves of the WebSocket closes the TCP connection.
}

/// Client → broker: writes each message's payload into the pair. Returns when the client
/// closes or fails, or the broker stops reading; returns the close frame the client should
/// still get, if any. Shuts down the write side of the pair on return.
async fn client_to_broker(ws: &mut WsSource, mut to_broker: OwnedWriteHalf) -> Option<CloseFrame> {
    let close = loop {
        let payload: Bytes = match ws.next().await {
            Some(Ok(Message::Binary(b))) => b,
            Some(Ok(Message::Text(t))) => t.into(),
            // Ping, pong (tungstenite answers pings), or the client's close: after a close,
            // the next poll flushes tungstenite's reply and then ends the stream.
            Some(Ok(_)) => continue,
            None => break None,
            Some(Err(WsError::Capacity(e))) => {
                tracing::debug!("ws: {e}");
                break Some(CloseFrame {
                    code: CloseCode::Size,
                    reason: "message too big".into(),
                });
            }
            Some(Err(e)) => {
                tracing::debug!("ws: {e}");
                break None;
            }
        };
        if let Err(e) = to_broker.write_all(&payload).await {
            tracing::debug!("ws: writing to the broker: {e}");
            break Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            });
        }
    };
    if let Err(e) = to_broker.shutdown().await {
        tracing::debug!("ws: shutdown: {e}");
    }
    close
}

/// Broker → client: sends what the broker writes as binary messages; at the broker's end of
/// stream sends a close frame. Returns then, or when the client is gone.
async fn broker_to_client(from_broker: &mut OwnedReadHalf, ws: &mut WsSink) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from_broker.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                let msg = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
                if let Err(e) = ws.send(msg).await {
                    tracing::debug!("ws: sending: {e}");
                    return;
                }
            }
            Err(e) => {
                tracing::debug!("ws: reading from the broker: {e}");
                break;
            }
        }
    }
    let close = Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }));
    if let Err(e) = ws.send(close).await {
        tracing::debug!("ws: sending close: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    type Client = WebSocketStream<TcpStream>;
    type ClientResponse = tokio_tungstenite::tungstenite::handshake::client::Response;
    type Accepted = tokio::task::JoinHandle<io::Result<UnixStream>>;

    const T: Duration = Duration::from_secs(10);

    /// A listener that accepts one connection through [`accept`].
    async fn server(max_message: usize) -> (std::net::SocketAddr, Accepted) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (stream, _) = listener.accept().await?;
            accept(stream, "mqtt", max_message).await
        });
        (addr, task)
    }

    async fn connect(
        addr: std::net::SocketAddr,
        protocols: Option<&str>,
    ) -> Result<(Client, ClientResponse), WsError> {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}/mqtt").into_client_request().unwrap();
        if let Some(p) = protocols {
            request
                .headers_mut()
                .insert(header::SEC_WEBSOCKET_PROTOCOL, p.parse().unwrap());
        }
        tokio_tungstenite::client_async(request, tcp).await
    }

    fn selected(response: &ClientResponse) -> Option<&str> {
        response
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .map(|v| v.to_str().unwrap())
    }

    /// A broker that echoes everything until end of stream, then closes.
    fn echo(mut broker: UnixStream) -> tokio::task::JoinHandle<usize> {
        tokio::spawn(async move {
            let (mut r, mut w) = broker.split();
            tokio::io::copy(&mut r, &mut w).await.unwrap() as usize
        })
    }

    /// Receives binary messages until `n` bytes have arrived; checks the message size cap.
    async fn receive(client: &mut Client, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < n {
            match tokio::time::timeout(T, client.next()).await.unwrap() {
                Some(Ok(Message::Binary(b))) => {
                    assert!(b.len() <= CHUNK, "message of {} bytes", b.len());
                    got.extend_from_slice(&b);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        got
    }

    /// The next message that is not a data message; then the end of the stream.
    async fn expect_close(client: &mut Client) -> Option<CloseFrame> {
        let frame = loop {
            match tokio::time::timeout(T, client.next()).await.unwrap() {
                Some(Ok(Message::Close(f))) => break f,
                Some(Ok(Message::Binary(_))) => {}
                other => panic!("unexpected {other:?}"),
            }
        };
        // tungstenite's client ends the stream once the server has closed the TCP connection.
        assert!(
            tokio::time::timeout(T, client.next())
                .await
                .unwrap()
                .is_none()
        );
        frame
    }

    #[tokio::test]
    async fn round_trip() {
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, response) = connect(addr, Some("mqtt")).await.unwrap();
        assert_eq!(selected(&response), Some("mqtt"));
        let echoed = echo(accepted.await.unwrap().unwrap());

        client
            .send(Message::binary(&b"\x10\x0c\x00\x04MQTT"[..]))
            .await
            .unwrap();
        assert_eq!(receive(&mut client, 8).await, b"\x10\x0c\x00\x04MQTT");

        // One packet split across three messages, the last also starting the next packet.
        client
            .send(Message::binary(&b"\x30\x05"[..]))
            .await
            .unwrap();
        client
            .send(Message::binary(&b"\x00\x01t"[..]))
            .await
            .unwrap();
        client
            .send(Message::binary(&b"x\xc0\x00"[..]))
            .await
            .unwrap();
        assert_eq!(receive(&mut client, 8).await, b"\x30\x05\x00\x01tx\xc0\x00");

        // Text messages are taken as bytes too.
        client.send(Message::text("abc")).await.unwrap();
        assert_eq!(receive(&mut client, 3).await, b"abc");

        // 200 KiB in one message: comes back in several messages of at most 64 KiB.
        let big: Vec<u8> = (0..200 * 1024).map(|i| (i * 7 % 251) as u8).collect();
        client.send(Message::binary(big.clone())).await.unwrap();
        assert_eq!(receive(&mut client, big.len()).await, big);

        // Pings are answered.
        client
            .send(Message::Ping(Bytes::from_static(b"p")))
            .await
            .unwrap();
        match tokio::time::timeout(T, client.next()).await.unwrap() {
            Some(Ok(Message::Pong(p))) => assert_eq!(&p[..], b"p"),
            other => panic!("unexpected {other:?}"),
        }

        client.close(None).await.unwrap();
        assert_eq!(echoed.await.unwrap(), 8 + 8 + 3 + big.len());
    }

    #[tokio::test]
    async fn subprotocol_selection() {
        for (offer, want) in [
            (None, None),
            (Some("mqtt"), Some("mqtt")),
            (Some("mqttv3.1"), Some("mqttv3.1")),
            (Some("foo, mqttv3.1, mqtt"), Some("mqtt")),
            (Some("MQTT"), Some("MQTT")),
        ] {
            let (addr, accepted) = server(1 << 20).await;
            let (_client, response) = connect(addr, offer).await.unwrap();
            assert_eq!(selected(&response), want, "offer {offer:?}");
            accepted.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn unknown_subprotocol_is_refused() {
        let (addr, accepted) = server(1 << 20).await;
        match connect(addr, Some("foo, bar")).await {
            Err(WsError::Http(r)) => {
                assert_eq!(r.status(), StatusCode::BAD_REQUEST);
                assert!(r.headers().get(header::SEC_WEBSOCKET_PROTOCOL).is_none());
            }
            other => panic!("unexpected {:?}", other.map(|(_, r)| r)),
        }
        let e = accepted.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn client_close_gives_broker_eof() {
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let mut broker = accepted.await.unwrap().unwrap();
        client.send(Message::binary(&b"bye"[..])).await.unwrap();
        client.close(None).await.unwrap();
        let mut got = Vec::new();
        let n = tokio::time::timeout(T, broker.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((n, &got[..]), (3, &b"bye"[..]));
        // The client gets the server's closing reply, then the end of the connection.
        assert_eq!(expect_close(&mut client).await, None);
    }

    #[tokio::test]
    async fn broker_drop_closes_client() {
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let mut broker = accepted.await.unwrap().unwrap();
        broker.write_all(b"\x20\x02\x00\x00").await.unwrap();
        drop(broker);
        assert_eq!(receive(&mut client, 4).await, b"\x20\x02\x00\x00");
        let frame = expect_close(&mut client).await.unwrap();
        assert_eq!(frame.code, CloseCode::Normal);
    }

    #[tokio::test]
    async fn oversized_message_closes() {
        let (addr, accepted) = server(1024).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let mut broker = accepted.await.unwrap().unwrap();
        client.send(Message::binary(vec![1u8; 1024])).await.unwrap();
        client.send(Message::binary(vec![2u8; 1025])).await.unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(T, broker.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![1u8; 1024]);
        let frame = expect_close(&mut client).await.unwrap();
        assert_eq!(frame.code, CloseCode::Size);
    }

    /// Neither direction buffers without bound: with nobody reading, writers stall.
    #[tokio::test]
    async fn back_pressure() {
        const LIMIT: usize = 32 << 20;
        let stalls = |sent: usize| assert!(sent < LIMIT, "{sent} bytes taken without a reader");
        let (addr, accepted) = server(1 << 20).await;
        let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let mut broker = accepted.await.unwrap().unwrap();
        let chunk = Bytes::from(vec![0u8; CHUNK]);
        let mut sent = 0;
        while let Ok(r) = tokio::time::timeout(
            Duration::from_millis(300),
            client.send(Message::Binary(chunk.clone())),
        )
        .await
        {
            r.unwrap();
            sent += CHUNK;
            stalls(sent);
        }
        let mut sent = 0;
        while let Ok(r) =
            tokio::time::timeout(Duration::from_millis(300), broker.write_all(&chunk)).await
        {
            r.unwrap();
            sent += CHUNK;
            stalls(sent);
        }
    }
}
