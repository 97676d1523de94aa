"""Hayate only: `kill -9` of the broker, K times, while third-party clients publish and wait
for acknowledgements; afterwards every acknowledged message is delivered at least once (0
lost), duplicates are counted and printed.

- MQTT (paho-mqtt), the default configuration (no stream): a publisher sends QoS 1 messages
  with up to 32 unacknowledged; one persistent subscriber stays offline the whole run (its
  messages wait in the broker), another is online, reconnecting after every restart. Their
  subscriptions were SUBACKed once, before the first kill.
- STOMP (stomp.py): a publisher SENDs to a /queue/ that a stream captures, each with a
  receipt; a client-individual subscriber then receives and acknowledges everything.
- Every protocol at once (issue 45's crash bar; the clients are in crashall.py): AMQP
  confirms and acks, MQTT QoS 1 and QoS 2 persistent sessions on both sides, STOMP receipts
  and client-individual acks, native confirms and a durable consumer, all on one broker
  killed at random moments; 0 lost and no duplicate of a settled acknowledgement.

Short by default (CI): CRASH_KILLS=5. The long run is `scripts/crash-test` (CRASH_KILLS=100,
after the native-protocol crash test). CRASH_MESSAGES (90,000) caps the messages of the whole
run (spread evenly over the runs of the broker), for MQTT and for STOMP."""

import os
import random
import threading
import time

import paho.mqtt.client as paho
import pytest
import stomp as stomppy
from paho.mqtt.enums import CallbackAPIVersion

from conftest import tail
from helpers import unique

pytestmark = pytest.mark.hayate_only

KILLS = int(os.environ.get("CRASH_KILLS", "5"))
# Messages per run of the broker at most: the offline subscriber's queue must hold them all
# (mqtt.max_queued_messages is 100,000).
PER_RUN = int(os.environ.get("CRASH_MESSAGES", "90000")) // KILLS


class Publisher:
    """A paho QoS 1 publisher on one run of the broker, with a window of unacknowledged
    messages; `acked` gets each payload whose PUBACK came."""

    def __init__(self, host, port, topic, version, acked: set, counter, window=32):
        self.topic, self.acked, self.counter, self.window = topic, acked, counter, window
        self.left = PER_RUN
        self.stop = threading.Event()
        proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=unique("pub"), protocol=proto,
                             reconnect_on_failure=False)
        self.c.on_disconnect = lambda *a: self.stop.set()
        self.c.connect(host, port, 30)
        self.c.loop_start()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _collect(self, pending):
        still = []
        for info, p in pending:
            if info.is_published():
                self.acked.add(p)
            else:
                still.append((info, p))
        return still

    def _run(self):
        pending = []
        while not self.stop.is_set():
            pending = self._collect(pending)
            if len(pending) >= self.window or self.left == 0:
                time.sleep(0.001)
                continue
            self.left -= 1
            p = f"m{next(self.counter)}".encode()
            info = self.c.publish(self.topic, p, qos=1)
            if info.rc != paho.MQTT_ERR_SUCCESS:
                time.sleep(0.01)
                continue
            pending.append((info, p))
        self._collect(pending)

    def close(self):
        self.stop.set()
        self.t.join(5)
        self.c.loop_stop()
        try:
            self.c.socket() and self.c.socket().close()
        except Exception:
            pass


class Subscriber:
    """A persistent-session subscriber; `got` counts every payload received."""

    def __init__(self, cid, version, got: dict):
        self.cid, self.version, self.got = cid, version, got
        self.c = None
        self.lock = threading.Lock()
        self.last = time.monotonic()

    def connect(self, host, port, topic=None):
        proto = paho.MQTTv5 if self.version == 5 else paho.MQTTv311
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.cid, protocol=proto,
                        clean_session=None if self.version == 5 else False,
                        reconnect_on_failure=False)
        c.on_message = self._on_message
        done = threading.Event()
        res = {}

        def on_connect(client, userdata, flags, rc, properties):
            res["present"] = bool(flags.session_present)
            res["rc"] = rc
            done.set()
        c.on_connect = on_connect
        kw = {}
        if self.version == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties
            pr = Properties(PacketTypes.CONNECT)
            pr.SessionExpiryInterval = 3600
            kw = {"clean_start": False, "properties": pr}
        c.connect(host, port, 30, **kw)
        c.loop_start()
        assert done.wait(10), "no CONNACK"
        assert not res["rc"].is_failure, res["rc"]
        if topic is not None:
            subacked = threading.Event()
            c.on_subscribe = lambda *a: subacked.set()
            c.subscribe(topic, qos=1)
            assert subacked.wait(10), "no SUBACK"
        self.c = c
        return res["present"]

    def _on_message(self, client, userdata, m):
        with self.lock:
            self.got[m.payload] = self.got.get(m.payload, 0) + 1
            self.last = time.monotonic()

    def close(self):
        if self.c is not None:
            self.c.loop_stop()
            try:
                self.c.socket() and self.c.socket().close()
            except Exception:
                pass
            self.c = None

    def drain(self, quiet=1.0, limit=60.0):
        """Waits until nothing arrived for `quiet` seconds."""
        end = time.monotonic() + limit
        while time.monotonic() < end:
            time.sleep(0.2)
            with self.lock:
                if time.monotonic() - self.last > quiet:
                    return


