"""The broker-wide memory budget against every case that once grew the broker without bound
(Hayate only). One broker with `limits.memory_budget` set; one after another, and each left in
place while the next runs:

- unauthenticated clients sending half of a 100 MiB MQTT CONNECT;
- offline persistent MQTT sessions (paho, clean_session=False) sent 64 KiB QoS 1 messages;
- STOMP queues without consumers sent 64 KiB messages (stomp.py);
- retained MQTT messages of 64 KiB on distinct topics;
- native clients that send half of a 32 MiB PUB frame and stop;
- native subscribers that never read, flooded with 64 KiB messages.

Unbounded, these would hold about 900 MiB. After each, a normal paho-mqtt pair exchanges a
QoS 1 message, and at the end the broker's peak resident memory (VmHWM) must stay under the
budget plus a stated margin for what the budget does not count (the process itself, per
connection buffers, allocator slack). The figures are printed for the record."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from conftest import KIND, REPO, start_hayate, stop_process, tail

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's memory budget")

HAYATE = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))
MIB = 1024 * 1024
BUDGET_MB = int(os.environ.get("MEMORY_TEST_BUDGET_MB", "96"))
# What the budget does not count: the process (code, runtime, a debug build's larger frames),
# each connection's uncharged 256 KiB of input and of outbox, and allocator slack.
MARGIN_MB = 64
PAYLOAD = os.urandom(64 * 1024)


def status(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


@pytest.fixture
def broker(tmp_path):
    cfg = tmp_path / "hayate.toml"
    cfg.write_text(f"""
