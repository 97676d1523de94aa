"""oslo.messaging (OpenStack's RPC library, a client nobody here wrote) over its rabbit
driver against Hayate's AMQP listener: the scenario of the RPC seed. Two RPC servers on one
topic with a versioned target; a client calls (answered with the result), calls one server
by name, is refused a version the servers do not have, casts (one server gets it) and fans
out (both get it)."""

from __future__ import annotations

import time

import pytest

from conftest import KIND
from test_amqp import broker  # noqa: F401  (the fixture: a broker with an AMQP listener)

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's AMQP listener")

om = pytest.importorskip("oslo_messaging")
cfg = pytest.importorskip("oslo_config.cfg")


class Calculator:
    """An RPC endpoint at version 1.3: `add` and `whoami` answer, `record` is cast to."""

    target = om.Target(version="1.3")

    def __init__(self, name: str):
        self.name = name
        self.seen: list[int] = []

    def add(self, ctxt, a, b):
        return a + b

    def whoami(self, ctxt):
        return self.name

    def record(self, ctxt, value):
        self.seen.append(value)


def until(pred, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pred()


@pytest.mark.parametrize("quorum", [False, True], ids=["classic", "quorum"])
def test_rpc_call_cast_fanout_with_a_versioned_target(broker, quorum, tmp_path):  # noqa: F811
    conf = cfg.CONF
    args = []
    if quorum:
        # The topic queues as quorum queues (durable, x-queue-type quorum), as OpenStack
        # deployments set it.
        ini = tmp_path / "oslo.conf"
        ini.write_text("[oslo_messaging_rabbit]\nrabbit_quorum_queue = true\n")
        args = ["--config-file", str(ini)]
    conf(args, project="hayate-interop")
    url = f"rabbit://guest:guest@127.0.0.1:{broker['amqp']}/"
    transport = om.get_rpc_transport(conf, url=url)
    endpoints, servers = [], []
    try:
        for name in ("alpha", "beta"):
            ep = Calculator(name)
            srv = om.get_rpc_server(transport, om.Target(topic="calc", server=name), [ep])
            srv.start()
            endpoints.append(ep)
            servers.append(srv)
        client = om.get_rpc_client(transport, om.Target(topic="calc", version="1.0"),
                                   timeout=15)
        if quorum:
            # The topic queue really is the durable quorum queue oslo.messaging asked for:
            # declaring it as a transient classic queue is refused.
            import pika
            conn = pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", broker["amqp"]))
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
                conn.channel().queue_declare("calc", durable=False)
            assert e.value.reply_code == 406
            conn.close()

        # call: one of the servers answers, as often as asked, at any version it has.
        for i in range(20):
            assert client.prepare(version="1.2").call({}, "add", a=i, b=1) == i + 1
        # call to a named server.
        assert client.prepare(server="beta").call({}, "whoami") == "beta"
        assert client.prepare(server="alpha").call({}, "whoami") == "alpha"
        # a version no server has: the dispatcher refuses it and the error comes back.
        with pytest.raises(Exception) as refused:
            client.prepare(version="2.0").call({}, "add", a=1, b=2)
        assert "UnsupportedVersion" in str(refused.value) or \
            "UnsupportedVersion" in type(refused.value).__name__

        # cast: exactly one server records each value (round robin over the topic queue).
        for v in range(10):
            client.cast({}, "record", value=v)
        assert until(lambda: sum(len(e.seen) for e in endpoints) >= 10)
        assert sorted(endpoints[0].seen + endpoints[1].seen) == list(range(10))

        # fanout: every server records it.
        client.prepare(fanout=True).cast({}, "record", value=100)
        assert until(lambda: all(100 in e.seen for e in endpoints))
        # a cast to a named server reaches that server only.
        client.prepare(server="alpha").cast({}, "record", value=200)
        assert until(lambda: 200 in endpoints[0].seen)
        time.sleep(0.3)
        assert 200 not in endpoints[1].seen
    finally:
        for srv in servers:
            srv.stop()
            srv.wait()
        transport.cleanup()
