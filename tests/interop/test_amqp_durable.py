"""AMQP 0-9-1 durable queues (pika, paho-mqtt and stomp.py) against a broker with a data
directory, stopped with SIGKILL (or SIGINT) and restarted on the same directory:

- durable queues (with their arguments and bindings), auto-delete durable queues and durable
  exchanges come back; non-durable queues and exchanges, and exclusive queues (even durable
  ones), do not; a declaration after the restart is checked against what came back (406);
- persistent messages (delivery_mode 2, MQTT QoS 1/2, STOMP `persistent:true`) in a durable
  queue survive `kill -9` once confirmed; transient ones do not; every recovered message has
  `redelivered` set and its queue's order (priority queues: highest first, FIFO within);
- unacknowledged messages come back, acknowledged ones do not (once the acknowledgements
  were flushed, at most every 100 ms); purge, delete, bind and unbind are durable;
- a crash loop: a publisher with confirms while the broker is SIGKILLed a few times
  (CRASH_KILLS, 5 by default, as test_crash.py); every confirmed message is delivered at
  least once;
- without a data directory durable queues live in memory only, as before.

Each test starts its own broker (`hayate broker --config FILE --data DIR`, every listener on
127.0.0.1 port 0, the ports read from its `hayate broker: <what> on <addr>` lines, new ones
after each restart) and kills it at the end."""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pika
import pytest

from conftest import BROKER_LINE, BUSY_POLL_US, REPO, tail, toml_value

pytestmark = pytest.mark.hayate_only

START_TIMEOUT = 30.0  # seconds: a start that recovers queues on a noisy 2-core VM
# Acknowledgements (and what a purge settles) reach the disk at most every 100 ms: this long
# after them a SIGKILL must not bring the messages back.
ACK_SETTLE = 0.5
KILLS = int(os.environ.get("CRASH_KILLS", "5"))

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


# -- the broker --------------------------------------------------------------------------------

def hayate_bin() -> Path:
    b = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))
    if not b.is_absolute():
        b = REPO / b
    if not b.exists():
        pytest.fail(f"HAYATE_BIN {b} does not exist (cargo build -p hayate)")
    return b


def params(port: int, vhost: str = "/") -> pika.ConnectionParameters:
    return pika.ConnectionParameters("127.0.0.1", port, virtual_host=vhost, connection_attempts=1,
                                     socket_timeout=10, blocked_connection_timeout=20)


def close_quietly(conn) -> None:
    try:
        if conn.is_open:
            conn.close()
    except Exception:  # noqa: BLE001 - a connection to a killed broker
        pass


class DurableBroker:
    """One Hayate broker with an AMQP listener (and MQTT / STOMP ones if asked), its data in
    `<tmp>/data` (`--data`), or none (`data=False`: `server.data_dir = ""`, run in `tmp` so
    that the default ./hayate-data would show there). `restart()` keeps the data directory;
    the ports are new each run (`ports["amqp"]`, `ports["mqtt"]`, `ports["stomp"]`)."""

    def __init__(self, tmp: Path, data: bool = True, mqtt: bool = False, stomp: bool = False,
                 vhosts=("/",)):
        self.bin = hayate_bin()
        self.tmp = tmp
        self.data_dir = tmp / "data" if data else None
        self.runs = 0
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}
        self.conns: list[pika.BlockingConnection] = []
        on = '["127.0.0.1:0"]'
        self.config = tmp / "hayate.toml"
        self.config.write_text(f"""
[server]
data_dir = ""
{f"busy_poll_us = {int(BUSY_POLL_US)}" if BUSY_POLL_US else ""}
[admin]
listen = []
[native]
listen = []
shm = false
[mqtt]
listen = {on if mqtt else "[]"}
ws = []
[stomp]
listen = {on if stomp else "[]"}
[amqp]
listen = {on}
heartbeat_secs = 10
vhosts = [{", ".join(toml_value(v) for v in vhosts)}]
""")

    @property
    def log(self) -> Path:
        return self.tmp / f"broker-{self.runs}.log"

    def start(self) -> "DurableBroker":
        assert self.proc is None
        self.runs += 1
        cmd = [str(self.bin), "broker", "--config", str(self.config)]
        if self.data_dir is not None:
            cmd += ["--data", str(self.data_dir)]
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.tmp)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            text = self.log.read_text(errors="replace")
            if "hayate broker: ready" in text:
                self.ports = {w: int(a.rsplit(":", 1)[1]) for w, a in BROKER_LINE.findall(text)}
                assert "amqp" in self.ports, f"no AMQP listener:\n{tail(self.log)}"
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"hayate exited with {self.proc.returncode} (run {self.runs}):\n"
                                   f"{tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"hayate not ready within {START_TIMEOUT}s (run {self.runs}):\n"
                                   f"{tail(self.log)}")
            time.sleep(0.02)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL; the AMQP connections made through `connect()` are dropped."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()
        conns, self.conns = self.conns, []
        for c in conns:
            close_quietly(c)

    def stop(self) -> None:
        """SIGINT (a clean shutdown); SIGKILL if it has not exited after 15 s."""
        for c in self.conns:
            close_quietly(c)
        self.conns = []
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"the broker did not stop within 15 s of SIGINT:\n{tail(self.log)}")

    def restart(self, how: str = "kill") -> "DurableBroker":
        assert self.alive(), f"the broker died before the restart:\n{tail(self.log)}"
        if how == "kill":
            self.kill()
        else:
            self.stop()
        return self.start()

    def connect(self, vhost: str = "/") -> pika.BlockingConnection:
        c = pika.BlockingConnection(params(self.ports["amqp"], vhost))
        self.conns.append(c)
        return c

    def amqp_dirs(self) -> list[Path]:
        """The queue stores' directories under `<data>/queues/` (one per virtual host with
        durable state)."""
        d = self.data_dir / "queues"
        return sorted(p for p in d.iterdir() if p.is_dir()) if d.is_dir() else []


