"""CONNECT / CONNACK, sessions, keep alive, wills, takeover, authentication."""

import time

import pytest

import mqttraw as raw
from helpers import WAIT, persistent, unique

VERSIONS = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])


@VERSIONS
def test_connack_ok_and_session_present(broker, mqtt, version):
    cid = unique("sp")
    topic = unique("sp") + "/x"
    c = mqtt(broker, client_id=cid, version=version, **persistent(version))
    assert int(c.connack_rc.value) == 0
    assert c.session_present is False, "a brand new session must not be reported present"
    c.subscribe(topic, qos=1)
    c.disconnect()

    c.reconnect()
    assert c.session_present is True, "clean session 0 / clean start 0: the session must be resumed"
    # The subscription is part of the session: no new SUBSCRIBE needed.
    p = mqtt(broker, version=version)
    p.publish(topic, b"still subscribed", qos=1)
    assert c.wait_messages(1)[0].payload == b"still subscribed"
    c.disconnect()

    # Clean session / clean start discards the stored session (v5: and with no Session Expiry
    # Interval, the new session ends with this connection).
    c.reconnect(clean=True, connect_props={})
    assert c.session_present is False
    p.publish(topic, b"after clean", qos=1)
    assert [m.payload for m in c.quiet(0.5)] == [b"still subscribed"], "subscription must be gone"
    c.disconnect()
    c.reconnect(clean=False, connect_props=persistent(version)["connect_props"] if version == 5 else None)
    assert c.session_present is False, "the clean connection must not have left a session behind"


def test_v5_session_expiry(broker, mqtt):
    cid = unique("exp")
    topic = unique("exp") + "/x"
    c = mqtt(broker, client_id=cid, version=5, clean=False, connect_props={"SessionExpiryInterval": 1})
    c.subscribe(topic, qos=1)
    c.disconnect()
    # While the session lives, messages for it are kept.
    mqtt(broker, version=5).publish(topic, b"kept", qos=1)
    c.reconnect()
    assert c.session_present is True
    assert c.wait_messages(1)[0].payload == b"kept"
    c.disconnect()
    time.sleep(2.5)  # past the 1 s expiry
    c.reconnect()
    assert c.session_present is False, "the session must have expired 1 s after the disconnect"


def test_v5_session_expiry_zero_ends_session_at_disconnect(broker, mqtt):
    c = mqtt(broker, version=5, clean=False)  # no Session Expiry Interval property: 0
    c.subscribe(unique() + "/x", qos=1)
    c.disconnect()
    c.reconnect()
    assert c.session_present is False


def test_v5_disconnect_can_shorten_session_expiry(broker, mqtt):
    c = mqtt(broker, version=5, clean=False, connect_props={"SessionExpiryInterval": 3600})
    c.subscribe(unique() + "/x", qos=1)
    c.disconnect(reason=0, properties={"SessionExpiryInterval": 0})
    c.reconnect()
    assert c.session_present is False, "DISCONNECT with Session Expiry Interval 0 ends the session"


def test_v5_assigned_client_identifier(broker, mqtt):
    a = mqtt(broker, client_id="", version=5)
    b = mqtt(broker, client_id="", version=5)
    ida = a.connack_props.AssignedClientIdentifier
    idb = b.connack_props.AssignedClientIdentifier
    assert ida and idb and ida != idb, "each empty-id client gets its own assigned identifier"
    # The assigned identifier is a working client: it can subscribe and receive.
    topic = unique() + "/a"
    a.subscribe(topic)
    b.publish(topic, b"to assigned")
    assert a.wait_messages(1)[0].payload == b"to assigned"


def test_v311_empty_client_id_requires_clean_session(broker):
    with raw.RawClient(broker.host, broker.port, 4) as r:
        ack = r.connect(client_id="", clean=False)
        assert ack.type == raw.CONNACK and ack.reason == 2, f"expected identifier rejected, got {ack}"
        assert ack.session_present is False
        r.wait_closed(WAIT)
    with raw.RawClient(broker.host, broker.port, 4) as r:
        ack = r.connect(client_id="", clean=True)
        assert ack.type == raw.CONNACK and ack.reason == 0


