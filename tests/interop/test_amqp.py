"""AMQP 0-9-1 with pika (a client nobody here wrote) against Hayate's AMQP listener:
publish and consume, acknowledgements (ack, nack with and without requeue, reject),
prefetch, publisher confirms, mandatory returns, transactions, direct reply-to RPC,
exchanges of each type, queue arguments (TTL, max length, dead-lettering), exclusive
queues; cross-protocol with MQTT (paho) and STOMP (stomp.py); and bad input answered with
the error and close RabbitMQ would send, the broker serving others throughout."""

from __future__ import annotations

import datetime
import decimal
import socket
import struct
import subprocess
import threading
import time
import uuid

import paho.mqtt.client as paho
import pika
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from conftest import KIND, start_hayate, stop_process

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's AMQP listener")


BROKER_CONFIG = """
[server]
data_dir = ""
[admin]
listen = []
[native]
listen = ["127.0.0.1:0"]
shm = false
[mqtt]
listen = ["127.0.0.1:0"]
ws = []
[stomp]
listen = ["127.0.0.1:0"]
[amqp]
listen = ["127.0.0.1:0"]
heartbeat_secs = 10
vhosts = ["/", "dev", "a*b/c"]
"""


def start_broker(tmp_path, extra: str = ""):
    """The tests' broker (BROKER_CONFIG, then `extra`): its process and its ports."""
    from test_dashboard import HAYATE

    cfg = tmp_path / "hayate.toml"
    cfg.write_text(BROKER_CONFIG + extra)
    return start_hayate(HAYATE, cfg, tmp_path / "broker.log")


@pytest.fixture
def broker(tmp_path):
    proc, ports = start_broker(tmp_path)
    yield ports
    stop_process(proc)


def connect(ports, vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["amqp"], virtual_host=vhost, connection_attempts=1,
        socket_timeout=5, blocked_connection_timeout=10))


def drain(ch, queue: str, n: int, auto_ack=True, timeout=10.0) -> list:
    """The first `n` messages of `queue` (method, properties, body) via basic.consume."""
    got = []
    deadline = time.monotonic() + timeout
    for method, props, body in ch.consume(queue, auto_ack=auto_ack, inactivity_timeout=0.2):
        if method is not None:
            got.append((method, props, body))
            if len(got) == n:
                break
        if time.monotonic() > deadline:
            break
    ch.cancel()
    return got


def test_publish_consume_ack_and_properties(broker):
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    assert q.startswith("amq.gen-")
    props = pika.BasicProperties(content_type="text/plain", correlation_id="c-1",
                                 message_id="m-1", headers={"app": "x", "n": 7},
                                 delivery_mode=2, priority=3, timestamp=1700000000,
                                 type="t", app_id="pytest")
    for i in range(5):
        ch.basic_publish("", q, f"msg-{i}".encode(), props)
    got = drain(ch, q, 5, auto_ack=False)
    assert [b for _, _, b in got] == [f"msg-{i}".encode() for i in range(5)]
    m, p, _ = got[0]
    assert (m.exchange, m.routing_key, m.redelivered) == ("", q, False)
    assert (p.content_type, p.correlation_id, p.message_id) == ("text/plain", "c-1", "m-1")
    assert (p.delivery_mode, p.priority, p.timestamp, p.type, p.app_id) == (2, 3, 1700000000, "t", "pytest")
    assert p.headers["app"] == b"x" or p.headers["app"] == "x"
    ch.basic_ack(got[-1][0].delivery_tag, multiple=True)
    declared = ch.queue_declare(queue=q, passive=True).method
    assert (declared.message_count, declared.consumer_count) == (0, 0)
    conn.close()


def test_headers_table_keeps_its_types_and_mqtt_sees_text(broker):
    # Celery relies on this: 'ignore_result': False must come back as a boolean, not the
    # text "False" (which is true in Python); arrays, tables and void must come back too.
    tag = uuid.uuid4().hex[:8]
    headers = {"flag": False, "on": True, "n": 7, "big": 2 ** 40, "neg": -3, "dec": decimal.Decimal("1.50"),
               "ts": datetime.datetime(2026, 11, 26, 4, 0, 0, tzinfo=datetime.timezone.utc),
               "s": "text", "void": None, "arr": [1, "a", None], "tbl": {"k": 2, "t": {}}}
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", f"h.{tag}")
    received = []
    ev = threading.Event()
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"amqp-h-{tag}",
                    protocol=paho.MQTTv5)
    m.on_message = lambda c, u, msg: (received.append(msg), ev.set())
    m.connect("127.0.0.1", broker["mqtt"])
    m.loop_start()
    m.subscribe(f"h/{tag}", qos=0)
    time.sleep(0.3)
    ch.basic_publish("amq.topic", f"h.{tag}", b"typed",
                     pika.BasicProperties(headers=headers, content_type="text/plain"))
    [(_, props, body)] = drain(ch, q, 1)
    assert body == b"typed"
    assert props.headers == headers
    assert props.content_type == "text/plain"
    # The MQTT subscriber gets the scalar entries as text user properties, and no binary
    # copy of the table.
    assert ev.wait(5)
    user = dict(received[0].properties.UserProperty)
    assert user["flag"] == "false" and user["n"] == "7" and user["s"] == "text"
    assert "amqp-table" not in user
    m.loop_stop()
    conn.close()


def test_nack_requeue_reject_and_redelivery_on_close(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="work-nack")
    ch.basic_publish("", "work-nack", b"a")
    ch.basic_publish("", "work-nack", b"b")
    m, _, body = ch.basic_get("work-nack")
    assert body == b"a"
    ch.basic_nack(m.delivery_tag, requeue=True)
    m, _, body = ch.basic_get("work-nack")
    assert (body, m.redelivered) == (b"a", True)
    ch.basic_reject(m.delivery_tag, requeue=False)  # dropped: no dead-letter exchange
    m, _, body = ch.basic_get("work-nack")
    assert body == b"b"
    # Left unacknowledged when the connection goes: back in the queue, redelivered.
    conn.close()
    conn = connect(broker)
    ch = conn.channel()
    m, _, body = ch.basic_get("work-nack", auto_ack=True)
    assert (body, m.redelivered) == (b"b", True)
    assert ch.basic_get("work-nack") == (None, None, None)
    # An unknown delivery tag closes the channel with PRECONDITION_FAILED.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_ack(999)
        ch.queue_declare(queue="work-nack", passive=True)
    assert e.value.reply_code == 406
    conn.channel().queue_delete("work-nack")
    conn.close()


def test_messages_given_back_keep_their_order(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="order-q")
    for i in range(6):
        ch.basic_publish("", "order-q", str(i).encode())
    got = [ch.basic_get("order-q") for _ in range(3)]
    assert [b for _, _, b in got] == [b"0", b"1", b"2"]
    # All three back (nack multiple, requeue): first again, in order, redelivered.
    ch.basic_nack(got[-1][0].delivery_tag, multiple=True, requeue=True)
    again = [ch.basic_get("order-q") for _ in range(4)]
    assert [b for _, _, b in again] == [b"0", b"1", b"2", b"3"]
    assert [m.redelivered for m, _, _ in again] == [True, True, True, False]
    # Left unacknowledged when the connection closes: back in order too.
    conn.close()
    conn = connect(broker)
    ch = conn.channel()
    back = [ch.basic_get("order-q", auto_ack=True)[2] for _ in range(6)]
    assert back == [b"0", b"1", b"2", b"3", b"4", b"5"]
    ch.queue_delete("order-q")
    conn.close()


def test_prefetch_limits_unacknowledged_deliveries(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="prefetch-q")
    for i in range(10):
        ch.basic_publish("", "prefetch-q", str(i).encode())
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume("prefetch-q", lambda c, m, p, b: got.append(m.delivery_tag))

    def settle(n):
        # process_data_events returns after the first events it dispatches, and deliveries
        # written apart arrive in reads of their own: loop until n came (at most 5 s), then
        # 0.3 s more, for any delivery past the prefetch limit to show.
        deadline = time.monotonic() + 5
        while len(got) < n and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            conn.process_data_events(time_limit=0.05)

    settle(3)
    assert len(got) == 3, got
    ch.basic_ack(got[-1], multiple=True)
    settle(6)
    assert len(got) == 6, got
    conn.close()


def test_confirms_mandatory_returns_and_transactions(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue="confirm-q")
    for i in range(20):
        ch.basic_publish("", "confirm-q", b"x", mandatory=True)  # raises unless acked
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", "nobody-bound", b"lost", mandatory=True)
    assert ch.queue_declare(queue="confirm-q", passive=True).method.message_count == 20
    # A transaction: publishes and acks take effect at commit, not before, nor at rollback.
    tx = conn.channel()
    tx.tx_select()
    tx.basic_publish("", "confirm-q", b"in-tx")
    tx.tx_rollback()
    assert ch.queue_declare(queue="confirm-q", passive=True).method.message_count == 20
    tx.basic_publish("", "confirm-q", b"in-tx")
    assert ch.queue_declare(queue="confirm-q", passive=True).method.message_count == 20
    tx.tx_commit()
    assert ch.queue_declare(queue="confirm-q", passive=True).method.message_count == 21
    ch.queue_delete("confirm-q")
    conn.close()


