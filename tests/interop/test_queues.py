"""One queue seen from every protocol (issue 45): a queue `jobs` that pika declares and
publishes to is STOMP's `/queue/jobs` and the native protocol's CONSUME of `jobs`; pika,
stomp.py and a native consumer take turns from it, a NACK from each reaches another, and
the admin API's `/api/queues` shows the depth and unacknowledged count the clients see.
Hostile: consumers that never acknowledge hold only their credit; a queue filled past its
bounds from three protocols at once; a NACK storm from STOMP."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import types
import urllib.request

import pika
import pytest

from conftest import KIND, start_hayate, stop_process
from nativeraw import Native
from stomphelpers import StompClient

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's queues")

CONFIG = """
[server]
data_dir = ""
[admin]
listen = ["127.0.0.1:0"]
[native]
listen = ["127.0.0.1:0"]
shm = false
[mqtt]
listen = []
ws = []
[stomp]
listen = ["127.0.0.1:0"]
queue_max_backlog = {backlog}
[amqp]
listen = ["127.0.0.1:0"]
heartbeat_secs = 30
[limits]
max_unacked = {max_unacked}
"""


def start(tmp_path, backlog=10_000, max_unacked=1024):
    from test_dashboard import HAYATE

    cfg = tmp_path / "hayate.toml"
    cfg.write_text(CONFIG.format(backlog=backlog, max_unacked=max_unacked))
    proc, ports = start_hayate(HAYATE, cfg, tmp_path / "broker.log")
    return proc, ports, HAYATE


@pytest.fixture
def make(tmp_path):
    """`make(**settings)`: a broker of the test's (its ports, the binary), stopped after it."""
    procs = []

    def make_one(**kw):
        proc, ports, binary = start(tmp_path, **kw)
        procs.append(proc)
        return ports, binary

    yield make_one
    for proc in procs:
        stop_process(proc)


@pytest.fixture
def broker(make):
    return make()[0]


def api(ports, path: str = "/api/queues", method: str = "GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{ports['admin http']}{path}", method=method)
    with urllib.request.urlopen(req, timeout=5) as r:
        body = r.read()
        return json.loads(body) if body else r.status


def queue_view(ports, name: str, ns: str = "") -> dict | None:
    return next((q for q in api(ports) if q["ns"] == ns and q["name"] == name), None)


def wait_view(ports, name: str, timeout: float = 5.0, **want) -> dict:
    """The queue's `/api/queues` entry once it shows `want` (fails with the last seen)."""
    deadline = time.monotonic() + timeout
    while True:
        v = queue_view(ports, name)
        if v is not None and all(v[k] == w for k, w in want.items()):
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: wanted {want}, /api/queues shows {v}")
        time.sleep(0.05)


def amqp(ports) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["amqp"], connection_attempts=1, socket_timeout=5,
        blocked_connection_timeout=10))


def stomp_client(ports) -> StompClient:
    server = types.SimpleNamespace(host="127.0.0.1", port=ports["stomp"], login=None, passcode=None)
    c = StompClient(server)
    c.connect()
    return c