@pytest.fixture
def make_durable_broker(tmp_path_factory, request):
    """Factory: `make_durable_broker(data=True, mqtt=False, stomp=False, vhosts=("/",))`
    starts a broker; all are killed at the end (their logs printed if the test failed)."""
    made: list[DurableBroker] = []

    def make(**kw) -> DurableBroker:
        tmp = Path(tempfile.mkdtemp(prefix="hayate-amqp-durable-", dir=tmp_path_factory.getbasetemp()))
        b = DurableBroker(tmp, **kw)
        made.append(b)
        return b.start()

    yield make
    rep = getattr(request.node, "rep_call", None)
    for b in made:
        was_alive = b.alive()
        b.kill()
        if rep is not None and rep.failed:
            print(f"--- hayate log ({b.log}, run {b.runs}) ---\n{tail(b.log, 60)}")
        elif not was_alive and b.runs:
            print(f"--- hayate died during the test (run {b.runs}) ---\n{tail(b.log, 60)}")


# -- client helpers ----------------------------------------------------------------------------

def take(ch, queue: str, n: int, timeout: float = 15.0, quiet: float = 0.3, ack: bool = True) -> list:
    """Consumes `queue` until `n` messages came (or `timeout`), then `quiet` seconds more for
    any extra one; returns every (method, properties, body) received, acknowledged (multiple)
    if `ack`, else left unacknowledged."""
    got = []
    deadline = time.monotonic() + timeout
    settle = None
    for m, p, b in ch.consume(queue, auto_ack=False, inactivity_timeout=0.05):
        now = time.monotonic()
        if m is not None:
            got.append((m, p, b))
        if len(got) >= n:
            settle = settle or now + quiet
            if now >= settle:
                break
        elif now > deadline:
            break
    if ack and got:
        ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    ch.cancel()
    return got


def bodies(got) -> list[bytes]:
    return [b for _, _, b in got]


def count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def wait_count(ch, queue: str, n: int, timeout: float = 10.0) -> int:
    """Polls the queue's ready count until it is `n` (or `timeout`); returns the last one."""
    deadline = time.monotonic() + timeout
    while True:
        c = count(ch, queue)
        if c == n or time.monotonic() > deadline:
            return c
        time.sleep(0.05)


def channel_error(conn, op) -> int | None:
    """Runs `op(channel)` on a new channel: the reply code of the channel.close it got, or
    None if it succeeded."""
    ch = conn.channel()
    try:
        op(ch)
    except pika.exceptions.ChannelClosedByBroker as e:
        return e.reply_code
    ch.close()
    return None


def header(props, name):
    v = (props.headers or {}).get(name)
    return v.decode() if isinstance(v, bytes) else v


# -- declarations ------------------------------------------------------------------------------

QUEUE_ARGS = {"x-message-ttl": 600_000, "x-max-length": 2,
              "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}


def test_durable_queues_and_exchanges_survive_kill_9_the_others_do_not(make_durable_broker):
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.exchange_declare("dx", "topic", durable=True)
    ch.exchange_declare("tx", "direct", durable=False)
    ch.queue_declare("dlq", durable=True)
    ch.queue_declare("dq", durable=True, arguments=QUEUE_ARGS)
    ch.queue_bind("dq", "dx", "a.*")
    ch.queue_bind("dq", "amq.topic", "dq.k")
    ch.queue_declare("nq", durable=False)
    ch.queue_declare("exq", durable=True, exclusive=True)
    ch.queue_declare("adq", durable=True, auto_delete=True)
    b.restart("kill")  # SIGKILL right after the declare-ok / bind-ok frames

    conn = b.connect()
    ch = conn.channel()
    assert count(ch, "dq") == 0
    assert count(ch, "adq") == 0, "a durable auto-delete queue survives a restart"
    ch.exchange_declare("dx", passive=True)
    # The same declarations again are accepted: the flags and arguments came back as they were.
    ch.queue_declare("dq", durable=True, arguments=QUEUE_ARGS)
    ch.queue_declare("adq", durable=True, auto_delete=True)
    ch.exchange_declare("dx", "topic", durable=True)
    # Other ones are not.
    other_args = dict(QUEUE_ARGS, **{"x-max-length": 3})
    assert channel_error(conn, lambda c: c.queue_declare("dq", durable=True, arguments=other_args)) == 406, \
        "re-declaring a recovered queue with other arguments must be 406 PRECONDITION_FAILED"
    assert channel_error(conn, lambda c: c.queue_declare("dq", durable=True)) == 406, \
        "re-declaring a recovered queue without its arguments must be 406"
    assert channel_error(conn, lambda c: c.queue_declare("dq", durable=False, arguments=QUEUE_ARGS)) == 406, \
        "the recovered queue is durable: a non-durable declaration must be 406"
    assert channel_error(conn, lambda c: c.exchange_declare("dx", "direct", durable=True)) == 406, \
        "the recovered exchange is a topic exchange: a direct one must be 406"
    # What was not durable, and the exclusive queue, are gone.
    for what, op in [("the non-durable exchange", lambda c: c.exchange_declare("tx", passive=True)),
                     ("the non-durable queue", lambda c: c.queue_declare("nq", passive=True)),
                     ("the exclusive durable queue", lambda c: c.queue_declare("exq", passive=True))]:
        assert channel_error(conn, op) == 404, f"{what} came back after the restart"
    # The bindings and the arguments work: through dx and amq.topic into dq, whose
    # x-max-length 2 dead-letters the oldest to dlq.
    ch.confirm_delivery()
    ch.basic_publish("dx", "a.b", b"first", PERSISTENT, mandatory=True)
    ch.basic_publish("amq.topic", "dq.k", b"second", PERSISTENT, mandatory=True)
    ch.basic_publish("dx", "a.c", b"third", PERSISTENT, mandatory=True)
    got = take(ch, "dq", 2)
    assert bodies(got) == [b"second", b"third"], "x-max-length 2 must have dropped the oldest"
    dead = take(ch, "dlq", 1)
    assert bodies(dead) == [b"first"], "the recovered x-dead-letter-* arguments must dead-letter"
    assert header(dead[0][1], "x-first-death-reason") == "maxlen"


def test_names_that_look_like_escapes_or_paths_stay_apart(make_durable_broker):
    """Definitions are meta-log records keyed by name (`/` and `%` escaped): a client naming
    exchanges and queues so that their keys would meet (`a/b` -> `c` against `a` -> `b/c`,
    `q/1` against `q%2F1`) gets each kept on its own after kill -9."""
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.confirm_delivery()
    for x in ("a", "a/b", "b/c", "c"):
        ch.exchange_declare(x, "fanout", durable=True)
    ch.exchange_bind("c", "a/b")          # a/b -> c
    ch.exchange_bind("b/c", "a")          # a -> b/c
    for q, x in (("q/1", "c"), ("q%2F1", "b/c")):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, x)
    ch.basic_publish("a/b", "", b"via-a/b", PERSISTENT)
    ch.basic_publish("a", "", b"via-a", PERSISTENT)
    b.restart("kill")
    ch = b.connect().channel()
    ch.confirm_delivery()
    assert bodies(take(ch, "q/1", 1)) == [b"via-a/b"]
    assert bodies(take(ch, "q%2F1", 1)) == [b"via-a"]
    ch.basic_publish("a/b", "", b"again-a/b", PERSISTENT)
    ch.basic_publish("a", "", b"again-a", PERSISTENT)
    assert bodies(take(ch, "q/1", 1)) == [b"again-a/b"], "the edges come back as bound"
    assert bodies(take(ch, "q%2F1", 1)) == [b"again-a"]