def test_exchanges_of_each_type(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.exchange_declare("ex-direct", "direct")
    ch.exchange_declare("ex-fanout", "fanout")
    ch.exchange_declare("ex-topic", "topic")
    ch.exchange_declare("ex-headers", "headers")
    qs = {name: ch.queue_declare(queue="", exclusive=True).method.queue
          for name in ["d", "f1", "f2", "t", "h"]}
    ch.queue_bind(qs["d"], "ex-direct", "green")
    ch.queue_bind(qs["f1"], "ex-fanout")
    ch.queue_bind(qs["f2"], "ex-fanout")
    ch.queue_bind(qs["t"], "ex-topic", "a.*.c")
    ch.queue_bind(qs["h"], "ex-headers", arguments={"x-match": "all", "kind": "big"})
    ch.basic_publish("ex-direct", "green", b"d1")
    ch.basic_publish("ex-direct", "red", b"d2")
    ch.basic_publish("ex-fanout", "whatever", b"f")
    ch.basic_publish("ex-topic", "a.b.c", b"t1")
    ch.basic_publish("ex-topic", "a.b.d", b"t2")
    ch.basic_publish("ex-headers", "", b"h1", pika.BasicProperties(headers={"kind": "big"}))
    ch.basic_publish("ex-headers", "", b"h2", pika.BasicProperties(headers={"kind": "small"}))
    time.sleep(0.2)
    def bodies(q):
        out = []
        while True:
            m, _, b = ch.basic_get(q, auto_ack=True)
            if m is None:
                return out
            out.append(b)
    assert bodies(qs["d"]) == [b"d1"]
    assert bodies(qs["f1"]) == [b"f"] and bodies(qs["f2"]) == [b"f"]
    assert bodies(qs["t"]) == [b"t1"]
    assert bodies(qs["h"]) == [b"h1"]
    # Redeclaring with another type: PRECONDITION_FAILED on the channel.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_declare("ex-direct", "fanout")
    assert e.value.reply_code == 406
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_declare("nowhere", "direct", passive=True)
    assert e.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.basic_publish("nowhere", "x", b"y")
        ch.queue_declare(queue="", exclusive=True)
    assert e.value.reply_code == 404
    conn.close()


def test_a_publish_matching_several_bindings_enters_a_queue_once(broker):
    """As RabbitMQ: a message that matches two or more bindings of one queue is in it once
    (topic patterns that overlap, a fanout bound twice, a headers exchange with one
    binding that refuses and one that takes), from AMQP, MQTT and native publishers alike;
    another queue bound once still gets its own copy."""
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    other = ch.queue_declare(queue="", exclusive=True).method.queue
    for bk in (f"o.{tag}.*", "o.*.b", f"o.{tag}.#", "o.#"):
        ch.queue_bind(q, "amq.topic", bk)
    ch.queue_bind(other, "amq.topic", f"o.{tag}.b")
    ch.exchange_declare(f"fan-{tag}", "fanout")
    ch.queue_bind(q, f"fan-{tag}", "one")
    ch.queue_bind(q, f"fan-{tag}", "two")
    ch.exchange_declare(f"hdr-{tag}", "headers")
    ch.queue_bind(q, f"hdr-{tag}", "no", arguments={"x-match": "all", "k": "nope"})
    ch.queue_bind(q, f"hdr-{tag}", "yes", arguments={"x-match": "any", "k": "v"})
    ch.queue_bind(q, f"hdr-{tag}", "yes-too", arguments={"x-match": "all", "k": "v"})
    for i in range(3):
        ch.basic_publish("amq.topic", f"o.{tag}.b", f"topic-{i}".encode(), mandatory=True)
    ch.basic_publish(f"fan-{tag}", "", b"fanout", mandatory=True)
    ch.basic_publish(f"hdr-{tag}", "", b"headers", pika.BasicProperties(headers={"k": "v"}),
                     mandatory=True)
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"amqp-once-{tag}")
    m.connect("127.0.0.1", broker["mqtt"])
    m.loop_start()
    m.publish(f"o/{tag}/b", b"from-mqtt", qos=1).wait_for_publish(5)
    m.loop_stop()
    m.disconnect()
    got = drain(ch, q, 7, timeout=3.0)
    assert sorted(b for _, _, b in got) == sorted(
        [b"topic-0", b"topic-1", b"topic-2", b"fanout", b"headers", b"from-mqtt"]), \
        "each publish once, whatever the number of bindings it matched"
    got = drain(ch, other, 5, timeout=2.0)
    assert sorted(b for _, _, b in got) == [b"from-mqtt", b"topic-0", b"topic-1", b"topic-2"]
    conn.close()


def bodies_of(ch, q) -> list:
    """Everything `q` holds now, by basic.get."""
    out = []
    while True:
        m, _, b = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append((m.exchange, m.routing_key, b))


def test_exchange_to_exchange_bindings_route_as_rabbitmq(broker):
    """exchange.bind: a message goes on through the destination's bindings when the
    source's binding takes it (each exchange matching as its type does), keeps the exchange
    it was published to and its routing key, enters a queue once whatever the number of
    paths (cycles included), and stops when the binding or an exchange goes. MQTT publishes
    take the same routes from amq.topic."""
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    src, top, fan, hdr = (f"{n}-{tag}" for n in ("src", "top", "fan", "hdr"))
    ch.exchange_declare(src, "direct")
    ch.exchange_declare(top, "topic")
    ch.exchange_declare(fan, "fanout")
    ch.exchange_declare(hdr, "headers")
    # direct src --a.b--> topic top --a.*--> queue qt
    ch.exchange_bind(top, src, "a.b")
    qt = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(qt, top, "a.*")
    # fanout fan --(any)--> topic top: qt also gets fan's a.* messages.
    ch.exchange_bind(top, fan, "ignored")
    # amq.topic --x.#--> fanout fan --> headers hdr --(k=v)--> queue qh
    ch.exchange_bind(fan, "amq.topic", f"x.{tag}.#")
    ch.exchange_bind(hdr, fan, "")
    qh = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(qh, hdr, "", arguments={"x-match": "all", "k": "v"})
    ch.basic_publish(src, "a.b", b"1")          # src takes, top takes: qt
    ch.basic_publish(src, "a.c", b"2")          # src's binding refuses
    ch.basic_publish(fan, "a.z", b"3")          # fan takes all, top takes a.*: qt
    ch.basic_publish(fan, "b.z", b"4")          # top refuses
    ch.basic_publish("amq.topic", f"x.{tag}.y", b"5",
                     pika.BasicProperties(headers={"k": "v"}))   # qh (and not qt: x.*.y)
    ch.basic_publish("amq.topic", f"x.{tag}.y", b"6",
                     pika.BasicProperties(headers={"k": "w"}))   # hdr refuses
    # A round trip on the channel: the broker has routed the publishes above before the
    # MQTT one below (two connections have no order of their own).
    ch.queue_declare(queue=qh, passive=True)
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"e2e-{tag}",
                    protocol=paho.MQTTv5)
    m.connect("127.0.0.1", broker["mqtt"])
    m.loop_start()
    from paho.mqtt.properties import Properties
    from paho.mqtt.packettypes import PacketTypes
    props = Properties(PacketTypes.PUBLISH)
    props.UserProperty = [("k", "v")]
    m.publish(f"x/{tag}/mqtt", b"7", qos=1, properties=props).wait_for_publish(5)
    m.loop_stop()
    m.disconnect()
    time.sleep(0.3)
    assert bodies_of(ch, qt) == [(src, "a.b", b"1"), (fan, "a.z", b"3")]
    assert bodies_of(ch, qh) == [("amq.topic", f"x.{tag}.y", b"5"),
                                 ("amq.topic", f"x.{tag}.mqtt", b"7")]
    # A cycle: c1 <-> c2, a queue bound to both: each publish once.
    c1, c2 = f"c1-{tag}", f"c2-{tag}"
    ch.exchange_declare(c1, "fanout")
    ch.exchange_declare(c2, "fanout")
    ch.exchange_bind(c2, c1)
    ch.exchange_bind(c1, c2)
    ch.exchange_bind(c1, c1)
    qc = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(qc, c1)
    ch.queue_bind(qc, c2)
    ch.confirm_delivery()
    ch.basic_publish(c1, "k", b"once-1", mandatory=True)
    ch.basic_publish(c2, "k", b"once-2", mandatory=True)
    time.sleep(0.2)
    assert bodies_of(ch, qc) == [(c1, "k", b"once-1"), (c2, "k", b"once-2")]
    # mandatory: a publish a route subscribes to but a later hop refuses is returned.
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish(fan, "b.z", b"returned", mandatory=True)
    ch.basic_publish(fan, "a.q", b"routed", mandatory=True)
    assert bodies_of(ch, qt) == [(fan, "a.q", b"routed")]
    # if-unused: the source of an exchange binding is in use.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_delete(src, if_unused=True)
    assert e.value.reply_code == 406
    ch = conn.channel()
    # unbind: the route is gone; deleting an exchange in the middle ends the rest.
    ch.exchange_unbind(top, src, "a.b")
    ch.exchange_unbind(top, src, "a.b")  # again: nothing to do, not an error
    ch.basic_publish(src, "a.b", b"after-unbind")
    ch.exchange_delete(fan)
    ch.basic_publish("amq.topic", f"x.{tag}.y", b"after-delete",
                     pika.BasicProperties(headers={"k": "v"}))
    time.sleep(0.2)
    assert bodies_of(ch, qt) == [] and bodies_of(ch, qh) == []
    # Errors as RabbitMQ's: a missing end (404), the default exchange (403).
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_bind(top, f"nowhere-{tag}", "k")
    assert e.value.reply_code == 404
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.exchange_bind("", top, "k")
    assert e.value.reply_code == 403
    conn.close()


