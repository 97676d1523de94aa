"""STOMP connection set-up and tear-down: CONNECT and STOMP frames, version negotiation,
CONNECTED headers, host, login/passcode, RECEIPTs in order, DISCONNECT with a receipt."""

import re

import pytest

from stomphelpers import bodies, still_serving, unique
from stompraw import frame

VERSIONS = pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
CLOSE_WAIT = 3.0  # a refused client must be closed within this


def assert_error_then_close(server, r, what: str, rabbitmq_keeps_open: str | None = None):
    """The server answers with one ERROR frame (a `message` header) and closes the connection."""
    frames, closed = r.drain(CLOSE_WAIT)
    errors = [f for f in frames if f.command == "ERROR"]
    if not closed and server.kind == "rabbitmq" and rabbitmq_keeps_open:
        pytest.xfail(rabbitmq_keeps_open)
    assert closed, f"{what}: the connection was not closed within {CLOSE_WAIT}s"
    return errors


# (accept-version header or None, command, negotiated version). The STOMP frame is 1.1+, so it
# always carries accept-version; without it a server speaks 1.0.
NEGOTIATION = [
    (None, "CONNECT", "1.0"),
    ("1.0", "CONNECT", "1.0"),
    ("1.1", "CONNECT", "1.1"),
    ("1.2", "CONNECT", "1.2"),
    ("1.0,1.1,1.2", "CONNECT", "1.2"),
    ("1.0,1.1", "CONNECT", "1.1"),
    ("1.2,1.0", "CONNECT", "1.2"),
    ("1.1", "STOMP", "1.1"),
    ("1.2", "STOMP", "1.2"),
    ("1.0,1.1,1.2", "STOMP", "1.2"),
]


@pytest.mark.parametrize("accept,command,expected", NEGOTIATION,
                         ids=[f"{c}-{a or 'none'}" for a, c, _ in NEGOTIATION])
def test_version_negotiation(stomp_server, raw_stomp, accept, command, expected):
    r = raw_stomp(stomp_server)
    f = r.connect(version=accept, command=command, login=stomp_server.login, passcode=stomp_server.passcode)
    assert f.command == "CONNECTED", f
    assert f.get("version") == expected, f"accept-version {accept}: CONNECTED {f.headers}"
    assert f.get("server"), f"CONNECTED has no server header: {f.headers}"
    assert f.get("session"), f"CONNECTED has no session header: {f.headers}"
    if expected != "1.0":  # STOMP 1.0 has no heart-beating (RabbitMQ sends "0,0" anyway)
        assert re.fullmatch(r"\d+,\d+", f.get("heart-beat", "")), f"CONNECTED heart-beat: {f.headers}"
    # The connection works at that version.
    dest = "/topic/" + unique("neg")
    r.send_frame("SUBSCRIBE", {"id": "s1", "destination": dest, "receipt": "r1"})
    assert r.expect("RECEIPT").get("receipt-id") == "r1"
    r.send_frame("SEND", {"destination": dest}, b"at " + expected.encode())
    m = r.expect("MESSAGE")
    assert m.body == b"at " + expected.encode()
    assert m.get("destination") == dest and m.get("message-id")
    if expected != "1.0":
        assert m.get("subscription") == "s1"


@VERSIONS
def test_stomp_py_connects(stomp_server, stomp, version):
    c = stomp(stomp_server, version=version)
    assert c.connected_frame.headers.get("version") == version
    dest = "/topic/" + unique("py")
    sid = c.subscribe(dest)
    c.send(dest, b"hello", sync=True)
    m = c.wait_messages(1)[0]
    assert m.body == b"hello" and m.headers["subscription"] == sid
    c.disconnect()


@pytest.mark.parametrize("accept", ["2.0", "0.9,3.1"])
def test_unsupported_version(stomp_server, stomp, raw_stomp, accept):
    r = raw_stomp(stomp_server)
    f = r.connect(version=accept, login=stomp_server.login, passcode=stomp_server.passcode)
    assert f.command == "ERROR", f"accept-version {accept} answered with {f}"
    assert f.get("message"), f"ERROR without a message header: {f}"
    # STOMP 1.2 "Protocol Negotiation": the server answers ERROR with the versions it supports.
    assert "1.2" in f.get("version", ""), f"ERROR should list the supported versions: {f.headers}"
    # RabbitMQ 3.10 keeps the connection open (~10 s) after this ERROR; STOMP 1.2 "ERROR":
    # the server MUST close the connection just after sending an ERROR frame.
    assert_error_then_close(stomp_server, r, "unsupported version",
                            rabbitmq_keeps_open="RabbitMQ does not close after a version-mismatch ERROR")
    still_serving(stomp_server, stomp)


@pytest.mark.parametrize("host", ["127.0.0.1", "example.org", None], ids=["ip", "name", "absent"])
def test_any_host_accepted(stomp_server, raw_stomp, host):
    if stomp_server.kind == "rabbitmq" and host is not None:
        # RabbitMQ reads `host` as the name of a vhost and refuses unknown ones; Hayate has
        # no vhosts and accepts any host.
        pytest.skip("RabbitMQ takes the host header as a vhost")
    r = raw_stomp(stomp_server)
    f = r.connect(version="1.2", host=host, login=stomp_server.login, passcode=stomp_server.passcode)
    assert f.command == "CONNECTED", f