def test_each_virtual_host_keeps_its_own_durable_queues(make_durable_broker):
    b = make_durable_broker(vhosts=("/", "dev"))
    root, dev = b.connect().channel(), b.connect("dev").channel()
    for ch, body in ((root, b"root-job"), (dev, b"dev-job")):
        ch.confirm_delivery()
        ch.queue_declare("jobs", durable=True)
        ch.basic_publish("", "jobs", body, PERSISTENT)
    dev.queue_declare("dev-only", durable=True)
    assert len(b.amqp_dirs()) >= 2, \
        f"expected a directory per virtual host under {b.data_dir / 'queues'}: {b.amqp_dirs()}"
    b.restart("kill")
    root_conn, dev_conn = b.connect(), b.connect("dev")
    root, dev = root_conn.channel(), dev_conn.channel()
    assert bodies(take(root, "jobs", 1)) == [b"root-job"]
    assert bodies(take(dev, "jobs", 1)) == [b"dev-job"]
    assert count(dev, "dev-only") == 0
    assert channel_error(root_conn, lambda c: c.queue_declare("dev-only", passive=True)) == 404, \
        "a durable queue of vhost dev must not come back in vhost /"


# -- messages ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["kill", "sigint"])
def test_persistent_messages_in_a_durable_queue_survive_a_restart(make_durable_broker, how):
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.confirm_delivery()
    ch.queue_declare("pq", durable=True)
    ch.queue_declare("tq", durable=False)

    def props(i):
        return pika.BasicProperties(delivery_mode=2, content_type="text/plain",
                                    correlation_id=f"c-{i}", headers={"n": i, "flag": i % 2 == 0})

    for i in range(10):
        ch.basic_publish("", "pq", f"p{i}".encode(), props(i))
        ch.basic_publish("", "pq", f"t{i}".encode(), TRANSIENT)
        ch.basic_publish("", "pq", f"u{i}".encode())  # no delivery_mode: transient
        ch.basic_publish("", "tq", f"n{i}".encode(), PERSISTENT)
    assert count(ch, "pq") == 30
    assert b.amqp_dirs(), f"nothing stored under {b.data_dir / 'queues'}"
    b.restart(how)  # SIGKILL right after the last confirm, or SIGINT

    conn = b.connect()
    ch = conn.channel()
    assert count(ch, "pq") == 10, "only the persistent messages come back"
    got = take(ch, "pq", 10)
    assert bodies(got) == [f"p{i}".encode() for i in range(10)], "persistent messages, in order"
    assert all(m.redelivered for m, _, _ in got), "every recovered message is redelivered"
    for i, (m, p, _) in enumerate(got):
        assert (m.exchange, m.routing_key) == ("", "pq")
        assert (p.delivery_mode, p.content_type, p.correlation_id) == (2, "text/plain", f"c-{i}")
        assert p.headers == {"n": i, "flag": i % 2 == 0}, "the headers table comes back as sent"
    assert channel_error(conn, lambda c: c.queue_declare("tq", passive=True)) == 404, \
        "a non-durable queue (and its persistent messages) must not come back"