def report(what, acked, got):
    lost = sorted(acked - set(got))
    dups = sum(n - 1 for n in got.values() if n > 1)
    print(f"crash test {what}: {KILLS} kills, {len(acked)} acknowledged, {len(lost)} lost, "
          f"{dups} duplicates, {len(set(got))} distinct received")
    return lost


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_mqtt_qos1_acknowledged_messages_survive_repeated_kill_9(make_broker, version):
    b = make_broker()
    topic = unique("crash") + "/t"
    acked: set = set()
    counter = iter(range(10**9))
    offline_got: dict = {}
    online_got: dict = {}
    offline = Subscriber(unique("off"), version, offline_got)
    online = Subscriber(unique("on"), version, online_got)
    offline.connect(b.host, b.port, topic)
    offline.close()  # stays offline: everything waits for it in the broker
    online.connect(b.host, b.port, topic)
    rnd = random.Random(KILLS)
    for k in range(KILLS):
        pub = Publisher(b.host, b.port, topic, version, acked, counter)
        time.sleep(rnd.uniform(0.2, 0.6))
        b.stop(graceful=False)  # SIGKILL while messages are in flight
        pub.close()
        online.close()
        b.start()
        assert online.connect(b.host, b.port) is True, f"the session was lost at kill {k + 1}"
    assert acked, "nothing was acknowledged"
    assert offline.connect(b.host, b.port) is True, "the offline session was lost"
    offline.drain()
    online.drain()
    lost_off = report(f"mqtt v{version} offline subscriber", acked, offline_got)
    lost_on = report(f"mqtt v{version} online subscriber", acked, online_got)
    offline.close()
    online.close()
    assert not lost_off, f"{len(lost_off)} acknowledged messages lost (offline): {lost_off[:10]}"
    assert not lost_on, f"{len(lost_on)} acknowledged messages lost (online): {lost_on[:10]}"


class StompPublisher(stomppy.ConnectionListener):
    """SENDs with receipts (up to 32 outstanding); `acked` gets each body whose RECEIPT came."""

    def __init__(self, host, port, dest, acked: set, counter, window=32):
        self.dest, self.acked, self.counter = dest, acked, counter
        self.left = PER_RUN
        self.sem = threading.Semaphore(window)
        self.stop = threading.Event()
        self.pending = {}
        self.lock = threading.Lock()
        self.c = stomppy.Connection12([(host, port)], reconnect_attempts_max=1)
        self.c.set_listener("p", self)
        self.c.connect(wait=True)
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def on_receipt(self, frame):
        with self.lock:
            body = self.pending.pop(frame.headers.get("receipt-id"), None)
        if body is not None:
            self.acked.add(body)
        self.sem.release()

    def on_disconnected(self):
        self.stop.set()

    def _run(self):
        while not self.stop.is_set():
            if self.left == 0:
                time.sleep(0.01)
                continue
            if not self.sem.acquire(timeout=0.1):
                continue
            self.left -= 1
            n = next(self.counter)
            body = f"s{n}".encode()
            with self.lock:
                self.pending[f"r{n}"] = body
            try:
                self.c.send(self.dest, body, headers={"receipt": f"r{n}"})
            except Exception:
                self.stop.set()

    def close(self):
        self.stop.set()
        self.t.join(5)
        try:
            self.c.disconnect()
        except Exception:
            pass