def test_auto_delete_exchanges_go_with_their_last_binding(broker):
    """As RabbitMQ: an auto-delete exchange stays until it has been bound and its last
    binding as a source (a queue's or an exchange's) goes: by unbind, by its queue's
    deletion (an exclusive queue when its connection closes), by the deletion of the
    exchange bound to it; the loss cascades through exchange bindings."""
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    ad, keep = f"ad-{tag}", f"keep-{tag}"
    ch.exchange_declare(ad, "direct", auto_delete=True)
    ch.exchange_declare(keep, "direct")
    ch.exchange_declare(ad, "direct", passive=True)  # never bound: still there
    q1 = ch.queue_declare(queue="", exclusive=True).method.queue
    q2 = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q1, ad, "a")
    ch.queue_bind(q2, ad, "b")
    ch.queue_bind(q1, keep, "a")
    ch.queue_unbind(q1, ad, "a")
    ch.exchange_declare(ad, "direct", passive=True)  # q2's binding is left
    ch.queue_unbind(q1, keep, "a")
    ch.queue_delete(q2)
    assert refused(conn, lambda c: c.exchange_declare(ad, "direct", passive=True)) == 404
    ch = conn.channel()
    ch.exchange_declare(keep, "direct", passive=True)  # not auto-delete: stays
    # Through exchange bindings: src -> mid -> an exclusive queue; the connection closes.
    src, mid = f"ad-src-{tag}", f"ad-mid-{tag}"
    other = connect(broker)
    och = other.channel()
    och.exchange_declare(src, "fanout", auto_delete=True)
    och.exchange_declare(mid, "fanout", auto_delete=True)
    och.exchange_bind(mid, src)
    q3 = och.queue_declare(queue="", exclusive=True).method.queue
    och.queue_bind(q3, mid)
    och.basic_publish(src, "k", b"through")
    time.sleep(0.2)
    assert [b for _, _, b in bodies_of(och, q3)] == [b"through"]
    other.close()
    time.sleep(0.3)
    for x in (src, mid):
        assert refused(conn, lambda c: c.exchange_declare(x, "fanout", passive=True)) == 404, x
    conn.close()


def test_hostile_exchange_binding_graphs_are_refused_in_bounded_time(broker):
    """A dense graph of exchange bindings (every path a route) is refused with 406 once a
    queue would get more than 1024 routes, in bounded time, and leaves the routes as they
    were; the broker serves others throughout."""
    tag = uuid.uuid4().hex[:8]
    bystander = connect(broker)
    bch = bystander.channel()
    bq = bch.queue_declare(queue="", exclusive=True).method.queue
    conn = connect(broker)
    ch = conn.channel()
    xs = [f"g{i}-{tag}" for i in range(9)]
    for x in xs:
        ch.exchange_declare(x, "fanout")
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q, xs[0])
    refused_at = None
    started = time.monotonic()
    for a in xs:
        for b in xs:
            if a == b:
                continue
            try:
                ch.exchange_bind(b, a)
            except pika.exceptions.ChannelClosedByBroker as e:
                assert e.reply_code == 406 and "routes" in e.reply_text, e
                refused_at = (a, b)
                ch = conn.channel()
    took = time.monotonic() - started
    assert refused_at is not None, "9 fully connected exchanges make far more than 1024 paths"
    assert took < 20, f"72 binds took {took:.1f} s"
    # What was accepted still routes, once.
    ch.basic_publish(xs[1], "k", b"through")
    time.sleep(0.2)
    assert bodies_of(ch, q) == [(xs[1], "k", b"through")]
    bch.basic_publish("", bq, b"still")
    assert bch.basic_get(bq, auto_ack=True)[2] == b"still"
    conn.close()
    bystander.close()


def test_routes_stay_whole_while_a_hostile_client_churns_exchange_bindings(broker):
    """A queue fed through src -> dst keeps every message once while another client binds
    and unbinds other exchanges into dst and src (each change recomputes the queue's routes:
    the route it keeps must not miss or repeat a message)."""
    tag = uuid.uuid4().hex[:8]
    src, dst = f"churn-src-{tag}", f"churn-dst-{tag}"
    setup = connect(broker)
    sch = setup.channel()
    sch.exchange_declare(src, "topic")
    sch.exchange_declare(dst, "fanout")
    sch.exchange_bind(dst, src, "m.#")
    q = sch.queue_declare(queue="", exclusive=True).method.queue
    sch.queue_bind(q, dst)
    others = [f"churn-x{i}-{tag}" for i in range(6)]
    for x in others:
        sch.exchange_declare(x, "fanout")
    stop = threading.Event()
    changes = [0]

    def churn():
        c = connect(broker)
        ch = c.channel()
        i = 0
        while not stop.is_set():
            x = others[i % len(others)]
            ch.exchange_bind(dst, x)
            ch.exchange_bind(src, x, f"k{i % 3}")
            ch.exchange_unbind(dst, x)
            ch.exchange_unbind(src, x, f"k{i % 3}")
            changes[0] += 4
            i += 1
        c.close()

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    pub = connect(broker)
    pch = pub.channel()
    pch.confirm_delivery()
    n = 3000
    for i in range(n):
        pch.basic_publish(src, f"m.{i % 7}", str(i).encode())
    stop.set()
    t.join(30)
    got = drain(sch, q, n + 1, timeout=15)
    bodies = [int(b) for _, _, b in got]
    print(f"{changes[0]} binding changes during {n} confirmed publishes")
    assert changes[0] > 40, f"only {changes[0]} binding changes happened meanwhile"
    assert sorted(bodies) == list(range(n)), \
        f"{len(bodies)} of {n}, {len(bodies) - len(set(bodies))} repeated"
    assert bodies == sorted(bodies), "out of order"
    pub.close()
    setup.close()


def test_long_exchange_binding_chains_are_bounded_per_queue_and_per_vhost(broker):
    """A line of exchange bindings costs a queue at its end one route per exchange and one
    hop per binding on the way: past 8192 for one queue, or 65536 for a vhost's queues,
    the binding that would pass it gets 406 and changes nothing."""
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    xs = [f"l{i}-{tag}" for i in range(140)]
    for x in xs:
        ch.exchange_declare(x, "fanout")
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q, xs[-1])
    accepted = 0
    for i in range(len(xs) - 2, -1, -1):
        try:
            ch.exchange_bind(xs[i + 1], xs[i])
            accepted += 1
        except pika.exceptions.ChannelClosedByBroker as e:
            assert e.reply_code == 406 and "8192" in e.reply_text, e
            ch = conn.channel()
            break
    # n bindings: n routes of 1..n hops, n + n(n+1)/2 <= 8192.
    assert accepted == 126, accepted
    first = xs[len(xs) - 1 - accepted]
    ch.basic_publish(first, "k", b"all-the-way")
    time.sleep(0.3)
    assert bodies_of(ch, q) == [(first, "k", b"all-the-way")]
    # Nine more queues at the end of the line: 10 x 8127 > 65536.
    qs = []
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        for _ in range(9):
            qs.append(ch.queue_declare(queue="", exclusive=True).method.queue)
            ch.queue_bind(qs[-1], xs[-1])
    assert e.value.reply_code == 406 and "65536" in e.value.reply_text
    assert len(qs) == 8, "eight queues of 8127 fit in 65536 with the first"
    ch = conn.channel()
    ch.basic_publish(first, "k", b"again")
    time.sleep(0.3)
    assert bodies_of(ch, q) == [(first, "k", b"again")]
    assert bodies_of(ch, qs[-1]) == [], "the refused binding routes nothing"
    assert bodies_of(ch, qs[0]) == [(first, "k", b"again")]
    conn.close()


