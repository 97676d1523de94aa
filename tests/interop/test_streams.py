"""Hayate only: streams capture what MQTT (paho) and STOMP (stomp.py) clients publish. A QoS 1
PUBACK, a QoS 2 PUBREC and a STOMP RECEIPT come only once the message is stored by the stream
(fsync `always` here), and a broker killed with SIGKILL right after still has it."""

import json
import subprocess

import pytest

from stomphelpers import unique

pytestmark = pytest.mark.hayate_only


def hayate(server, *args):
    r = subprocess.run([str(server.bin), *args, "--server", f"127.0.0.1:{server.broker.native_port}"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout


def add_stream(server, name, capture):
    hayate(server, "stream", "add", name, "--capture", capture, "--fsync", "always")


def records(server, name):
    return json.loads(hayate(server, "stream", "info", name, "--json"))[0]["records"]


@pytest.fixture
def server(make_stomp_server):
    s = make_stomp_server(mqtt=True)
    assert s.mqtt_port and s.broker.native_port
    return s


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
@pytest.mark.parametrize("qos", [1, 2])
def test_mqtt_acknowledged_publishes_are_stored_and_survive_kill_9(server, mqtt, version, qos):
    base = unique("sm")
    add_stream(server, "mq", f"{base}/**")
    p = mqtt(server.broker, version=version)
    for i in range(20):
        p.publish(f"{base}/t", f"m{i}".encode(), qos=qos)  # waits for PUBACK / PUBCOMP
    p.publish(f"{unique('other')}/t", b"not captured", qos=qos)
    assert records(server, "mq") == 20
    server.broker.stop(graceful=False)  # SIGKILL
    server.broker.start()
    assert records(server, "mq") == 20


def test_stomp_receipts_come_once_stored_and_survive_kill_9(server, stomp):
    base = unique("ss")
    add_stream(server, "st", f"{base}/**")
    c = stomp(server)
    for i in range(20):
        c.send(f"/topic/{base}/t", f"s{i}".encode(), sync=True)  # waits for the RECEIPT
    assert records(server, "st") == 20
    server.broker.stop(graceful=False)
    server.broker.start()
    assert records(server, "st") == 20
