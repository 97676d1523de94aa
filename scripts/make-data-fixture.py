"""The body of scripts/make-data-fixture (run it through that script, which picks the venv).

What goes in is fixed below (streams, STOMP, MQTT, AMQP), each step waiting for the broker's
acknowledgement, so two runs make the same content (file bytes differ: times, session ids).
tests/interop/test_migration.py checks every item MANIFEST.md lists."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/interop"))
os.environ.setdefault("STOMP_SKIP_HOSTNAME_SCAN", "1")

import pika  # noqa: E402

import mqttraw as mq  # noqa: E402
from nativeraw import Native  # noqa: E402
from stompraw import RawStomp  # noqa: E402

HOST = "127.0.0.1"
LINE = re.compile(r"hayate broker: (.+?) on (\S+)")
SEGMENT = 1 << 20  # the smallest stream segment (files are not preallocated)

# -- what goes in -------------------------------------------------------------------------------

ORDERS = [  # stream `orders` (captures orders/**), native PUB_CONFIRM
    ("orders/eu/1", b"order-1", None),
    ("orders/eu/2", b"order-2", [("customer", "alice"), ("priority", "high")]),
    ("orders/us/3", b"order-3", None),
    ("orders/us/4", b"order-4", [("customer", "bob")]),
    # published after consumer `billing` left: never delivered
    ("orders/eu/5", b"order-5", None),
    ("orders/asia/6", b'{"id":6}', [("content-type", "application/json")]),
]
SENSORS = [  # stream `sensors` (captures sensors/**)
    ("sensors/t1", b"20.0"),
    ("sensors/t2", b"21.0"),
    ("sensors/t1", b"20.5"),
    ("sensors/h1", b"55"),
    ("sensors/t2", b"21.5"),
    ("sensors/t1", b"19.5"),  # after consumer `dash` left: never delivered
]
JOBS = [b"job-1", b"job-2", b"job-3", b"job-4", b"job-5", b"job-6"]  # STOMP /queue/jobs

RETAINED = [  # (topic, payload, qos, version, properties)
    ("home/kitchen/temp", b"21.5", 1, 4, None),
    ("home/hall/light", b"on", 0, 4, None),
    ("home/garage/door", b"closed", 1, 5,
     {0x01: 1, 0x03: "text/plain", 0x26: [("room", "garage")]}),
]
OFFLINE_V5 = [  # published while session fixture-v5 is parked: (topic, payload, qos)
    ("alerts/fire", b"fire", 2),
    ("alerts/flood", b"flood", 1),
    ("metrics/h1/cpu", b"0.75", 1),
    ("metrics/h2/cpu", b"0.50", 2),
    ("alerts/noise", b"noise", 0),  # QoS 0: not held for a parked session
]


def log(msg: str) -> None:
    print(f"make-data-fixture: {msg}", flush=True)


# -- the broker ---------------------------------------------------------------------------------

def start(binary: Path, tmp: Path, data: Path, run: int) -> tuple[subprocess.Popen, dict[str, int]]:
    config = tmp / "hayate.toml"
    on = '["127.0.0.1:0"]'
    config.write_text(f"""
[server]
data_dir = "{data}"
[admin]
listen = []
[native]
listen = {on}
shm = false
[mqtt]
listen = {on}
ws = []
sys_interval_secs = 0
journal_fsync = "always"
[stomp]
listen = {on}
[amqp]
listen = {on}
fsync = "always"
""")
    logf = tmp / f"broker-{run}.log"
    with open(logf, "wb") as f:
        proc = subprocess.Popen([str(binary), "broker", "--config", str(config)], stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp)
    deadline = time.monotonic() + 30
    while True:
        text = logf.read_text(errors="replace")
        if "ready" in text:
            return proc, {w: int(a.rsplit(":", 1)[1]) for w, a in LINE.findall(text)}
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the broker did not start:\n{text}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen, logf: Path) -> None:
    """SIGTERM, and a clean exit within 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit("the broker did not stop within 60 s of SIGTERM")
    if code != 0:
        raise SystemExit(f"the broker exited with {code}:\n{logf.read_text()[-4000:]}")