@pytest.fixture
def auth_server(make_stomp_server, broker_kind):
    """(server, good user, good password): Hayate with a user list and no anonymous access;
    RabbitMQ with its guest user."""
    if broker_kind == "rabbitmq":
        return make_stomp_server(), "guest", "guest"
    return make_stomp_server(allow_anonymous=False, users={"alice": "wonder:land"}), "alice", "wonder:land"


def test_login_accepted(auth_server, stomp, raw_stomp):
    server, user, password = auth_server
    r = raw_stomp(server)
    assert r.connect(version="1.2", login=user, passcode=password).command == "CONNECTED"
    for version in ("1.0", "1.1", "1.2"):
        c = stomp(server, version=version, login=user, passcode=password)
        assert c.connected_frame is not None


@pytest.mark.parametrize("case", ["bad-passcode", "unknown-user", "no-passcode", "anonymous"])
def test_login_refused(auth_server, stomp, raw_stomp, case):
    server, user, password = auth_server
    login, passcode = {
        "bad-passcode": (user, password + "x"),
        "unknown-user": (unique("nobody"), password),
        "no-passcode": (user, None),
        "anonymous": (None, None),
    }[case]
    if case == "anonymous" and server.kind == "rabbitmq":
        # RabbitMQ logs a STOMP client without login in as its default user (guest).
        pytest.skip("RabbitMQ lets anonymous STOMP clients in as its default user")
    r = raw_stomp(server)
    f = r.connect(version="1.2", login=login, passcode=passcode)
    if case == "no-passcode" and server.kind == "rabbitmq" and f.command == "CONNECTED":
        # RabbitMQ 3.10 takes a login without passcode for its default user (guest/guest);
        # Hayate checks login and passcode together.
        pytest.xfail("RabbitMQ accepts a login without a passcode")
    assert f.command == "ERROR", f"{case}: {f}"
    assert f.get("message"), f"ERROR without a message header: {f}"
    # RabbitMQ 3.10 closes a refused STOMP connection only ~10 s after its ERROR.
    assert_error_then_close(server, r, case,
                            rabbitmq_keeps_open="RabbitMQ closes a refused login only after ~10 s")
    # stomp.py sees the ERROR too.
    c = stomp(server, connect=False, login=login, passcode=passcode)
    assert c.connect(expect_ok=False) is None
    assert c.wait_error().headers.get("message")
    if server.kind == "hayate":
        server.login, server.passcode = user, password
    still_serving(server, stomp)


def test_anonymous_by_default(stomp_server, raw_stomp):
    # Hayate allows anonymous clients unless [auth] allow_anonymous = false; RabbitMQ logs them
    # in as its default user.
    r = raw_stomp(stomp_server)
    assert r.connect(version="1.2").command == "CONNECTED"


@VERSIONS
def test_receipts_in_order(stomp_server, raw_stomp, version):
    """A RECEIPT for every frame that asks for one, in the order of the frames (STOMP 1.2
    "RECEIPT": a receipt is a cumulative acknowledgment of all the previous frames)."""
    r = raw_stomp(stomp_server)
    accept = None if version == "1.0" else version
    assert r.connect(version=accept, login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    dest = "/topic/" + unique("rcpt")
    frames = [
        ("SUBSCRIBE", {"id": "s1", "destination": dest}),
        ("SEND", {"destination": dest}),
        ("BEGIN", {"transaction": "t1"}),
        ("SEND", {"destination": dest, "transaction": "t1"}),
        ("COMMIT", {"transaction": "t1"}),
        ("SEND", {"destination": dest}),
        ("UNSUBSCRIBE", {"id": "s1"}),
        ("SEND", {"destination": dest}),
    ]
    data = b""
    for i, (cmd, h) in enumerate(frames):
        data += frame(cmd, dict(h, receipt=f"r{i}"), b"m%d" % i if cmd == "SEND" else b"")
    r.send(data)  # all in one write
    receipts, others = [], []
    while len(receipts) < len(frames):
        f = r.read_frame()
        (receipts if f.command == "RECEIPT" else others).append(f)
    order = [f.get("receipt-id") for f in receipts]
    if stomp_server.kind == "rabbitmq" and order != sorted(order):
        # RabbitMQ answers a SEND's receipt when its publisher confirm comes back, after the
        # receipts of the frames that followed it.
        pytest.xfail(f"RabbitMQ sent the RECEIPTs out of order: {order}")
    assert order == [f"r{i}" for i in range(len(frames))]
    while True:  # MESSAGEs may trail the last RECEIPT
        try:
            others.append(r.read_frame(timeout=0.3))
        except TimeoutError:
            break
    assert all(f.command == "MESSAGE" for f in others), others
    # The subscription saw the three SENDs made while it existed (the transactional one at
    # COMMIT), and nothing after UNSUBSCRIBE.
    assert sorted(bodies(others)) == [b"m1", b"m3", b"m5"]


@VERSIONS
def test_disconnect_with_receipt(stomp_server, raw_stomp, stomp, version):
    r = raw_stomp(stomp_server)
    accept = None if version == "1.0" else version
    assert r.connect(version=accept, login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    r.send_frame("DISCONNECT", {"receipt": "bye-1"})
    frames = r.wait_closed(CLOSE_WAIT)
    assert [(f.command, f.get("receipt-id")) for f in frames] == [("RECEIPT", "bye-1")]
    # stomp.py's disconnect (it waits for the RECEIPT, then closes).
    c = stomp(stomp_server, version=version)
    c.disconnect()
    assert not c.conn.is_connected()
