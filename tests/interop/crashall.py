"""The clients of test_crash.py's all-at-once crash test: one broker, every protocol's
acknowledged path at once, the broker killed with SIGKILL at random moments.

Each protocol has a `Book`: what its publisher sent (and sent again), what the broker
confirmed (confirm, RECEIPT, PUBACK/PUBCOMP, CONFIRM), and when its consumer received and
acknowledged each message. A `Worker` is one client; `Worker.run` is one session of it on one
run of the broker (a thread), ended by the kill (its connection breaks) or by `stop`.
Publishers send again, on the next run, what was not confirmed when the broker died (paho does
it itself: its sessions are persistent, so it resends with the same packet ids).

A duplicate is allowed when it has a cause: the publisher sent the same message again (its
confirm was lost in the kill), or a kill came while the message was received but not settled
(not yet acknowledged, or acknowledged less than SETTLE seconds before the kill: the brokers
write acknowledgements at most every 100 ms, and nothing confirms an acknowledgement to the
client). Any other duplicate is a message delivered again after its acknowledgement was
settled: a violation."""

from __future__ import annotations

import abc
import collections
import itertools
import os
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pika
import stomp as stomppy
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from conftest import BUSY_POLL_US, free_port, tail
from nativeraw import Native
from test_amqp_durable import DurableBroker, close_quietly, params as amqp_params

HOST = "127.0.0.1"
SETTLE = float(os.environ.get("CRASH_SETTLE", "0.5"))
BACKLOG = 1000  # a publisher waits while this many confirmed messages are not yet received
PERSISTENT = pika.BasicProperties(delivery_mode=2)


# -- the broker --------------------------------------------------------------------------------

class CrashBroker(DurableBroker):
    """One broker with every listener (native, MQTT, STOMP, AMQP) on ports fixed for the whole
    test, and a data directory; `kill()` is SIGKILL, `start()` runs it again on both."""

    def __init__(self, tmp: Path):
        super().__init__(tmp)
        self.starts: list[float] = []  # seconds from exec to "ready"
        self.fixed = {p: free_port() for p in ("native", "mqtt", "stomp", "amqp")}
        on = {p: f'["{HOST}:{port}"]' for p, port in self.fixed.items()}
        busy = f"busy_poll_us = {int(BUSY_POLL_US)}" if BUSY_POLL_US else ""
        self.config.write_text(f"""
[server]
data_dir = ""
{busy}
[admin]
listen = []
[native]
listen = {on["native"]}
shm = false
[mqtt]
listen = {on["mqtt"]}
ws = []
sys_interval_secs = 0
[stomp]
listen = {on["stomp"]}
[amqp]
listen = {on["amqp"]}
""")

    def start(self) -> "CrashBroker":
        t0 = time.monotonic()
        super().start()
        self.starts.append(time.monotonic() - t0)
        got = {"native": self.ports.get("native protocol"), "mqtt": self.ports.get("mqtt"),
               "stomp": self.ports.get("stomp"), "amqp": self.ports.get("amqp")}
        assert got == self.fixed, f"listeners {self.ports}, wanted {self.fixed}"
        return self


# -- what each protocol did --------------------------------------------------------------------

class Book:
    """One protocol's record: sends per message, the confirmed ones, and the times each was
    received ("r") and acknowledged ("a") by its consumer."""

    def __init__(self, name: str, prefix: str):
        self.name, self.prefix = name, prefix
        self.lock = threading.Lock()
        self.numbers = itertools.count()
        self.sends: collections.Counter = collections.Counter()
        self.confirmed: set[bytes] = set()
        self.events: dict[bytes, list[tuple[str, float]]] = collections.defaultdict(list)

    def new(self) -> bytes:
        body = f"{self.prefix}{next(self.numbers)}".encode()
        self.sent(body)
        return body

    def sent(self, body: bytes) -> None:
        with self.lock:
            self.sends[body] += 1

    def confirm(self, body: bytes) -> None:
        with self.lock:
            self.confirmed.add(body)

    def received(self, body: bytes) -> None:
        with self.lock:
            self.events[body].append(("r", time.monotonic()))

    def acked(self, body: bytes) -> None:
        with self.lock:
            self.events[body].append(("a", time.monotonic()))

    def backlog(self) -> int:
        with self.lock:
            return len(self.confirmed) - len(self.events)

    def missing(self) -> int:
        with self.lock:
            return len(self.confirmed - self.events.keys())

    def check(self, kills: list[tuple[float, float]]) -> dict:
        """Lost (confirmed, never received), and each duplicate receipt by its cause:
        "unacked" (a kill came after the previous receipt, before any acknowledgement of it),
        "doubt" (a kill came less than SETTLE seconds after the acknowledgement), "resent"
        (none of these, but the publisher sent the message again: one copy per send again),
        or none: "bad"."""
        with self.lock:
            causes: collections.Counter = collections.Counter()
            ages: list[float] = []
            bad = []
            for body, events in self.events.items():
                budget = self.sends[body] - 1  # copies made by sending again
                for cause, age in redeliveries(events, kills):
                    if cause == "bad" and budget > 0:
                        budget -= 1
                        cause = "resent"
                    elif cause == "doubt":
                        ages.append(age)
                    causes[cause] += 1
                    if cause == "bad":
                        bad.append((body, events, self.sends[body]))
            return {"sent": len(self.sends), "resends": sum(self.sends.values()) - len(self.sends),
                    "confirmed": len(self.confirmed), "received": len(self.events),
                    "lost": sorted(self.confirmed - self.events.keys()),
                    "duplicates": sum(causes.values()), "causes": causes, "bad": bad,
                    "ack_age": max(ages, default=0.0)}


