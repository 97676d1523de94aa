//! Tests of the WebSocket transport: the upgrade, both directions against a real client
//! (tungstenite), hostile frames, header parsing and unmasking, back-pressure.

use super::frame::{op, unmask};
use super::*;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hayate_io::transport::write_all;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::{StatusCode, header};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

type Client = WebSocketStream<TcpStream>;
type ClientResponse = tokio_tungstenite::tungstenite::handshake::client::Response;
type Accepted = tokio::task::JoinHandle<io::Result<(Reader, Writer)>>;

const T: Duration = Duration::from_secs(10);

/// A listener that accepts one connection through [`accept`].
async fn server(max_message: usize) -> (std::net::SocketAddr, Accepted) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (stream, _) = listener.accept().await?;
        let (r, w) = hayate_io::transport::tcp(stream);
        accept(r, w, "mqtt", max_message, HANDSHAKE_TIMEOUT).await
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
fn echo((mut r, w): (Reader, Writer)) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut n = 0;
        let mut buf = BytesMut::with_capacity(64 * 1024);
        loop {
            buf.clear();
            let k = r.read_buf(&mut buf).await.unwrap();
            if k == 0 {
                break;
            }
            n += k;
            write_all(&*w, buf.split().freeze()).await.unwrap();
        }
        w.shutdown();
        n
    })
}