def test_stomp_receipted_sends_survive_repeated_kill_9(make_stomp_server, stomp):
    import subprocess
    from conftest import StompServer
    server = make_stomp_server()
    b = server.broker
    base = unique("sc")
    r = subprocess.run([str(b.bin), "stream", "add", "crashq", "--capture", f"{base}/**",
                        "--server", f"127.0.0.1:{b.native_port}"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0, r.stderr
    dest = f"/queue/{base}/jobs"
    acked: set = set()
    counter = iter(range(10**9))
    rnd = random.Random(KILLS + 1)
    for _ in range(KILLS):
        pub = StompPublisher(b.host, b.stomp_port, dest, acked, counter)
        time.sleep(rnd.uniform(0.2, 0.6))
        b.stop(graceful=False)
        pub.close()
        b.start()
    assert acked, "nothing was receipted"
    c = stomp(StompServer("hayate", b.host, b.stomp_port, broker=b))
    sid = c.subscribe(dest, ack="client-individual")
    got: dict = {}
    last = time.monotonic()
    # stomp.py receives and acknowledges a few thousand messages a second.
    end = time.monotonic() + 60 + len(acked) / 1000
    seen = 0
    while time.monotonic() < end:
        time.sleep(0.2)
        msgs = c.received(sub=sid)
        for m in msgs[seen:]:
            got[m.body] = got.get(m.body, 0) + 1
            c.ack(m)
        if len(msgs) > seen:
            seen = len(msgs)
            last = time.monotonic()
        elif time.monotonic() - last > 1.5:
            break
    lost = report("stomp client-individual", acked, got)
    assert not lost, f"{len(lost)} receipted messages lost: {lost[:10]}"


def test_every_protocol_at_once_survives_repeated_kill_9(tmp_path):
    """The crash bar of issue 45: one broker (fixed ports, one data directory) serves at once
    a pika publisher with confirms to a durable AMQP queue and a pika consumer with manual
    acks; paho QoS 1 (3.1.1) and QoS 2 (5.0) publishers and subscribers, all with persistent
    sessions; stomp.py SENDs with receipts to a durable /queue/ (a stream captures it) read
    with client-individual acks; a native publisher with confirms to a stream and a native
    durable consumer acking. The broker is killed with SIGKILL at a random moment of each run
    (CRASH_KILLS runs) and started again; the clients reconnect and send again what was not
    confirmed. Then everything is drained. Per protocol: every confirmed message received, and
    each duplicate has a cause (crashall.py: a resend, or a kill while it was not yet
    acknowledged, or acknowledged less than CRASH_SETTLE seconds before)."""
    import logging

    import crashall
    for name in ("pika", "stomp.py"):  # every kill makes them log a traceback per connection
        logging.getLogger(name).setLevel(logging.CRITICAL)
    b = crashall.CrashBroker(tmp_path).start()
    workers = []
    try:
        books, workers = crashall.make_clients(b, unique("all"))
        rnd = random.Random(KILLS + 2)
        kills: list[tuple[float, float]] = []
        for _ in range(KILLS):
            crashall.run_and_kill(b, workers, rnd.uniform(0.4, 1.2), kills)
        took = crashall.drain(b, workers, books)
    except BaseException:
        print(f"--- broker log (run {b.runs}) ---\n{tail(b.log, 60)}")
        raise
    finally:
        b.kill()
        for w in workers:
            if isinstance(w, crashall.Paho):
                w.close()
    failures = [f for w in workers for f in w.failures]
    print(f"\ncrash test all protocols: {KILLS} kills, restarts {min(b.starts):.2f}-"
          f"{max(b.starts):.2f} s, drained in {took:.1f} s, acknowledgement settle {crashall.SETTLE} s")
    problems = []
    for proto, book in books.items():
        r = book.check(kills)
        c = r["causes"]
        print(f"crash test {proto}: kills {KILLS}, sent {r['sent']}, confirmed {r['confirmed']}, "
              f"received {r['received']}, lost {len(r['lost'])}, duplicates {r['duplicates']} "
              f"(resends {r['resends']}; duplicates of resent messages {c['resent']}, received "
              f"and not acknowledged at a kill {c['unacked']}, acknowledged less than "
              f"{crashall.SETTLE} s before a kill {c['doubt']}, without a cause {c['bad']}; the "
              f"oldest acknowledgement a kill undid: {r['ack_age'] * 1000:.0f} ms)")
        assert r["confirmed"] > 0, f"{proto}: nothing was confirmed"
        if r["lost"]:
            problems.append(f"{proto}: {len(r['lost'])} confirmed messages lost: {r['lost'][:10]}")
        for body, events, sends in r["bad"][:5]:
            problems.append(f"{proto}: {body!r} delivered again after its acknowledgement settled "
                            f"(sent {sends}x; events {events}; kills {kills})")
    assert not failures, f"client failures before a kill: {failures[:10]}"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_mqtt_retained_and_subscriptions_survive_kill_9(make_broker, mqtt, version):
    """Default configuration: a retained message PUBACKed, a subscription SUBACKed and an
    unsubscription UNSUBACKed right before SIGKILL are all there after the restart."""
    from helpers import persistent
    b = make_broker()
    base = unique("rk")
    p = mqtt(b, version=version)
    p.publish(f"{base}/r", b"kept", qos=1, retain=True)
    p.publish(f"{base}/gone", b"x", qos=1, retain=True)
    p.publish(f"{base}/gone", b"", qos=1, retain=True)  # clears it
    cid = unique("rks")
    s = mqtt(b, client_id=cid, version=version, **persistent(version))
    s.subscribe(f"{base}/a", qos=1)
    s.subscribe(f"{base}/b", qos=1)
    s.unsubscribe(f"{base}/b")
    time.sleep(0.2)  # the UNSUBACK (paho does not wait for it)
    s.drop()
    b.stop(graceful=False)  # SIGKILL at once: no checkpoint since
    b.start()
    again = mqtt(b, client_id=cid, version=version, **persistent(version))
    assert again.session_present is True
    p2 = mqtt(b, version=version)
    p2.publish(f"{base}/a", b"to-a", qos=1)
    p2.publish(f"{base}/b", b"to-b", qos=1)
    assert [m.payload for m in again.wait_messages(1)] == [b"to-a"]
    assert len(again.quiet(0.3)) == 1, "the unsubscribed filter must stay unsubscribed"
    r = mqtt(b, version=version)
    r.subscribe(f"{base}/#", qos=1)
    got = r.wait_messages(1)
    assert [(m.topic, m.payload, m.retain) for m in got] == [(f"{base}/r", b"kept", True)]
    assert len(r.quiet(0.3)) == 1


def test_mqtt_run_without_journal_in_between_is_not_replayed_over(make_broker, mqtt):
    """A run with `journal = false` between two with it: the old journal left in the data
    directory must not be replayed over what the run without it saved."""
    b = make_broker()
    base = unique("nj")
    p = mqtt(b)
    p.publish(f"{base}/t", b"v1", qos=1, retain=True)
    p.close()
    b.stop(graceful=True)
    b.settings["journal"] = False
    b._write_hayate_config()
    b.start()
    p = mqtt(b)
    p.publish(f"{base}/t", b"", qos=1, retain=True)  # cleared
    p.publish(f"{base}/u", b"v2", qos=1, retain=True)
    p.close()
    b.stop(graceful=True)
    del b.settings["journal"]
    b.config.write_text("")
    b.start()
    r = mqtt(b)
    r.subscribe(f"{base}/#", qos=1)
    got = r.wait_messages(1)
    assert [(m.topic, m.payload) for m in got] == [(f"{base}/u", b"v2")]
    assert len(r.quiet(0.3)) == 1, "the retained message cleared without the journal came back"


def _dir_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def test_mqtt_journal_stays_bounded_with_subscribers_that_never_read(make_broker, mqtt):
    """Hostile: 20 persistent sessions subscribe and never read or acknowledge while a
    publisher floods 64 KiB QoS 1 messages at them. Each session holds at most
    max_queued_bytes (1 MiB): what is held is journaled, what is dropped is not, so the data
    directory stays near 20 x 1 MiB; the publisher and another client carry on; after kill -9
    the held messages are still there."""
    import socket
    from mqttraw import RawClient, connect, subscribe
    b = make_broker(max_queued_bytes=1 << 20)
    base = unique("hog")
    hogs = []
    for i in range(20):
        r = RawClient(b.host, b.port)
        r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        r.send(connect(client_id=f"{base}-{i}", clean=False))
        assert r.recv_packet().type == 2  # CONNACK
        r.send(subscribe(f"{base}/t", qos=1))
        assert r.recv_packet().type == 9  # SUBACK
        hogs.append(r)  # never read again
    p = mqtt(b)
    payload = b"x" * 65536
    for _ in range(400):  # 25 MiB, to each of the 20 sessions
        p.publish(f"{base}/t", payload, qos=1, timeout=20)
    # Another client is served meanwhile.
    other = mqtt(b)
    other.subscribe(f"{base}/other", qos=1)
    p.publish(f"{base}/other", b"still here", qos=1)
    assert [m.payload for m in other.wait_messages(1)] == [b"still here"]
    size = _dir_bytes(b.data_dir)
    print(f"hostile: data directory {size / 2**20:.1f} MiB after 400 x 64 KiB to 20 stalled sessions")
    # 20 sessions x 1 MiB held, journaled once plus a checkpoint, plus the segment in use.
    assert size < 80 << 20, f"data directory grew to {size} bytes"
    b.stop(graceful=False)
    b.start()
    late = mqtt(b, client_id=f"{base}-0", **{"clean": False})
    assert late.session_present is True
    got = late.wait_messages(1)
    assert got[0].payload == payload
    for r in hogs:
        r.sock.close()