def test_a_hash_binding_on_amq_topic_sees_everything_but_reply_inboxes(broker):
    """In `/`, `#` on amq.topic covers every key, reply inboxes included: the binding is
    allowed, and its guard keeps other connections' direct reply-to replies out."""
    tag = uuid.uuid4().hex[:8]
    watcher = connect(broker)
    wch = watcher.channel()
    everything = wch.queue_declare(queue="", exclusive=True).method.queue
    wch.queue_bind(everything, "amq.topic", "#")
    server = connect(broker)
    sch = server.channel()
    sch.queue_declare(f"svc-{tag}", exclusive=True)
    client = connect(broker)
    cch = client.channel()
    replies = []
    cch.basic_consume("amq.rabbitmq.reply-to",
                      lambda c, m, p, b: replies.append(b), auto_ack=True)
    cch.basic_publish("", f"svc-{tag}", b"request",
                      pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        m, props, body = sch.basic_get(f"svc-{tag}", auto_ack=True)
        if m is not None:
            sch.basic_publish("", props.reply_to, b"reply-" + body)
            break
        time.sleep(0.05)
    while not replies and time.monotonic() < deadline:
        client.process_data_events(time_limit=0.1)
    assert replies == [b"reply-request"]
    wch.basic_publish("amq.topic", f"hello.{tag}", b"hello")
    time.sleep(0.3)
    got = [b for _, _, b in bodies_of(wch, everything)]
    assert b"hello" in got and b"request" in got
    assert b"reply-request" not in got, "another connection's reply reached a '#' binding"
    for c in (watcher, server, client):
        c.close()


@pytest.fixture
def users_broker(tmp_path):
    from test_dashboard import HAYATE

    def user(name, password, group):
        out = subprocess.run([str(HAYATE), "user", "add", name, "--password", password],
                             check=True, capture_output=True, text=True).stdout
        return out.replace(f"[auth.users.{name}]", f"[auth.users.{name}]\ngroups = [\"{group}\"]")

    cfg = tmp_path / "hayate.toml"
    cfg.write_text(f"""
[server]
data_dir = "{tmp_path / 'data'}"
[admin]
listen = []
[native]
listen = ["127.0.0.1:0"]
shm = false
[mqtt]
listen = []
ws = []
[stomp]
listen = []
[amqp]
listen = ["127.0.0.1:0"]
[auth.groups.worker]
subscribe = ["q/**", "a/**", "amqp/**"]
deny_subscribe = ["a/secret/**", "amqp/ex-d/secret/**"]
serve = ["q/**"]
publish = ["q/**", "a/**", "amqp/**"]
[auth.groups.outsider]
subscribe = ["amqp/open/**"]
serve = ["q/bob"]
publish = ["amqp/open/**", "q/bob"]
""" + user("alice", "wonderland", "worker") + user("bob", "builder", "outsider"))
    proc, ports = start_hayate(HAYATE, cfg, tmp_path / "broker.log")
    yield ports
    stop_process(proc)


def connect_as(ports, user, password) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", ports["amqp"], credentials=pika.PlainCredentials(user, password),
        connection_attempts=1, socket_timeout=5))


def refused(conn, op) -> int:
    """The reply code of the channel error `op` (given a new channel) ends in."""
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        op(ch)
    return e.value.reply_code


def test_configured_users_bind_consume_and_bind_exchanges_within_their_permissions(
        users_broker):
    """With users configured, a user consumes and binds what its permissions allow (a
    binding that covers a denied key is allowed, and what it denies stays out), and is
    refused (403) what they do not; exchange.bind needs reading the source and writing
    the destination."""
    alice = connect_as(users_broker, "alice", "wonderland")
    ch = alice.channel()
    ch.queue_declare("q/one")
    ch.basic_publish("", "q/one", b"direct")
    time.sleep(0.1)
    assert ch.basic_get("q/one", auto_ack=True)[2] == b"direct"
    ch.queue_bind("q/one", "amq.topic", "a.#")
    ch.basic_publish("amq.topic", "a.x", b"open")
    ch.basic_publish("amq.topic", "a.secret.x", b"secret")
    ch.exchange_declare("ex-a", "topic")
    ch.exchange_declare("ex-b", "fanout")
    ch.exchange_bind("ex-b", "ex-a", "x.*")
    ch.queue_declare("q/two")
    ch.queue_bind("q/two", "ex-b")
    ch.basic_publish("ex-a", "x.y", b"through")
    ch.basic_publish("ex-a", "z.y", b"not-through")
    time.sleep(0.3)
    assert [b for _, _, b in bodies_of(ch, "q/one")] == [b"open"], \
        "a binding's guard keeps the keys its maker may not read out"
    assert bodies_of(ch, "q/two") == [("ex-a", "x.y", b"through")]
    # Reading amq.topic's a.# includes a denied a.secret.#: no exchange binding from it.
    assert refused(alice, lambda c: c.exchange_bind("ex-b", "amq.topic", "a.#")) == 403
    alice.close()

    bob = connect_as(users_broker, "bob", "builder")
    assert refused(bob, lambda c: c.exchange_bind("ex-b", "ex-a", "x.*")) == 403
    assert refused(bob, lambda c: c.exchange_unbind("ex-b", "ex-a", "x.*")) == 403
    assert refused(bob, lambda c: c.queue_bind("q/bob", "amq.topic", "a.#")) in (403, 404)
    bch = bob.channel()
    bch.queue_declare("q/bob")
    assert refused(bob, lambda c: c.queue_bind("q/bob", "amq.topic", "a.#")) == 403
    assert refused(bob, lambda c: c.basic_get("q/one")) == 403
    bch = bob.channel()
    bch.basic_publish("", "q/bob", b"mine")
    time.sleep(0.1)
    assert bch.basic_get("q/bob", auto_ack=True)[2] == b"mine"
    bob.close()


def test_amqp_permissions_on_queues_exchanges_and_routes(users_broker):
    """A user declares only queues it may consume from (never a reply inbox), dead-letters
    only where it may publish, binds and unbinds only queues it may publish to (or its own
    exclusive ones), deletes only exchanges it may publish to, binds a durable queue only to
    what it may read in full; a route through an exchange binding brings into a queue only
    what the queue's binding would."""
    alice = connect_as(users_broker, "alice", "wonderland")
    ch = alice.channel()
    ch.queue_declare("q/one")
    ch.exchange_declare("ex-a", "topic")
    ch.exchange_declare("ex-d", "topic")
    ch.exchange_declare("ex-s", "topic")
    bob = connect_as(users_broker, "bob", "builder")
    # Declaring: a reply inbox, a queue he may not consume from with a dead-letter
    # exchange (its way out), a DLX he may not publish to. Without a DLX a producer may
    # declare a queue it does not consume from (it cannot read what it collects).
    assert refused(bob, lambda c: c.queue_declare("_inbox/x/amqp")) == 403
    assert refused(bob, lambda c: c.queue_declare("q/stolen", arguments={
        "x-dead-letter-exchange": "amqp-open-dlx"})) == 403
    assert refused(bob, lambda c: c.queue_declare("q/bob", arguments={
        "x-dead-letter-exchange": "amq.topic"})) == 403
    bch = bob.channel()
    bch.queue_declare("q/produced")
    assert refused(bob, lambda c: c.basic_get("q/produced")) == 403
    bch = bob.channel()
    bch.queue_declare("q/bob")
    mine = bch.queue_declare(queue="", exclusive=True).method.queue
    # Binding: another user's queue (write on it) no; his own exclusive queue yes (to
    # what he may read).
    assert refused(bob, lambda c: c.queue_bind("q/one", "amq.topic", "amqp.open.#")) == 403
    assert refused(bob, lambda c: c.queue_unbind("q/one", "", "q/one")) == 403
    assert refused(bob, lambda c: c.exchange_delete("ex-a")) == 403
    bob.close()
    # A durable queue's binding must be readable in full (a.# covers the denied a.secret.#).
    ch.queue_declare("q/dur", durable=True)
    assert refused(alice, lambda c: c.queue_bind("q/dur", "amq.topic", "a.#")) == 403
    ch = alice.channel()
    ch.queue_bind("q/dur", "amq.topic", "a.open.#")
    # Routes: q/three bound to ex-d with '#', alice may not read amqp/ex-d/secret/**; a
    # route from ex-s brings in only what a publish to ex-d would.
    ch.queue_declare("q/three")
    ch.queue_bind("q/three", "ex-d", "#")
    ch.exchange_bind("ex-d", "ex-s", "#")
    ch.basic_publish("ex-s", "open.x", b"open")
    ch.basic_publish("ex-s", "secret.x", b"secret")
    ch.basic_publish("ex-d", "secret.y", b"direct-secret")
    time.sleep(0.3)
    assert [b for _, _, b in bodies_of(ch, "q/three")] == [b"open"]
    alice.close()


