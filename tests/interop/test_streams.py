"""Hayate only: streams capture what MQTT (paho) and STOMP (stomp.py) clients publish. A QoS 1
PUBACK, a QoS 2 PUBREC and a STOMP RECEIPT come only once the message is stored by the stream
(fsync `always` here), and a broker killed with SIGKILL right after still has it."""

import json
import time
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


@pytest.mark.parametrize("mode", ["client-individual", "client"])
def test_stomp_durable_queue_keeps_unacknowledged_messages_through_kill_9(server, stomp, mode):
    """A /queue/ whose key a stream captures is durable: what was not acknowledged is
    delivered again after the broker was SIGKILLed, what was acknowledged is not."""
    base = unique("dq")
    add_stream(server, "dq", f"{base}/**")
    q = f"/queue/{base}/jobs"
    c = stomp(server)
    for i in range(10):
        c.send(q, f"j{i}".encode(), sync=True)
    r = stomp(server)
    sid = r.subscribe(q, ack=mode)
    msgs = r.wait_messages(10, sub=sid)
    assert [m.body for m in msgs] == [f"j{i}".encode() for i in range(10)]
    if mode == "client":
        r.ack(msgs[4], sync=True)  # cumulative: j0..j4
    else:
        for m in msgs[:5]:
            r.ack(m, sync=True)
    time.sleep(0.4)  # the consumer saves its position at most every 100 ms
    server.broker.stop(graceful=False)  # SIGKILL, with j5..j9 unacknowledged
    server.broker.start()
    # The restarted broker listens on new ports.
    from conftest import StompServer
    again = stomp(StompServer("hayate", server.broker.host, server.broker.stomp_port, broker=server.broker))
    sid2 = again.subscribe(q, ack="client-individual")
    got = again.wait_messages(5, sub=sid2)
    assert sorted(m.body for m in got) == [f"j{i}".encode() for i in range(5, 10)]
    for m in got:
        again.ack(m, sync=True)
    time.sleep(0.3)
    assert len(again.messages) == 5, "acknowledged messages are not delivered again"