def test_unacknowledged_messages_come_back_acknowledged_ones_do_not(make_durable_broker):
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.confirm_delivery()
    ch.queue_declare("wq", durable=True)
    for i in range(10):
        ch.basic_publish("", "wq", f"m{i}".encode(), PERSISTENT)
    got = [ch.basic_get("wq", auto_ack=False) for _ in range(6)]
    assert [g[2] for g in got] == [f"m{i}".encode() for i in range(6)]
    ch.basic_ack(got[1][0].delivery_tag, multiple=True)        # m0, m1
    ch.basic_reject(got[2][0].delivery_tag, requeue=False)      # m2: dropped (no dead-letter exchange)
    ch.basic_nack(got[5][0].delivery_tag, requeue=True)         # m5: back in the queue
    # m3, m4 delivered and left unacknowledged; m6..m9 never delivered.
    time.sleep(ACK_SETTLE)
    b.restart("kill")

    ch = b.connect().channel()
    got = take(ch, "wq", 7, quiet=0.5)  # acknowledged (multiple) by take
    assert bodies(got) == [f"m{i}".encode() for i in range(3, 10)], \
        "m0-m2 were settled before the crash; m3-m9 come back in their order"
    assert all(m.redelivered for m, _, _ in got), "every recovered message is redelivered"
    # Acknowledged after the recovery: gone after the next crash too.
    time.sleep(ACK_SETTLE)
    b.restart("kill")
    ch = b.connect().channel()
    assert count(ch, "wq") == 0
    assert bodies(take(ch, "wq", 0, quiet=0.5)) == [], "acknowledged messages came back"


def test_priority_queue_order_survives_kill_9(make_durable_broker):
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.confirm_delivery()
    ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 5})
    sent = [(b"a", 1), (b"b", 5), (b"c", None), (b"d", 9), (b"e", 5), (b"f", 3)]
    for body, p in sent:
        ch.basic_publish("", "prio", body, pika.BasicProperties(delivery_mode=2, priority=p))
    b.restart("kill")
    ch = b.connect().channel()
    ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 5})
    got = take(ch, "prio", 6)
    # Highest first (9 counts as the queue's 5), arrival order within a priority, none as 0.
    assert bodies(got) == [b"b", b"d", b"e", b"f", b"a", b"c"]
    assert all(m.redelivered for m, _, _ in got)


