"""STOMP /topic/ publish/subscribe with stomp.py: fan-out, order, wildcards, UNSUBSCRIBE,
MESSAGE headers, user headers and their 1.1/1.2 escaping, binary bodies."""

import pytest

from stomphelpers import bodies, unique
from stompraw import frame

VERSIONS = pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])


@VERSIONS
def test_fan_out_in_order(stomp_server, stomp, version):
    dest = stomp_server.topic(unique("fan"), "x")
    subs = [stomp(stomp_server, version=version) for _ in range(2)]
    sids = [c.subscribe(dest) for c in subs]
    pub = stomp(stomp_server, version=version)
    sent = [b"m%d" % i for i in range(20)]
    for body in sent:
        pub.send(dest, body)
    for c, sid in zip(subs, sids):
        got = c.wait_messages(len(sent))
        assert bodies(got) == sent
        ids = set()
        for m in got:
            assert m.headers["destination"] == dest
            assert m.headers["subscription"] == sid
            ids.add(m.headers["message-id"])
        assert len(ids) == len(sent), "message-id must be unique"
    assert all(len(c.quiet(0.2)) == len(sent) for c in subs), "duplicates"


def test_publisher_not_subscribed_gets_nothing(stomp_server, stomp):
    base = unique("iso")
    sub = stomp(stomp_server)
    sub.subscribe(stomp_server.topic(base, "a"))
    pub = stomp(stomp_server)
    pub.send(stomp_server.topic(base, "b"), b"other topic")
    pub.send(stomp_server.topic(base, "a"), b"mine", sync=True)
    assert bodies(sub.wait_messages(1)) == [b"mine"]
    assert bodies(sub.quiet(0.3)) == [b"mine"]
    assert pub.received() == []


def test_wildcards(stomp_server, stomp):
    base = unique("wild")
    c = stomp(stomp_server)
    one = c.subscribe(stomp_server.pattern(base, "*"))
    many = c.subscribe(stomp_server.pattern(base, "**"))
    mid = c.subscribe(stomp_server.pattern(base, "*", "z"))
    pub = stomp(stomp_server)
    for parts in [("a",), ("a", "b"), ("a", "z"), ("q", "r", "z")]:
        pub.send(stomp_server.topic(base, *parts), "/".join(parts))
    pub.send(stomp_server.topic(unique("elsewhere"), "a"), b"no")
    pub.sync()
    c.wait_messages(1 + 4 + 1)
    got = c.quiet(0.3)
    by_sub = {s: sorted(bodies(m for m in got if m.headers["subscription"] == s)) for s in (one, many, mid)}
    assert by_sub[one] == [b"a"]
    assert by_sub[many] == [b"a", b"a/b", b"a/z", b"q/r/z"]
    assert by_sub[mid] == [b"a/z"]
    for m in got:  # the MESSAGE names the destination it was sent to, not the pattern
        assert "*" not in m.headers["destination"] and "#" not in m.headers["destination"]


@VERSIONS
def test_unsubscribe_stops_delivery(stomp_server, stomp, version):
    dest = "/topic/" + unique("unsub")
    c = stomp(stomp_server, version=version)
    keep = c.subscribe(dest)
    gone = c.subscribe(dest)
    pub = stomp(stomp_server, version=version)
    pub.send(dest, b"both", sync=True)
    c.wait_messages(2)
    c.unsubscribe(gone)
    pub.send(dest, b"one", sync=True)
    c.wait_messages(1 + 2, sub=None)
    got = c.quiet(0.3)
    assert sorted((m.headers["subscription"], m.body) for m in got) == sorted(
        [(keep, b"both"), (gone, b"both"), (keep, b"one")])


@VERSIONS
def test_user_headers_pass_through(stomp_server, stomp, version):
    dest = "/topic/" + unique("hdr")
    sub = stomp(stomp_server, version=version)
    sub.subscribe(dest)
    pub = stomp(stomp_server, version=version)
    headers = {"x-order": "42", "x-name": "hayate", "content-type": "text/plain;charset=utf-8",
               "correlation-id": "c-1", "x-empty": ""}
    pub.send(dest, b"with headers", headers=headers)
    m = sub.wait_messages(1)[0]
    for k, v in headers.items():
        assert m.headers.get(k) == v, f"{k}: sent {v!r}, got {m.headers.get(k)!r} ({m.headers})"


