"""Persistent sessions: offline queues, redelivery, and state that survives a broker restart."""

import time

import pytest

from helpers import persistent, unique

VERSIONS = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])


@VERSIONS
@pytest.mark.parametrize("sub_qos", [1, 2])
def test_offline_messages_delivered_on_reconnect(broker, mqtt, version, sub_qos):
    topic = unique("off") + "/x"
    sub = mqtt(broker, version=version, **persistent(version))
    sub.subscribe(topic, qos=sub_qos)
    sub.disconnect()
    pub = mqtt(broker, version=version)
    sent = [f"queued-{i}".encode() for i in range(10)]
    for i, p in enumerate(sent):
        pub.publish(topic, p, qos=1 + i % 2)
    sub.reconnect()
    assert sub.session_present is True
    got = sub.wait_messages(10)
    assert sorted(m.payload for m in got) == sorted(sent)
    for m in got:
        assert m.qos == min(1 + int(m.payload.split(b"-")[1]) % 2, sub_qos)
    # Order is kept per topic and QoS (MQTT 3.1.1 section 4.6, 5.0 [MQTT-4.6.0-6]).
    for q in (1, 2):
        same = [m.payload for m in got if m.qos == q]
        assert same == [p for p in sent if p in same]
    assert len(sub.quiet(0.3)) == 10, "duplicates"


@VERSIONS
def test_unacknowledged_messages_redelivered_with_dup(broker, mqtt, version):
    topic = unique("dup") + "/x"
    cid = unique("dup")
    first = mqtt(broker, client_id=cid, version=version, manual_ack=True, **persistent(version))
    first.subscribe(topic, qos=1)
    pub = mqtt(broker, version=version)
    for i in range(3):
        pub.publish(topic, f"{i}".encode(), qos=1)
    assert [m.payload for m in first.wait_messages(3)] == [b"0", b"1", b"2"]
    first.ack(first.received()[0])  # only the first one is acknowledged
    first.quiet(0.2)
    first.drop()
    again = mqtt(broker, client_id=cid, version=version, **persistent(version))
    assert again.session_present is True
    got = again.wait_messages(2)
    # MQTT-4.4.0-1: unacknowledged PUBLISH packets are re-sent on reconnect, with DUP set.
    assert [(m.payload, m.dup) for m in got] == [(b"1", True), (b"2", True)]
    assert len(again.quiet(0.3)) == 2


@VERSIONS
def test_session_and_queue_survive_restart(broker, mqtt, version):
    topic = unique("rs") + "/x"
    cid = unique("rs")
    sub = mqtt(broker, client_id=cid, version=version, **persistent(version))
    sub.subscribe(topic, qos=1)
    sub.disconnect()
    pub = mqtt(broker, version=version)
    sent = [f"before-restart-{i}".encode() for i in range(5)]
    for p in sent:
        pub.publish(topic, p, qos=1)
    pub.disconnect()
    broker.restart()
    sub = mqtt(broker, client_id=cid, version=version, **persistent(version))
    assert sub.session_present is True, "the persistent session must survive a broker restart"
    assert [m.payload for m in sub.wait_messages(5)] == sent
    # The subscription survived too.
    mqtt(broker, version=version).publish(topic, b"after-restart", qos=1)
    assert sub.wait_messages(6)[5].payload == b"after-restart"
    assert len(sub.quiet(0.3)) == 6


@VERSIONS
def test_retained_survive_restart(broker, mqtt, version):
    base = unique("rr")
    pub = mqtt(broker, version=version)
    pub.publish(f"{base}/kept", b"kept", qos=1, retain=True)
    pub.publish(f"{base}/gone", b"gone", qos=1, retain=True)
    pub.publish(f"{base}/gone", b"", qos=1, retain=True)
    pub.publish(f"{base}/replaced", b"old", qos=0, retain=True)
    pub.publish(f"{base}/replaced", b"new", qos=1, retain=True)
    pub.disconnect()
    broker.restart()
    sub = mqtt(broker, version=version)
    sub.subscribe(f"{base}/#", qos=1)
    got = sorted((m.topic, m.payload, m.retain) for m in sub.quiet(0.6))
    assert got == [(f"{base}/kept", b"kept", True), (f"{base}/replaced", b"new", True)]


def test_v5_session_expiry_after_restart(broker, mqtt):
    cid = unique("rx")
    sub = mqtt(broker, client_id=cid, version=5, clean=False, connect_props={"SessionExpiryInterval": 1})
    sub.subscribe(unique() + "/x", qos=1)
    sub.disconnect()
    broker.restart()
    time.sleep(2.2)
    again = mqtt(broker, client_id=cid, version=5, clean=False, connect_props={"SessionExpiryInterval": 60})
    if broker.kind == "mosquitto" and again.session_present:
        # MQTT 5.0 section 3.1.2.11.2: the session ends when the Session Expiry Interval has
        # passed. Mosquitto 2.0.11 never expires sessions it restored from its persistence file.
        pytest.xfail("mosquitto does not expire sessions restored after a restart")
    assert again.session_present is False, "a 1 s session must not outlive a restart by seconds"