[server]
data_dir = ""
[admin]
listen = []
[native]
listen = ["127.0.0.1:0"]
[mqtt]
listen = ["127.0.0.1:0"]
[amqp]
listen = []
[stomp]
listen = ["127.0.0.1:0"]
[limits]
memory_budget = {BUDGET_MB * MIB}
max_block_ms = 1000
handshake_timeout_ms = 3000
""")
    log = tmp_path / "broker.log"
    proc, ports = start_hayate(HAYATE, cfg, log)
    yield proc, ports, log
    stop_process(proc)


def port_of(ports: dict, word: str) -> int:
    return next(p for w, p in ports.items() if w.startswith(word))


def mqtt_client(port: int, cid: str, clean: bool = True) -> paho.Client:
    c = paho.Client(CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean)
    c.connect("127.0.0.1", port, keepalive=60)
    c.loop_start()
    return c


class Pair:
    """A normal paho-mqtt publisher and subscriber on `mem/ok`."""

    def __init__(self, port: int):
        self.got: list[bytes] = []
        self.cv = threading.Condition()
        self.sub = paho.Client(CallbackAPIVersion.VERSION2, client_id="mem-ok-sub")
        self.sub.on_message = self._on_message
        self.sub.connect("127.0.0.1", port)
        self.sub.loop_start()
        self.sub.subscribe("mem/ok", qos=1)[1]
        time.sleep(0.3)
        self.pub = mqtt_client(port, "mem-ok-pub")

    def _on_message(self, _c, _u, m):
        with self.cv:
            self.got.append(m.payload)
            self.cv.notify_all()

    def check(self, tag: str) -> None:
        body = f"{tag}-{uuid.uuid4()}".encode()
        self.pub.publish("mem/ok", body, qos=1).wait_for_publish(10)
        with self.cv:
            assert self.cv.wait_for(lambda: body in self.got, timeout=15), f"normal pair lost {tag}"


def preauth_connects(port: int) -> list[socket.socket]:
    socks = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", port))
        # CONNECT with a remaining length of 100 MiB, then 1 MiB of it.
        s.sendall(b"\x10" + bytes([0x80, 0x80, 0x80, 0x32]))
        try:
            s.sendall(b"\x00" * MIB)
        except OSError:
            pass
        socks.append(s)
    return socks


def offline_sessions(port: int) -> None:
    for i in range(6):
        c = mqtt_client(port, f"mem-off-{i}", clean=False)
        c.subscribe("mem/off/#", qos=1)
        time.sleep(0.1)
        c.disconnect()
        c.loop_stop()
    pub = mqtt_client(port, "mem-off-pub")
    for i in range(1100):  # 69 MiB to each of 6 sessions (each capped at 64 MiB by itself)
        pub.publish(f"mem/off/{i % 7}", PAYLOAD, qos=1).wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()


def stomp_queues(port: int) -> None:
    c = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    c.connect(wait=True)
    for q in range(2):
        for _ in range(1100):  # 69 MiB per queue (each capped at 64 MiB by itself)
            c.send(destination=f"/queue/mem-q-{q}", body=PAYLOAD)
    c.disconnect()


def retained(port: int) -> None:
    pub = mqtt_client(port, "mem-ret-pub")
    for i in range(1600):  # 100 MiB
        pub.publish(f"mem/ret/{i}", PAYLOAD, qos=1, retain=True).wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()


def native_hello() -> bytes:
    name = b"mem"
    body = struct.pack(">IHH", 0x48595431, 1, 0) + struct.pack(">H", len(name)) + name + struct.pack(">I", 0)
    return struct.pack(">I", 1 + len(body)) + b"\x01" + body


def native_key(k: str) -> bytes:
    return struct.pack(">H", len(k)) + k.encode()


def half_frames(port: int) -> list[socket.socket]:
    socks = []
    for _ in range(8):
        s = socket.create_connection(("127.0.0.1", port))
        s.settimeout(5)
        body = b"\x00" + native_key("mem/half")  # PUB: flags, key, payload
        total = 1 + len(body) + 32 * MIB
        s.sendall(native_hello() + struct.pack(">I", total) + b"\x03" + body)
        try:
            s.sendall(b"\x00" * (16 * MIB))  # half of it, then nothing
        except OSError:
            pass  # cut off while sending: what the budget is for
        socks.append(s)
    return socks


def non_readers(port: int, mqtt_port: int) -> list[socket.socket]:
    socks = []
    for i in range(10):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        expr = "mem/flood"
        # SUB: sid, qos (0x02 drop), group "", expr
        body = struct.pack(">IB", i + 1, 0x02) + struct.pack(">H", 0) + native_key(expr)
        s.sendall(native_hello() + struct.pack(">I", 1 + len(body)) + b"\x04" + body)
        socks.append(s)
    time.sleep(0.5)
    pub = mqtt_client(mqtt_port, "mem-flood-pub")
    for _ in range(400):  # 25 MiB to each of 10 subscribers that never read
        pub.publish("mem/flood", PAYLOAD, qos=1).wait_for_publish(30)
    pub.disconnect()
    pub.loop_stop()
    return socks


def test_the_budget_bounds_every_store(broker):
    proc, ports, log = broker
    mqtt_port, stomp_port, native_port = port_of(ports, "mqtt"), port_of(ports, "stomp"), port_of(ports, "native")
    pair = Pair(mqtt_port)
    pair.check("start")
    figures = {"start": status(proc.pid, "VmRSS")}
    held = []
    for name, run in [
        ("preauth CONNECTs", lambda: held.extend(preauth_connects(mqtt_port))),
        ("offline MQTT sessions", lambda: offline_sessions(mqtt_port)),
        ("STOMP queues", lambda: stomp_queues(stomp_port)),
        ("retained messages", lambda: retained(mqtt_port)),
        ("half-sent native frames", lambda: held.extend(half_frames(native_port))),
        ("subscribers that never read", lambda: held.extend(non_readers(native_port, mqtt_port))),
    ]:
        run()
        time.sleep(0.5)
        assert proc.poll() is None, f"broker died during {name}:\n{tail(log)}"
        pair.check(name)
        figures[name] = status(proc.pid, "VmRSS")
    figures["peak (VmHWM)"] = status(proc.pid, "VmHWM")
    print(f"\nbudget {BUDGET_MB} MiB; broker RSS after each case (MiB): {figures}")
    # The half-sent frames the budget could not cover were cut off with ERR 11.
    busy = 0
    for s in held:
        try:
            s.settimeout(0.2)
            data = s.recv(1 << 20)
            if b"\x0c\x00\x0b" in data:  # ERR 11 SERVER_BUSY
                busy += 1
        except OSError:
            pass
        s.close()
    print(f"half-sent frames cut off with ERR 11: {busy} of 8")
    if BUDGET_MB > 0:  # 0: the default budget (half the machine), for the record only
        assert busy >= 4, f"only {busy} of 8 half-sent frames were cut off"
        assert figures["peak (VmHWM)"] <= BUDGET_MB + MARGIN_MB, figures
    pair.check("end")