def test_dead_letters_never_reach_sys_and_mandatory_sees_past_other_vhosts(broker):
    """A dead letter whose routing key falls under $SYS is dropped ($SYS is read-only for
    clients); a mandatory publish in one vhost is returned when only another vhost's '#'
    binding was offered it."""
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    watch = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(watch, "amq.topic", f"$SYS.{tag}")
    ch.queue_bind(watch, "amq.topic", f"ok.{tag}")
    ch.queue_declare(f"dl-{tag}", exclusive=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "amq.topic",
        "x-dead-letter-routing-key": f"$SYS.{tag}"})
    ch.queue_declare(f"dl-ok-{tag}", exclusive=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "amq.topic",
        "x-dead-letter-routing-key": f"ok.{tag}"})
    ch.basic_publish("", f"dl-{tag}", b"to-sys")
    ch.basic_publish("", f"dl-ok-{tag}", b"to-ok")
    time.sleep(0.5)
    assert [b for _, _, b in bodies_of(ch, watch)] == [b"to-ok"]
    # Nobody names a queue after a reply inbox (its default binding would read it).
    assert refused(conn, lambda c: c.queue_declare("_inbox/x/amqp")) == 403
    ch = conn.channel()
    everything = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(everything, "amq.topic", "#")
    dev = connect(broker, "dev")
    dch = dev.channel()
    dch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        dch.basic_publish("amq.topic", f"nobody.{tag}", b"x", mandatory=True)
    dev.close()
    conn.close()


def test_queue_arguments_ttl_max_length_dead_letters(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="dlq")
    ch.queue_declare(queue="bounded", arguments={"x-max-length": 2,
                                                 "x-dead-letter-exchange": "",
                                                 "x-dead-letter-routing-key": "dlq"})
    for i in range(4):
        ch.basic_publish("", "bounded", str(i).encode())
    time.sleep(0.3)
    assert ch.queue_declare(queue="bounded", passive=True).method.message_count == 2
    assert [ch.basic_get("bounded", auto_ack=True)[2] for _ in range(2)] == [b"2", b"3"]
    dead = [ch.basic_get("dlq", auto_ack=True) for _ in range(2)]
    assert [d[2] for d in dead] == [b"0", b"1"]
    assert dead[0][1].headers.get("x-first-death-reason") in (b"maxlen", "maxlen")
    ch.queue_declare(queue="ttl", arguments={"x-message-ttl": 100})
    ch.basic_publish("", "ttl", b"old")
    time.sleep(0.4)
    assert ch.basic_get("ttl", auto_ack=True) == (None, None, None)
    # Redeclaring with other arguments: PRECONDITION_FAILED.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        ch.queue_declare(queue="ttl", arguments={"x-message-ttl": 5})
    assert e.value.reply_code == 406
    conn.close()


def test_max_length_bytes_counts_bodies_as_rabbitmq(broker):
    """x-max-length-bytes counts the ready messages' bodies only, as RabbitMQ does: ten
    100-byte bodies fit in 1,000 bytes and the eleventh drops the oldest (the broker's own
    bound and its memory budget count each message's whole footprint, far larger)."""
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="body-bounded", arguments={"x-max-length-bytes": 1000})
    for i in range(11):
        ch.basic_publish("", "body-bounded", b"%03d" % i + b"x" * 97)
    time.sleep(0.3)
    assert ch.queue_declare(queue="body-bounded", passive=True).method.message_count == 10
    assert ch.basic_get("body-bounded", auto_ack=True)[2][:3] == b"001"
    conn.close()


def test_priority_queues(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.queue_declare(queue="prio", arguments={"x-max-priority": 5})
    ch.queue_declare(queue="fifo")
    sent = [(b"a", 1), (b"b", 5), (b"c", None), (b"d", 9), (b"e", 5), (b"f", 3)]
    for body, p in sent:
        for q in ("prio", "fifo"):
            ch.basic_publish("", q, body, pika.BasicProperties(priority=p))
    time.sleep(0.3)
    # Higher priorities first (9 counts as the queue's 5), the same priority in order of
    # arrival, no priority as 0. A queue without x-max-priority keeps arrival order.
    got = [ch.basic_get("prio", auto_ack=False) for _ in range(6)]
    assert [g[2] for g in got] == [b"b", b"d", b"e", b"f", b"a", b"c"]
    assert [ch.basic_get("fifo", auto_ack=True)[2] for _ in range(6)] == \
        [b"a", b"b", b"c", b"d", b"e", b"f"]
    # Given back, a message returns to its place: before those of lower priority.
    ch.basic_nack(got[4][0].delivery_tag, requeue=True)   # a (1)
    ch.basic_nack(got[0][0].delivery_tag, requeue=True)   # b (5)
    for g in got[1:4] + got[5:]:
        ch.basic_ack(g[0].delivery_tag)
    time.sleep(0.2)
    again = [ch.basic_get("prio", auto_ack=True) for _ in range(2)]
    assert [(g[2], g[0].redelivered) for g in again] == [(b"b", True), (b"a", True)]
    for bad in (0, 256):
        c2 = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
            c2.queue_declare(queue=f"prio-bad-{bad}", arguments={"x-max-priority": bad})
        assert e.value.reply_code == 406
    conn.close()


def test_virtual_hosts_are_separate(broker):
    root, dev = connect(broker), connect(broker, "dev")
    rc, dc = root.channel(), dev.channel()
    # The same queue name in two vhosts: two queues.
    rc.queue_declare(queue="jobs")
    dc.queue_declare(queue="jobs")
    dc.basic_publish("", "jobs", b"dev-job",
                     pika.BasicProperties(reply_to="dev-replies", correlation_id="1"))
    rc.basic_publish("", "jobs", b"root-job")
    time.sleep(0.2)
    method, props, body = dc.basic_get("jobs", auto_ack=True)
    assert body == b"dev-job"
    # A reply-to naming a queue reads as the name the publisher gave, in its vhost.
    assert props.reply_to == "dev-replies"
    assert dc.basic_get("jobs", auto_ack=True) == (None, None, None)
    assert rc.basic_get("jobs", auto_ack=True)[2] == b"root-job"
    # Bindings see their own vhost only, both ways: dev's '#', and in '/' a binding whose
    # expression also covers dev's keys (amqp-vhost/dev/v/...).
    rq = rc.queue_declare(queue="", exclusive=True).method.queue
    rc.queue_bind(rq, "amq.topic", "v.#")
    rc.queue_bind(rq, "amq.topic", "amqp-vhost.*.v.#")
    dq = dc.queue_declare(queue="", exclusive=True).method.queue
    dc.queue_bind(dq, "amq.topic", "#")
    # Other protocols see a vhost's keys under amqp-vhost/<name>/.
    tag = uuid.uuid4().hex[:8]
    received, ev = [], threading.Event()
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"amqp-vh-{tag}")
    m.on_message = lambda c, u, msg: (received.append((msg.topic, msg.payload)), ev.set())
    m.connect("127.0.0.1", broker["mqtt"])
    m.loop_start()
    m.subscribe(f"amqp-vhost/dev/v/{tag}", qos=0)
    time.sleep(0.3)
    dc.basic_publish("amq.topic", f"v.{tag}", b"in-dev")
    rc.basic_publish("amq.topic", f"v.{tag}", b"in-root")
    # (Asking for two, waiting 1 s: a second would be the other vhost's.)
    assert [(mm.routing_key, b) for mm, _, b in drain(dc, dq, 2, timeout=1)] == \
        [(f"v.{tag}", b"in-dev")]
    assert [(mm.routing_key, b) for mm, _, b in drain(rc, rq, 2, timeout=1)] == \
        [(f"v.{tag}", b"in-root")]
    assert ev.wait(5)
    time.sleep(0.2)
    assert received == [(f"amqp-vhost/dev/v/{tag}", b"in-dev")]
    m.loop_stop()
    # '/' cannot write into dev by naming dev's keys: unroutable (returned), dev's queue
    # stays empty.
    rc.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        rc.basic_publish("", "amqp-vhost/dev/jobs", b"intruder", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        rc.basic_publish("amq.topic", "amqp-vhost.dev.jobs", b"intruder", mandatory=True)
    assert dc.basic_get("jobs", auto_ack=True) == (None, None, None)
    # A vhost whose name has characters keys treat specially works like any other.
    odd = connect(broker, "a*b/c")
    oc = odd.channel()
    oq = oc.queue_declare(queue="q*", exclusive=True).method.queue
    oc.queue_bind(oq, "amq.topic", "t.#")
    oc.basic_publish("", oq, b"direct")
    oc.basic_publish("amq.topic", "t.1", b"topic")
    assert [b for _, _, b in drain(oc, oq, 2, timeout=2)] == [b"direct", b"topic"]
    odd.close()
    # An unknown vhost: connection.close 530 NOT_ALLOWED, as RabbitMQ.
    with pytest.raises(pika.exceptions.AMQPConnectionError) as e:
        connect(broker, "nope")
    assert "530" in repr(e.value) or "NOT_ALLOWED" in repr(e.value) or \
        "not found" in repr(e.value)
    root.close()
    dev.close()


def test_reject_publish_nacks_the_confirm(broker):
    conn = connect(broker)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue="one-only", arguments={"x-max-length": 1,
                                                   "x-overflow": "reject-publish"})
    ch.basic_publish("", "one-only", b"first")          # confirmed: acked
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", "one-only", b"second")      # refused: nacked
    assert ch.basic_get("one-only", auto_ack=True)[2] == b"first"
    ch.basic_publish("", "one-only", b"third")           # room again: acked
    assert ch.basic_get("one-only", auto_ack=True)[2] == b"third"
    # Mandatory to a headers exchange: returned when no binding's arguments match.
    ch.exchange_declare("hx", exchange_type="headers")
    hq = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(hq, "hx", arguments={"x-match": "all", "k": "v"})
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("hx", "", b"no", pika.BasicProperties(headers={"k": "w"}),
                         mandatory=True)
    ch.basic_publish("hx", "", b"yes", pika.BasicProperties(headers={"k": "v"}),
                     mandatory=True)
    assert ch.basic_get(hq, auto_ack=True)[2] == b"yes"
    conn.close()