def api(n: Native, op: str, body: dict) -> dict:
    r = n.request(f"$hayate/api/{op}", body)
    if not r.get("ok"):
        raise SystemExit(f"{op} {body}: {r}")
    return r


# -- streams ------------------------------------------------------------------------------------

def streams(port: int, m: dict) -> None:
    n = Native(HOST, port, "fixture")
    for name, capture in (("orders", "orders/**"), ("sensors", "sensors/**"), ("queues", "jobs")):
        api(n, "stream/add", {"name": name, "capture": [capture], "fsync": "always",
                              "segment_bytes": SEGMENT})
    api(n, "consumer/add", {"stream": "orders", "name": "billing", "ack_wait_ms": 600000})
    for key, payload, headers in ORDERS[:4]:
        assert n.publish(key, payload, headers)[0] == 0
    for key, payload in SENSORS[:5]:
        assert n.publish(key, payload)[0] == 0
    # (made once the records are there: a start past the end is clamped to the end)
    api(n, "consumer/add", {"stream": "sensors", "name": "dash", "start": {"offset": 1},
                            "ack_wait_ms": 600000})

    # billing: offsets 0-3 delivered; 0, 1 and 3 acknowledged, 2 not.
    c = Native(HOST, port, "fixture-billing")
    c.consume(1, "orders", "billing")
    got = c.deliveries(4)
    assert [d.offset for d in got] == [0, 1, 2, 3], got
    for d in got:
        if d.offset != 2:
            c.ack(d.delivery)
    # dash (from offset 1): 1-4 delivered; 1 and 2 acknowledged (cumulative ACK of 2). On a
    # connection of its own: a cumulative ACK covers every earlier delivery of the connection.
    d = Native(HOST, port, "fixture-dash")
    d.consume(1, "sensors", "dash")
    got = d.deliveries(4)
    assert [x.offset for x in got] == [1, 2, 3, 4], got
    d.ack(got[1].delivery, cumulative=True)
    time.sleep(0.5)  # positions are saved at most every 100 ms
    c.close()
    d.close()
    time.sleep(0.5)

    for key, payload, headers in ORDERS[4:]:
        assert n.publish(key, payload, headers)[0] == 0
    for key, payload in SENSORS[5:]:
        assert n.publish(key, payload)[0] == 0
    # archive: made after the last record, so it has nothing to deliver.
    api(n, "consumer/add", {"stream": "sensors", "name": "archive", "start": "new"})
    time.sleep(0.3)
    m["streams"] = {s: api(n, "stream/info", {"name": s})["info"] for s in ("orders", "sensors", "queues")}
    m["consumers"] = {s: api(n, "consumer/ls", {"name": s})["consumers"]
                      for s in ("orders", "sensors", "queues")}
    n.close()


# -- STOMP --------------------------------------------------------------------------------------

def stomp(port: int) -> None:
    """/queue/jobs, durable (stream `queues` captures `jobs`): job-1..4 delivered to a
    client-individual subscriber that ACKs job-1 and job-3 and leaves; job-5, 6 sent after."""
    s = RawStomp(HOST, port)
    assert s.connect("1.2").command == "CONNECTED"
    s.send_frame("SUBSCRIBE", [("id", "0"), ("destination", "/queue/jobs"),
                               ("ack", "client-individual"), ("receipt", "sub")])
    assert s.expect("RECEIPT").get("receipt-id") == "sub"
    for i, body in enumerate(JOBS[:4]):
        s.send_frame("SEND", [("destination", "/queue/jobs"), ("job-kind", "a" if i % 2 == 0 else "b"),
                              ("content-type", "text/plain"), ("receipt", f"r{i}")], body)
    msgs, receipts = [], 0
    while len(msgs) < 4 or receipts < 4:
        f = s.read_frame()
        if f.command == "MESSAGE":
            msgs.append(f)
        elif f.command == "RECEIPT":
            receipts += 1
        else:
            raise SystemExit(f"STOMP: {f}")
    assert [f.body for f in msgs] == JOBS[:4], msgs
    for f in msgs:
        if f.body in (b"job-1", b"job-3"):
            s.send_frame("ACK", [("id", f.get("ack"))])
    time.sleep(0.5)
    s.send_frame("DISCONNECT", [("receipt", "bye")])
    s.expect("RECEIPT")
    s.close()
    time.sleep(0.3)
    s = RawStomp(HOST, port)
    assert s.connect("1.2").command == "CONNECTED"
    for i, body in enumerate(JOBS[4:], 4):
        s.send_frame("SEND", [("destination", "/queue/jobs"), ("job-kind", "a" if i % 2 == 0 else "b"),
                              ("content-type", "text/plain"), ("receipt", f"r{i}")], body)
        s.expect("RECEIPT")
    s.send_frame("DISCONNECT", [("receipt", "bye")])
    s.expect("RECEIPT")
    s.close()