def redeliveries(events: list[tuple[str, float]], kills: list[tuple[float, float]]):
    """For each receipt after the first: its cause if a kill explains it, and how long before
    that kill the previous receipt was acknowledged (None: it was not). A receipt before the
    restart counts as before the kill (what the client reads after the kill was sent before
    it; its acknowledgement went nowhere)."""
    receipts = sorted(t for e, t in events if e == "r")
    out = []
    for prev, t in zip(receipts, receipts[1:]):
        kill = next((k for k, restart in kills if prev < restart and k < t), None)
        if kill is None:
            out.append(("bad", None))
            continue
        acks = [a for e, a in events if e == "a" and prev <= a < kill]
        if not acks:
            out.append(("unacked", None))
        else:
            age = kill - min(acks)
            out.append(("doubt" if age <= SETTLE else "bad", age))
    return out


# -- clients -----------------------------------------------------------------------------------

class Worker(abc.ABC):
    """One client. `session` runs it on one run of the broker until its connection breaks or
    `stop` is set; an exception raised before the kill is a failure of the test."""

    name = "worker"

    def __init__(self, book: Book):
        self.book = book
        self.failures: list[str] = []
        self.sessions = 0

    def run(self, ports: dict, stop: threading.Event, killed: threading.Event, final: bool) -> None:
        try:
            self.session(ports, stop, final)
        except Exception as e:  # noqa: BLE001 - the kill, or a failure
            if not killed.is_set():
                self.failures.append(f"{self.name} (session {self.sessions}): {e!r}")

    @abc.abstractmethod
    def session(self, ports: dict, stop: threading.Event, final: bool) -> None:
        """Each protocol's own."""


class Publisher(Worker):
    """What a publisher of ours shares: `resend`, the bodies not confirmed when the broker
    died, sent first on the next run; `final`: no new message, only those."""

    def __init__(self, book: Book):
        super().__init__(book)
        self.resend: list[bytes] = []

    def next_body(self, final: bool) -> bytes | None:
        """The next body to send, None when there is none now (final: none any more)."""
        if self.resend:
            body = self.resend.pop(0)
            self.book.sent(body)
            return body
        if final or self.book.backlog() > BACKLOG:
            return None
        return self.book.new()


class OneByOne(Publisher):
    """A publisher that waits for each message's confirm before the next one."""

    @abc.abstractmethod
    def open(self, ports: dict):
        """Each protocol's own."""

    @abc.abstractmethod
    def publish(self, conn, body: bytes) -> None:
        """Sends `body` and returns once it is confirmed (raises if it is refused)."""

    @abc.abstractmethod
    def close(self, conn) -> None:
        """Each protocol's own."""

    def session(self, ports, stop, final):
        conn = self.open(ports)
        self.sessions += 1
        body = None
        try:
            while not stop.is_set():
                body = self.next_body(final)
                if body is None:
                    if final:
                        return
                    time.sleep(0.01)
                    continue
                self.publish(conn, body)
                self.book.confirm(body)
                body = None
        finally:
            if body is not None:
                self.resend.insert(0, body)
            self.close(conn)


