"""Request/reply over /temp-queue/: the broker rewrites `reply-to:/temp-queue/<name>` into a
destination of its own (RabbitMQ `/reply-queue/...`, Hayate `/queue/_inbox/<session>/<name>`)
that reaches only the requester, whose reply MESSAGE carries `subscription:/temp-queue/<name>`
without any SUBSCRIBE."""

import re

import pytest

from stomphelpers import bodies, unique, wait_total


def test_temp_queue_reply(stomp_server, stomp):
    svc = "/topic/" + unique("svc")
    responder = stomp(stomp_server)
    responder.subscribe(svc)
    a = stomp(stomp_server)
    c = stomp(stomp_server)  # another requester using the same temp-queue name
    a.send(svc, b"from a", headers={"reply-to": "/temp-queue/r1", "correlation-id": "a-1"})
    c.send(svc, b"from c", headers={"reply-to": "/temp-queue/r1", "correlation-id": "c-1"})
    reqs = responder.wait_messages(2)
    reply_to = {m.body: m.headers["reply-to"] for m in reqs}
    for v in reply_to.values():
        assert not v.startswith("/temp-queue/"), f"reply-to not rewritten: {v}"
    assert reply_to[b"from a"] != reply_to[b"from c"], "two connections' temp queues must differ"
    if stomp_server.kind == "hayate":
        for v in reply_to.values():
            assert re.fullmatch(r"/queue/_inbox/[^/]+/r1", v), v
    for m in reqs:
        assert m.headers.get("correlation-id") in ("a-1", "c-1")
    responder.send(reply_to[b"from a"], b"reply to a", headers={"correlation-id": "a-1"})
    got = a.wait_messages(1)[0]
    assert got.body == b"reply to a"
    assert got.headers["subscription"] == "/temp-queue/r1"
    assert got.headers.get("correlation-id") == "a-1"
    assert c.quiet(0.3) == [], "a reply reached another connection's temp queue"
    responder.send(reply_to[b"from c"], b"reply to c")
    assert bodies(c.wait_messages(1)) == [b"reply to c"]
    assert len(a.quiet(0.2)) == 1


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_temp_queue_versions(stomp_server, stomp, version):
    """The requester and the responder at any protocol version; the service is a queue."""
    svc = "/queue/" + unique("svcq")
    responder = stomp(stomp_server, version=version)
    responder.subscribe(svc)
    req = stomp(stomp_server, version=version)
    req.send(svc, b"ping", headers={"reply-to": "/temp-queue/v" + version.replace(".", "")})
    m = responder.wait_messages(1)[0]
    responder.send(m.headers["reply-to"], b"pong")
    got = req.wait_messages(1)[0]
    assert got.body == b"pong"
    assert got.headers.get("subscription") == "/temp-queue/v" + version.replace(".", "")


def test_temp_queues_of_one_connection(stomp_server, stomp):
    """Several temp queues on one connection stay apart."""
    svc = "/topic/" + unique("svc2")
    responder = stomp(stomp_server)
    responder.subscribe(svc)
    a = stomp(stomp_server)
    a.send(svc, b"x", headers={"reply-to": "/temp-queue/x"})
    a.send(svc, b"y", headers={"reply-to": "/temp-queue/y"})
    reqs = responder.wait_messages(2)
    for m in reqs:
        responder.send(m.headers["reply-to"], b"re " + m.body)
    got = a.wait_messages(2)
    assert sorted((m.headers["subscription"], m.body) for m in got) == [
        ("/temp-queue/x", b"re x"), ("/temp-queue/y", b"re y")]


def test_rpc_many_in_flight(stomp_server, stomp):
    """Two requesters with 25 requests each in flight at once, two responders sharing the
    service queue: every requester gets exactly its own replies."""
    n = 25
    svc = "/queue/" + unique("rpc")
    responders = [stomp(stomp_server) for _ in range(2)]
    for r in responders:
        r.subscribe(svc)
    requesters = {name: stomp(stomp_server) for name in ("alpha", "beta")}
    for i in range(n):
        for name, c in requesters.items():
            c.send(svc, f"{name}:{i}", headers={"reply-to": "/temp-queue/rpc", "correlation-id": f"{name}-{i}"})
    wait_total(responders, 2 * n)
    assert all(r.received() for r in responders), "both responders should take a share"
    for r in responders:
        for m in r.received():
            r.send(m.headers["reply-to"], b"re " + m.body,
                   headers={"correlation-id": m.headers["correlation-id"]})
    for name, c in requesters.items():
        got = c.wait_messages(n)
        assert sorted(m.headers["correlation-id"] for m in got) == sorted(f"{name}-{i}" for i in range(n))
        for m in got:
            assert m.body == b"re " + m.headers["correlation-id"].replace("-", ":").encode()
            assert m.headers["subscription"] == "/temp-queue/rpc"
        assert len(c.quiet(0.2)) == n