def test_quorum_queues_keep_every_message_and_limit_deliveries(make_durable_broker):
    b = make_durable_broker()
    conn = b.connect()
    ch = conn.channel()
    q = {"x-queue-type": "quorum"}
    # As RabbitMQ: a quorum queue is durable, not exclusive, not auto-delete, no priorities.
    assert channel_error(conn, lambda c: c.queue_declare("qq", durable=False, arguments=q)) == 406
    assert channel_error(conn, lambda c: c.queue_declare("qq", durable=True, exclusive=True,
                                                          arguments=q)) == 406
    assert channel_error(conn, lambda c: c.queue_declare("qq", durable=True, auto_delete=True,
                                                          arguments=q)) == 406
    assert channel_error(conn, lambda c: c.queue_declare(
        "qq", durable=True, arguments={**q, "x-max-priority": 3})) == 406
    assert channel_error(conn, lambda c: c.queue_declare(
        "sq", durable=True, arguments={"x-queue-type": "stream"})) == 406
    ch.confirm_delivery()
    ch.queue_declare("dead", durable=True)
    args = {**q, "x-delivery-limit": 2, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dead"}
    ch.queue_declare("qq", durable=True, arguments=args)
    # Transient messages too: a quorum queue keeps every message.
    for i in range(5):
        ch.basic_publish("", "qq", f"q{i}".encode(), pika.BasicProperties(delivery_mode=1))
    b.restart("kill")

    ch = b.connect().channel()
    ch.queue_declare("qq", durable=True, arguments=args)
    assert count(ch, "qq") == 5, "a quorum queue's transient messages survive kill -9"
    # q0 given back three times: the third return passes the limit of 2 and dead-letters it.
    # The count survives kill -9 after the second return (it is written with the acks).
    counts = []
    for i in range(3):
        if i == 2:
            time.sleep(ACK_SETTLE)
            b.restart("kill")
            ch = b.connect().channel()
        m, p, body = ch.basic_get("qq", auto_ack=False)
        assert body == b"q0"
        counts.append(header(p, "x-delivery-count"))
        ch.basic_nack(m.delivery_tag, requeue=True)
    assert counts == [None, 1, 2], "x-delivery-count counts the returns, across a restart"
    got = take(ch, "dead", 1)
    assert bodies(got) == [b"q0"]
    assert header(got[0][1], "x-first-death-reason") == "delivery_limit"
    assert bodies(take(ch, "qq", 4)) == [b"q1", b"q2", b"q3", b"q4"]


def test_purge_and_delete_are_durable(make_durable_broker):
    b = make_durable_broker()
    conn = b.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for q in ("purged", "deleted", "kept", "again"):
        ch.queue_declare(q, durable=True)
        for i in range(5):
            ch.basic_publish("", q, f"{q}-{i}".encode(), PERSISTENT)
    assert ch.queue_purge("purged").method.message_count == 5
    ch.queue_delete("deleted")
    # Deleted and declared again: another queue, without the first one's messages.
    ch.queue_delete("again")
    ch.queue_declare("again", durable=True)
    ch.basic_publish("", "again", b"again-new", PERSISTENT)
    time.sleep(ACK_SETTLE)  # purged messages are settled like acknowledged ones
    b.restart("kill")

    conn = b.connect()
    ch = conn.channel()
    assert count(ch, "purged") == 0, "a purged queue must be empty after the restart"
    assert bodies(take(ch, "purged", 0, quiet=0.5)) == []
    assert channel_error(conn, lambda c: c.queue_declare("deleted", passive=True)) == 404, \
        "a deleted durable queue must not come back"
    assert bodies(take(ch, "again", 1, quiet=0.5)) == [b"again-new"], \
        "a queue declared again after a delete must not get the deleted one's messages"
    assert bodies(take(ch, "kept", 5)) == [f"kept-{i}".encode() for i in range(5)]


def test_bindings_are_as_they_were_before_kill_9(make_durable_broker):
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.exchange_declare("bx", "direct", durable=True)
    ch.exchange_declare("gone-x", "fanout", durable=True)
    ch.queue_declare("bq", durable=True)
    for k in ("k1", "k2", "k3"):
        ch.queue_bind("bq", "bx", k)
    ch.queue_unbind("bq", "bx", "k2")
    ch.queue_bind("bq", "amq.topic", "t.#")
    ch.queue_bind("bq", "amq.topic", "u.#")
    ch.queue_unbind("bq", "amq.topic", "u.#")
    ch.queue_bind("bq", "gone-x")
    ch.exchange_delete("gone-x")  # its bindings go with it
    b.restart("kill")  # SIGKILL right after the bind-ok / unbind-ok / delete-ok frames

    conn = b.connect()
    ch = conn.channel()
    assert channel_error(conn, lambda c: c.exchange_declare("gone-x", passive=True)) == 404, \
        "a deleted durable exchange must not come back"
    ch.exchange_declare("bx", "direct", durable=True)
    ch.exchange_declare("gone-x", "fanout", durable=True)  # a new one: no bindings
    ch.confirm_delivery()
    for x, k in [("bx", "k1"), ("bx", "k2"), ("bx", "k3"), ("amq.topic", "t.1"),
                 ("amq.topic", "u.1"), ("gone-x", "")]:
        ch.basic_publish(x, k, f"{x}:{k}".encode(), PERSISTENT)
    got = take(ch, "bq", 3, quiet=0.5)
    assert bodies(got) == [b"bx:k1", b"bx:k3", b"amq.topic:t.1"], \
        "bq must have the bindings k1, k3 and t.# only (k2 and u.# unbound, gone-x deleted)"


def test_exchange_to_exchange_bindings_between_durable_exchanges_survive_kill_9(
        make_durable_broker):
    """An exchange binding between two durable exchanges is kept (and its unbind, and the
    delete of an exchange at one end); one with a transient end is not, as in RabbitMQ."""
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.exchange_declare("e-src", "topic", durable=True)
    ch.exchange_declare("e-mid", "fanout", durable=True)
    ch.exchange_declare("e-dst", "direct", durable=True)
    ch.exchange_declare("e-gone", "fanout", durable=True)
    ch.exchange_declare("e-tmp", "fanout", durable=False)
    ch.exchange_bind("e-mid", "e-src", "a.#")
    ch.exchange_bind("e-dst", "e-mid")
    ch.exchange_bind("e-dst", "e-src", "b.*")
    ch.exchange_unbind("e-dst", "e-src", "b.*")
    ch.exchange_bind("e-dst", "e-gone")
    ch.exchange_delete("e-gone")
    ch.exchange_bind("e-dst", "e-tmp")
    ch.queue_declare("e-q", durable=True)
    ch.queue_bind("e-q", "e-dst", "a.x")
    ch.queue_bind("e-q", "e-dst", "b.x")
    b.restart("kill")

    conn = b.connect()
    ch = conn.channel()
    ch.exchange_declare("e-gone", "fanout", durable=True)  # a new one: no bindings
    ch.exchange_declare("e-tmp", "fanout", durable=False)  # a new one too
    ch.confirm_delivery()
    for x, k in [("e-src", "a.x"), ("e-src", "a.y"), ("e-src", "b.x"), ("e-gone", "a.x"),
                 ("e-tmp", "a.x"), ("e-mid", "b.x")]:
        ch.basic_publish(x, k, f"{x}:{k}".encode(), PERSISTENT)
    got = take(ch, "e-q", 2, quiet=0.5)
    assert bodies(got) == [b"e-src:a.x", b"e-mid:b.x"], \
        "e-src -a.#-> e-mid -> e-dst must be back; the unbound b.*, the deleted e-gone's " \
        "and the transient e-tmp's bindings must not"


def test_without_a_data_directory_durable_queues_are_in_memory_only(make_durable_broker):
    b = make_durable_broker(data=False)
    conn = b.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("dx", "topic", durable=True)
    ch.queue_declare("dq", durable=True)
    ch.basic_publish("", "dq", b"kept-in-memory", PERSISTENT)
    # Served as before, from memory.
    assert bodies(take(ch, "dq", 1, ack=False)) == [b"kept-in-memory"]
    b.restart("kill")
    conn = b.connect()
    assert channel_error(conn, lambda c: c.queue_declare("dq", passive=True)) == 404
    assert channel_error(conn, lambda c: c.exchange_declare("dx", passive=True)) == 404
    written = [p for p in b.tmp.rglob("*") if p.name in ("amqp", "queues", "meta", "hayate-data")]
    assert not written, f"nothing may be written without a data directory: {written}"


# -- MQTT and STOMP publishers -----------------------------------------------------------------

def test_mqtt_qos_1_2_and_stomp_persistent_sends_survive_kill_9(make_durable_broker):
    from helpers import MqttClient
    from stomphelpers import StompClient

    b = make_durable_broker(mqtt=True, stomp=True)
    ch = b.connect().channel()
    ch.queue_declare("xq", durable=True)
    ch.queue_bind("xq", "amq.topic", "d.x")   # MQTT topic d/x
    ch.queue_bind("xq", "amq.topic", "d.y")   # STOMP /topic/d/y (as test_amqp.py's cross-protocol test)
    m = MqttClient(SimpleNamespace(host="127.0.0.1", port=b.ports["mqtt"], ws_port=None), version=5)
    s = StompClient(SimpleNamespace(host="127.0.0.1", port=b.ports["stomp"], login=None, passcode=None))
    try:
        m.connect()
        s.connect()
        m.publish("d/x", b"mqtt-qos1", qos=1, timeout=15)       # waits for the PUBACK
        m.publish("d/x", b"mqtt-qos0", qos=0, wait=False)       # transient
        m.publish("d/x", b"mqtt-qos2", qos=2, timeout=15)       # waits for the PUBCOMP
        s.send("/topic/d/y", b"stomp-persistent", headers={"persistent": "true"}, sync=True)
        s.send("/topic/d/y", b"stomp-transient", sync=True)     # waits for the RECEIPT
        assert wait_count(ch, "xq", 5) == 5, "all five must have reached the queue before the kill"
        b.restart("kill")
    finally:
        m.close()
        s.close()
    ch = b.connect().channel()
    got = take(ch, "xq", 3, quiet=0.5)
    assert [(mm.routing_key, body) for mm, _, body in got] == [
        ("d.x", b"mqtt-qos1"), ("d.x", b"mqtt-qos2"), ("d.y", b"stomp-persistent")], \
        "MQTT QoS 1/2 and STOMP persistent:true survive, in order; QoS 0 and STOMP without it do not"
    assert all(mm.exchange == "amq.topic" and mm.redelivered for mm, _, _ in got)


# -- crash loop --------------------------------------------------------------------------------

# The broker refused something: a test failure, not an effect of the kill.
REFUSALS = (pika.exceptions.NackError, pika.exceptions.UnroutableError,
            pika.exceptions.ChannelClosedByBroker, pika.exceptions.ConnectionClosedByBroker)


class ConfirmingPublisher(threading.Thread):
    """Publishes the persistent messages `first`, `first + 1`, ... to the durable queue, each
    waiting for its confirm, until the connection is lost; `next` is then the last confirmed
    number + 1."""

    def __init__(self, port: int, queue: str, first: int):
        super().__init__(daemon=True)
        self.port, self.queue, self.next = port, queue, first
        self.confirmed: list[int] = []
        self.started_confirming = threading.Event()
        self.ended_by: BaseException | None = None

    def run(self):
        conn = None
        try:
            conn = pika.BlockingConnection(params(self.port))
            ch = conn.channel()
            ch.confirm_delivery()
            ch.queue_declare(self.queue, durable=True)  # declared again after every restart
            while True:
                n = self.next
                ch.basic_publish("", self.queue, str(n).encode(), PERSISTENT, mandatory=True)
                self.confirmed.append(n)
                self.next = n + 1
                self.started_confirming.set()
        except BaseException as e:  # noqa: BLE001 - ended by the kill, or a refusal
            self.ended_by = e
        finally:
            self.started_confirming.set()
            if conn is not None:
                close_quietly(conn)


def test_confirmed_persistent_messages_survive_repeated_kill_9(make_durable_broker):
    b = make_durable_broker()
    queue = "crashq"
    confirmed: list[int] = []
    next_n = 0
    rnd = random.Random(KILLS)
    for k in range(KILLS):
        pub = ConfirmingPublisher(b.ports["amqp"], queue, next_n)
        pub.start()
        assert pub.started_confirming.wait(20) and pub.confirmed, \
            f"run {k + 1}: nothing confirmed within 20 s: {pub.ended_by!r}"
        time.sleep(rnd.uniform(0.2, 0.6))
        assert b.alive(), f"the broker died on its own in run {k + 1}:\n{tail(b.log)}"
        b.kill()  # SIGKILL while messages are in flight
        pub.join(15)
        assert not pub.is_alive(), f"run {k + 1}: the publisher hangs after the kill"
        assert not isinstance(pub.ended_by, REFUSALS), f"run {k + 1}: the broker refused: {pub.ended_by!r}"
        confirmed += pub.confirmed
        next_n = pub.next
        b.start()
    want = set(confirmed)
    assert len(want) == len(confirmed)

    ch = b.connect().channel()
    ch.basic_qos(prefetch_count=1000)
    got: dict[int, int] = {}
    not_redelivered = 0
    last = time.monotonic()
    deadline = last + 60 + len(want) / 500
    for m, _, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.2):
        now = time.monotonic()
        if m is not None:
            n = int(body)
            got[n] = got.get(n, 0) + 1
            not_redelivered += not m.redelivered
            last = now
        if now > deadline or now - last > (0.5 if want <= got.keys() else 3.0):
            break
    ch.cancel()
    lost = sorted(want - got.keys())
    dups = sum(c - 1 for c in got.values())
    print(f"amqp durable crash test: {KILLS} kills, {len(want)} confirmed, {len(lost)} lost, "
          f"{dups} duplicates, {len(got)} distinct received")
    assert not lost, f"{len(lost)} confirmed messages lost: {lost[:10]}"
    assert not_redelivered == 0, f"{not_redelivered} recovered messages without redelivered"