class AmqpPublisher(OneByOne):
    name = "amqp publisher"

    def __init__(self, book: Book, queue: str):
        super().__init__(book)
        self.queue = queue

    def open(self, ports):
        conn = pika.BlockingConnection(amqp_params(ports["amqp"]))
        self.ch = conn.channel()
        self.ch.confirm_delivery()
        return conn

    def publish(self, conn, body):
        self.ch.basic_publish("", self.queue, body, PERSISTENT, mandatory=True)

    def close(self, conn):
        close_quietly(conn)


class AmqpConsumer(Worker):
    name = "amqp consumer"

    def __init__(self, book: Book, queue: str):
        super().__init__(book)
        self.queue = queue

    def session(self, ports, stop, final):
        conn = pika.BlockingConnection(amqp_params(ports["amqp"]))
        self.sessions += 1
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=100)
            for m, _, body in ch.consume(self.queue, auto_ack=False, inactivity_timeout=0.1):
                if stop.is_set():
                    return
                if m is None:
                    continue
                self.book.received(body)
                ch.basic_ack(m.delivery_tag)
                self.book.acked(body)
        finally:
            close_quietly(conn)


class Paho(Worker):
    """A paho client with a persistent session, kept for the whole test: connected once, then
    reconnected (`reconnect()`, the same client object: paho keeps its unacknowledged
    messages and the QoS 2 state of both directions) after each restart; the broker must say
    the session is present every time."""

    def __init__(self, book: Book, cid: str, version: int, topic: str, qos: int):
        super().__init__(book)
        self.topic, self.qos, self.version = topic, qos, version
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                             protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
                             clean_session=None if version == 5 else False,
                             reconnect_on_failure=False)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda *a: self.down.set()
        self.connack = threading.Event()
        self.down = threading.Event()
        self.present: bool | None = None
        self.rc = None
        self.connected_once = False

    def _on_connect(self, client, userdata, flags, rc, properties):
        self.present, self.rc = bool(flags.session_present), rc
        self.connack.set()

    def connect(self, port: int) -> None:
        self.c.loop_stop()
        self.connack.clear()
        self.down.clear()
        if self.connected_once:
            self.c.reconnect()
        else:
            kw = {}
            if self.version == 5:
                p = Properties(PacketTypes.CONNECT)
                p.SessionExpiryInterval = 3600
                kw = {"clean_start": False, "properties": p}
            self.c.connect(HOST, port, 30, **kw)
        self.c.loop_start()
        assert self.connack.wait(10), "no CONNACK"
        assert not self.rc.is_failure, f"CONNACK {self.rc}"
        if self.connected_once:
            assert self.present, f"the session of {self.name} was lost (session present 0)"
        self.connected_once = True
        self.sessions += 1

    def wait_down(self, stop: threading.Event) -> None:
        while not stop.is_set() and not self.down.is_set():
            time.sleep(0.02)

    def close(self) -> None:
        self.c.loop_stop()
        try:
            self.c.socket() and self.c.socket().close()
        except Exception:  # noqa: BLE001
            pass


class PahoSubscriber(Paho):
    def __init__(self, book, cid, version, topic, qos):
        super().__init__(book, cid, version, topic, qos)
        self.name = f"mqtt qos {qos} subscriber"
        self.c.on_message = self._on_message

    def _on_message(self, client, userdata, m):
        # QoS 1: paho sends the PUBACK when this returns; QoS 2: called on the PUBREL.
        self.book.received(m.payload)
        self.book.acked(m.payload)

    def subscribe(self, port: int) -> None:
        """Before the first kill: the session and its subscription, SUBACKed; then parked."""
        self.connect(port)
        subacked = threading.Event()
        self.c.on_subscribe = lambda *a: subacked.set()
        self.c.subscribe(self.topic, qos=self.qos)
        assert subacked.wait(10), "no SUBACK"
        self.c.disconnect()
        self.c.loop_stop()

    def session(self, ports, stop, final):
        self.connect(ports["mqtt"])
        self.wait_down(stop)


