"""A tiny raw MQTT 3.1.1 / 5.0 codec over a plain socket, for the tests that must send what a
well-behaved client library never would (garbage, wildcards in a PUBLISH topic, a second
CONNECT, reserved flags, a CONNECT with an empty client id and clean session 0 ...) or must see
the exact bytes the broker answers with (CONNACK return codes, DISCONNECT reason codes).

Only what the tests need is implemented. Properties are decoded into a dict keyed by the
property identifier; user properties (0x26) and subscription identifiers (0x0B) into lists.
"""

from __future__ import annotations

import socket
import struct
import time

# Packet types (upper nibble of the first byte).
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT, AUTH = (
    8, 9, 10, 11, 12, 13, 14, 15)

# Property identifiers (MQTT 5.0 section 2.2.2.2) and their wire types.
PROP_TYPES = {
    0x01: "byte",      # payload format indicator
    0x02: "u32",       # message expiry interval
    0x03: "str",       # content type
    0x08: "str",       # response topic
    0x09: "bin",       # correlation data
    0x0B: "varint",    # subscription identifier
    0x11: "u32",       # session expiry interval
    0x12: "str",       # assigned client identifier
    0x13: "u16",       # server keep alive
    0x15: "str",       # authentication method
    0x16: "bin",       # authentication data
    0x17: "byte",      # request problem information
    0x18: "u32",       # will delay interval
    0x19: "byte",      # request response information
    0x1A: "str",       # response information
    0x1C: "str",       # server reference
    0x1F: "str",       # reason string
    0x21: "u16",       # receive maximum
    0x22: "u16",       # topic alias maximum
    0x23: "u16",       # topic alias
    0x24: "byte",      # maximum qos
    0x25: "byte",      # retain available
    0x26: "pair",      # user property
    0x27: "u32",       # maximum packet size
    0x28: "byte",      # wildcard subscription available
    0x29: "byte",      # subscription identifiers available
    0x2A: "byte",      # shared subscription available
}
REASON_STRING = 0x1F
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
MAXIMUM_PACKET_SIZE = 0x27
TOPIC_ALIAS = 0x23
TOPIC_ALIAS_MAXIMUM = 0x22
SESSION_EXPIRY = 0x11
RECEIVE_MAXIMUM = 0x21


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mqtt_str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(b)) + b


def encode_props(props: dict | None) -> bytes:
    if props is None:
        return b"\x00"
    body = bytearray()
    for pid, value in props.items():
        kind = PROP_TYPES[pid]
        values = value if kind in ("pair",) or (kind == "varint" and isinstance(value, list)) else [value]
        for v in values:
            body += varint(pid)
            if kind == "byte":
                body += bytes([v])
            elif kind == "u16":
                body += struct.pack(">H", v)
            elif kind == "u32":
                body += struct.pack(">I", v)
            elif kind == "varint":
                body += varint(v)
            elif kind in ("str", "bin"):
                body += mqtt_str(v)
            elif kind == "pair":
                body += mqtt_str(v[0]) + mqtt_str(v[1])
    return varint(len(body)) + bytes(body)


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