class Pika:
    """A pika consumer of `queue` with prefetch `prefetch` (consuming from the start), read
    one message at a time."""

    def __init__(self, ports, queue: str, prefetch: int):
        self.conn = amqp(ports)
        self.ch = self.conn.channel()
        self.ch.basic_qos(prefetch_count=prefetch)
        self.got = []
        self.ch.basic_consume(queue, lambda _c, m, _p, b: self.got.append(
            (m.delivery_tag, b, m.redelivered)))
        self.conn.process_data_events(0.05)

    def next(self, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while not self.got and time.monotonic() < deadline:
            self.conn.process_data_events(0.02)
        return self.got.pop(0) if self.got else None

    def quiet(self, t: float = 0.3):
        return self.next(t)

    def close(self):
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass


class Stomp:
    """A stomp.py consumer of `/queue/<queue>` (client-individual acks, `prefetch-count`)."""

    def __init__(self, ports, queue: str, prefetch: int | None):
        self.c = stomp_client(ports)
        headers = {"prefetch-count": str(prefetch)} if prefetch else {}
        self.c.subscribe("/queue/" + queue, ack="client-individual", headers=headers)
        self.seen = 0

    def next(self, timeout: float = 5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.c.received()
            if len(got) > self.seen:
                m = got[self.seen]
                self.seen += 1
                return m, bytes(m.body), None  # STOMP shows no redelivered flag
            time.sleep(0.01)
        return None

    def quiet(self, t: float = 0.3):
        return self.next(t)


class Raw:
    """A native consumer of queue `queue` (CONSUME with an empty stream)."""

    def __init__(self, ports, queue: str, prefetch: int = 0):
        self.n = Native("127.0.0.1", ports["native protocol"])
        self.n.consume(1, "", queue, prefetch)

    def next(self, timeout: float = 5.0):
        try:
            d = self.n.next_delivery(timeout)
        except TimeoutError:
            return None
        return d.delivery, d.payload, d.redelivered

    def quiet(self, t: float = 0.3):
        return self.next(t)


def test_one_queue_three_protocols(broker):
    conn = amqp(broker)
    ch = conn.channel()
    ch.queue_declare(queue="jobs")
    ch.confirm_delivery()
    for i in range(30):
        ch.basic_publish("", "jobs", b"j%d" % i)
    assert queue_view(broker, "jobs")["depth"] == 30

    s = Stomp(broker, "jobs", prefetch=1)
    n = Raw(broker, "jobs", prefetch=1)
    p = Pika(broker, "jobs", prefetch=1)
    held = {"stomp": s.next(), "native": n.next(), "pika": p.next()}
    assert all(held.values()), held
    # Each holds one (its credit), the rest wait: what the admin API shows too.
    v = wait_view(broker, "jobs", depth=27, unacked=3, consumers=3)
    assert (v["kind"], v["waiting"]) == ("memory", 27)

    acks = {"stomp": lambda h: s.c.ack(h[0], sync=True), "native": lambda h: n.n.ack(h[0]),
            "pika": lambda h: p.ch.basic_ack(h[0])}
    nacks = {"stomp": lambda h: s.c.nack(h[0], sync=True), "native": lambda h: n.n.nack(h[0]),
             "pika": lambda h: p.ch.basic_nack(h[0], requeue=True)}
    consumers = {"stomp": s, "native": n, "pika": p}
    got = {k: [h[1]] for k, h in held.items()}
    # Taking turns: each acknowledges what it holds and gets the next, until none is left.
    for _ in range(9):
        for k, c in consumers.items():
            acks[k](held[k])
            held[k] = c.next()
            assert held[k] is not None, f"{k} got nothing"
            got[k].append(held[k][1])
    v = wait_view(broker, "jobs", depth=0, unacked=3, consumers=3)
    everything = sorted(b for g in got.values() for b in g)
    assert everything == sorted(b"j%d" % i for i in range(30)), got
    assert all(len(g) == 10 for g in got.values()), {k: len(g) for k, g in got.items()}

    # A NACK from each reaches another consumer (the others have credit: they acknowledged
    # what they held), marked redelivered.
    for nacker in ("stomp", "native", "pika"):
        for k in consumers:
            if k != nacker and held[k] is not None:
                acks[k](held[k])
                held[k] = None
        body = held[nacker][1]
        nacks[nacker](held[nacker])
        held[nacker] = None
        time.sleep(0.3)
        arrived = {k: consumers[k].quiet(0.3) for k in consumers}
        who = [k for k, h in arrived.items() if h is not None]
        assert len(who) == 1 and who[0] != nacker, f"{nacker}'s nack went to {arrived}"
        again = arrived[who[0]]
        assert again[1] == body
        if again[2] is not None:
            assert again[2], "marked redelivered"
        held[who[0]] = again
    assert queue_view(broker, "jobs")["unacked"] == sum(h is not None for h in held.values())
    for k, h in held.items():
        if h is not None:
            acks[k](h)
    p.conn.process_data_events(0.1)
    wait_view(broker, "jobs", depth=0, unacked=0, consumers=3)
    p.close()
    s.c.close()
    n.n.close()
    wait_view(broker, "jobs", consumers=0)
    conn.close()


def test_a_stomp_queue_is_the_amqp_queue_and_unacked_go_back(broker):
    """STOMP makes the queue (implicit); an AMQP declare of it succeeds and keeps its
    messages; what a consumer leaves unacknowledged goes back to its place."""
    st = stomp_client(broker)
    for i in range(5):
        st.send("/queue/made-by-stomp", b"m%d" % i, sync=True)
    conn = amqp(broker)
    ch = conn.channel()
    ok = ch.queue_declare(queue="made-by-stomp").method
    assert ok.message_count == 5
    ch.queue_declare(queue="made-by-stomp", durable=True)  # equivalent: it stays as it is
    n = Raw(broker, "made-by-stomp", prefetch=2)
    assert [n.next()[1] for _ in range(2)] == [b"m0", b"m1"]
    wait_view(broker, "made-by-stomp", depth=3, unacked=2)
    n.n.close()  # leaves with two unacknowledged: back in their places
    wait_view(broker, "made-by-stomp", depth=5, unacked=0, consumers=0)
    got = [ch.basic_get("made-by-stomp", auto_ack=True) for _ in range(5)]
    assert [b for _, _, b in got] == [b"m%d" % i for i in range(5)]
    assert [m.redelivered for m, _, _ in got] == [True, True, False, False, False]
    assert got[0][0].routing_key == "made-by-stomp"
    # The admin API deletes any queue.
    assert api(broker, "/api/queues/_/made-by-stomp", "DELETE") == 204
    assert queue_view(broker, "made-by-stomp") is None
    st.close()
    conn.close()


def test_the_cli_consumes_a_queue_and_settles_from_stdin(make):
    ports, binary = make()
    conn = amqp(ports)
    ch = conn.channel()
    ch.queue_declare(queue="cli-q")
    for i in range(3):
        ch.basic_publish("", "cli-q", b"c%d" % i)
    cli = subprocess.Popen(
        [str(binary), "sub", "--queue", "cli-q", "--ack", "stdin", "--prefetch", "1",
         "--server", f"127.0.0.1:{ports['native protocol']}", "--shm", "off"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        d, how, body = cli.stdout.readline().rstrip("\n").split("\t")
        assert (how, body) == ("new", "c0")
        cli.stdin.write(f"nack {d}\n")
        cli.stdin.flush()
        d, how, body = cli.stdout.readline().rstrip("\n").split("\t")
        assert (how, body) == ("redelivered", "c0")
        cli.stdin.write(f"ack {d}\n")
        cli.stdin.flush()
        d, how, body = cli.stdout.readline().rstrip("\n").split("\t")
        assert (how, body) == ("new", "c1")
        wait_view(ports, "cli-q", depth=1, unacked=1, consumers=1)
    finally:
        cli.kill()
        cli.wait()
    wait_view(ports, "cli-q", depth=2, unacked=0, consumers=0)
    conn.close()


def test_consumers_that_never_ack_hold_only_their_credit(make):
    ports, _ = make(max_unacked=16)
    conn = amqp(ports)
    ch = conn.channel()
    ch.queue_declare(queue="hog")
    p = Pika(ports, "hog", prefetch=10)
    s = Stomp(ports, "hog", prefetch=None)   # limits.max_unacked
    n = Raw(ports, "hog")                      # limits.max_unacked
    for i in range(300):
        ch.basic_publish("", "hog", b"x" * 1000)
    v = wait_view(ports, "hog", unacked=10 + 16 + 16, depth=300 - 42)
    assert v["bytes"] < 2_000_000, v
    got = {"pika": 0, "stomp": 0, "native": 0}
    for k, c in (("pika", p), ("stomp", s), ("native", n)):
        while c.quiet(0.3 if got[k] else 3) is not None:
            got[k] += 1
    assert got == {"pika": 10, "stomp": 16, "native": 16}
    # The broker serves others meanwhile: a fresh consumer takes the rest.
    other = Raw(ports, "hog")
    for _ in range(258):
        d = other.next()
        assert d is not None
        other.n.ack(d[0])
    wait_view(ports, "hog", depth=0, unacked=42)
    p.close()
    conn.close()


def test_a_queue_filled_past_its_bounds_from_three_protocols(make):
    ports, _ = make(backlog=100)
    conn = amqp(ports)
    ch = conn.channel()
    ch.queue_declare(queue="capped", arguments={"x-max-length": 50, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    st = stomp_client(ports)
    nat = Native("127.0.0.1", ports["native protocol"])
    errors = []

    def flood(send):
        try:
            for i in range(500):
                send(i)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    nacked = [0]

    def amqp_send(i):
        try:
            ch.basic_publish("", "capped", b"a%d" % i)
        except pika.exceptions.NackError:
            nacked[0] += 1

    # The AMQP queue and an implicit one (STOMP's first use: stomp.queue_max_backlog;
    # made before the flood: a native PUB makes no queue).
    st.send("/queue/implicit-capped", b"first", sync=True)
    threads = [threading.Thread(target=flood, args=(f,)) for f in (
        lambda i: st.send("/queue/capped", b"s%d" % i),
        lambda i: nat.pub("capped", b"n%d" % i),
        lambda i: st.send("/queue/implicit-capped", b"s%d" % i),
        lambda i: nat.pub("implicit-capped", b"n%d" % i),
    )]
    for t in threads:
        t.start()
    flood(amqp_send)
    for t in threads:
        t.join(60)
    st.send("/queue/capped", b"last", sync=True)
    assert not errors, errors
    assert nacked[0] > 0, "reject-publish: confirms turn negative"
    v = wait_view(ports, "capped", depth=50)
    assert v["dropped"] >= 1500 - 50, v
    w = wait_view(ports, "implicit-capped", depth=100)
    assert w["dropped"] == 1001 - 100, w
    # The first in stay (reject-publish), and the broker still serves.
    c = Raw(ports, "implicit-capped", prefetch=200)
    assert len([c.next() for _ in range(100)]) == 100
    assert c.quiet(0.3) is None
    st.close()
    conn.close()


def test_a_nack_storm_from_stomp(broker):
    st = stomp_client(broker)
    for i in range(20):
        st.send("/queue/storm", b"s%d" % i, sync=i == 19)
    stormer = Stomp(broker, "storm", prefetch=5)
    nacks, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        m = stormer.next(1)
        assert m is not None, "the storm's messages keep coming back"
        stormer.c.nack(m[0])
        nacks += 1
    assert nacks > 200, nacks
    stormer.c.close()  # whatever it still held goes back
    wait_view(broker, "storm", depth=20, unacked=0, consumers=0)
    n = Raw(broker, "storm", prefetch=20)
    got = sorted(n.next()[1] for _ in range(20))
    assert got == sorted(b"s%d" % i for i in range(20))
    assert n.quiet(0.3) is None
    st.close()
