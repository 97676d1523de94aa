"""Migration: the data directory written by the release before issue 45
(crates/hayate/tests/fixtures/data-844fe42/, made by scripts/make-data-fixture; its MANIFEST.md
lists what is in it) opens with this tree's broker and keeps every stream record and consumer
position, the STOMP durable queue, the MQTT persistent sessions (subscriptions, queued and
in-flight messages, unreleased inbound QoS 2 ids) and retained messages, and the AMQP durable
exchanges, queues, bindings and persistent messages.

Every test runs on two directories of that release: `data-844fe42/` (stopped with SIGTERM)
and `data-844fe42-kill/` (the same content, the broker killed with SIGKILL: `scripts/
make-data-fixture --kill`). The expectations are the same for both: what the kill leaves
different is only where things are (its MQTT state is in the journal alone, the checkpoint
`mqtt.state` is the empty one of the clean stop on the way; see its MANIFEST.md), not what
comes back.

The fixture is copied to a temporary directory; the broker starts on it, is stopped (SIGTERM)
and started again before anything is read, so that whatever the first start converted must
also read back. Then each test checks one protocol's part, with real clients (pika) and the
raw MQTT, STOMP and native clients of this directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pika
import pytest

import mqttraw as mq
from conftest import REPO, start_hayate, tail
from nativeraw import Native
from stompraw import RawStomp

pytestmark = pytest.mark.hayate_only

FIXTURES = REPO / "crates/hayate/tests/fixtures"
# A clean stop, and a kill -9 (the MQTT journal ahead of its checkpoint, nothing saved at the stop).
KINDS = ["data-844fe42", "data-844fe42-kill"]
HOST = "127.0.0.1"
QUIET = 0.5  # seconds of silence that say "nothing more"


class Fixture:
    def __init__(self, tmp: Path, source: Path):
        self.bin = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))
        if not self.bin.is_absolute():
            self.bin = REPO / self.bin
        if not self.bin.exists():
            pytest.fail(f"HAYATE_BIN {self.bin} does not exist (cargo build -p hayate)")
        self.tmp = tmp
        self.data = tmp / "data"
        shutil.copytree(source, self.data, ignore=shutil.ignore_patterns("MANIFEST.md"))
        on = '["127.0.0.1:0"]'
        self.config = tmp / "hayate.toml"
        self.config.write_text(f"""