# -- hostile clients ---------------------------------------------------------------------------

def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def test_garbage_arguments_get_406_and_the_broker_carries_on(make_durable_broker):
    b = make_durable_broker()
    conn = b.connect()
    for args in ({"x-queue-type": "quorum", "x-delivery-limit": "abc"},
                 {"x-queue-type": "quorum", "x-delivery-limit": -1},
                 {"x-queue-type": 5},
                 {"x-queue-type": "stream"}):
        assert channel_error(conn, lambda c: c.queue_declare("bad", durable=True,
                                                              arguments=args)) == 406, args
    # Nothing of it was kept; the connection and the broker serve on.
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("good", durable=True)
    ch.basic_publish("", "good", b"ok", PERSISTENT)
    b.restart("kill")
    ch = b.connect().channel()
    assert channel_error(b.connect(), lambda c: c.queue_declare("bad", passive=True)) == 404
    assert bodies(take(ch, "good", 1)) == [b"ok"]


def test_churning_durable_queues_keeps_the_definitions_small(make_durable_broker):
    """A client that declares and deletes durable queues as fast as it can: each change is
    a record of the meta log, compacted as it grows, so the meta log stays within twice
    what is kept plus its 1 MiB of slack (and a segment being written); another client's
    persistent messages flow meanwhile; after kill -9 the churned queues are gone and the
    kept one is there."""
    b = make_durable_broker()
    ch = b.connect().channel()
    ch.confirm_delivery()
    ch.queue_declare("kept", durable=True)
    churn = b.connect().channel()
    for i in range(1500):
        churn.queue_declare(f"churn-{i}", durable=True, arguments={"x-max-length": i})
        churn.queue_bind(f"churn-{i}", "amq.topic", f"c.{i}")
        churn.queue_delete(f"churn-{i}")
        if i % 100 == 0:
            ch.basic_publish("", "kept", f"k{i // 100}".encode(), PERSISTENT)
    time.sleep(ACK_SETTLE)
    size = sum(f.stat().st_size for f in (b.data_dir / "meta").iterdir() if f.is_file())
    print(f"meta log: {size} B after 4,500 changes")
    assert size < 2 << 20, f"the meta log takes {size} bytes after 4,500 changes"
    b.restart("kill")
    conn = b.connect()
    assert channel_error(conn, lambda c: c.queue_declare("churn-7", passive=True)) == 404
    got = take(conn.channel(), "kept", 15)
    assert bodies(got) == [f"k{i}".encode() for i in range(15)]