def test_large_bodies_cross_whole(broker):
    # Bodies of many frames (frame_max 128 KiB), around the sizes where the broker stops
    # copying frame payloads and queues them by reference (16 KiB).
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    sizes = [0, 1, 16 * 1024 - 1, 16 * 1024, 131072 - 8, 131072, 1024 * 1024 + 3,
             3 * 1024 * 1024]
    bodies = [bytes((i * 31 + n) % 251 for i in range(n)) for n in sizes]
    for b in bodies:
        ch.basic_publish("", q, b)
    got = [body for _, _, body in drain(ch, q, len(bodies))]
    assert [len(b) for b in got] == sizes
    assert got == bodies
    conn.close()


def test_hostile_headers_tables(broker):
    # A publisher sends a headers table of 12,000 entries (about 100 KB, near the frame
    # limit), and a STOMP client forges an `amqp-table` header (text, never taken for the
    # binary table). The AMQP consumer gets the table intact and the forged message without
    # the forgery, and a plain publish after them still flows.
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", f"hh.{tag}.#")
    big = {f"k{i}": (i % 2 == 0) for i in range(12000)}
    ch.basic_publish("amq.topic", f"hh.{tag}.big", b"big", pika.BasicProperties(headers=big))
    s = stomp.Connection12([("127.0.0.1", broker["stomp"])])
    s.connect(wait=True)
    s.send(f"/topic/hh/{tag}/forged", "forged", headers={"amqp-table": "not a table",
                                                        "plain": "yes"})
    ch.basic_publish("amq.topic", f"hh.{tag}.after", b"after")
    got = drain(ch, q, 3, timeout=15)
    by_body = {b: p for _, p, b in got}
    assert set(by_body) == {b"big", b"forged", b"after"}
    assert by_body[b"big"].headers == big
    # A forged `amqp-table` that is not a table is left out; the other headers stay.
    assert "amqp-table" not in by_body[b"forged"].headers
    assert by_body[b"forged"].headers.get("plain") in (b"yes", "yes")
    s.disconnect()
    conn.close()


def test_exclusive_queues_belong_to_their_connection(broker):
    a = connect(broker)
    q = a.channel().queue_declare(queue="mine", exclusive=True).method.queue
    b = connect(broker)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        b.channel().basic_consume(q, lambda *x: None)
    assert e.value.reply_code == 405
    a.close()
    time.sleep(0.2)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        b.channel().queue_declare(queue="mine", passive=True)
    assert e.value.reply_code == 404, "deleted with its connection"
    b.close()


@pytest.mark.parametrize("vhost", ["/", "dev"])
def test_direct_reply_to_rpc(broker, vhost):
    server = connect(broker, vhost)
    sch = server.channel()
    sch.queue_declare(queue="rpc-q")

    def on_request(c, m, p, body):
        c.basic_publish("", p.reply_to, body.upper(),
                        pika.BasicProperties(correlation_id=p.correlation_id))
        c.basic_ack(m.delivery_tag)

    sch.basic_consume("rpc-q", on_request)
    stop = threading.Event()

    def serve():
        # process_data_events returns after the first events it dispatches: loop.
        while not stop.is_set():
            server.process_data_events(time_limit=0.05)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    client = connect(broker, vhost)
    cch = client.channel()
    replies = []
    cch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append((p.correlation_id, b)),
                      auto_ack=True)
    for i in range(5):
        cch.basic_publish("", "rpc-q", f"req-{i}".encode(),
                          pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=str(i)))
    deadline = time.monotonic() + 5
    while len(replies) < 5 and time.monotonic() < deadline:
        client.process_data_events(time_limit=0.1)
    stop.set()
    t.join(5)
    assert sorted(replies) == [(str(i), f"REQ-{i}".encode()) for i in range(5)]
    client.close()
    server.close()


def test_cross_protocol_mqtt_stomp_amqp(broker):
    tag = uuid.uuid4().hex[:8]
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", f"x.{tag}.#")
    # MQTT publishes on x/<tag>/m, STOMP sends to /topic/x/<tag>/s: both reach the queue.
    m = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"amqp-x-{tag}")
    m.connect("127.0.0.1", broker["mqtt"])
    m.loop_start()
    m.publish(f"x/{tag}/m", b"from-mqtt", qos=1).wait_for_publish(5)
    s = stomp.Connection12([("127.0.0.1", broker["stomp"])])
    s.connect(wait=True)
    s.send(f"/topic/x/{tag}/s", "from-stomp")
    got = drain(ch, q, 2)
    assert sorted((mm.routing_key, b) for mm, _, b in got) == [
        (f"x.{tag}.m", b"from-mqtt"), (f"x.{tag}.s", b"from-stomp")]
    # And the reverse: an AMQP publish to amq.topic reaches an MQTT subscriber.
    received = []
    ev = threading.Event()
    m.on_message = lambda c, u, msg: (received.append((msg.topic, msg.payload)), ev.set())
    m.subscribe(f"y/{tag}/#", qos=0).__class__  # noqa: B018
    time.sleep(0.3)
    ch.basic_publish("amq.topic", f"y.{tag}.z", b"from-amqp")
    assert ev.wait(5)
    assert received == [(f"y/{tag}/z", b"from-amqp")]
    m.loop_stop()
    s.disconnect()
    conn.close()


def test_amqp_publishes_reach_an_mqtt_shared_subscription_once_each(broker):
    """A key with a queue group (an MQTT shared subscription) takes the publish path that
    may wait (the broker's publish_rest): every message reaches one member, none twice."""
    tag = uuid.uuid4().hex[:8]
    got: dict[int, list[bytes]] = {0: [], 1: []}
    members = []
    for i in range(2):
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"share-{tag}-{i}",
                        protocol=paho.MQTTv5)
        c.on_message = lambda _c, _u, msg, i=i: got[i].append(msg.payload)
        c.connect("127.0.0.1", broker["mqtt"])
        c.loop_start()
        c.subscribe(f"$share/g{tag}/s/{tag}/#", qos=1)
        members.append(c)
    time.sleep(0.3)
    conn = connect(broker)
    ch = conn.channel()
    for n in range(20):
        ch.basic_publish("amq.topic", f"s.{tag}.k", str(n).encode())
    deadline = time.time() + 10
    while len(got[0]) + len(got[1]) < 20 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    for c in members:
        c.loop_stop()
        c.disconnect()
    conn.close()
    assert sorted(got[0] + got[1]) == sorted(str(n).encode() for n in range(20))
    assert got[0] and got[1], got