@pytest.mark.parametrize("version", ["1.1", "1.2"])
def test_header_escaping_round_trip(stomp_server, stomp, raw_stomp, version):
    """STOMP 1.2 "Value Encoding": \\r \\n \\c \\\\ in header names and values (1.1: no \\r)."""
    dest = "/topic/" + unique("esc")
    value = "a:b\nc\\d" + ("\re" if version == "1.2" else "e")
    sub = stomp(stomp_server, version=version)
    sub.subscribe(dest)
    # stomp.py escapes values (not names).
    pub = stomp(stomp_server, version=version)
    pub.send(dest, b"py", headers={"x-value": value})
    m = sub.wait_messages(1)[0]
    assert m.headers.get("x-value") == value, m.headers
    # A raw client: an escaped header name too, and the escaped bytes checked on the wire.
    r = raw_stomp(stomp_server)
    assert r.connect(version=version, login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    r.expect("RECEIPT")
    r.send(frame("SEND", [("destination", dest), ("x:key", value)], b"raw"))
    for _ in range(2):
        f = r.expect("MESSAGE")
        if f.body == b"raw":
            break
    assert f.get("x:key") == value, f.headers
    wire = b"x\\ckey:" + value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c").replace(
        "\r", "\\r").encode()
    assert wire in f.raw_headers, f"escaped header not found on the wire: {f.raw_headers}"


def test_repeated_header_first_wins(stomp_server, raw_stomp):
    """STOMP 1.2 "Repeated Header Entries": only the first occurrence is used."""
    dest = "/topic/" + unique("rep")
    r = raw_stomp(stomp_server)
    assert r.connect(version="1.2", login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    r.expect("RECEIPT")
    r.send(frame("SEND", [("destination", dest), ("x-rep", "first"), ("x-rep", "second")], b"rep"))
    f = r.expect("MESSAGE")
    assert f.get("x-rep") == "first", f.header_list


@VERSIONS
@pytest.mark.parametrize("size", [0, 1, 256 * 4, 300_000])
def test_binary_body(stomp_server, stomp, version, size):
    dest = "/topic/" + unique("bin")
    body = (bytes(range(256)) * (size // 256 + 1))[:size]  # NULs and every other byte value
    sub = stomp(stomp_server, version=version)
    sub.subscribe(dest)
    pub = stomp(stomp_server, version=version)
    pub.send(dest, body, headers={"content-type": "application/octet-stream"})
    m = sub.wait_messages(1)[0]
    assert m.body == body
    if size:
        assert m.headers.get("content-length") == str(size), m.headers


def test_body_without_content_length(stomp_server, raw_stomp):
    """A text body ended by the NUL alone (no content-length header)."""
    dest = "/topic/" + unique("nocl")
    r = raw_stomp(stomp_server)
    assert r.connect(version="1.2", login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    r.expect("RECEIPT")
    r.send(frame("SEND", {"destination": dest}, b"no length\nsecond line", content_length=False))
    r.send(frame("SEND", {"destination": dest}, b"", content_length=False))
    assert r.expect("MESSAGE").body == b"no length\nsecond line"
    assert r.expect("MESSAGE").body == b""


def test_frames_split_and_glued(stomp_server, raw_stomp):
    """Frames cut at every byte boundary, several in one write, EOLs between frames."""
    dest = "/topic/" + unique("split")
    r = raw_stomp(stomp_server)
    assert r.connect(version="1.2", login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    r.expect("RECEIPT")
    one = frame("SEND", {"destination": dest}, b"one\x00with nul")
    for i in range(len(one)):  # byte by byte
        r.send(one[i:i + 1])
    r.send(b"\n\r\n" + frame("SEND", {"destination": dest}, b"two") + b"\n"
           + frame("SEND", {"destination": dest}, b"three", eol=b"\r\n"))
    assert [r.expect("MESSAGE").body for _ in range(3)] == [b"one\x00with nul", b"two", b"three"]


def test_cross_version(stomp_server, stomp):
    """A 1.0 publisher, 1.1 and 1.2 subscribers (and back)."""
    dest = "/topic/" + unique("xv")
    clients = {v: stomp(stomp_server, version=v) for v in ("1.0", "1.1", "1.2")}
    for c in clients.values():
        c.subscribe(dest)
    for v, c in clients.items():
        c.send(dest, f"from {v}", headers={"x-from": v})
    for c in clients.values():
        got = c.wait_messages(3)
        assert sorted(bodies(got)) == [b"from 1.0", b"from 1.1", b"from 1.2"]
        assert all(m.headers["x-from"] == m.body.decode()[5:] for m in got)
