"""STOMP transactions: SENDs and ACKs inside BEGIN ... COMMIT take effect at COMMIT, none at
ABORT or when the connection ends first; an unknown transaction gets an ERROR.

Transactional frames carry no receipt here: RabbitMQ holds their RECEIPTs until COMMIT (it
replays the frames then), so the tests synchronise with a non-transactional frame instead."""

import pytest

from stomphelpers import bodies, unique

VERSIONS = pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])


@VERSIONS
def test_sends_take_effect_at_commit(stomp_server, stomp, version):
    dest = "/topic/" + unique("tx")
    sub = stomp(stomp_server, version=version)
    sub.subscribe(dest)
    pub = stomp(stomp_server, version=version)
    tx = pub.begin()
    for i in range(3):
        pub.send(dest, b"tx-%d" % i, transaction=tx)
    pub.send(dest, b"outside", sync=True)
    assert bodies(sub.wait_messages(1)) == [b"outside"]
    assert bodies(sub.quiet(0.3)) == [b"outside"], "a transactional SEND was delivered before COMMIT"
    pub.commit(tx)
    assert bodies(sub.wait_messages(4)) == [b"outside", b"tx-0", b"tx-1", b"tx-2"]


@VERSIONS
def test_abort_discards_sends(stomp_server, stomp, version):
    dest = "/queue/" + unique("txq")
    pub = stomp(stomp_server, version=version)
    tx = pub.begin()
    for i in range(3):
        pub.send(dest, b"aborted-%d" % i, transaction=tx)
    pub.abort(tx)
    pub.send(dest, b"after", sync=True)
    sub = stomp(stomp_server, version=version)
    sub.subscribe(dest)
    assert bodies(sub.wait_messages(1)) == [b"after"]
    assert bodies(sub.quiet(0.3)) == [b"after"]


def test_disconnect_aborts_open_transaction(stomp_server, stomp):
    dest = "/topic/" + unique("txd")
    sub = stomp(stomp_server)
    sub.subscribe(dest)
    pub = stomp(stomp_server)
    tx = pub.begin()
    pub.send(dest, b"never", transaction=tx)
    pub.sync()
    pub.disconnect()
    other = stomp(stomp_server)
    other.send(dest, b"marker", sync=True)
    assert bodies(sub.wait_messages(1)) == [b"marker"]
    assert bodies(sub.quiet(0.3)) == [b"marker"]


@VERSIONS
@pytest.mark.parametrize("outcome", ["commit", "abort", "drop"])
def test_acks_take_effect_at_commit(stomp_server, stomp, version, outcome):
    q = "/queue/" + unique("txack")
    mode = "client" if version == "1.0" else "client-individual"
    a = stomp(stomp_server, version=version)
    a.subscribe(q, ack=mode)
    pub = stomp(stomp_server)
    for i in range(3):
        pub.send(q, b"k-%d" % i)
    got = a.wait_messages(3)
    tx = a.begin()
    if mode == "client":
        a.ack(got[1], transaction=tx)     # cumulative: k-0 and k-1
    else:
        a.ack(got[0], transaction=tx)
        a.ack(got[1], transaction=tx)
    a.sync()
    if outcome == "commit":
        a.commit(tx)
    elif outcome == "abort":
        a.abort(tx)
    a.drop()  # what is not acknowledged goes back to the queue
    b = stomp(stomp_server, version=version)
    b.subscribe(q, ack=mode)
    expected = [b"k-2"] if outcome == "commit" else [b"k-0", b"k-1", b"k-2"]
    b.wait_messages(len(expected))
    assert sorted(bodies(b.quiet(0.3))) == expected


@pytest.mark.parametrize("case", ["commit", "abort", "send", "ack", "other-connection"])
def test_unknown_transaction(stomp_server, stomp, raw_stomp, case):
    dest = "/queue/" + unique("txu")
    owner = stomp(stomp_server)
    owner.begin("mine")
    r = raw_stomp(stomp_server)
    assert r.connect(version="1.2", login=stomp_server.login, passcode=stomp_server.passcode).command == "CONNECTED"
    tx = "mine" if case == "other-connection" else unique("nosuch")
    frame = {
        "commit": ("COMMIT", {"transaction": tx}),
        "abort": ("ABORT", {"transaction": tx}),
        "send": ("SEND", {"transaction": tx, "destination": dest}),
        "ack": ("ACK", {"transaction": tx, "id": "whatever"}),
        "other-connection": ("COMMIT", {"transaction": tx}),
    }[case]
    cmd, headers = frame
    r.send_frame(cmd, dict(headers, receipt="r-unknown"), b"txu" if cmd == "SEND" else b"")
    f = r.read_frame()
    assert f.command == "ERROR", f"{case}: expected ERROR, got {f}"
    assert f.get("message"), f"ERROR without a message header: {f}"
    # (Whether the connection is then closed is not checked here; the bad-input tests are
    # about that.) A transactional SEND of an unknown transaction is not delivered.
    if case == "send":
        sub = stomp(stomp_server)
        sub.subscribe(dest)
        assert sub.quiet(0.3) == []
    # The owner's transaction is untouched.
    owned = "/queue/" + unique("txo")
    owner.send(owned, b"owned", transaction="mine")
    owner.commit("mine")
    c = stomp(stomp_server)
    c.subscribe(owned)
    assert bodies(c.wait_messages(1)) == [b"owned"]
