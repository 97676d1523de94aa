"""Hostile clients on every listener at once, beside normal publishers and subscribers
(Hayate only): on the native, MQTT, MQTT-over-WebSocket, STOMP, AMQP and TLS listeners
(native, MQTT, STOMP and AMQP over TLS), connections
that send garbage, half frames with 4 GiB length prefixes (and the largest MQTT remaining
length), or trickle a handshake a byte at a time. Meanwhile a paho-mqtt pair, a stomp.py pair,
a pika pair and a native `hayate sub`/`hayate pub` pair move their messages: they lose nothing, every
hostile connection is closed within the handshake timeout (plus a margin), and the broker's
resident memory stays under a bound while it all happens."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from conftest import KIND, REPO, start_hayate, stop_process, tail

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's listeners and limits")

HAYATE = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))
HANDSHAKE_MS = 2000
PER_KIND = 15          # hostile connections of each kind per listener
BUDGET_MB = 256        # limits.memory_budget
RSS_LIMIT_MB = 300     # the broker's resident memory while under attack (debug build): the
                       # budget plus the process and per-connection buffers it does not count
MESSAGES = 2000


def rss_mb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


@pytest.fixture
def broker(tmp_path):
    d = tmp_path
    run = lambda *a: subprocess.run(["openssl", *a], cwd=d, check=True, capture_output=True)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=hostile CA")
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "s.key", "-out", "s.csr", "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", "s.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "s.pem",
        "-days", "2", "-extfile", "san.cnf")
    cfg = d / "hayate.toml"
    cfg.write_text(f"""