class PahoPublisher(Paho):
    WINDOW = 20  # paho's max_inflight_messages

    def __init__(self, book, cid, version, topic, qos):
        super().__init__(book, cid, version, topic, qos)
        self.name = f"mqtt qos {qos} publisher"
        self.pending: list[tuple[paho.MQTTMessageInfo, bytes]] = []

    def collect(self) -> None:
        still = []
        for info, body in self.pending:
            # PUBACK (QoS 1) or PUBCOMP (QoS 2). Not is_published(): it raises for a message
            # published while disconnected, which paho still sends on reconnect.
            if info._published:
                self.book.confirm(body)
            else:
                still.append((info, body))
        self.pending = still

    def session(self, ports, stop, final):
        self.collect()
        for _, body in self.pending:  # paho sends them again once connected
            self.book.sent(body)
        self.connect(ports["mqtt"])
        while not stop.is_set() and not self.down.is_set():
            self.collect()
            if len(self.pending) >= self.WINDOW:
                time.sleep(0.002)
                continue
            body = None
            if not final and self.book.backlog() <= BACKLOG:
                body = self.book.new()
            if body is None:
                if final and not self.pending:
                    return
                time.sleep(0.01)
                continue
            info = self.c.publish(self.topic, body, qos=self.qos)
            # Not connected (the kill): paho keeps it in its session and sends it on reconnect.
            self.pending.append((info, body))
        self.collect()


class StompPublisher(Publisher, stomppy.ConnectionListener):
    name = "stomp publisher"
    WINDOW = 32

    def __init__(self, book: Book, dest: str):
        Publisher.__init__(self, book)
        self.dest = dest
        self.ids = itertools.count()
        self.pending: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.sem = threading.Semaphore(self.WINDOW)
        self.down = threading.Event()

    def on_receipt(self, frame):
        with self.lock:
            body = self.pending.pop(frame.headers.get("receipt-id"), None)
        if body is not None:
            self.book.confirm(body)
            self.sem.release()

    def on_disconnected(self):
        self.down.set()

    def session(self, ports, stop, final):
        self.down.clear()
        self.sem = threading.Semaphore(self.WINDOW)
        conn = stomp_connection(ports["stomp"], self)
        self.sessions += 1
        try:
            while not stop.is_set() and not self.down.is_set():
                if not self.sem.acquire(timeout=0.1):
                    continue
                body = self.next_body(final)
                if body is None:
                    self.sem.release()
                    with self.lock:
                        if final and not self.pending:
                            return
                    time.sleep(0.01)
                    continue
                rid = f"r{next(self.ids)}"
                with self.lock:
                    self.pending[rid] = body
                conn.send(self.dest, body, headers={"receipt": rid})
        finally:
            with self.lock:
                self.resend = list(self.pending.values()) + self.resend
                self.pending.clear()
            disconnect_quietly(conn)


class StompConsumer(Worker, stomppy.ConnectionListener):
    name = "stomp consumer"

    def __init__(self, book: Book, dest: str):
        Worker.__init__(self, book)
        self.dest = dest
        self.conn = None
        self.down = threading.Event()

    def on_message(self, frame):
        self.book.received(frame.body)
        self.conn.ack(frame.headers["ack"])
        self.book.acked(frame.body)

    def on_disconnected(self):
        self.down.set()

    def session(self, ports, stop, final):
        self.down.clear()
        self.conn = stomp_connection(ports["stomp"], self)
        self.sessions += 1
        try:
            self.conn.subscribe(self.dest, id="1", ack="client-individual")
            while not stop.is_set() and not self.down.is_set():
                time.sleep(0.02)
        finally:
            disconnect_quietly(self.conn)


def stomp_connection(port: int, listener) -> stomppy.Connection12:
    conn = stomppy.Connection12([(HOST, port)], reconnect_attempts_max=1, timeout=10,
                                auto_decode=False, vhost="/")
    conn.set_listener("crash", listener)
    conn.connect(wait=True)
    return conn


def disconnect_quietly(conn) -> None:
    try:
        if conn.is_connected():
            conn.disconnect()
    except Exception:  # noqa: BLE001
        pass


class NativePublisher(OneByOne):
    name = "native publisher"

    def __init__(self, book: Book, key: str):
        super().__init__(book)
        self.key = key

    def open(self, ports):
        return Native(HOST, ports["native"], "crash-pub")

    def publish(self, conn, body):
        status, _, why = conn.publish(self.key, body)  # PUB_CONFIRM, waits for its CONFIRM
        assert status == 0, f"CONFIRM status {status}: {why}"

    def close(self, conn):
        conn.sock.close()


class NativeConsumer(Worker):
    name = "native consumer"

    def __init__(self, book: Book, stream: str, consumer: str):
        super().__init__(book)
        self.stream, self.consumer = stream, consumer

    def session(self, ports, stop, final):
        c = Native(HOST, ports["native"], "crash-consumer")
        self.sessions += 1
        try:
            c.consume(1, self.stream, self.consumer)
            while not stop.is_set():
                try:
                    d = c.next_delivery(0.1)
                except TimeoutError:
                    continue
                self.book.received(d.payload)
                c.ack(d.delivery)
                self.book.acked(d.payload)
        finally:
            c.sock.close()