def test_a_consumer_that_never_reads_holds_back_no_publisher(make_durable_broker):
    """A durable queue bounded by x-max-length-bytes has a consumer that never reads its
    socket. A publisher with confirms sends 24 MB of persistent messages into it and as
    much into another durable queue read normally: every publish is confirmed, the reader
    gets all of its queue, and the bounded queue keeps its bound. (The disk the stuck
    consumer's unacknowledged messages would pin: the next test.)"""
    b = make_durable_broker()
    setup = b.connect().channel()
    setup.queue_declare("stuck", durable=True, arguments={"x-max-length-bytes": 4 << 20})
    setup.queue_declare("read", durable=True)
    sleeper = b.connect()
    sc = sleeper.channel()
    sc.basic_consume("stuck", lambda *a: None, auto_ack=False)  # never processed: never read
    pub = b.connect().channel()
    pub.confirm_delivery()  # each publish below raises if it is not confirmed
    body = b"x" * (16 << 10)
    n = 1500
    reader = b.connect().channel()
    for i in range(n):
        pub.basic_publish("", "stuck", body, PERSISTENT)
        pub.basic_publish("", "read", body, PERSISTENT)
    got = take(reader, "read", n, timeout=60)
    assert len(got) == n
    ready = count(setup, "stuck")
    assert ready * len(body) <= 4 << 20, f"{ready} messages wait in a queue bounded to 4 MiB"
    assert b.alive()


def log_bytes(b: DurableBroker) -> int:
    """Bytes in the queue stores' logs (every virtual host) under the data directory."""
    return sum(f.stat().st_size for f in (b.data_dir / "queues").glob("*/*") if f.is_file())


def test_a_message_held_unacknowledged_does_not_pin_the_disk(make_durable_broker):
    """One persistent message is taken and never acknowledged while 150 MB of others go
    through the same virtual host and are acknowledged. The store moves the held record to
    the log's end so the old segments can go: the log stays within twice what is held plus
    48 MiB (docs/amqp.md, *Durable queues*), where before it kept all 150 MB. After
    `kill -9` the held message comes back exactly once, redelivered, and nothing else."""
    b = make_durable_broker()
    holder = b.connect().channel()
    holder.queue_declare("held", durable=True)
    holder.confirm_delivery()
    holder.basic_publish("", "held", b"the held one", PERSISTENT)
    m, _, body = holder.basic_get("held", auto_ack=False)
    assert body == b"the held one"  # and never acknowledged
    pub = b.connect().channel()
    pub.queue_declare("flow", durable=True)
    pub.confirm_delivery()
    reader = b.connect().channel()
    chunk = b"y" * (128 << 10)
    most = 0
    for _ in range(6):
        for _ in range(200):
            pub.basic_publish("", "flow", chunk, PERSISTENT)
        assert len(take(reader, "flow", 200, timeout=60, quiet=0.05)) == 200
        time.sleep(0.3)  # the store's flush: acknowledgements written, the log compacted
        most = max(most, log_bytes(b))
    time.sleep(ACK_SETTLE)
    end = log_bytes(b)
    print(f"log: peak {most} B, end {end} B")
    assert most < 100 << 20 and end < 64 << 20, \
        f"the log peaked at {most} B and ends at {end} B after 157 MB went through"
    b.restart("kill")
    ch = b.connect().channel()
    got = take(ch, "held", 1, quiet=0.5)
    assert bodies(got) == [b"the held one"] and got[0][0].redelivered
    assert count(ch, "flow") == 0