@VERSIONS
def test_keep_alive_timeout_publishes_will(broker, mqtt, version):
    topic = unique("ka") + "/will"
    watcher = mqtt(broker, version=version)
    watcher.subscribe(topic, qos=1)
    silent = raw.RawClient(broker.host, broker.port, version)
    pinger = raw.RawClient(broker.host, broker.port, version)
    limit = 1.5 * 1 + 1.0  # 1.5 x keep alive (MQTT-3.1.2-24), plus 1 s of scheduling slack
    try:
        t0 = time.monotonic()
        ack = silent.connect(client_id=unique("silent"), keepalive=1, will=(topic, b"silent died", 1, False))
        assert ack.reason == 0
        assert pinger.connect(client_id=unique("pinger"), keepalive=1).reason == 0
        # The pinger keeps its connection alive with PINGREQ every 0.4 s; the other says nothing.
        # Mosquitto checks keep alives only every few seconds, hence the longer wait for it.
        closed_at = None
        give_up = 7.0 if broker.kind == "mosquitto" else limit + 0.5
        while time.monotonic() - t0 < give_up and closed_at is None:
            pinger.send(bytes([raw.PINGREQ << 4, 0]))
            assert pinger.recv_packet(2).type == raw.PINGRESP, "a pinging client must stay connected"
            try:
                silent.recv_packet(0.4)
            except TimeoutError:
                continue
            except raw.Closed:
                closed_at = time.monotonic() - t0
        assert closed_at is not None, "a client silent for 1.5x its keep alive must be disconnected"
        assert closed_at > 0.9, f"disconnected after {closed_at:.2f}s, before its keep alive of 1 s"
        m = watcher.wait_messages(1, timeout=2)[0]
        assert (m.topic, m.payload) == (topic, b"silent died")
        pinger.send(bytes([raw.PINGREQ << 4, 0]))
        assert pinger.recv_packet(2).type == raw.PINGRESP
        if broker.kind == "mosquitto" and closed_at > limit:
            # MQTT 3.1.1 section 3.1.2.10 / 5.0 section 3.1.2.10 [MQTT-3.1.2-24]: disconnect
            # within 1.5x the keep alive. Mosquitto 2.0.11 runs its keep alive check every ~5 s.
            pytest.xfail(f"mosquitto disconnected a keep alive 1 client after {closed_at:.1f}s")
        assert closed_at <= limit, f"disconnected only after {closed_at:.2f}s (keep alive 1 s)"
    finally:
        silent.close()
        pinger.close()


@VERSIONS
def test_will_on_abrupt_close_not_on_disconnect(broker, mqtt, version):
    topic = unique("will")
    watcher = mqtt(broker, version=version)
    watcher.subscribe(topic + "/#", qos=1)
    polite = mqtt(broker, version=version, will=(topic + "/polite", b"no", 1, False))
    polite.disconnect()
    rude = mqtt(broker, version=version, will=(topic + "/rude", b"gone", 1, True))
    rude.drop()
    m = watcher.wait_messages(1)[0]
    assert (m.topic, m.payload, m.qos) == (topic + "/rude", b"gone", 1)
    assert watcher.quiet(0.3, topic + "/polite") == [], "a normal DISCONNECT must discard the will"
    # The will was retained: a later subscriber gets it with the retain flag.
    late = mqtt(broker, version=version)
    late.subscribe(topic + "/rude", qos=1)
    r = late.wait_messages(1)[0]
    assert r.payload == b"gone" and r.retain is True


def test_v5_disconnect_with_will_message(broker, mqtt):
    topic = unique("willrc")
    watcher = mqtt(broker, version=5)
    watcher.subscribe(topic, qos=1)
    c = mqtt(broker, version=5, will=(topic, b"asked for it", 1, False),
             will_props={"ContentType": "text/plain", "UserProperty": [("k", "v")]})
    c.disconnect(reason=0x04)  # Disconnect with Will Message
    m = watcher.wait_messages(1)[0]
    assert m.payload == b"asked for it"
    assert m.prop("ContentType") == "text/plain"
    assert m.prop("UserProperty") == [("k", "v")]


