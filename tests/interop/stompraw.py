"""A small raw-socket STOMP 1.0/1.1/1.2 codec for the tests no well-behaved client can do:
malformed frames, exact heart-beat timing, frames split or glued together at will.

`frame()` encodes (with or without 1.2 header escaping, any content-length, with or without the
NUL); `RawStomp` reads frames and heart-beat EOLs off a socket with short timeouts and tells
when the server closed the connection.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

WAIT = 5.0

_ESCAPE = {"\\": "\\\\", "\r": "\\r", "\n": "\\n", ":": "\\c"}
_UNESCAPE = {"\\": "\\", "r": "\r", "n": "\n", "c": ":"}


def escape(s: str) -> str:
    return "".join(_ESCAPE.get(ch, ch) for ch in s)


def unescape(s: str) -> str:
    out, i = [], 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] in _UNESCAPE:
            out.append(_UNESCAPE[s[i + 1]])
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def frame(command: str, headers=None, body: bytes | str = b"", *, content_length: bool | int = None,
          escaped: bool = True, nul: bool = True, eol: bytes = b"\n") -> bytes:
    """Encode a frame. `headers`: a dict or a list of (name, value) pairs (repeats allowed).
    `content_length`: None = add one when the body is not empty, True = always, False = never,
    an int = that value whatever the body is. `escaped`: apply 1.1/1.2 header escaping (never
    for CONNECT/STOMP, as the spec says). `nul=False` leaves the terminating NUL out."""
    if isinstance(body, str):
        body = body.encode()
    items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    names = {k.lower() for k, _ in items}
    if "content-length" not in names:
        if content_length is True or (content_length is None and body):
            items.append(("content-length", str(len(body))))
        elif isinstance(content_length, int) and not isinstance(content_length, bool):
            items.append(("content-length", str(content_length)))
    esc = escaped and command not in ("CONNECT", "STOMP")
    out = command.encode() + eol
    for k, v in items:
        k, v = str(k), str(v)
        if esc:
            k, v = escape(k), escape(v)
        out += f"{k}:{v}".encode() + eol
    out += eol + body
    if nul:
        out += b"\x00"
    return out


@dataclass
class Frame:
    command: str
    headers: dict                       # first occurrence wins (STOMP 1.2 "Repeated Header Entries")
    body: bytes
    header_list: list = field(default_factory=list)
    raw_headers: list = field(default_factory=list)   # undecoded header lines
    at: float = field(default_factory=time.monotonic)

    def get(self, name, default=None):
        return self.headers.get(name, default)

    def __repr__(self):
        body = self.body if len(self.body) <= 80 else self.body[:80] + b"..."
        return f"Frame({self.command} {self.headers} {body!r})"


class Closed(Exception):
    """The server closed the connection."""


class RawStomp:
    """One TCP connection to a STOMP server, read with timeouts."""

    def __init__(self, host: str, port: int, timeout: float = WAIT):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.closed = False
        self.version = "1.0"          # what the server said in CONNECTED (header decoding depends on it)
        self.heartbeats: list[float] = []   # monotonic times of EOLs received between frames
        self.pending: list[Frame] = []      # frames read by is_open(), returned by read_frame() first

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, command: str, headers=None, body: bytes | str = b"", **kw) -> None:
        self.send(frame(command, headers, body, **kw))

    # -- reading --------------------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        if self.closed:
            raise Closed()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no data from the server in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except socket.timeout:
            raise TimeoutError("no data from the server in time") from None
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            raise Closed()
        self.buf += data

    def _skip_eols(self) -> None:
        while True:
            if self.buf.startswith(b"\r\n"):
                self.buf = self.buf[2:]
            elif self.buf.startswith(b"\n"):
                self.buf = self.buf[1:]
            else:
                return
            self.heartbeats.append(time.monotonic())

    def read_frame(self, timeout: float = WAIT) -> Frame:
        """The next frame (heart-beat EOLs are recorded in `heartbeats` and skipped). Raises
        `Closed` if the server closes first, `TimeoutError` if nothing complete comes in time."""
        if self.pending:
            return self.pending.pop(0)
        return self._read_wire(timeout)

    def _read_wire(self, timeout: float) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            self._skip_eols()
            if self.buf:
                end = self._header_end()
                if end is not None:
                    head, body_start = end
                    f = self._try_body(head, body_start)
                    if f is not None:
                        # EOLs that came with the frame (in the same read) end it; they are
                        # not heart-beats.
                        self.buf = self.buf.lstrip(b"\r\n")
                        return f
            self._fill(deadline)

    def _header_end(self):
        i = self.buf.find(b"\n\n")
        j = self.buf.find(b"\r\n\r\n")
        k = self.buf.find(b"\n\r\n")
        cands = [(x, n) for x, n in ((i, 2), (j, 4), (k, 3)) if x >= 0]
        if not cands:
            return None
        x, n = min(cands)
        return self.buf[:x], x + n

    def _try_body(self, head: bytes, body_start: int):
        lines = head.replace(b"\r\n", b"\n").split(b"\n")
        command = lines[0].decode(errors="replace")
        decode = command != "CONNECTED" and self.version != "1.0"
        headers, hlist, raw = {}, [], []
        for line in lines[1:]:
            raw.append(line)
            text = line.decode(errors="replace")
            k, _, v = text.partition(":")
            if decode:
                k, v = unescape(k), unescape(v)
            hlist.append((k, v))
            headers.setdefault(k, v)
        if "content-length" in headers:
            n = int(headers["content-length"])
            if len(self.buf) < body_start + n + 1:
                return None
            body = self.buf[body_start:body_start + n]
            if self.buf[body_start + n:body_start + n + 1] != b"\x00":
                raise AssertionError(f"{command}: no NUL after content-length {n} bytes")
            self.buf = self.buf[body_start + n + 1:]
        else:
            nul = self.buf.find(b"\x00", body_start)
            if nul < 0:
                return None
            body = self.buf[body_start:nul]
            self.buf = self.buf[nul + 1:]
        f = Frame(command, headers, body, hlist, raw)
        if command == "CONNECTED":
            self.version = headers.get("version", "1.0")
        return f

    def expect(self, command: str, timeout: float = WAIT) -> Frame:
        f = self.read_frame(timeout)
        assert f.command == command, f"expected {command}, got {f}"
        return f

    def wait_closed(self, timeout: float = WAIT) -> list[Frame]:
        """Read frames until the server closes the connection; fails if it has not within
        `timeout`. Returns the frames received meanwhile."""
        got, deadline = [], time.monotonic() + timeout
        while True:
            try:
                got.append(self.read_frame(max(0.0, deadline - time.monotonic())))
            except Closed:
                return got
            except TimeoutError:
                raise AssertionError(f"the server did not close the connection within {timeout}s; "
                                     f"frames: {got}") from None

    def drain(self, timeout: float = WAIT) -> tuple[list[Frame], bool]:
        """Read frames for up to `timeout` seconds or until the server closes the connection:
        (the frames, whether it closed)."""
        got, deadline = [], time.monotonic() + timeout
        while True:
            try:
                got.append(self.read_frame(max(0.0, deadline - time.monotonic())))
            except Closed:
                return got, True
            except TimeoutError:
                return got, False

    def wait_eof(self, timeout: float) -> float:
        """Wait for the close, reading (and dropping) frames and recording heart-beat EOLs;
        returns when it happened (monotonic)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.read_frame(max(0.0, deadline - time.monotonic()))
            except Closed:
                return time.monotonic()
            except TimeoutError:
                raise AssertionError(f"the server did not close the connection within {timeout}s") from None

    def is_open(self, wait: float = 0.2) -> bool:
        """True if the server has not closed the connection within `wait` seconds. Frames that
        come meanwhile are kept for read_frame(), heart-beats recorded."""
        if self.closed:
            return False
        deadline = time.monotonic() + wait
        while True:
            try:
                f = self._read_wire(max(0.0, deadline - time.monotonic()))
            except Closed:
                return False
            except TimeoutError:
                return True
            self.pending.append(f)

    # -- conveniences ---------------------------------------------------------------------
    def connect(self, version: str | None = "1.2", login: str | None = None, passcode: str | None = None,
                host: str | None = "/", heart_beat: str | None = None, command: str = "CONNECT",
                extra=None, timeout: float = WAIT) -> Frame:
        """Send CONNECT (or STOMP) and return the server's answer (CONNECTED or ERROR)."""
        h = []
        if version is not None:
            h.append(("accept-version", version))
        if host is not None:
            h.append(("host", host))
        if login is not None:
            h.append(("login", login))
        if passcode is not None:
            h.append(("passcode", passcode))
        if heart_beat is not None:
            h.append(("heart-beat", heart_beat))
        h += list(extra or [])
        self.send_frame(command, h)
        return self.read_frame(timeout)