def test_kill_9_while_held_messages_are_moved_loses_and_duplicates_nothing(make_durable_broker):
    """Twenty persistent messages are held unacknowledged while a flow of 128 KiB messages
    goes through the same vhost (published with confirms, taken with auto-ack), so the
    store keeps moving the held records to the log's end; the broker is SIGKILLed at a
    random moment of each round. After every restart the twenty are there exactly once,
    in their order, redelivered."""
    b = make_durable_broker()
    setup = b.connect().channel()
    setup.confirm_delivery()
    setup.queue_declare("held", durable=True)
    setup.queue_declare("flow", durable=True)
    want = [f"held-{i}".encode() for i in range(20)]
    for body in want:
        setup.basic_publish("", "held", body, PERSISTENT)
    holder = b.connect().channel()
    assert [holder.basic_get("held", auto_ack=False)[2] for _ in want] == want
    rnd = random.Random(20)
    chunk = b"z" * (128 << 10)
    for k in range(max(KILLS, 3)):
        stop = threading.Event()
        moved = [0]

        def flow(port=b.ports["amqp"]):
            try:
                c = pika.BlockingConnection(params(port))
                ch = c.channel()
                ch.confirm_delivery()
                while not stop.is_set():
                    ch.basic_publish("", "flow", chunk, PERSISTENT)
                    ch.basic_get("flow", auto_ack=True)
                    moved[0] += len(chunk)
            except Exception:  # noqa: BLE001 - the broker was killed under it
                pass

        t = threading.Thread(target=flow, daemon=True)
        t.start()
        time.sleep(rnd.uniform(1.0, 2.5))
        assert b.alive(), f"round {k + 1}: the broker died on its own:\n{tail(b.log)}"
        b.kill()
        stop.set()
        t.join(15)
        b.start()
        ch = b.connect().channel()
        assert count(ch, "held") == len(want), f"round {k + 1} ({moved[0]} B of flow)"
        got = [ch.basic_get("held", auto_ack=False) for _ in want]
        assert [g[2] for g in got] == want, f"round {k + 1}: out of order or changed"
        assert all(g[0].redelivered for g in got)
        print(f"round {k + 1}: {moved[0] >> 20} MiB of flow, log {log_bytes(b) >> 20} MiB")
        # Held again, unacknowledged, for the next round.
    assert log_bytes(b) < 128 << 20, "the log kept the flow (compaction did not run)"


def test_a_confirming_publisher_that_never_reads_holds_nothing_up(make_durable_broker):
    """A raw client puts a channel in confirm mode and sends persistent messages as fast as
    it can into a durable queue bounded at 4 MiB with `reject-publish` (so most of them get
    a basic.nack of their own), and never reads a byte: the acks and nacks it is owed pile
    up on its side. For 5 s the broker's RSS stays within 96 MiB of where it started,
    another publisher with confirms and a consumer carry on, and the durable queue keeps
    its bound. (Measured: 127 MiB sent in 5 s, RSS +23 MiB; with HOSTILE_SECS=25, 157 MiB,
    RSS +25 MiB: once what it is owed fills its outbox it is no longer read.)"""
    from test_amqp import handshake, rss_kib

    b = make_durable_broker()
    setup = b.connect().channel()
    setup.queue_declare("sink", durable=True, arguments={
        "x-max-length-bytes": 4 << 20, "x-overflow": "reject-publish"})
    setup.queue_declare("fine", durable=True)
    s = socket.create_connection(("127.0.0.1", b.ports["amqp"]), timeout=5)
    handshake(s)

    def method(payload: bytes) -> bytes:
        return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"

    s.sendall(method(b"\x00\x14\x00\x0a\x00"))          # channel.open
    s.sendall(method(b"\x00\x55\x00\x0a\x00"))          # confirm.select
    body = b"p" * 200
    one = (method(b"\x00\x3c\x00\x28\x00\x00\x00\x04sink\x00")   # basic.publish "" "sink"
           # content header: class 60, size, delivery-mode present (0x1000) = 2
           + struct.pack(">BHI", 2, 1, 15) + struct.pack(">HHQH", 60, 0, len(body), 0x1000)
           + b"\x02\xce"
           + struct.pack(">BHI", 3, 1, len(body)) + body + b"\xce")
    burst = one * 64
    s.setblocking(False)
    pid = b.proc.pid
    start = rss_kib(pid)
    most = start
    sent = 0
    pub = b.connect().channel()
    pub.confirm_delivery()
    deadline = time.monotonic() + float(os.environ.get("HOSTILE_SECS", "5"))
    n = 0
    out = b""
    while time.monotonic() < deadline:
        if not out:
            out = burst
        try:
            k = s.send(out)  # possibly part of it: the rest goes first next time
            out = out[k:]
            sent += k
        except BlockingIOError:
            time.sleep(0.005)
        if n % 50 == 0:
            pub.basic_publish("", "fine", f"f{n}".encode(), PERSISTENT)  # raises if not confirmed
            most = max(most, rss_kib(pid))
        n += 1
    reader = b.connect().channel()  # (pika's idle connections would miss heartbeats above)
    got = take(reader, "fine", len(range(0, n, 50)), timeout=30)
    assert len(got) == len(range(0, n, 50)), "the well-behaved pair lost messages"
    assert b.alive()
    assert (most - start) < 96 << 10, f"RSS grew {most - start} KiB ({sent >> 20} MiB sent)"
    assert count(reader, "sink") * len(body) <= 4 << 20
    print(f"never-reading confirming publisher: {sent >> 20} MiB sent, RSS +{(most - start) >> 10} MiB")
    s.close()