# -- MQTT ---------------------------------------------------------------------------------------

def expect(c: mq.RawClient, kind: int) -> mq.Packet:
    p = c.recv_packet()
    assert p.type == kind, (p, kind)
    return p


def publish_ok(c: mq.RawClient, topic: str, payload: bytes, qos: int, pid: int, retain=False,
               version=4, props=None) -> None:
    c.send(mq.publish(topic, payload, qos=qos, retain=retain, pid=pid, version=version, props=props))
    if qos == 1:
        assert expect(c, mq.PUBACK).pid == pid
    elif qos == 2:
        assert expect(c, mq.PUBREC).pid == pid
        c.send(mq.packet(0x62, pid.to_bytes(2, "big")))
        assert expect(c, mq.PUBCOMP).pid == pid


def mqtt(port: int, m: dict) -> None:
    # Retained messages.
    for topic, payload, qos, version, props in RETAINED:
        p = mq.RawClient(HOST, port, version=version)
        assert p.connect(client_id=f"fixture-retain-{version}", clean=True).reason == 0
        publish_ok(p, topic, payload, qos, 1, retain=True, version=version, props=props)
        p.send(mq.disconnect(version))
        p.close()

    # fixture-v5: MQTT 5, Clean Start 0, session never expires; two subscriptions; parked.
    a = mq.RawClient(HOST, port, version=5)
    ack = a.connect(client_id="fixture-v5", clean=False, props={mq.SESSION_EXPIRY: 0xFFFFFFFF})
    assert ack.reason == 0 and not ack.session_present, ack
    a.send(mq.subscribe("alerts/#", qos=2, pid=1, version=5, props={0x0B: 7}))
    assert expect(a, mq.SUBACK).reason == 2
    a.send(mq.subscribe("metrics/+/cpu", qos=1, pid=2, version=5))
    assert expect(a, mq.SUBACK).reason == 1
    a.send(mq.disconnect(5))
    a.close()

    # fixture-v311: 3.1.1, clean session 0, work/# at QoS 2.
    b = mq.RawClient(HOST, port, version=4)
    assert b.connect(client_id="fixture-v311", clean=False).reason == 0
    b.send(mq.subscribe("work/#", qos=2, pid=1))
    assert expect(b, mq.SUBACK).reason == 2

    pub = mq.RawClient(HOST, port, version=4)
    assert pub.connect(client_id="fixture-pub", clean=True).reason == 0
    time.sleep(0.2)
    for i, (topic, payload, qos) in enumerate(OFFLINE_V5, 10):
        publish_ok(pub, topic, payload, qos, i)

    # fixture-v311's in-flight deliveries: w1 (QoS 1, no PUBACK), w2 (QoS 2: PUBREC sent,
    # PUBREL received, no PUBCOMP); an inbound QoS 2 id 77 PUBRECed, not released.
    publish_ok(pub, "work/1", b"w1", 1, 20)
    w1 = expect(b, mq.PUBLISH)
    assert w1.payload == b"w1" and w1.qos == 1, w1
    publish_ok(pub, "work/2", b"w2", 2, 21)
    w2 = expect(b, mq.PUBLISH)
    assert w2.payload == b"w2" and w2.qos == 2, w2
    b.send(mq.packet(0x50, w2.pid.to_bytes(2, "big")))
    assert expect(b, mq.PUBREL).pid == w2.pid
    b.send(mq.publish("inbound/q2", b"in-77", qos=2, pid=77))
    assert expect(b, mq.PUBREC).pid == 77
    time.sleep(0.3)
    b.close()  # the connection dies: no DISCONNECT, nothing acknowledged
    time.sleep(0.5)
    publish_ok(pub, "work/3", b"w3", 1, 22)
    pub.send(mq.disconnect())
    pub.close()
    m["mqtt"] = {"w1_pid": w1.pid, "w2_pid": w2.pid}


