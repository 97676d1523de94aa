"""A thin synchronous wrapper around stomp.py 9 for the STOMP tests.

Each `StompClient` is one stomp.py connection (1.0, 1.1 or 1.2) whose receiver thread records
every MESSAGE, RECEIPT and ERROR; the test waits on them with short timeouts. Bodies are kept as
bytes (`auto_decode=False`). Operations that must have taken effect before the test goes on
(SUBSCRIBE, UNSUBSCRIBE, and SEND/ACK/... when asked with `sync=True`) carry a `receipt` header
and wait for the RECEIPT: the server sends it once it has processed the frame.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import stomp
from stomp.utils import Frame

WAIT = 5.0  # seconds: the longest any single wait may take

_DEFAULT = object()
_CONNECTIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


def unique(prefix: str = "t") -> str:
    """A destination name unique to this call (letters, digits and `-`: valid for every broker)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class StompClient(stomp.ConnectionListener):
    def __init__(self, server, version: str = "1.2", login=_DEFAULT, passcode=_DEFAULT,
                 heartbeats=(0, 0), vhost: str | None = "/", connect_headers: dict | None = None,
                 heart_beat_receive_scale: float = 2.5):
        self.server = server
        self.version = version
        self.login = server.login if login is _DEFAULT else login
        self.passcode = server.passcode if passcode is _DEFAULT else passcode
        self.connect_headers = dict(connect_headers or {})
        kw = dict(host_and_ports=[(server.host, server.port)], reconnect_attempts_max=1,
                  timeout=WAIT, auto_decode=False)
        if version != "1.0":
            # The 1.2 client sends `host:<connect address>` unless given a vhost; RabbitMQ reads
            # the host as a vhost, so "/" (Hayate accepts any host).
            kw.update(heartbeats=heartbeats, vhost=vhost, heart_beat_receive_scale=heart_beat_receive_scale)
        self.conn = _CONNECTIONS[version](**kw)
        self.conn.set_listener("recorder", self)
        self.lock = threading.Condition()
        self.messages: list[Frame] = []
        self.receipts: list[str] = []
        self.errors: list[Frame] = []
        self.heartbeats_received = 0
        self.connected_frame: Frame | None = None
        self.disconnected = threading.Event()
        self._ids = itertools.count(1)

    # -- listener callbacks (stomp.py's receiver thread) ---------------------------------------
    def on_connected(self, frame):
        with self.lock:
            self.connected_frame = frame
            self.lock.notify_all()

    def on_message(self, frame):
        with self.lock:
            self.messages.append(frame)
            self.lock.notify_all()

    def on_receipt(self, frame):
        with self.lock:
            self.receipts.append(frame.headers.get("receipt-id"))
            self.lock.notify_all()

    def on_error(self, frame):
        with self.lock:
            self.errors.append(frame)
            self.lock.notify_all()

    def on_heartbeat(self):
        with self.lock:
            self.heartbeats_received += 1

    def on_disconnected(self):
        with self.lock:
            self.disconnected.set()
            self.lock.notify_all()

    # -- connection ------------------------------------------------------------------------
    def connect(self, timeout: float = WAIT, expect_ok: bool = True, headers: dict | None = None):
        """CONNECT (1.0) or STOMP (1.1, 1.2: stomp.py's choice); returns the CONNECTED frame, or
        None if the server answered ERROR or closed (then `expect_ok=True` fails)."""
        h = dict(self.connect_headers)
        h.update(headers or {})
        self.conn.connect(self.login, self.passcode, wait=False, headers=h)
        with self.lock:
            self.lock.wait_for(lambda: self.connected_frame or self.errors or self.disconnected.is_set(),
                               timeout)
            frame = self.connected_frame
        if expect_ok:
            assert frame is not None, f"no CONNECTED within {timeout}s: errors {self.errors}"
        return frame

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def _receipted(self, headers: dict, sync: bool) -> str | None:
        if not sync:
            return None
        rid = self.next_id("r")
        headers["receipt"] = rid
        return rid

    def wait_receipt(self, rid: str, timeout: float = WAIT) -> None:
        with self.lock:
            ok = self.lock.wait_for(lambda: rid in self.receipts or self.errors, timeout)
            errors = list(self.errors)
        assert not errors, f"ERROR instead of RECEIPT {rid}: {errors}"
        assert ok, f"no RECEIPT {rid} within {timeout}s"

    def frame(self, command: str, headers: dict | None = None, body=b"", sync: bool = False) -> None:
        """Send any frame (headers are escaped as the version requires)."""
        h = dict(headers or {})
        rid = self._receipted(h, sync)
        self.conn.send_frame(command, h, body)
        if rid:
            self.wait_receipt(rid)

    def subscribe(self, destination: str, ack: str = "auto", id: str | None = None,
                  headers: dict | None = None, sync: bool = True) -> str:
        """SUBSCRIBE and (by default) wait for its RECEIPT; returns the subscription id."""
        sid = id or self.next_id("sub")
        h = dict(headers or {})
        h.update({"destination": destination, "id": sid, "ack": ack})
        self.frame("SUBSCRIBE", h, sync=sync)
        return sid

    def unsubscribe(self, sid: str, sync: bool = True) -> None:
        self.frame("UNSUBSCRIBE", {"id": sid}, sync=sync)

    def send(self, destination: str, body=b"", headers: dict | None = None, sync: bool = False,
             transaction: str | None = None, content_length: bool = True) -> None:
        h = dict(headers or {})
        h["destination"] = destination
        if transaction:
            h["transaction"] = transaction
        if content_length and "content-length" not in h:
            h["content-length"] = len(body.encode() if isinstance(body, str) else body)
        self.frame("SEND", h, body, sync=sync)

    def _ack_headers(self, msg: Frame) -> dict:
        if self.version == "1.2":
            return {"id": msg.headers["ack"]}
        # 1.0 needs only message-id; the subscription is sent too (1.1 requires it).
        h = {"message-id": msg.headers["message-id"]}
        if "subscription" in msg.headers:
            h["subscription"] = msg.headers["subscription"]
        return h

    def ack(self, msg: Frame, transaction: str | None = None, sync: bool = False) -> None:
        h = self._ack_headers(msg)
        if transaction:
            h["transaction"] = transaction
        self.frame("ACK", h, sync=sync)

    def nack(self, msg: Frame, transaction: str | None = None, sync: bool = False) -> None:
        assert self.version != "1.0", "NACK is STOMP 1.1+"
        h = self._ack_headers(msg)
        if transaction:
            h["transaction"] = transaction
        self.frame("NACK", h, sync=sync)

    def begin(self, tx: str | None = None, sync: bool = True) -> str:
        tx = tx or self.next_id("tx")
        self.frame("BEGIN", {"transaction": tx}, sync=sync)
        return tx

    def commit(self, tx: str, sync: bool = True) -> None:
        self.frame("COMMIT", {"transaction": tx}, sync=sync)

    def abort(self, tx: str, sync: bool = True) -> None:
        self.frame("ABORT", {"transaction": tx}, sync=sync)

    def sync(self) -> None:
        """A round trip: every frame sent before has been processed by the server. (A SEND
        with a receipt to a topic of its own that nobody subscribes to.)"""
        if not hasattr(self, "_sync_topic"):
            self._sync_topic = "/topic/" + unique("sync")
        self.send(self._sync_topic, b"", sync=True)

    def disconnect(self, timeout: float = WAIT) -> None:
        """DISCONNECT with a receipt; stomp.py closes the socket on the RECEIPT."""
        if not self.conn.is_connected():
            return
        self.conn.disconnect()
        assert self.disconnected.wait(timeout), f"no RECEIPT for DISCONNECT / no close within {timeout}s"

    def drop(self) -> None:
        """Close the TCP connection without DISCONNECT (an abrupt network loss)."""
        self.conn.transport.disconnect_socket()
        self.disconnected.wait(WAIT)

    def close(self) -> None:
        """Tear down (at the end of a test): DISCONNECT if still connected, then the socket."""
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
                self.disconnected.wait(1.0)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.transport.disconnect_socket()
        except Exception:  # noqa: BLE001
            pass

    # -- waits -----------------------------------------------------------------------------
    def _match(self, sub):
        return [m for m in self.messages if sub is None or m.headers.get("subscription") == sub]

    def wait_messages(self, n: int, timeout: float = WAIT, sub: str | None = None) -> list[Frame]:
        """The first `n` MESSAGE frames (of subscription `sub` if given); fails if fewer arrive."""
        with self.lock:
            ok = self.lock.wait_for(lambda: len(self._match(sub)) >= n, timeout)
            got = self._match(sub)
        assert ok, (f"expected {n} messages{' on ' + sub if sub else ''}, got {len(got)}: "
                    f"{[(m.headers, m.body[:40]) for m in got[:5]]}; errors {self.errors}")
        return got[:n]

    def quiet(self, timeout: float, sub: str | None = None) -> list[Frame]:
        """Wait `timeout` seconds, then return every MESSAGE received (of `sub` if given)."""
        time.sleep(timeout)
        return self.received(sub)

    def received(self, sub: str | None = None) -> list[Frame]:
        with self.lock:
            return list(self._match(sub))

    def wait_error(self, timeout: float = WAIT) -> Frame:
        with self.lock:
            ok = self.lock.wait_for(lambda: self.errors, timeout)
            assert ok, f"no ERROR frame within {timeout}s"
            return self.errors[0]

    def clear(self) -> None:
        with self.lock:
            self.messages.clear()


def bodies(msgs) -> list[bytes]:
    return [bytes(m.body) if m.body is not None else b"" for m in msgs]


def still_serving(server, stomp) -> None:
    """The server process is up and a fresh client can subscribe, send and receive."""
    assert server.alive(), "the broker died"
    dest = "/topic/" + unique("alive")
    c = stomp(server)
    c.subscribe(dest)
    c.send(dest, b"still here")
    assert bodies(c.wait_messages(1)) == [b"still here"]


def wait_total(clients, n: int, timeout: float = WAIT) -> None:
    """Wait until `clients` have received `n` MESSAGEs between them."""
    deadline = time.monotonic() + timeout
    while sum(len(c.received()) for c in clients) < n:
        assert time.monotonic() < deadline, (
            f"expected {n} messages in all, got {[len(c.received()) for c in clients]}")
        time.sleep(0.01)