/// Receives binary messages until `n` bytes have arrived.
async fn receive(client: &mut Client, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(T, client.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => {
                assert!(b.len() <= MAX_OUT_FRAME, "message of {} bytes", b.len());
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
    match tokio::time::timeout(T, client.next()).await.unwrap() {
        None | Some(Err(_)) => {}
        other => panic!("unexpected {other:?}"),
    }
    frame
}

async fn read_to_end(r: &mut Reader) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(T, r.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    got
}

#[tokio::test]
async fn round_trip() {
    let (addr, accepted) = server(4 << 20).await;
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

    // 3 MiB in one message: unmasked right across frame and read boundaries, and back.
    let big: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i * 7 % 251) as u8).collect();
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
    let e = accepted.await.unwrap().err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn not_an_upgrade_is_refused() {
    let (addr, accepted) = server(1 << 20).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(T, tcp.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(accepted.await.unwrap().is_err());
    // An endless request line is cut off at 8 KiB.
    let (addr, accepted) = server(1 << 20).await;
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let _ = tcp.write_all(&vec![b'a'; 9000]).await;
    let e = accepted.await.unwrap().err().unwrap();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
}

#[tokio::test]
async fn client_close_gives_broker_eof() {
    let (addr, accepted) = server(1 << 20).await;
    let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
    let (mut r, w) = accepted.await.unwrap().unwrap();
    client.send(Message::binary(&b"bye"[..])).await.unwrap();
    client.close(None).await.unwrap();
    assert_eq!(read_to_end(&mut r).await, b"bye");
    drop((r, w));
    // The client gets the server's closing reply, then the end of the connection.
    let f = expect_close(&mut client).await;
    assert!(
        f.as_ref().is_none_or(|f| f.code == CloseCode::Normal),
        "{f:?}"
    );
}

#[tokio::test]
async fn broker_shutdown_closes_client() {
    let (addr, accepted) = server(1 << 20).await;
    let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
    let (r, w) = accepted.await.unwrap().unwrap();
    write_all(&*w, Bytes::from_static(b"\x20\x02\x00\x00"))
        .await
        .unwrap();
    w.shutdown();
    drop((r, w));
    assert_eq!(receive(&mut client, 4).await, b"\x20\x02\x00\x00");
    let frame = expect_close(&mut client).await.unwrap();
    assert_eq!(frame.code, CloseCode::Normal);
}

#[tokio::test]
async fn oversized_message_closes() {
    let (addr, accepted) = server(1024).await;
    let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
    let (mut r, _w) = accepted.await.unwrap().unwrap();
    client.send(Message::binary(vec![1u8; 1024])).await.unwrap();
    client.send(Message::binary(vec![2u8; 1025])).await.unwrap();
    assert_eq!(read_to_end(&mut r).await, vec![1u8; 1024]);
    let frame = tokio::time::timeout(T, async {
        loop {
            match client.next().await {
                Some(Ok(Message::Close(f))) => break f,
                Some(Ok(_)) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(frame.code, CloseCode::Size);
}

/// Raw frames a conforming client never sends: each is a protocol error (close 1002)
/// and the end of the broker's stream, after the data before it.
#[tokio::test]
async fn hostile_frames_close_with_a_protocol_error() {
    let mask = [1u8, 2, 3, 4];
    let masked = |b0: u8, payload: &[u8]| {
        let mut f = vec![b0, 0x80 | payload.len() as u8];
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("unmasked", vec![0x82, 0x01, b'x']),
        ("reserved bit", masked(0xC2, b"x")),
        ("unknown opcode", masked(0x83, b"x")),
        ("fragmented ping", masked(0x09, b"x")),
        ("continuation first", masked(0x80, b"x")),
        ("long ping", {
            let mut f = vec![0x89, 0x80 | 126, 0, 200];
            f.extend_from_slice(&mask);
            f.extend(std::iter::repeat_n(0u8, 200));
            f
        }),
    ];
    for (what, bad) in cases {
        let (addr, accepted) = server(1 << 20).await;
        let (client, _) = connect(addr, Some("mqtt")).await.unwrap();
        let (mut r, _w) = accepted.await.unwrap().unwrap();
        let mut tcp = client.into_inner();
        let mut bytes = masked(0x82, b"ok");
        bytes.extend_from_slice(&bad);
        tcp.write_all(&bytes).await.unwrap();
        assert_eq!(read_to_end(&mut r).await, b"ok", "{what}");
        // The close frame: 0x88, length 2, code 1002.
        let mut answer = [0u8; 4];
        tokio::time::timeout(T, tcp.read_exact(&mut answer))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer, [0x88, 2, 0x03, 0xEA], "{what}");
    }
}

/// A client header as a conforming client writes it.
fn client_header(fin: bool, opcode: u8, len: u64, mask: [u8; 4]) -> Vec<u8> {
    let mut h = vec![u8::from(fin) << 7 | opcode];
    if len < 126 {
        h.push(0x80 | len as u8);
    } else if len <= 0xFFFF {
        h.push(0x80 | 126);
        h.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        h.push(0x80 | 127);
        h.extend_from_slice(&len.to_be_bytes());
    }
    h.extend_from_slice(&mask);
    h
}

proptest::proptest! {
    /// The word-wise unmasking equals the definition, at any offset and length.
    #[test]
    fn unmask_matches_the_definition(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100), mask: [u8; 4], offset in 0usize..8) {
        let mut fast = data.clone();
        unmask(&mut fast, mask, offset);
        let slow: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ mask[(offset + i) % 4]).collect();
        proptest::prop_assert_eq!(fast, slow);
    }

    /// Whatever the bytes: no panic, and an accepted header fits in them and obeys the
    /// rules a client frame must.
    #[test]
    fn parse_header_never_panics(raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20), in_message: bool) {
        if let Ok(Some(h)) = parse_header(&raw, in_message) {
            proptest::prop_assert!(h.header_len <= raw.len());
            proptest::prop_assert!(raw[1] & 0x80 != 0 && raw[0] & 0x70 == 0);
            if h.opcode >= op::CLOSE {
                proptest::prop_assert!(h.fin && h.len <= 125);
            }
        }
    }

    /// Every header a conforming client writes parses back to its fields, and each
    /// proper prefix of it asks for more.
    #[test]
    fn client_headers_round_trip(fin: bool, data in 0u8..3, len in 0u64..(1 << 40), mask: [u8; 4]) {
        let opcode = [op::CONTINUATION, op::TEXT, op::BINARY][usize::from(data)];
        let in_message = opcode == op::CONTINUATION;
        let raw = client_header(fin, opcode, len, mask);
        for k in 0..raw.len() {
            proptest::prop_assert_eq!(parse_header(&raw[..k], in_message), Ok(None));
        }
        let h = parse_header(&raw, in_message).unwrap().unwrap();
        proptest::prop_assert_eq!(h, Header { fin, opcode, len, mask, header_len: raw.len() });
    }
}

/// Neither direction buffers without bound: with nobody reading, writers stall.
#[tokio::test]
async fn back_pressure() {
    const LIMIT: usize = 32 << 20;
    const CHUNK: usize = 64 * 1024;
    let stalls = |sent: usize| assert!(sent < LIMIT, "{sent} bytes taken without a reader");
    let (addr, accepted) = server(1 << 20).await;
    let (mut client, _) = connect(addr, Some("mqtt")).await.unwrap();
    let (_r, w) = accepted.await.unwrap().unwrap();
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
        tokio::time::timeout(Duration::from_millis(300), write_all(&*w, chunk.clone())).await
    {
        r.unwrap();
        sent += CHUNK;
        stalls(sent);
    }
}

/// A client that sends PINGs and does not read gets PONGs only as far as the sockets and
/// [`writer::MAX_PONGS`] hold; the others are not queued (before: one queued per PING, with
/// no bound, so a PING flood grew the broker as fast as it was sent).
#[tokio::test]
async fn pongs_to_a_client_that_does_not_read_are_bounded() {
    use tokio::io::AsyncReadExt;
    const PINGS: usize = 200_000;
    let (addr, accepted) = server(1 << 20).await;
    let (client, _) = connect(addr, Some("mqtt")).await.unwrap();
    let (mut r, w) = accepted.await.unwrap().unwrap();
    let reader = tokio::spawn(async move { read_to_end(&mut r).await });
    let mut tcp = client.into_inner();
    // A masked PING of 125 zero bytes: its payload on the wire is the mask repeated.
    let mask = [9u8, 8, 7, 6];
    let mut ping = vec![0x89, 0x80 | 125];
    ping.extend_from_slice(&mask);
    ping.extend((0..125).map(|i| mask[i % 4]));
    let burst = ping.repeat(1000);
    for _ in 0..PINGS / 1000 {
        tokio::time::timeout(T, tcp.write_all(&burst))
            .await
            .unwrap()
            .unwrap();
    }
    // Let the PINGs be read, then drain: the writer pushes out what it queued once the
    // socket takes it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let flushed = tokio::spawn(async move {
        std::future::poll_fn(|cx| w.poll_write_ready(cx))
            .await
            .unwrap();
        w
    });
    let mut got = 0usize;
    let mut b = vec![0u8; 256 * 1024];
    loop {
        let idle = if flushed.is_finished() { 300 } else { 5000 };
        match tokio::time::timeout(Duration::from_millis(idle), tcp.read(&mut b)).await {
            Ok(Ok(n)) if n > 0 => got += n,
            Ok(r) => panic!("the connection ended: {r:?}"),
            Err(_) if flushed.is_finished() => break,
            Err(_) => panic!("the writer did not drain"),
        }
    }
    reader.abort();
    let pong = 2 + 125;
    assert_eq!(got % pong, 0, "whole PONGs");
    let pongs = got / pong;
    assert!(pongs < PINGS / 2, "{pongs} PONGs queued for {PINGS} PINGs");
}