# -- AMQP ---------------------------------------------------------------------------------------

def amqp_first(port: int) -> None:
    """The first declarations, before the broker restarts (which folds them into
    definitions.json; the later ones stay in definitions.log)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, port, connection_attempts=1))
    ch = conn.channel()
    ch.exchange_declare("fx.direct", "direct", durable=True)
    ch.queue_declare("fx.orders", durable=True, arguments={
        "x-max-length": 10, "x-dead-letter-exchange": "fx.direct",
        "x-dead-letter-routing-key": "dead"})
    ch.queue_declare("fx.dead", durable=True)
    ch.queue_bind("fx.orders", "fx.direct", "order")
    ch.queue_bind("fx.dead", "fx.direct", "dead")
    conn.close()


def amqp(port: int, m: dict) -> None:
    params = pika.ConnectionParameters(HOST, port, connection_attempts=1, socket_timeout=10)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.exchange_declare("fx.topic", "topic", durable=True)
    ch.queue_declare("fx.prio", durable=True, arguments={"x-max-priority": 5})
    ch.queue_declare("fx.idle", durable=True)
    ch.queue_bind("fx.prio", "fx.topic", "task.#")
    ch.queue_bind("fx.idle", "fx.topic", "idle.*")
    ch.queue_bind("fx.idle", "fx.direct", "idle")
    ch.confirm_delivery()

    def put(ex, rk, body, mode=2, **props):
        ch.basic_publish(ex, rk, body, pika.BasicProperties(delivery_mode=mode, **props),
                         mandatory=True)

    for i in range(1, 6):
        put("fx.direct", "order", f"o{i}".encode(), message_id=f"o{i}", headers={"n": i})
    put("fx.topic", "task.a", b"t-low", priority=1)
    put("fx.topic", "task.b", b"t-high", priority=5)
    put("fx.topic", "task.c", b"t-mid", priority=3)
    put("fx.topic", "task.d", b"t-none")
    put("fx.topic", "idle.a", b"i1")
    put("fx.topic", "idle.b", b"i2")
    put("fx.topic", "idle.c", b"i-transient", mode=1)
    put("fx.direct", "idle", b"i3", content_type="text/plain", correlation_id="c-3",
        headers={"kind": "idle", "n": 3})
    conn.close()

    # A consumer that dies with deliveries unacknowledged (a child process: its socket is
    # closed by the kernel, no channel.close, no connection.close).
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            ch.basic_qos(prefetch_count=10)
            got = []
            for method, props, body in ch.consume("fx.orders", inactivity_timeout=5):
                got.append((method.delivery_tag, body))
                if len(got) == 5:
                    break
            assert [b for _, b in got] == [b"o1", b"o2", b"o3", b"o4", b"o5"], got
            ch.basic_ack(got[0][0])
            ch.basic_ack(got[1][0])
            ch.basic_nack(got[2][0], requeue=False)  # dead-lettered to fx.dead
            method, _, body = ch.basic_get("fx.prio")
            assert body == b"t-high", body
            ch.basic_ack(method.delivery_tag)
            method, _, body = ch.basic_get("fx.prio")
            assert body == b"t-mid", body  # left unacknowledged
            conn.process_data_events(1.0)  # acknowledgements are written every 100 ms
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the AMQP consumer failed ({status})"
    time.sleep(0.5)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    m["amqp"] = {q: ch.queue_declare(q, passive=True).method.message_count
                 for q in ("fx.orders", "fx.dead", "fx.prio", "fx.idle")}
    conn.close()


# -- the manifest -------------------------------------------------------------------------------

def consumer_line(c: dict) -> str:
    cfg, st = c["config"], c["state"]
    start = cfg.get("start", "first")
    return (f"| `{cfg['stream']}` | `{cfg['name']}` | `{json.dumps(start)}` | {st['floor']} | "
            f"{st['next']} | {st['done_above_floor']} | {st['in_flight'] + st['waiting']} | {st['pending']} |")


def intro(rev: str, binary: Path, kill: bool) -> str:
    """MANIFEST.md's title and how the broker was run and stopped."""
    made = f"""Written by `scripts/make-data-fixture {'--kill ' if kill else ''}{binary}` (a release build of main {rev}, the last
release before issue 45 changes the durable format): the broker ran on an empty data
directory with every listener on 127.0.0.1 (config: `[mqtt] journal_fsync = "always"`,
`sys_interval_secs = 0`, `[amqp] fsync = "always"`, defaults otherwise), the content below was
put in with acknowledgements (confirms, receipts, PUBACK/PUBCOMP, publisher confirms)"""
    on_the_way = """It was
stopped (SIGTERM) and started once on the way, after the streams, the STOMP queue and the
first AMQP declarations (`fx.direct`, `fx.orders`, `fx.dead` and their bindings, folded into
`amqp/default/definitions.json` by that start; the later ones are in `definitions.log`)."""
    if kill:
        return f"""# Data directory of hayate {rev}, killed with SIGKILL

{made}, and
0.5 s after the clients' last work the broker was killed with SIGKILL: nothing was saved at
the stop. The figures in this file are what that broker reported just before. {on_the_way}

The content is the same as in `data-{rev}/` (made the same way, stopped with SIGTERM); what
the kill leaves different:

- `mqtt.state` is the checkpoint taken by the clean stop on the way, before any MQTT client
  came (30 bytes: no session, no retained message); every MQTT item below is only in
  `mqtt-journal/` (journal ahead of the checkpoint: the broker must replay it).
- `amqp/default/acks` and the stream consumers' positions (`consumers/*.json`) are as last
  written while running (every 100 ms); this release does not rewrite them at a clean stop
  either, so they are byte for byte those of `data-{rev}/`; so is `definitions.log` (folded
  by a start, not by a stop).
- The AMQP log and the MQTT journal differ from `data-{rev}/` only in times and ids."""
    return f"""# Data directory of hayate {rev}

{made}, and
the broker was stopped with SIGTERM (a clean stop: MQTT checkpoint taken, consumer positions
saved). The figures in this file are what that broker reported just before it stopped. {on_the_way}

What a clean stop of this release leaves twice: the MQTT state is whole both in `mqtt.state`
(the checkpoint taken at the stop) and in `mqtt-journal/` (every change since the start, its
segment not yet removed), so either file alone brings it all back; `amqp/default/returns` is
empty (no quorum queue). Every other file holds something no other file has."""