[server]
data_dir = ""
[admin]
listen = []
[native]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[mqtt]
listen = ["127.0.0.1:0"]
ws = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[amqp]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[stomp]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[tls]
cert = "{d / 's.pem'}"
key = "{d / 's.key'}"
[limits]
handshake_timeout_ms = {HANDSHAKE_MS}
memory_budget = {BUDGET_MB * 1024 * 1024}
""")
    log = d / "broker.log"
    proc, ports = start_hayate(HAYATE, cfg, log)
    yield proc, ports, d
    stop_process(proc, 10)


def hostile_payloads(kind: str) -> dict[str, bytes]:
    """What each kind of hostile connection sends first, per listener kind."""
    garbage = os.urandom(4096)
    half = {
        "native": b"\xff\xff\xff\xff\x01" + b"\x00" * 1000,              # 4 GiB frame
        "mqtt": b"\x10\xff\xff\xff\x7f" + b"\x00" * 1000,                 # 256 MiB CONNECT
        "stomp": b"CONNECT\ncontent-length:4294967295\n\n" + b"x" * 1000,
        "ws": b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n",  # never ends
        "tls": b"\x16\x03\x01\xff\xff\x01\x00\xff\xfb" + b"\x00" * 100,   # half ClientHello
        "amqp": b"AMQP\x00\x00\x09\x01" + b"\x01\x00\x00\xff\xff\xff\xff" + b"\x00" * 1000,  # 4 GiB frame
    }[kind]
    return {"garbage": garbage, "half": half}


class Hostile(threading.Thread):
    """One hostile connection: sends its bytes (or trickles), then waits for the close."""

    def __init__(self, port: int, first: bytes | None):
        super().__init__(daemon=True)
        self.port, self.first = port, first
        self.closed_after: float | None = None
        self.error: str | None = None

    def run(self):
        t0 = time.monotonic()
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
            s.settimeout(0.5)
            if self.first is not None:
                try:
                    s.sendall(self.first)
                except OSError:
                    pass
            while time.monotonic() - t0 < 30:
                if self.first is None:
                    try:
                        s.send(b"C")  # slowloris: a byte now and then
                    except OSError:
                        break
                try:
                    if s.recv(65536) == b"":
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            self.closed_after = time.monotonic() - t0
            s.close()
        except OSError as e:
            self.error = str(e)
            self.closed_after = time.monotonic() - t0


def test_hostile_clients_on_every_listener_while_normal_pairs_run(broker):
    proc, ports, d = broker
    listeners = {
        "native": ports["native protocol"],
        "mqtt": ports["mqtt"],
        "stomp": ports["stomp"],
        "ws": ports["mqtt over websocket"],
        "amqp": ports["amqp"],
        "tls": ports["native protocol over tls"],
        "tls-mqtt": ports["mqtt over tls"],
        "tls-stomp": ports["stomp over tls"],
        "tls-amqp": ports["amqp over tls"],
    }
    attackers = []
    for name, port in listeners.items():
        kind = "tls" if name.startswith("tls") else name
        for what, first in hostile_payloads(kind).items():
            attackers += [Hostile(port, first) for _ in range(PER_KIND)]
        attackers += [Hostile(port, None) for _ in range(PER_KIND)]
    peak = [rss_mb(proc.pid)]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for a in attackers:
        a.start()

    # Normal pairs, at the same time.
    # MQTT (paho, QoS 1).
    got_mqtt = []
    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id="good-sub", protocol=paho.MQTTv311)
    ready = threading.Event()
    sub.on_subscribe = lambda *a, **k: ready.set()
    sub.on_message = lambda c, u, m: got_mqtt.append(m.payload)
    sub.on_connect = lambda c, u, f, rc, p=None: c.subscribe("good/mqtt", qos=1)
    sub.connect("127.0.0.1", ports["mqtt"])
    sub.loop_start()
    assert ready.wait(10)
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="good-pub", protocol=paho.MQTTv311)
    pub.connect("127.0.0.1", ports["mqtt"])
    pub.loop_start()
    # STOMP (stomp.py, receipts).
    got_stomp = []

    class L(stomp.ConnectionListener):
        def on_message(self, frame):
            got_stomp.append(frame.body)

    sc = stomp.Connection([("127.0.0.1", ports["stomp"])], heartbeats=(0, 0))
    sc.set_listener("l", L())
    sc.connect(wait=True)
    sc.subscribe("/topic/good/stomp", id="1", ack="auto", headers={"receipt": "s"})
    time.sleep(0.3)
    # AMQP (pika, publisher confirms), on a thread of its own (pika's connection is not
    # shared across threads).
    got_amqp = []

    def amqp_pair():
        import pika
        params = pika.ConnectionParameters("127.0.0.1", ports["amqp"], connection_attempts=1,
                                           socket_timeout=10)
        pc = pika.BlockingConnection(params)
        ch = pc.channel()
        ch.confirm_delivery()
        q = ch.queue_declare(queue="", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "good.amqp")
        for i in range(MESSAGES // 4):
            ch.basic_publish("amq.topic", "good.amqp", b"a%d" % i)
        deadline = time.monotonic() + 20
        while len(got_amqp) < MESSAGES // 4 and time.monotonic() < deadline:
            m, _, body = ch.basic_get(q, auto_ack=True)
            if m is None:
                time.sleep(0.02)
            else:
                got_amqp.append(body)
        pc.close()

    amqp_thread = threading.Thread(target=amqp_pair, daemon=True)
    amqp_thread.start()
    # Native (the CLI).
    nsub = subprocess.Popen([str(HAYATE), "sub", "good/native", "--count", str(MESSAGES), "--server",
                             f"127.0.0.1:{ports['native protocol']}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(0.7)
    for i in range(MESSAGES):
        pub.publish("good/mqtt", b"m%d" % i, qos=1)
        if i % 4 == 0:
            sc.send("/topic/good/stomp", "s%d" % i)
    subprocess.run([str(HAYATE), "pub", "good/native", "n", "--count", str(MESSAGES), "--server",
                    f"127.0.0.1:{ports['native protocol']}"], check=True, timeout=60)
    out, err = nsub.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while (len(got_mqtt) < MESSAGES or len(got_stomp) < MESSAGES // 4) and time.monotonic() < deadline:
        time.sleep(0.05)
    amqp_thread.join(40)
    for a in attackers:
        a.join(40)
    stop.set()
    sampler.join(2)

    assert len(got_mqtt) == MESSAGES, f"paho got {len(got_mqtt)} of {MESSAGES}"
    assert sorted(got_mqtt, key=lambda b: int(b[1:])) == [b"m%d" % i for i in range(MESSAGES)]
    assert len(got_stomp) == MESSAGES // 4, f"stomp.py got {len(got_stomp)} of {MESSAGES // 4}"
    assert got_amqp == [b"a%d" % i for i in range(MESSAGES // 4)], f"pika got {len(got_amqp)}"
    assert out.count("\n") >= MESSAGES, (out[-200:], err[-500:])
    slow = [a.closed_after for a in attackers if a.closed_after is None or a.closed_after > HANDSHAKE_MS / 1000 + 3]
    assert not slow, f"{len(slow)} of {len(attackers)} hostile connections not closed in time: {slow[:10]}"
    assert proc.poll() is None, "the broker died"
    print(f"{len(attackers)} hostile connections, all closed within "
          f"{max(a.closed_after for a in attackers):.2f} s; broker peak RSS {peak[0]} MiB")
    assert peak[0] < RSS_LIMIT_MB, f"broker RSS {peak[0]} MiB"
    for c in (sub, pub):
        c.loop_stop()
        c.disconnect()
    sc.disconnect()