[server]
data_dir = "{self.data}"
[admin]
listen = []
[native]
listen = {on}
shm = false
[mqtt]
listen = {on}
ws = []
sys_interval_secs = 0
[stomp]
listen = {on}
[amqp]
listen = {on}
""")
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.runs = 0

    @property
    def log(self) -> Path:
        return self.tmp / f"broker-{self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        self.proc, self.ports = start_hayate(self.bin, self.config, self.log)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(30) == 0, f"the broker exited with {proc.returncode}:\n{tail(self.log)}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the broker did not stop within 30 s of SIGTERM:\n{tail(self.log)}")


@pytest.fixture(scope="module", params=KINDS)
def broker(tmp_path_factory, request):
    source = FIXTURES / request.param
    if not source.is_dir():
        pytest.fail(f"no fixture at {source} (scripts/make-data-fixture [--kill] makes it)")
    b = Fixture(tmp_path_factory.mktemp("migration"), source)
    try:
        b.start()
        b.stop()
        b.start()
        yield b
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait()
        print(f"--- broker log ({b.log}) ---\n{tail(b.log, 40)}")


# -- streams and their durable consumers -------------------------------------------------------

def consume(b: Fixture, stream: str, consumer: str, n: int) -> list:
    c = Native(HOST, b.ports["native protocol"], f"migration-{consumer}")
    c.consume(1, stream, consumer)
    got = c.deliveries(n)
    got += c.quiet(QUIET)
    for d in got:
        c.ack(d.delivery)
    time.sleep(0.2)
    c.close()
    return got


def test_streams_keep_their_records(broker):
    n = Native(HOST, broker.ports["native protocol"], "migration")
    for name, first, nxt in (("orders", 0, 6), ("sensors", 0, 6), ("queues", 0, 6)):
        info = n.request("$hayate/api/stream/info", {"name": name})
        assert info["ok"], info
        assert (info["info"]["first"], info["info"]["next"], info["info"]["records"]) == (first, nxt, 6), info
    n.close()
    # A new consumer from the first record reads every one, headers included.
    n = Native(HOST, broker.ports["native protocol"], "migration")
    r = n.request("$hayate/api/consumer/add", {"stream": "orders", "name": "migration-all"})
    assert r["ok"], r
    n.close()
    got = consume(broker, "orders", "migration-all", 6)
    assert [(d.offset, d.key, d.payload, d.headers) for d in got] == [
        (0, "orders/eu/1", b"order-1", []),
        (1, "orders/eu/2", b"order-2", [("customer", b"alice"), ("priority", b"high")]),
        (2, "orders/us/3", b"order-3", []),
        (3, "orders/us/4", b"order-4", [("customer", b"bob")]),
        (4, "orders/eu/5", b"order-5", []),
        (5, "orders/asia/6", b'{"id":6}', [("content-type", b"application/json")]),
    ]


def test_stream_consumers_keep_their_positions(broker):
    n = Native(HOST, broker.ports["native protocol"], "migration")
    states = {}
    for stream in ("orders", "sensors"):
        r = n.request("$hayate/api/consumer/ls", {"name": stream})
        assert r["ok"], r
        for c in r["consumers"]:
            states[(stream, c["config"]["name"])] = c
    n.close()
    assert states[("orders", "billing")]["state"]["floor"] == 2
    assert states[("orders", "billing")]["config"]["ack_wait_ms"] == 600000
    assert states[("sensors", "dash")]["state"]["floor"] == 3
    assert states[("sensors", "dash")]["config"]["start"] == {"offset": 1}
    assert states[("sensors", "archive")]["state"]["floor"] == 6

    got = consume(broker, "orders", "billing", 3)
    assert [(d.offset, d.payload, d.deliveries, d.redelivered) for d in got] == [
        (2, b"order-3", 2, True), (4, b"order-5", 1, False), (5, b'{"id":6}', 1, False)]
    got = consume(broker, "sensors", "dash", 3)
    assert [(d.offset, d.payload, d.deliveries) for d in got] == [
        (3, b"55", 2), (4, b"21.5", 2), (5, b"19.5", 1)]
    got = consume(broker, "sensors", "archive", 0)
    assert got == []


# -- STOMP durable queue ----------------------------------------------------------------------

def test_stomp_durable_queue_keeps_its_pending_messages(broker):
    s = RawStomp(HOST, broker.ports["stomp"])
    assert s.connect("1.2").command == "CONNECTED"
    s.send_frame("SUBSCRIBE", [("id", "0"), ("destination", "/queue/jobs"),
                               ("ack", "client-individual"), ("receipt", "sub")])
    frames = [s.read_frame() for _ in range(5)]
    assert [f.command for f in frames].count("RECEIPT") == 1, frames
    msgs = [f for f in frames if f.command == "MESSAGE"]
    while True:
        try:
            msgs.append(s.read_frame(QUIET))
        except TimeoutError:
            break
    assert [(f.body, f.get("job-kind"), f.get("content-type")) for f in msgs] == [
        (b"job-2", "b", "text/plain"), (b"job-4", "b", "text/plain"),
        (b"job-5", "a", "text/plain"), (b"job-6", "b", "text/plain")], msgs
    for f in msgs:
        s.send_frame("ACK", [("id", f.get("ack"))])
    s.send_frame("DISCONNECT", [("receipt", "bye")])
    s.expect("RECEIPT")
    s.close()


# -- MQTT ---------------------------------------------------------------------------------------

def recv(c: mq.RawClient, kind: int) -> mq.Packet:
    p = c.recv_packet()
    assert p.type == kind, (p, p.topic, p.payload)
    return p


def nothing(c: mq.RawClient) -> None:
    try:
        p = c.recv_packet(QUIET)
    except TimeoutError:
        return
    pytest.fail(f"unexpected {p} {p.topic} {p.payload}")


def publish(port: int, topic: str, payload: bytes, qos: int) -> None:
    p = mq.RawClient(HOST, port)
    assert p.connect(client_id="migration-pub").reason == 0
    p.send(mq.publish(topic, payload, qos=qos, pid=1))
    if qos == 1:
        recv(p, mq.PUBACK)
    elif qos == 2:
        recv(p, mq.PUBREC)
        p.send(mq.packet(0x62, b"\x00\x01"))
        recv(p, mq.PUBCOMP)
    p.send(mq.disconnect())
    p.close()


def settle(c: mq.RawClient, p: mq.Packet) -> None:
    if p.qos == 1:
        c.send(mq.packet(0x40, p.pid.to_bytes(2, "big")))
    elif p.qos == 2:
        c.send(mq.packet(0x50, p.pid.to_bytes(2, "big")))
        assert recv(c, mq.PUBREL).pid == p.pid
        c.send(mq.packet(0x70, p.pid.to_bytes(2, "big")))


def test_mqtt_retained_messages_are_kept(broker):
    c = mq.RawClient(HOST, broker.ports["mqtt"], version=5)
    assert c.connect(client_id="migration-retained", clean=True).reason == 0
    c.send(mq.subscribe("home/#", qos=1, pid=1, version=5))
    recv(c, mq.SUBACK)
    got = {}
    for p in [recv(c, mq.PUBLISH) for _ in range(3)]:
        assert p.flags & 1, "the retain flag"
        got[p.topic.decode()] = (p.payload, p.qos, p.props)
        settle(c, p)
    nothing(c)
    assert got["home/kitchen/temp"][:2] == (b"21.5", 1)
    assert got["home/hall/light"][:2] == (b"on", 0)
    payload, qos, props = got["home/garage/door"]
    assert (payload, qos) == (b"closed", 1)
    assert props.get(0x01) == 1 and props.get(0x03) == "text/plain", props
    assert props.get(0x26) == [("room", "garage")], props
    c.close()


def test_mqtt_v5_session_keeps_subscriptions_and_queued_messages(broker):
    port = broker.ports["mqtt"]
    c = mq.RawClient(HOST, port, version=5)
    ack = c.connect(client_id="fixture-v5", clean=False, props={mq.SESSION_EXPIRY: 0xFFFFFFFF})
    assert ack.reason == 0 and ack.session_present, ack
    packets = [recv(c, mq.PUBLISH) for _ in range(4)]
    for p in packets:
        settle(c, p)
    got = [(p.topic, p.payload, p.qos, p.props.get(0x0B)) for p in packets]
    assert got == [
        (b"alerts/fire", b"fire", 2, [7]),
        (b"alerts/flood", b"flood", 1, [7]),
        (b"metrics/h1/cpu", b"0.75", 1, None),
        (b"metrics/h2/cpu", b"0.50", 1, None),
    ]
    nothing(c)  # alerts/noise was QoS 0
    # The subscriptions still deliver, with their QoS and identifier.
    publish(port, "alerts/new", b"new", 2)
    p = recv(c, mq.PUBLISH)
    assert (p.topic, p.payload, p.qos, p.props.get(0x0B)) == (b"alerts/new", b"new", 2, [7])
    settle(c, p)
    publish(port, "metrics/h3/cpu", b"0.25", 2)
    p = recv(c, mq.PUBLISH)
    assert (p.topic, p.payload, p.qos) == (b"metrics/h3/cpu", b"0.25", 1)
    settle(c, p)
    c.send(mq.disconnect(5))
    c.close()


def test_mqtt_v311_session_keeps_in_flight_messages(broker):
    port = broker.ports["mqtt"]
    watcher = mq.RawClient(HOST, port)
    assert watcher.connect(client_id="migration-watcher", clean=True).reason == 0
    watcher.send(mq.subscribe("inbound/#", qos=1, pid=1))
    recv(watcher, mq.SUBACK)

    c = mq.RawClient(HOST, port)
    ack = c.connect(client_id="fixture-v311", clean=False)
    assert ack.reason == 0 and ack.session_present, ack
    w1 = recv(c, mq.PUBLISH)  # in flight: sent again, DUP, the same packet id
    assert (w1.topic, w1.payload, w1.qos, w1.pid, bool(w1.flags & 0x08)) == (
        b"work/1", b"w1", 1, 1, True)
    rel = recv(c, mq.PUBREL)  # w2 was PUBRECed: its PUBREL again
    assert rel.pid == 2
    w3 = recv(c, mq.PUBLISH)  # queued
    assert (w3.topic, w3.payload, w3.qos) == (b"work/3", b"w3", 1)
    assert w3.pid not in (1, 2)
    c.send(mq.packet(0x40, b"\x00\x01"))
    c.send(mq.packet(0x70, b"\x00\x02"))
    settle(c, w3)
    nothing(c)
    # Inbound QoS 2 packet id 77 was PUBRECed and not released: sent again, it is not routed.
    again = mq.publish("inbound/q2", b"in-77", qos=2, pid=77)
    c.send(bytes([again[0] | 0x08]) + again[1:])  # DUP
    assert recv(c, mq.PUBREC).pid == 77
    nothing(watcher)
    c.send(mq.packet(0x62, bytes([0, 77])))
    assert recv(c, mq.PUBCOMP).pid == 77
    # Once released, the id is new again: routed (the watcher works).
    c.send(mq.publish("inbound/q2", b"in-78", qos=2, pid=77))
    assert recv(c, mq.PUBREC).pid == 77
    p = recv(watcher, mq.PUBLISH)
    assert p.payload == b"in-78"
    c.send(mq.packet(0x62, bytes([0, 77])))
    assert recv(c, mq.PUBCOMP).pid == 77
    # The subscription still delivers at QoS 2.
    publish(port, "work/4", b"w4", 2)
    p = recv(c, mq.PUBLISH)
    assert (p.topic, p.payload, p.qos) == (b"work/4", b"w4", 2)
    settle(c, p)
    c.send(mq.disconnect())
    c.close()
    watcher.close()


# -- AMQP ---------------------------------------------------------------------------------------

def test_amqp_durable_queues_keep_their_messages(broker):
    params = pika.ConnectionParameters(HOST, broker.ports["amqp"], connection_attempts=1,
                                       socket_timeout=10)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare("fx.direct", "direct", passive=True)
    ch.exchange_declare("fx.topic", "topic", passive=True)
    counts = {q: ch.queue_declare(q, passive=True).method.message_count
              for q in ("fx.orders", "fx.dead", "fx.prio", "fx.idle")}
    assert counts == {"fx.orders": 2, "fx.dead": 1, "fx.prio": 3, "fx.idle": 3}, counts
    # The same declarations (flags and arguments) are accepted as they are.
    ch.queue_declare("fx.orders", durable=True, arguments={
        "x-max-length": 10, "x-dead-letter-exchange": "fx.direct",
        "x-dead-letter-routing-key": "dead"})
    ch.queue_declare("fx.prio", durable=True, arguments={"x-max-priority": 5})

    def take(queue: str):
        method, props, body = ch.basic_get(queue)
        assert method is not None, f"{queue} is empty"
        return method, props, body

    got = []
    for q, n in (("fx.orders", 2), ("fx.dead", 1), ("fx.prio", 3), ("fx.idle", 3)):
        for _ in range(n):
            method, props, body = take(q)
            got.append((q, body, method.redelivered, props))
            if q != "fx.orders":
                ch.basic_ack(method.delivery_tag)
    assert [(q, b, r) for q, b, r, _ in got] == [
        ("fx.orders", b"o4", True), ("fx.orders", b"o5", True),
        ("fx.dead", b"o3", True),
        ("fx.prio", b"t-mid", True), ("fx.prio", b"t-low", True), ("fx.prio", b"t-none", True),
        ("fx.idle", b"i1", True), ("fx.idle", b"i2", True), ("fx.idle", b"i3", True),
    ]
    props = {b: p for _, b, _, p in got}
    assert (props[b"o4"].message_id, props[b"o4"].headers.get("n")) == ("o4", 4)
    assert props[b"o4"].delivery_mode == 2
    assert props[b"o3"].headers.get("x-first-death-reason") == "rejected", props[b"o3"].headers
    assert props[b"o3"].headers.get("x-first-death-queue") == "fx.orders"
    assert props[b"t-mid"].priority == 3
    i3 = props[b"i3"]
    assert (i3.content_type, i3.correlation_id) == ("text/plain", "c-3")
    assert (i3.headers.get("kind"), i3.headers.get("n")) == ("idle", 3)

    # The dead-letter argument still works: o4 rejected goes to fx.dead.
    ch.basic_reject(1, requeue=False)  # o4 (fx.orders' first get on this channel)
    ch.basic_ack(2)  # o5
    deadline = time.monotonic() + 5
    while ch.queue_declare("fx.dead", passive=True).method.message_count != 1:
        assert time.monotonic() < deadline, "o4 was not dead-lettered to fx.dead"
        time.sleep(0.05)
    method, props, body = take("fx.dead")
    assert body == b"o4" and props.headers.get("x-first-death-queue") == "fx.orders"
    ch.basic_ack(method.delivery_tag)

    # The bindings are there: each route delivers to its queue.
    ch.confirm_delivery()
    for ex, rk, q in (("fx.direct", "order", "fx.orders"), ("fx.topic", "task.z", "fx.prio"),
                      ("fx.topic", "idle.q", "fx.idle"), ("fx.direct", "idle", "fx.idle")):
        ch.basic_publish(ex, rk, f"{ex}/{rk}".encode(), pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
        method, _, body = take(q)
        assert body == f"{ex}/{rk}".encode()
        assert not method.redelivered
        ch.basic_ack(method.delivery_tag)
    for q in ("fx.orders", "fx.dead", "fx.prio", "fx.idle"):
        assert ch.queue_declare(q, passive=True).method.message_count == 0, q
    conn.close()