def manifest(rev: str, binary: Path, out: Path, m: dict, kill: bool = False) -> str:
    def files() -> str:
        rows = []
        for p in sorted(out.rglob("*")):
            if p.is_file() and p.name != "MANIFEST.md":
                rows.append(f"| `{p.relative_to(out)}` | {p.stat().st_size} |")
        return "\n".join(rows)

    s = m["streams"]
    consumers = "\n".join(consumer_line(c) for cs in m["consumers"].values() for c in cs)
    orders = "\n".join(
        f"| {i} | `{k}` | `{p.decode()}` | {', '.join(f'{a}: {b}' for a, b in h) if h else ''} |"
        for i, (k, p, h) in enumerate(ORDERS))
    sensors = "\n".join(f"| {i} | `{k}` | `{p.decode()}` |" for i, (k, p) in enumerate(SENSORS))
    a = m["amqp"]
    checked = ("Checked by `tests/interop/test_migration.py` (everything): it copies this directory "
               "to a temporary one\nand starts the broker of the tree on it." if kill else
               """Checked by `tests/interop/test_migration.py` (everything) and
`crates/hayate/tests/migration.rs` (streams and consumer positions): each copies this
directory to a temporary one and starts the broker of the tree on it.""")
    return f"""{intro(rev, binary, kill)}

{checked}

## Streams (`streams/`)

Created through the stream API (no owner: anonymous), `fsync = "always"`, `segment_bytes` =
1 MiB (segment files are not preallocated), no retention.

| stream | captures | first | next | records |
|---|---|---|---|---|
| `orders` | `orders/**` | {s['orders']['first']} | {s['orders']['next']} | {s['orders']['records']} |
| `sensors` | `sensors/**` | {s['sensors']['first']} | {s['sensors']['next']} | {s['sensors']['records']} |
| `queues` | `jobs` (STOMP `/queue/jobs`) | {s['queues']['first']} | {s['queues']['next']} | {s['queues']['records']} |

`orders` (native PUB_CONFIRM; offsets 4 and 5 published after `billing` left):

| offset | key | payload | headers |
|---|---|---|---|
{orders}

`sensors` (native PUB_CONFIRM; offset 5 published after `dash` left):

| offset | key | payload |
|---|---|---|
{sensors}

`queues`: `jobs` = `job-1` .. `job-6` at offsets 0-5 (STOMP SEND with receipts, headers
`job-kind: a` on job-1, 3, 5 and `b` on job-2, 4, 6, `content-type: text/plain`).

### Durable consumers (`streams/<stream>/consumers/<name>.json`)

| stream | consumer | start | floor | next | done above floor | delivered, not acknowledged | pending (never delivered) |
|---|---|---|---|---|---|---|---|
{consumers}

- `orders/billing` (ack wait 600 s): offsets 0-3 delivered once; 0, 1 and 3 acknowledged, 2
  not (its member left); 4 and 5 never delivered. So after a restart a member gets offset 2
  (its second delivery, redelivered), then 4 and 5 (first deliveries), nothing else.
- `sensors/dash` (starts at offset 1, ack wait 600 s): 1-4 delivered once; 1 and 2
  acknowledged (a cumulative ACK), 3 and 4 not; 5 never delivered. After a restart: 3 and 4
  (second deliveries), then 5; never 0, 1 or 2.
- `sensors/archive` (start `new`, made after the last record): nothing to deliver.
- `queues/stomp-jobs` (made by the STOMP SUBSCRIBE to `/queue/jobs`, no owner): job-1 .. job-4
  delivered to a `client-individual` subscriber, job-1 and job-3 ACKed, job-2 and job-4 not
  (the subscriber disconnected); job-5 and job-6 sent after. After a restart a subscriber of
  `/queue/jobs` gets job-2, job-4, job-5, job-6 (with their headers), never job-1 or job-3.

## MQTT (`mqtt.state`, `mqtt-journal/`)

Retained messages:

| topic | payload | QoS | published by |
|---|---|---|---|
| `home/kitchen/temp` | `21.5` | 1 | 3.1.1 |
| `home/hall/light` | `on` | 0 | 3.1.1 |
| `home/garage/door` | `closed` | 1 | 5.0, with Payload Format Indicator 1, Content Type `text/plain`, User Property `room: garage` |

Persistent sessions (both parked):

- `fixture-v5`: MQTT 5.0, Clean Start 0, Session Expiry Interval 0xFFFFFFFF (never expires).
  Subscriptions: `alerts/#` QoS 2 with Subscription Identifier 7; `metrics/+/cpu` QoS 1.
  Queued while parked, in this order (nothing in flight):
  `alerts/fire` `fire` QoS 2, `alerts/flood` `flood` QoS 1, `metrics/h1/cpu` `0.75` QoS 1,
  `metrics/h2/cpu` `0.50` QoS 1 (published at 2, granted 1). `alerts/noise` was published at
  QoS 0 while it was parked: not held.
- `fixture-v311`: MQTT 3.1.1, Clean Session 0. Subscription: `work/#` QoS 2.
  In flight: `work/1` `w1` QoS 1, packet id {m['mqtt']['w1_pid']}, not PUBACKed; `work/2` `w2`
  QoS 2, packet id {m['mqtt']['w2_pid']}, PUBRECed by the client and PUBREL sent, not
  PUBCOMPed. Queued: `work/3` `w3` QoS 1. Inbound: the client's QoS 2 PUBLISH packet id 77
  (`inbound/q2`, `in-77`, no subscriber) PUBRECed, not released. The connection died (socket
  closed, no DISCONNECT). On resuming: PUBLISH `w1` again with DUP and id
  {m['mqtt']['w1_pid']}, PUBREL {m['mqtt']['w2_pid']}, then `w3`; a repeated PUBLISH id 77 is not
  routed again.

## AMQP (`amqp/default/`: vhost `/`)

Durable exchanges: `fx.direct` (direct), `fx.topic` (topic).

| queue | arguments | bindings | ready at stop | messages in the log (after a restart) |
|---|---|---|---|---|
| `fx.orders` | `x-max-length` 10, `x-dead-letter-exchange` `fx.direct`, `x-dead-letter-routing-key` `dead` | `fx.direct` / `order` | {a['fx.orders']} | `o4`, `o5` |
| `fx.dead` | | `fx.direct` / `dead` | {a['fx.dead']} | `o3` (dead-lettered: `x-first-death-reason` `rejected`, `x-first-death-queue` `fx.orders`) |
| `fx.prio` | `x-max-priority` 5 | `fx.topic` / `task.#` | {a['fx.prio']} | `t-mid` (priority 3), `t-low` (1), `t-none` (none) |
| `fx.idle` | | `fx.topic` / `idle.*`, `fx.direct` / `idle` | {a['fx.idle']} | `i1`, `i2`, `i3`; not `i-transient` |

Every message was published persistent (delivery mode 2) with publisher confirms, except
`i-transient` (delivery mode 1: in memory only, gone after a restart, as documented).

- `fx.orders`: `o1` .. `o5` (message ids `o1` .. `o5`, headers `n`: 1 .. 5) delivered to one
  consumer (prefetch 10): `o1`, `o2` acknowledged; `o3` nacked without requeue (dead-lettered
  to `fx.dead`); `o4`, `o5` unacknowledged when its connection died (the process exited:
  socket closed by the kernel).
- `fx.prio`: `t-low` (priority 1), `t-high` (5), `t-mid` (3), `t-none` published in this order;
  `basic.get` took `t-high` (acknowledged) and `t-mid` (unacknowledged, then the connection
  died).
- `fx.idle`: never consumed. `i3` has content type `text/plain`, correlation id `c-3`,
  headers `kind: idle`, `n: 3`.

After a restart every message comes back marked `redelivered`, in its queue's order.

## Files

| path | bytes |
|---|---|
{files()}
"""


