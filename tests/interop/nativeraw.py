"""A tiny client of Hayate's native protocol (docs/protocol.md) over a plain socket: HELLO,
PUB_CONFIRM with headers, the stream API (request/reply), CONSUME, MSG_ACKED and ACK. Only
what scripts/make-data-fixture and tests/interop/test_migration.py need; no shared memory,
no batches from the client side."""

from __future__ import annotations

import json
import socket
import struct
import time

HELLO, WELCOME, PUB, SUB, UNSUB, MSG = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
MSG_BATCH, PING, PONG, LOST, ERR, CLOSE = 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D
MSG_ACKED, ACK, NACK, PUB_CONFIRM, CONFIRM, CONSUME = 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13

OPT_REPLY_TO, OPT_CORRELATION, OPT_HEADERS = 0x01, 0x02, 0x04
ACKED_REDELIVERED, ACKED_STREAM = 0x80, 0x40
INBOX_SID = 0xFFFF_FFFF


def str16(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def options(reply_to: str | None, headers: list[tuple[str, str | bytes]] | None) -> tuple[int, bytes]:
    flags, out = 0, b""
    if reply_to is not None:
        flags |= OPT_REPLY_TO
        out += str16(reply_to)
    if headers:
        flags |= OPT_HEADERS
        out += struct.pack(">H", len(headers))
        for name, value in headers:
            v = value.encode() if isinstance(value, str) else value
            out += str16(name) + struct.pack(">I", len(v)) + v
    return flags, out


class Delivery:
    """A MSG or MSG_ACKED: `sid`, `key`, `payload`, `headers` (list of (name, bytes)), and for
    MSG_ACKED `delivery`, `redelivered`, and from a stream `offset` and `deliveries`."""

    def __init__(self, sid, key, payload, headers, reply_to=None, delivery=None, redelivered=False,
                 offset=None, deliveries=None):
        self.sid, self.key, self.payload, self.headers = sid, key, payload, headers
        self.reply_to, self.delivery, self.redelivered = reply_to, delivery, redelivered
        self.offset, self.deliveries = offset, deliveries

    def __repr__(self) -> str:
        return (f"Delivery(key={self.key!r}, payload={self.payload!r}, offset={self.offset}, "
                f"deliveries={self.deliveries}, redelivered={self.redelivered}, headers={self.headers})")


def parse_options(b: bytes, i: int, flags: int):
    reply_to, headers = None, []
    if flags & OPT_REPLY_TO:
        n = struct.unpack_from(">H", b, i)[0]
        reply_to, i = b[i + 2:i + 2 + n].decode(), i + 2 + n
    if flags & OPT_CORRELATION:
        n = struct.unpack_from(">H", b, i)[0]
        i += 2 + n
    if flags & OPT_HEADERS:
        count = struct.unpack_from(">H", b, i)[0]
        i += 2
        for _ in range(count):
            n = struct.unpack_from(">H", b, i)[0]
            name, i = b[i + 2:i + 2 + n].decode(), i + 2 + n
            m = struct.unpack_from(">I", b, i)[0]
            headers.append((name, b[i + 4:i + 4 + m]))
            i += 4 + m
    return reply_to, headers, i


class Native:
    """One connection, read with timeouts. Frames not asked for (PING) are answered."""

    def __init__(self, host: str, port: int, name: str = "nativeraw", timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.ids = 0
        body = struct.pack(">IHH", 0x48595431, 1, 0) + str16(name) + struct.pack(">I", 0)
        self.send(HELLO, body)
        t, b = self.frame()
        assert t == WELCOME, f"expected WELCOME, got {t:#x} {b!r}"
        n = struct.unpack_from(">H", b, 18)[0]
        i = 20 + n
        m = struct.unpack_from(">H", b, i)[0]
        self.inbox = b[i + 2:i + 2 + m].decode()
        self.send(SUB, struct.pack(">IB", INBOX_SID, 0) + str16("") + str16(self.inbox + "/**"))

    def send(self, kind: int, body: bytes) -> None:
        self.sock.sendall(struct.pack(">IB", len(body) + 1, kind) + body)

    def frame(self, timeout: float = 10.0) -> tuple[int, bytes]:
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 5:
                n = struct.unpack_from(">I", self.buf, 0)[0]
                if len(self.buf) >= 4 + n:
                    kind, body = self.buf[4], self.buf[5:4 + n]
                    self.buf = self.buf[4 + n:]
                    if kind == PING:
                        self.send(PONG, body)
                        continue
                    if kind == ERR:
                        code = struct.unpack_from(">H", body, 0)[0]
                        raise RuntimeError(f"ERR {code}: {body[4:].decode(errors='replace')}")
                    return kind, body
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the broker")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout as e:
                raise TimeoutError("no frame from the broker") from e
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self.buf += chunk

    def publish(self, key: str, payload: bytes, headers=None) -> tuple[int, int | None, str]:
        """PUB_CONFIRM; returns (status, offset, stream) from the CONFIRM."""
        self.ids += 1
        flags, opts = options(None, headers)
        self.send(PUB_CONFIRM, struct.pack(">QB", self.ids, flags) + str16(key) + opts + payload)
        while True:
            t, b = self.frame()
            if t != CONFIRM:
                continue
            cid, status = struct.unpack_from(">QB", b, 0)
            assert cid == self.ids, (cid, self.ids)
            if status == 0:
                offset = struct.unpack_from(">Q", b, 9)[0]
                n = struct.unpack_from(">H", b, 17)[0]
                return 0, offset, b[19:19 + n].decode()
            return status, None, b[9:].decode(errors="replace")

    def request(self, key: str, body: dict) -> dict:
        """The stream API: a JSON request on `key`, the JSON reply."""
        self.ids += 1
        reply = f"{self.inbox}/{self.ids}"
        flags, opts = options(reply, None)
        self.send(PUB, bytes([flags]) + str16(key) + opts + json.dumps(body).encode())
        while True:
            d = self.next_delivery()
            if d.key == reply:
                return json.loads(d.payload)

    def consume(self, sid: int, stream: str, consumer: str, prefetch: int = 0) -> None:
        """CONSUME a stream's consumer, or with `stream` empty the queue `consumer` (at most
        `prefetch` unacknowledged; 0: the broker's limits.max_unacked)."""
        extra = struct.pack(">I", prefetch) if prefetch else b""
        self.send(CONSUME, struct.pack(">I", sid) + str16(stream) + str16(consumer) + extra)

    def nack(self, delivery: int) -> None:
        self.send(NACK, struct.pack(">Q", delivery))

    def pub(self, key: str, payload: bytes) -> None:
        """A plain PUB (no confirm)."""
        self.send(PUB, bytes([0]) + str16(key) + payload)

    def ack(self, delivery: int, cumulative: bool = False) -> None:
        self.send(ACK, struct.pack(">BQ", 1 if cumulative else 0, delivery))

    def next_delivery(self, timeout: float = 10.0) -> Delivery:
        while True:
            t, b = self.frame(timeout)
            if t == MSG:
                sid, flags = struct.unpack_from(">IB", b, 0)
                n = struct.unpack_from(">H", b, 5)[0]
                key, i = b[7:7 + n].decode(), 7 + n
                reply_to, headers, i = parse_options(b, i, flags)
                return Delivery(sid, key, b[i:], headers, reply_to)
            if t == MSG_ACKED:
                sid, delivery, flags = struct.unpack_from(">IQB", b, 0)
                i, offset, deliveries = 13, None, None
                if flags & ACKED_STREAM:
                    offset, deliveries = struct.unpack_from(">QI", b, i)
                    i += 12
                n = struct.unpack_from(">H", b, i)[0]
                key, i = b[i + 2:i + 2 + n].decode(), i + 2 + n
                reply_to, headers, i = parse_options(b, i, flags & 0x07)
                return Delivery(sid, key, b[i:], headers, reply_to, delivery,
                                bool(flags & ACKED_REDELIVERED), offset, deliveries)

    def deliveries(self, n: int, timeout: float = 10.0) -> list[Delivery]:
        return [self.next_delivery(timeout) for _ in range(n)]

    def quiet(self, timeout: float) -> list[Delivery]:
        """Whatever is delivered within `timeout` seconds."""
        got, deadline = [], time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            try:
                got.append(self.next_delivery(left))
            except TimeoutError:
                return got

    def close(self) -> None:
        try:
            self.send(CLOSE, b"")
        except OSError:
            pass
        self.sock.close()
