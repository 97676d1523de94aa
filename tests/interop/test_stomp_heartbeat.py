"""STOMP heart-beating (1.1+), on raw sockets for exact timing.

Negotiation (STOMP 1.2 "Heart-beating"): the client sends `heart-beat:cx,cy`, the server
answers `heart-beat:sx,sy`. The client sends every max(cx, sy) ms if neither is 0; the server
sends every max(sx, cy) ms if neither is 0. A peer that hears nothing for "some tolerance" past
its interval may close. Hayate: `[stomp] heart_beat_ms` is both sx and sy (500 here), and a
client silent for twice its interval is disconnected. RabbitMQ 3.10 has no server-side
setting: it answers with whole seconds (at least 1000 ms) derived from the client's values, and
closes a silent client after about three intervals.
"""

import time

import pytest

from stomphelpers import unique

HB = 500  # Hayate's heart_beat_ms in these tests


@pytest.fixture
def hb_server(make_stomp_server):
    return make_stomp_server(heart_beat_ms=HB)


def connect(server, raw_stomp, heart_beat):
    r = raw_stomp(server)
    f = r.connect(version="1.2", login=server.login, passcode=server.passcode, heart_beat=heart_beat)
    assert f.command == "CONNECTED", f
    sx, sy = (int(v) for v in f.get("heart-beat", "0,0").split(","))
    return r, sx, sy


def grace(server) -> float:
    """How many intervals a silent client may last: 2 (Hayate's contract), 3 (RabbitMQ)."""
    return 2.0 if server.kind == "hayate" else 3.0


def test_connected_heart_beat(hb_server, raw_stomp):
    r, sx, sy = connect(hb_server, raw_stomp, "500,500")
    assert sx > 0 and sy > 0, "the server offers to send and wants to receive heart-beats"
    if hb_server.kind == "hayate":
        assert (sx, sy) == (HB, HB)


def test_silent_client_is_disconnected(hb_server, raw_stomp):
    r, sx, sy = connect(hb_server, raw_stomp, "500,0")
    assert sy > 0, f"the server ({hb_server.kind}) should want heart-beats: {sx},{sy}"
    interval = max(500, sy) / 1000
    start = time.monotonic()
    closed_at = r.wait_eof(grace(hb_server) * interval + 2.0) - start
    # Not before the interval has passed, and within the grace (plus scheduling slack).
    assert closed_at >= interval, f"cut after {closed_at:.2f}s, interval {interval}s"
    assert closed_at <= grace(hb_server) * interval + 0.75, f"cut only after {closed_at:.2f}s, interval {interval}s"
    assert not r.heartbeats, "the client asked for no heart-beats (cy = 0)"


def test_beating_client_stays(hb_server, raw_stomp):
    r, sx, sy = connect(hb_server, raw_stomp, "500,0")
    interval = max(500, sy) / 1000
    until = time.monotonic() + max(3 * interval, 1.6)
    while time.monotonic() < until:
        r.send(b"\n")
        time.sleep(interval / 3)
    assert r.is_open(0.05), "a client sending heart-beats was disconnected"
    # And it still works.
    dest = "/topic/" + unique("hb")
    r.send(b"\r\n")
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    assert r.expect("RECEIPT").get("receipt-id") == "r1"


def test_frames_count_as_heart_beats(hb_server, raw_stomp):
    """Any frame resets the receive timer, not only EOLs."""
    r, sx, sy = connect(hb_server, raw_stomp, "500,0")
    interval = max(500, sy) / 1000
    dest = "/topic/" + unique("hbf")
    until = time.monotonic() + max(3 * interval, 1.6)
    i = 0
    while time.monotonic() < until:
        r.send_frame("SEND", {"destination": dest}, b"beat %d" % i)
        i += 1
        time.sleep(interval / 3)
    assert r.is_open(0.05), "a client sending frames was disconnected"


def test_server_sends_heart_beats(hb_server, raw_stomp):
    r, sx, sy = connect(hb_server, raw_stomp, "0,500")
    assert sx > 0, f"the server should offer heart-beats: {sx},{sy}"
    interval = max(sx, 500) / 1000
    start = time.monotonic()
    watch = max(4 * interval, 2.0)
    assert r.is_open(watch), "the server closed a client that asked to receive heart-beats"
    beats = [t - start for t in r.heartbeats if t >= start]
    assert len(beats) >= int(watch / interval) - 1, f"heart-beats at {beats}, interval {interval}s"
    gaps = [b - a for a, b in zip([0.0] + beats, beats)]
    assert max(gaps) <= interval * 1.5 + 0.2, f"heart-beat gaps {gaps}, interval {interval}s"
    # The client sent nothing (cx = 0): it must not be disconnected for that.
    assert r.is_open(0.05)


def test_no_heart_beats_when_not_asked(hb_server, raw_stomp):
    r, sx, sy = connect(hb_server, raw_stomp, "0,0")
    start = time.monotonic()
    assert r.is_open(max(3 * HB / 1000, 1.5)), "a client that promised no heart-beats was disconnected"
    assert [t for t in r.heartbeats if t > start + 0.05] == [], "the client asked for no heart-beats"


def test_no_heart_beat_header(hb_server, raw_stomp):
    """1.0 style: no heart-beat header means none either way."""
    r = raw_stomp(hb_server)
    f = r.connect(version="1.2", login=hb_server.login, passcode=hb_server.passcode, heart_beat=None)
    assert f.command == "CONNECTED"
    start = time.monotonic()
    assert r.is_open(1.5)
    assert [t for t in r.heartbeats if t > start + 0.05] == []


def test_malformed_heart_beat(hb_server, raw_stomp):
    r = raw_stomp(hb_server)
    f = r.connect(version="1.2", login=hb_server.login, passcode=hb_server.passcode, heart_beat="fast,slow")
    if hb_server.kind == "rabbitmq" and f.command == "CONNECTED":
        pytest.skip("RabbitMQ ignores a malformed heart-beat header")
    assert f.command == "ERROR" and f.get("message"), f


def test_stomp_py_heartbeats(hb_server, stomp):
    """stomp.py with heart-beats both ways keeps its connection and exchanges messages."""
    c = stomp(hb_server, heartbeats=(500, 500))
    hb = c.connected_frame.headers.get("heart-beat")
    assert hb and hb != "0,0", hb
    dest = "/topic/" + unique("pyhb")
    c.subscribe(dest)
    time.sleep(2.2)
    assert c.conn.is_connected(), "stomp.py's heart-beat connection was dropped"
    assert c.heartbeats_received >= 1
    c.send(dest, b"alive")
    assert c.wait_messages(1)[0].body == b"alive"