def stomp_subscriber_that_never_reads(port: int, destination: str) -> socket.socket:
    """A STOMP 1.2 client that subscribes to `destination` (a `block` subscription), then
    never reads again; its receive buffer is small, so it fills at once."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:/\n\n\x00")
    s.sendall(f"SUBSCRIBE\nid:0\ndestination:{destination}\nack:auto\n\n\x00".encode())
    return s


def test_amqp_publisher_carries_on_past_a_subscriber_that_never_reads(tmp_path):
    """AMQP publishes whose key has a STOMP subscriber that never reads: its outbox (256 KiB
    here) fills, so a publish takes the path that waits (the broker's publish_rest) until
    max_block, then the subscriber's stall policy. The publisher finishes, an AMQP queue on
    the same key gets every message, the broker's memory stays bounded, and it serves new
    clients afterwards."""
    proc, ports = start_broker(
        tmp_path, "[limits]\nmax_block_ms = 300\noutbox_bytes = 262144\n")
    try:
        tag = uuid.uuid4().hex[:8]
        hog = stomp_subscriber_that_never_reads(ports["stomp"], f"/topic/h/{tag}/k")
        time.sleep(0.3)
        rss_before = rss_kib(proc.pid)
        conn = connect(ports)
        ch = conn.channel()
        q = ch.queue_declare(queue="", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", f"h.{tag}.#")
        pub = connect(ports)
        pch = pub.channel()
        body = b"p" * 4096
        started = time.time()
        for _ in range(2000):
            pch.basic_publish("amq.topic", f"h.{tag}.k", body)
        pub.process_data_events(0)
        took = time.time() - started
        assert took < 30, took
        got = drain(ch, q, 2000, timeout=30)
        assert len(got) == 2000 and all(b == body for _, _, b in got)
        # 2000 x 4 KiB went through: what the broker holds for the hog is its outbox.
        assert rss_kib(proc.pid) - rss_before < 64 * 1024
        fresh = connect(ports)
        fch = fresh.channel()
        fq = fch.queue_declare(queue="", exclusive=True).method.queue
        fch.basic_publish("", fq, b"after")
        assert drain(fch, fq, 1)[0][2] == b"after"
        for c in (fresh, pub, conn):
            c.close()
        hog.close()
    finally:
        stop_process(proc)
    # The publisher did wait for the hog, up to max_block, before its stall policy.
    assert "slow consumer" in (tmp_path / "broker.log").read_text()


def raw(ports) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", ports["amqp"]), timeout=5)
    return s


def frames_until_close(s: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                return out
            out += b
    except (socket.timeout, ConnectionResetError):
        return out


def connection_close_code(data: bytes) -> int | None:
    """The reply code of the first connection.close (class 10, method 50) in `data`."""
    i = 0
    while i + 7 <= len(data):
        ty, ch, size = struct.unpack(">BHI", data[i:i + 7])
        payload = data[i + 7:i + 7 + size]
        if ty == 1 and payload[:4] == b"\x00\x0a\x00\x32":
            return struct.unpack(">H", payload[4:6])[0]
        i += 8 + size
    return None


def handshake(s: socket.socket) -> None:
    """Protocol header, start-ok (PLAIN guest), tune-ok, open; reads what comes back."""
    s.sendall(b"AMQP\x00\x00\x09\x01")
    time.sleep(0.1)
    s.recv(65536)  # connection.start
    resp = b"\x00guest\x00guest"
    args = (struct.pack(">I", 0) + bytes([5]) + b"PLAIN" + struct.pack(">I", len(resp)) + resp
            + bytes([5]) + b"en_US")
    start_ok = b"\x00\x0a\x00\x0b" + args
    s.sendall(struct.pack(">BHI", 1, 0, len(start_ok)) + start_ok + b"\xce")
    time.sleep(0.1)
    s.recv(65536)  # connection.tune
    tune_ok = b"\x00\x0a\x00\x1f" + struct.pack(">HIH", 10, 4096, 0)
    s.sendall(struct.pack(">BHI", 1, 0, len(tune_ok)) + tune_ok + b"\xce")
    open_ = b"\x00\x0a\x00\x28" + bytes([1]) + b"/" + bytes([0]) + bytes([0])
    s.sendall(struct.pack(">BHI", 1, 0, len(open_)) + open_ + b"\xce")
    time.sleep(0.1)
    s.recv(65536)  # connection.open-ok


def test_after_close_ok_the_client_closes_the_socket(broker):
    """As RabbitMQ: after connection.close-ok the broker leaves the socket to the client (a
    client that reads close-ok and EOF together may count its own close as an error), and
    discards what it still sends; a client that never closes is cut off after about 1 s.
    Deliveries stop at close-ok."""
    ports = broker
    conn = connect(ports)
    ch = conn.channel()
    ch.queue_declare(queue="after-close")
    s = raw(ports)
    handshake(s)
    # channel.open, basic.consume on the queue (no-ack), then connection.close.
    s.sendall(struct.pack(">BHI", 1, 1, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce")
    consume = (b"\x00\x3c\x00\x14" + b"\x00\x00" + bytes([11]) + b"after-close" + bytes([0])
               + bytes([0b10]) + struct.pack(">I", 0))
    s.sendall(struct.pack(">BHI", 1, 1, len(consume)) + consume + b"\xce")
    time.sleep(0.2)
    s.recv(65536)  # open-ok, consume-ok
    close = b"\x00\x0a\x00\x32" + struct.pack(">H", 200) + bytes([3]) + b"bye" + struct.pack(">HH", 0, 0)
    s.sendall(struct.pack(">BHI", 1, 0, len(close)) + close + b"\xce")
    s.settimeout(0.5)
    got = s.recv(65536)
    assert got == struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x33" + b"\xce", got
    # Not closed by the broker yet; garbage sent now is discarded, not answered.
    s.sendall(b"garbage after close" * 100)
    ch.basic_publish("", "after-close", b"not for the closed consumer")
    t0 = time.monotonic()
    try:
        rest = s.recv(65536)
    except socket.timeout:
        rest = None
    assert rest is None, f"the broker sent {rest!r} after close-ok"
    s.settimeout(5)
    assert s.recv(65536) == b"", "the broker did not close the socket"
    assert time.monotonic() - t0 < 3
    s.close()
    # The message went to the queue (the closed connection's consumer was gone at close-ok).
    assert ch.basic_get("after-close", auto_ack=True)[2] == b"not for the closed consumer"

    # Many clients that close (before logging in) and then keep the socket open, writing:
    # each is cut off about 1 s after its close-ok, and the others carry on meanwhile.
    close_frame = struct.pack(">BHI", 1, 0, len(close)) + close + b"\xce"
    lingerers = []
    for _ in range(50):
        r = raw(ports)
        r.sendall(b"AMQP\x00\x00\x09\x01" + close_frame + b"junk" * 256)
        lingerers.append(r)
    t0 = time.monotonic()
    ch.basic_publish("", "after-close", b"meanwhile")
    assert ch.basic_get("after-close", auto_ack=True)[2] == b"meanwhile"
    for r in lingerers:
        r.settimeout(5)
        data = frames_until_close(r)
        assert data.endswith(struct.pack(">BHI", 1, 0, 4) + b"\x00\x0a\x00\x33" + b"\xce"), data[-40:]
        r.close()
    assert time.monotonic() - t0 < 4, "lingering connections were not cut off"
    conn.close()


@pytest.mark.parametrize("bad,code", [
    # A frame larger than the negotiated 4096 bytes: FRAME_ERROR.
    (struct.pack(">BHI", 1, 1, 100_000) + b"x" * 100, 501),
    # An unknown class/method: NOT_IMPLEMENTED.
    (struct.pack(">BHI", 1, 1, 4) + b"\x00\x63\x00\x01" + b"\xce", 540),
    # A channel past channel_max (10): CHANNEL_ERROR.
    (struct.pack(">BHI", 1, 500, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce", 504),
    # A method on a channel never opened: CHANNEL_ERROR.
    (struct.pack(">BHI", 1, 3, 5) + b"\x00\x55\x00\x0a\x00" + b"\xce", 504),
    # A bad frame end: FRAME_ERROR.
    (struct.pack(">BHI", 8, 0, 0) + b"\x00", 501),
    # A content header without basic.publish: UNEXPECTED_FRAME (after channel.open).
    (struct.pack(">BHI", 1, 1, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce"
     + struct.pack(">BHI", 2, 1, 14) + b"\x00\x3c\x00\x00" + struct.pack(">Q", 1) + b"\x00\x00\xce", 505),
    # A body longer than its header announced: FRAME_ERROR.
    (struct.pack(">BHI", 1, 1, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce"
     + struct.pack(">BHI", 1, 1, 10) + b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00" + b"\xce"
     + struct.pack(">BHI", 2, 1, 14) + b"\x00\x3c\x00\x00" + struct.pack(">Q", 2) + b"\x00\x00\xce"
     + struct.pack(">BHI", 3, 1, 5) + b"12345" + b"\xce", 501),
])
def test_bad_input_gets_the_error_rabbitmq_sends(broker, bad, code):
    bystander = connect(broker)
    bch = bystander.channel()
    bq = bch.queue_declare(queue="", exclusive=True).method.queue
    s = raw(broker)
    handshake(s)
    s.sendall(bad)
    data = frames_until_close(s)
    assert connection_close_code(data) == code, data[:200]
    s.close()
    # The broker and its other clients carry on.
    bch.basic_publish("", bq, b"still")
    assert bch.basic_get(bq, auto_ack=True)[2] == b"still"
    bystander.close()


def test_not_amqp_gets_the_protocol_header(broker):
    s = raw(broker)
    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert frames_until_close(s) == b"AMQP\x00\x00\x09\x01"
    s.close()


def test_kombu_simple_queue(broker):
    from kombu import Connection

    with Connection(f"amqp://guest:guest@127.0.0.1:{broker['amqp']}//", connect_timeout=5) as c:
        q = c.SimpleQueue("kombu-q")
        q.put({"hello": "world", "n": 1})
        m = q.get(timeout=5)
        assert m.payload == {"hello": "world", "n": 1}
        m.ack()
        q.put("again")
        assert q.get(timeout=5).payload == "again"
        q.close()


@pytest.fixture
def small_broker(tmp_path):
    """A broker with small AMQP bounds: 2 MiB per queue, 8 channels, 1 MiB messages, a 1 s
    handshake."""
    from test_dashboard import HAYATE

    cfg = tmp_path / "hayate.toml"
    cfg.write_text("""
[server]
data_dir = ""
[admin]
listen = []
[native]
listen = []
[mqtt]
listen = []
ws = []
[stomp]
listen = []
[amqp]
listen = ["127.0.0.1:0"]
channel_max = 8
queue_max_bytes = 2097152
max_message_size = 1048576
[limits]
handshake_timeout_ms = 1000
""")
    proc, ports = start_hayate(HAYATE, cfg, tmp_path / "broker.log")
    yield proc, ports
    stop_process(proc)


def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_hostile_amqp_clients(small_broker):
    proc, ports = small_broker
    # A consumer that never reads: raw handshake, basic.consume with no_ack, then silence.
    s = raw(ports)
    handshake(s)
    s.sendall(struct.pack(">BHI", 1, 1, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce")
    conn = connect(ports)
    ch = conn.channel()
    ch.queue_declare(queue="hog")
    consume = (b"\x00\x3c\x00\x14" + b"\x00\x00" + bytes([3]) + b"hog" + bytes([0])
               + bytes([0b10]) + struct.pack(">I", 0))
    s.sendall(struct.pack(">BHI", 1, 1, len(consume)) + consume + b"\xce")
    time.sleep(0.3)
    before = rss_kib(proc.pid)
    # 64 MiB published at it: the queue keeps at most 2 MiB, the consumer's outbox 1 MiB
    # (plus what its socket buffers hold); the publisher is never held back.
    body = b"x" * 65536
    t0 = time.monotonic()
    for _ in range(1024):
        ch.basic_publish("", "hog", body)
    ch.queue_declare(queue="hog", passive=True)  # a round trip: all routed
    assert time.monotonic() - t0 < 10, "the publisher was held back by a consumer that never reads"
    grown = rss_kib(proc.pid) - before
    assert grown < 48 * 1024, f"the broker grew by {grown} KiB for a consumer that never reads"
    # Everyone else carries on.
    other = conn.channel()
    q = other.queue_declare(queue="", exclusive=True).method.queue
    other.basic_publish("", q, b"fine")
    assert other.basic_get(q, auto_ack=True)[2] == b"fine"
    s.close()

    # Channels past channel_max (8): CHANNEL_ERROR, the connection closed.
    s = raw(ports)
    handshake(s)
    for n in range(1, 10):
        s.sendall(struct.pack(">BHI", 1, n, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce")
    assert connection_close_code(frames_until_close(s)) == 504
    s.close()

    # A handshake that never finishes: closed after limits.handshake_timeout_ms.
    s = raw(ports)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    t0 = time.monotonic()
    frames_until_close(s)
    assert 0.5 < time.monotonic() - t0 < 4.5
    s.close()

    # A start-ok announced past the pre-login frame limit: FRAME_ERROR before it is read.
    s = raw(ports)
    s.sendall(b"AMQP\x00\x00\x09\x01")
    time.sleep(0.1)
    s.recv(65536)
    s.sendall(struct.pack(">BHI", 1, 0, 50_000_000))
    assert connection_close_code(frames_until_close(s)) == 501
    s.close()

    # Many connections at once, each handshaking: all served.
    conns = [connect(ports) for _ in range(50)]
    for c in conns:
        c.close()
    conn.close()


def test_message_sizes_at_and_past_the_limit(small_broker):
    """An empty body and a body of exactly max_message_size (1 MiB here) are delivered; one
    byte more closes only that channel with 406, and what follows on other channels (and a
    new channel) is served. The refused message's body frames are ignored, not an error."""
    proc, ports = small_broker
    conn = connect(ports)
    ch = conn.channel()
    q = ch.queue_declare(queue="", exclusive=True).method.queue
    ch.basic_publish("", q, b"")
    ch.basic_publish("", q, b"m" * 1048576)
    assert ch.basic_get(q, auto_ack=True)[2] == b""
    assert ch.basic_get(q, auto_ack=True)[2] == b"m" * 1048576
    bad = conn.channel()
    bad.basic_publish("", q, b"x" * (1048576 + 1))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        bad.queue_declare(queue=q, passive=True)
    assert e.value.reply_code == 406 and "max size" in e.value.reply_text
    ch.basic_publish("", q, b"after")
    assert ch.basic_get(q, auto_ack=True)[2] == b"after"
    again = conn.channel()
    again.basic_publish("", q, b"again")
    assert again.basic_get(q, auto_ack=True)[2] == b"again"
    assert ch.queue_declare(queue=q, passive=True).method.message_count == 0
    conn.close()
    assert proc.poll() is None


def test_content_held_is_bounded_by_the_memory_budget(tmp_path):
    """A client that announces a huge body and sends it slowly cannot hold more than the
    broker-wide memory budget: past it, 506 RESOURCE_ERROR and the connection closed,
    while another client carries on."""
    from test_dashboard import HAYATE

    cfg = tmp_path / "hayate.toml"
    cfg.write_text("""
[server]
data_dir = ""
[admin]
listen = []
[native]
listen = []
[mqtt]
listen = []
ws = []
[stomp]
listen = []
[amqp]
listen = ["127.0.0.1:0"]
[limits]
memory_budget = 16777216
""")
    proc, ports = start_hayate(HAYATE, cfg, tmp_path / "broker.log")
    try:
        other = connect(ports)
        och = other.channel()
        q = och.queue_declare(queue="", exclusive=True).method.queue
        s = raw(ports)
        handshake(s)  # frame_max 4096
        s.sendall(struct.pack(">BHI", 1, 1, 5) + b"\x00\x14\x00\x0a\x00" + b"\xce")
        publish = b"\x00\x3c\x00\x28\x00\x00\x00\x01q\x00"
        header = b"\x00\x3c\x00\x00" + struct.pack(">Q", 100 << 20) + b"\x00\x00"
        s.sendall(struct.pack(">BHI", 1, 1, len(publish)) + publish + b"\xce"
                  + struct.pack(">BHI", 2, 1, len(header)) + header + b"\xce")
        body = struct.pack(">BHI", 3, 1, 4000) + b"x" * 4000 + b"\xce"
        sent = 0
        try:
            # 40 MB in 4 KB frames: far past the 16 MiB budget.
            for _ in range(10_000):
                s.sendall(body)
                sent += 4000
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert connection_close_code(frames_until_close(s)) == 506
        s.close()
        och.basic_publish("", q, b"fine")
        assert och.basic_get(q, auto_ack=True)[2] == b"fine"
        other.close()
    finally:
        stop_process(proc)


@pytest.fixture
def patient_broker(tmp_path):
    """A broker that lets a blocking subscriber hold its publishers for 30 s."""
    proc, ports = start_broker(tmp_path, "[limits]\nmax_block_ms = 30000\n")
    yield ports
    stop_process(proc)


def test_a_stalled_dead_letter_route_holds_back_only_its_own_queue(patient_broker):
    """Dead letters of one queue whose dead-letter exchange reaches a subscriber that never
    reads (an MQTT QoS 1 subscription: it holds its publishers back, here for up to 30 s)
    wait for it; another queue's dead letters still go at once. Before, every queue's dead
    letters went through one broker-wide publisher, so they all waited behind the stall."""
    from mqttraw import CONNACK, SUBACK, RawClient, subscribe

    tag = uuid.uuid4().hex[:8]
    stalled = RawClient("127.0.0.1", patient_broker["mqtt"])
    assert stalled.connect(client_id=f"stall-{tag}").type == CONNACK
    stalled.send(subscribe(f"stall-{tag}/#", qos=1))
    assert stalled.recv_packet().type == SUBACK  # nothing is read after this
    stalled.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn = connect(patient_broker)
    ch = conn.channel()
    ch.queue_declare(f"a-{tag}", exclusive=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "amq.topic",
        "x-dead-letter-routing-key": f"stall-{tag}.x"})
    ch.queue_declare(f"b-{tag}", exclusive=True, arguments={
        "x-message-ttl": 0, "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": f"c-{tag}"})
    ch.queue_declare(f"c-{tag}", exclusive=True)
    # More than the stalled subscriber's outbox (8 MiB) and socket take: its dead letters
    # now wait for room.
    chunk = b"x" * (256 * 1024)
    for _ in range(96):
        ch.basic_publish("", f"a-{tag}", chunk)
    time.sleep(1.0)
    started = time.monotonic()
    ch.basic_publish("", f"b-{tag}", b"go")
    got = drain(ch, f"c-{tag}", 1, timeout=10.0)
    took = time.monotonic() - started
    assert [b for _, _, b in got] == [b"go"], got
    assert took < 3.0, f"the other queue's dead letter took {took:.1f} s"
    conn.close()
    stalled.close()