def test_v5_will_delay_interval(broker, mqtt):
    topic = unique("wd")
    watcher = mqtt(broker, version=5)
    watcher.subscribe(topic + "/#", qos=1)
    session = {"SessionExpiryInterval": 30}
    # 1. Connection lost; the will waits for its 2 s delay.
    a = mqtt(broker, version=5, clean=False, connect_props=session,
             will=(topic + "/a", b"late", 1, False), will_props={"WillDelayInterval": 2})
    a.drop()
    t0 = time.monotonic()
    assert watcher.quiet(1.0, topic + "/a") == [], "the will must wait for its delay interval"
    m = watcher.wait_messages(1, timeout=3.5, topic=topic + "/a")[0]
    assert m.payload == b"late"
    assert time.monotonic() - t0 >= 1.5
    # 2. The client comes back within the delay: no will at all.
    b = mqtt(broker, version=5, clean=False, connect_props=session,
             will=(topic + "/b", b"never", 1, False), will_props={"WillDelayInterval": 2})
    b.drop()
    time.sleep(0.5)
    b.reconnect()
    assert b.session_present is True
    assert watcher.quiet(2.5, topic + "/b") == [], "reconnecting within the will delay cancels the will"


def test_v5_server_keep_alive(make_broker, mqtt):
    broker = make_broker(max_keep_alive=60)
    c = mqtt(broker, version=5, keepalive=1000)
    assert c.connack_props.ServerKeepAlive == 60
    ok = mqtt(broker, version=5, keepalive=30)
    assert getattr(ok.connack_props, "ServerKeepAlive", 30) == 30


@VERSIONS
def test_session_takeover(broker, mqtt, version):
    cid = unique("take")
    first = mqtt(broker, client_id=cid, version=version)
    second = mqtt(broker, client_id=cid, version=version)
    assert first.disconnected.wait(WAIT), "the older connection must be closed"
    assert second.connected.is_set()
    topic = unique() + "/t"
    second.subscribe(topic)
    second.publish(topic, b"alive")
    assert second.wait_messages(1)[0].payload == b"alive"
    if version == 5:
        if broker.kind == "mosquitto" and first.disconnect_rc != 0x8E:
            # MQTT 5.0 section 3.1.4 [MQTT-3.1.4-3]: the server sends DISCONNECT 0x8E (Session
            # taken over) to the existing client. Mosquitto 2.0.11 only closes the socket.
            pytest.xfail("mosquitto closes a taken-over v5 connection without DISCONNECT 0x8E")
        assert first.disconnect_rc == 0x8E, f"expected Session taken over, got {first.disconnect_rc}"
        reason = getattr(first.disconnect_props, "ReasonString", None)
        assert reason is None or isinstance(reason, str)


@pytest.fixture
def auth_broker(make_broker):
    return make_broker(allow_anonymous=False, users={"alice": "s3cret", "bob": "hunter2"})


def test_v5_authentication(auth_broker, mqtt):
    good = mqtt(auth_broker, version=5, username="alice", password="s3cret")
    assert int(good.connack_rc.value) == 0
    bad = mqtt(auth_broker, connect=False, version=5, username="alice", password="wrong")
    bad.connect(expect_ok=False)
    assert int(bad.connack_rc.value) in (0x86, 0x87), f"got {bad.connack_rc}"
    anon = mqtt(auth_broker, connect=False, version=5)
    anon.connect(expect_ok=False)
    assert int(anon.connack_rc.value) in (0x86, 0x87), f"got {anon.connack_rc}"


def test_v311_authentication(auth_broker):
    cases = [("bob", "hunter2", {0}), ("bob", "s3cret", {4, 5}), ("nobody", "x", {4, 5}), (None, None, {4, 5})]
    for user, password, want in cases:
        with raw.RawClient(auth_broker.host, auth_broker.port, 4) as r:
            ack = r.connect(client_id=unique("auth"), username=user, password=password)
            assert ack.type == raw.CONNACK and ack.reason in want, f"{user}/{password}: {ack}"
            if ack.reason:
                r.wait_closed(WAIT)