def connect(client_id: str = "raw", version: int = 4, clean: bool = True, keepalive: int = 60,
            props: dict | None = None, will: tuple | None = None, will_props: dict | None = None,
            username: str | None = None, password: str | None = None) -> bytes:
    """CONNECT for protocol level `version` (4 = 3.1.1, 5 = 5.0). `will` = (topic, payload, qos, retain)."""
    flags = 0x02 if clean else 0
    if will:
        flags |= 0x04 | (will[2] << 3) | (0x20 if will[3] else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = mqtt_str("MQTT") + bytes([version, flags]) + struct.pack(">H", keepalive)
    if version == 5:
        body += encode_props(props)
    body += mqtt_str(client_id)
    if will:
        if version == 5:
            body += encode_props(will_props)
        body += mqtt_str(will[0]) + mqtt_str(will[1])
    if username is not None:
        body += mqtt_str(username)
    if password is not None:
        body += mqtt_str(password)
    return packet(CONNECT << 4, body)


def publish(topic: str | bytes, payload: bytes, qos: int = 0, retain: bool = False, pid: int = 1,
            version: int = 4, props: dict | None = None) -> bytes:
    body = mqtt_str(topic)
    if qos:
        body += struct.pack(">H", pid)
    if version == 5:
        body += encode_props(props)
    body += payload
    return packet((PUBLISH << 4) | (qos << 1) | (1 if retain else 0), body)


def subscribe(topic: str, qos: int = 0, pid: int = 1, version: int = 4, first_byte: int = 0x82,
              props: dict | None = None) -> bytes:
    body = struct.pack(">H", pid)
    if version == 5:
        body += encode_props(props)
    body += mqtt_str(topic) + bytes([qos])
    return packet(first_byte, body)


def disconnect(version: int = 4, reason: int = 0, props: dict | None = None) -> bytes:
    if version == 5 and (reason or props):
        return packet(DISCONNECT << 4, bytes([reason]) + encode_props(props))
    return packet(DISCONNECT << 4, b"")


class Packet:
    def __init__(self, first: int, body: bytes, version: int):
        self.type = first >> 4
        self.flags = first & 0x0F
        self.body = body
        self.version = version
        self.reason: int | None = None
        self.session_present: bool | None = None
        self.props: dict = {}
        self.topic: bytes | None = None
        self.payload: bytes | None = None
        self.pid: int | None = None
        self._parse()

    def _parse(self) -> None:
        b = self.body
        if self.type == CONNACK:
            self.session_present = bool(b[0] & 1)
            self.reason = b[1]
            if self.version == 5 and len(b) > 2:
                self.props, _ = decode_props(b, 2)
        elif self.type == DISCONNECT:
            self.reason = b[0] if b else 0
            if self.version == 5 and len(b) > 1:
                self.props, _ = decode_props(b, 1)
        elif self.type == PUBLISH:
            n = struct.unpack_from(">H", b, 0)[0]
            self.topic = b[2:2 + n]
            i = 2 + n
            if (self.flags >> 1) & 3:
                self.pid = struct.unpack_from(">H", b, i)[0]
                i += 2
            if self.version == 5:
                self.props, i = decode_props(b, i)
            self.payload = b[i:]
        elif self.type in (PUBACK, PUBREC, PUBREL, PUBCOMP, SUBACK, UNSUBACK):
            self.pid = struct.unpack_from(">H", b, 0)[0]
            if self.type == SUBACK:
                i = 2
                if self.version == 5:
                    self.props, i = decode_props(b, 2)
                self.reason = b[i] if len(b) > i else None
            elif len(b) > 2:
                self.reason = b[2]
                if self.version == 5 and len(b) > 3:
                    self.props, _ = decode_props(b, 3)

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    def __repr__(self) -> str:
        return f"Packet(type={self.type}, flags={self.flags:#x}, reason={self.reason}, props={self.props})"


def read_varint(b: bytes, i: int) -> tuple[int, int]:
    n, shift = 0, 0
    for _ in range(4):
        byte = b[i]
        i += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n, i
        shift += 7
    raise ValueError("malformed variable byte integer")


def decode_props(b: bytes, i: int) -> tuple[dict, int]:
    length, i = read_varint(b, i)
    end = i + length
    props: dict = {}
    while i < end:
        pid, i = read_varint(b, i)
        kind = PROP_TYPES[pid]
        if kind == "byte":
            v = b[i]; i += 1
        elif kind == "u16":
            v = struct.unpack_from(">H", b, i)[0]; i += 2
        elif kind == "u32":
            v = struct.unpack_from(">I", b, i)[0]; i += 4
        elif kind == "varint":
            v, i = read_varint(b, i)
        elif kind in ("str", "bin"):
            n = struct.unpack_from(">H", b, i)[0]
            raw = b[i + 2:i + 2 + n]; i += 2 + n
            v = raw.decode("utf-8") if kind == "str" else raw  # raises on invalid UTF-8
        else:  # pair
            n = struct.unpack_from(">H", b, i)[0]
            k = b[i + 2:i + 2 + n].decode(); i += 2 + n
            n = struct.unpack_from(">H", b, i)[0]
            val = b[i + 2:i + 2 + n].decode(); i += 2 + n
            v = (k, val)
        if kind == "pair" or pid == 0x0B:
            props.setdefault(pid, []).append(v)
        else:
            props[pid] = v
    return props, end


class Closed(Exception):
    """The broker closed the connection."""


class RawClient:
    """A blocking socket speaking just enough MQTT; `version` decides how replies are parsed."""

    def __init__(self, host: str, port: int, version: int = 4, timeout: float = 5.0):
        self.version = version
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from broker")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except socket.timeout as e:
            raise TimeoutError("no data from broker") from e
        except (ConnectionResetError, BrokenPipeError) as e:
            raise Closed() from e
        if not chunk:
            raise Closed()
        self.buf += chunk

    def recv_packet(self, timeout: float = 5.0) -> Packet:
        """The next packet; raises Closed if the broker closed first, TimeoutError if silent."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 2:
                n, shift, i = 0, 0, 1
                complete = False
                while i < len(self.buf) and i <= 4:
                    byte = self.buf[i]
                    n |= (byte & 0x7F) << shift
                    shift += 7
                    i += 1
                    if not byte & 0x80:
                        complete = True
                        break
                if complete and len(self.buf) >= i + n:
                    first, body = self.buf[0], self.buf[i:i + n]
                    self.buf = self.buf[i + n:]
                    return Packet(first, body, self.version)
            self._fill(deadline)

    def connect(self, **kw) -> Packet:
        kw.setdefault("version", self.version)
        self.send(connect(**kw))
        return self.recv_packet()

    def wait_closed(self, timeout: float = 5.0) -> list[Packet]:
        """Read until the broker closes the connection; return every packet it sent before.

        Raises TimeoutError if the connection is still open after `timeout` seconds."""
        got: list[Packet] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                got.append(self.recv_packet(max(0.0, deadline - time.monotonic())))
            except Closed:
                return got

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "RawClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