# -- the whole set -----------------------------------------------------------------------------

def api(c: Native, op: str, body: dict) -> dict:
    r = c.request(f"$hayate/api/{op}", body)
    assert r.get("ok"), f"{op} {body}: {r}"
    return r


def make_clients(b: CrashBroker, base: str) -> tuple[dict[str, Book], list[Worker]]:
    """Declares what each protocol needs (AMQP durable queue, the streams and the native
    consumer, the MQTT sessions' subscriptions) and returns the books and the workers."""
    books = {p: Book(p, prefix) for p, prefix in (
        ("amqp", "a"), ("mqtt-qos1", "q1-"), ("mqtt-qos2", "q2-"), ("stomp", "s"), ("native", "n"))}
    conn = pika.BlockingConnection(amqp_params(b.fixed["amqp"]))
    queue = f"{base}-amqp"
    conn.channel().queue_declare(queue, durable=True)
    conn.close()
    n = Native(HOST, b.fixed["native"], "crash-setup")
    api(n, "stream/add", {"name": "crash-stomp", "capture": [f"{base}-s/**"]})
    api(n, "stream/add", {"name": "crash-native", "capture": [f"{base}-n/**"]})
    api(n, "consumer/add", {"stream": "crash-native", "name": "crash-nc"})
    n.close()
    dest = f"/queue/{base}-s/jobs"
    subs = [PahoSubscriber(books["mqtt-qos1"], f"{base}-s1", 4, f"{base}/q1", 1),
            PahoSubscriber(books["mqtt-qos2"], f"{base}-s2", 5, f"{base}/q2", 2)]
    for s in subs:
        s.subscribe(b.fixed["mqtt"])
    workers = [
        AmqpPublisher(books["amqp"], queue), AmqpConsumer(books["amqp"], queue),
        *subs,
        PahoPublisher(books["mqtt-qos1"], f"{base}-p1", 4, f"{base}/q1", 1),
        PahoPublisher(books["mqtt-qos2"], f"{base}-p2", 5, f"{base}/q2", 2),
        StompPublisher(books["stomp"], dest), StompConsumer(books["stomp"], dest),
        NativePublisher(books["native"], f"{base}-n/k"),
        NativeConsumer(books["native"], "crash-native", "crash-nc"),
    ]
    return books, workers


def start_run(b: CrashBroker, workers: list[Worker], final: bool):
    stop, killed = threading.Event(), threading.Event()
    threads = [threading.Thread(target=w.run, args=(b.fixed, stop, killed, final), daemon=True,
                                name=w.name) for w in workers]
    for t in threads:
        t.start()
    return stop, killed, threads


def end_run(stop: threading.Event, threads: list[threading.Thread]) -> None:
    stop.set()
    for t in threads:
        t.join(20)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"clients hang after the kill: {hung}"


def run_and_kill(b: CrashBroker, workers: list[Worker], seconds: float,
                 kills: list[tuple[float, float]]) -> None:
    """One run of the broker: every client works for `seconds`, then SIGKILL; the broker is
    started again on the same ports and data directory. Appends (kill, restart) times."""
    stop, killed, threads = start_run(b, workers, final=False)
    time.sleep(seconds)
    assert b.alive(), f"the broker died on its own in run {b.runs}:\n{tail(b.log)}"
    killed.set()
    at = time.monotonic()
    b.kill()
    end_run(stop, threads)
    b.start()
    kills.append((at, time.monotonic()))


def drain(b: CrashBroker, workers: list[Worker], books: dict[str, Book]) -> float:
    """The last run: publishers send again what is unconfirmed, nothing new; consumers take
    everything. Ends once every confirmed message was received and a second passed quietly
    (or after a minute and a second per 1,000 confirmed). Returns the seconds it took."""
    t0 = time.monotonic()
    total = sum(len(bk.confirmed) for bk in books.values())
    deadline = t0 + 60 + total / 1000
    stop, killed, threads = start_run(b, workers, final=True)
    quiet_since = None
    while time.monotonic() < deadline:
        time.sleep(0.1)
        pubs_done = all(not t.is_alive() for t, w in zip(threads, workers)
                        if isinstance(w, (Publisher, PahoPublisher)))
        if pubs_done and all(bk.missing() == 0 for bk in books.values()):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 1.0:
                break
    end_run(stop, threads)
    return time.monotonic() - t0