def main() -> None:
    kill = "--kill" in sys.argv[1:]
    args = [a for a in sys.argv[1:] if a != "--kill"]
    binary = Path(args[0] if args else "/work/bin/hayate-844fe42").resolve()
    rev = binary.name.rsplit("-", 1)[-1] if "-" in binary.name else "release"
    name = f"data-{rev}-kill" if kill else f"data-{rev}"
    out = Path(args[1]) if len(args) > 1 else REPO / f"crates/hayate/tests/fixtures/{name}"
    tmp = Path(tempfile.mkdtemp(prefix="hayate-fixture-"))
    data = tmp / "data"
    proc, ports = start(binary, tmp, data, 1)
    log(f"{binary} on {ports}")
    m: dict = {}
    try:
        streams(ports["native protocol"], m)
        log("streams done")
        stomp(ports["stomp"])
        log("stomp done")
        amqp_first(ports["amqp"])
        stop(proc, tmp / "broker-1.log")
        proc, ports = start(binary, tmp, data, 2)
        log(f"restarted on {ports}")
        mqtt(ports["mqtt"], m)
        log("mqtt done")
        amqp(ports["amqp"], m)
        log(f"amqp done: {m['amqp']}")
        n = Native(HOST, ports["native protocol"], "fixture")
        m["streams"]["queues"] = api(n, "stream/info", {"name": "queues"})["info"]
        m["consumers"]["queues"] = api(n, "consumer/ls", {"name": "queues"})["consumers"]
        n.close()
        time.sleep(0.5)
    except BaseException:
        proc.kill()
        for f in sorted(tmp.glob("broker-*.log")):
            print(f"--- {f.name}\n" + f.read_text(errors="replace")[-4000:], file=sys.stderr)
        raise
    if kill:
        proc.kill()  # SIGKILL: no checkpoint, no compaction, nothing saved at the stop
        proc.wait()
        log("broker killed (SIGKILL)")
    else:
        stop(proc, tmp / "broker-2.log")
        log("broker stopped cleanly")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(data, out)
    (out / "MANIFEST.md").write_text(manifest(rev, binary, out, m, kill))
    shutil.rmtree(tmp)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
