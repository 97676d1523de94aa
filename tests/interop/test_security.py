"""Security with clients nobody here wrote, against Hayate only: TLS on every listener
(paho-mqtt with a password and with a client certificate, stomp.py with a login accepted and
refused, mosquitto_pub/mosquitto_sub with --cafile, the native CLI with a CA), and
permissions as MQTT and STOMP clients see them (0x87 on PUBACK and SUBACK, a client id owned
by another user, `$SYS` read-only, a STOMP subscription refused).

Test certificates are made with the openssl command line: a CA, a server certificate for
127.0.0.1, and a client certificate whose CN is `alice`."""

from __future__ import annotations

import os
import ssl
import subprocess
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes

from conftest import KIND, REPO, start_hayate, stop_process, tail

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's own security settings")

HAYATE = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", "/CN=hayate interop CA", cwd=d)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    # Extensions make X.509 v3 certificates (webpki refuses v1, which `x509 -req` makes
    # without any).
    (d / "client.cnf").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("server", "/CN=127.0.0.1", ["-extfile", "san.cnf"]),
                            ("alice", "/CN=alice", ["-extfile", "client.cnf"])):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", subj, cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


def user_table(name: str, password: str) -> str:
    out = subprocess.run([str(HAYATE), "user", "add", name, "--password", password],
                         check=True, capture_output=True, text=True).stdout
    return out


class Hayate:
    """`hayate broker` with a config file: every listener plain and TLS on port 0."""

    def __init__(self, tmp: Path, certs: Path, extra: str = ""):
        self.tmp = tmp
        cfg = f"""
[server]
data_dir = "{tmp / 'data'}"
[admin]
listen = []
[native]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[mqtt]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
ws = []
wss = ["127.0.0.1:0"]
[amqp]
listen = []
tls = ["127.0.0.1:0"]
[stomp]
listen = ["127.0.0.1:0"]
tls = ["127.0.0.1:0"]
[tls]
cert = "{certs / 'server.pem'}"
key = "{certs / 'server.key'}"
client_ca = "{certs / 'ca.pem'}"
cert_user = true
[auth.groups.readers]
subscribe = ["public/**", "alice/**"]
deny_subscribe = ["public/secret/**"]
[auth.groups.limited]
publish = ["bob/**"]
deny_subscribe = ["secret/**"]
"""
        cfg += user_table("alice", "wonderland").replace("[auth.users.alice]", "[auth.users.alice]\ngroups = [\"readers\"]")
        cfg += user_table("bob", "builder").replace("[auth.users.bob]", "[auth.users.bob]\ngroups = [\"limited\"]")
        cfg += extra
        (tmp / "hayate.toml").write_text(cfg)
        self.log = tmp / "broker.log"
        self.proc, self.ports = start_hayate(HAYATE, tmp / "hayate.toml", self.log)

    def stop(self):
        stop_process(self.proc, 10)


@pytest.fixture
def hayate(tmp_path, certs, request):
    h = Hayate(tmp_path, certs)
    yield h
    h.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        print(f"--- hayate log ---\n{tail(h.log, 60)}")


def mqtt_client(h, certs, *, user=None, password=None, cert=False, version=5, client_id="",
                port_kind="mqtt over tls", transport="tcp"):
    """A connected paho client (or the CONNACK reason code if refused)."""
    proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
    kw = {"client_id": client_id, "protocol": proto, "transport": transport}
    if version != 5:
        kw["clean_session"] = True
    c = paho.Client(CallbackAPIVersion.VERSION2, **kw)
    if port_kind != "mqtt":
        c.tls_set(ca_certs=str(certs / "ca.pem"),
                  certfile=str(certs / "alice.pem") if cert else None,
                  keyfile=str(certs / "alice.key") if cert else None)
    if transport == "websockets":
        c.ws_set_options(path="/mqtt")
    if user is not None:
        c.username_pw_set(user, password)
    done = threading.Event()
    result = {}

    def on_connect(client, userdata, flags, rc, props=None):
        result["rc"] = rc
        done.set()

    c.on_connect = on_connect
    c.connect("127.0.0.1", h.ports[port_kind], keepalive=30)
    c.loop_start()
    assert done.wait(10), "no CONNACK"
    rc = result["rc"]
    if rc != 0:
        c.loop_stop()
        return None, rc
    return c, rc


def round_trip(sub, pub, topic, payload=b"hello"):
    got = threading.Event()
    box = {}

    def on_message(client, userdata, msg):
        box["m"] = msg.payload
        got.set()

    subscribed = threading.Event()
    sub.on_message = on_message
    sub.on_subscribe = lambda *a, **k: subscribed.set()
    sub.subscribe(topic, qos=1)
    assert subscribed.wait(10)
    pub.publish(topic, payload, qos=1).wait_for_publish(10)
    assert got.wait(10), "message not delivered"
    return box["m"]


def test_paho_over_tls_with_a_password_and_with_a_client_certificate(hayate, certs):
    c, rc = mqtt_client(hayate, certs, user="alice", password="nope")
    assert c is None and rc == 0x86, rc  # bad user name or password
    alice, _ = mqtt_client(hayate, certs, user="alice", password="wonderland")
    # The client certificate (CN=alice) logs in as alice, no password; over wss too.
    by_cert, _ = mqtt_client(hayate, certs, cert=True)
    assert round_trip(alice, by_cert, "alice/tls", b"x" * 100_000) == b"x" * 100_000
    wss, _ = mqtt_client(hayate, certs, cert=True, port_kind="mqtt over websocket over tls",
                         transport="websockets")
    assert round_trip(wss, alice, "alice/wss") == b"hello"
    # Without credentials (anonymous is off: users exist).
    c, rc = mqtt_client(hayate, certs)
    assert c is None and rc == 0x87, rc
    for x in (alice, by_cert, wss):
        x.loop_stop()
        x.disconnect()


def test_stomp_over_tls_login_accepted_and_refused(hayate, certs):
    port = hayate.ports["stomp over tls"]
    ok = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    ok.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(certs / "ca.pem"))
    got = threading.Event()

    class L(stomp.ConnectionListener):
        def on_message(self, frame):
            if frame.body == "over tls":
                got.set()

    ok.set_listener("l", L())
    ok.connect("alice", "wonderland", wait=True)
    ok.subscribe("/topic/alice/s", id="1", ack="auto")
    ok.send("/topic/alice/s", "over tls", receipt="r1")
    assert got.wait(10)
    ok.disconnect()
    bad = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    bad.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=str(certs / "ca.pem"))
    with pytest.raises(stomp.exception.ConnectFailedException):
        bad.connect("alice", "wrong", wait=True)


def pika_tls(h, certs, credentials, cert=False):
    import pika

    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(certs / "alice.pem"), str(certs / "alice.key"))
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", h.ports["amqp over tls"], credentials=credentials,
        ssl_options=pika.SSLOptions(ctx, "127.0.0.1"), connection_attempts=1,
        socket_timeout=10))


def test_pika_over_tls_with_a_password_and_with_a_client_certificate(hayate, certs):
    """amqps: pika with a password (accepted and refused) and with a client certificate
    through SASL EXTERNAL (CN=alice logs in as alice); an MQTT client over TLS sees what
    AMQP publishes."""
    import pika

    with pytest.raises((pika.exceptions.ProbableAuthenticationError,
                        pika.exceptions.AMQPConnectionError)):
        pika_tls(hayate, certs, pika.PlainCredentials("alice", "nope"))
    by_password = pika_tls(hayate, certs, pika.PlainCredentials("alice", "wonderland"))
    ch = by_password.channel()
    ch.queue_declare("alice/amqps")
    ch.basic_publish("", "alice/amqps", b"y" * 100_000)
    by_cert = pika_tls(hayate, certs, pika.credentials.ExternalCredentials(), cert=True)
    cch = by_cert.channel()
    time.sleep(0.2)
    assert cch.basic_get("alice/amqps", auto_ack=True)[2] == b"y" * 100_000
    # The certificate's user is alice: her permissions, not anyone's.
    cch.queue_declare("alice/bound")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as e:
        cch.queue_bind("alice/bound", "amq.topic", "bob.#")
    assert e.value.reply_code == 403
    # AMQP over TLS meets MQTT over TLS on one key.
    m, _ = mqtt_client(hayate, certs, user="alice", password="wonderland")
    got = threading.Event()
    m.on_message = lambda c, u, msg: got.set() if msg.payload == b"from amqps" else None
    subscribed = threading.Event()
    m.on_subscribe = lambda *a, **k: subscribed.set()
    m.subscribe("alice/tls", qos=1)
    assert subscribed.wait(10)
    ch.basic_publish("amq.topic", "alice.tls", b"from amqps")
    assert got.wait(10), "an MQTT subscriber over TLS did not get the AMQP publish"
    m.loop_stop()
    m.disconnect()
    # Without a client certificate EXTERNAL is not offered.
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        pika_tls(hayate, certs, pika.credentials.ExternalCredentials())
    by_password.close()
    by_cert.close()


def test_mosquitto_clients_with_cafile(hayate, certs):
    port = str(hayate.ports["mqtt over tls"])
    common = ["-h", "127.0.0.1", "-p", port, "--cafile", str(certs / "ca.pem"), "-V", "mqttv311"]
    sub = subprocess.Popen(["mosquitto_sub", *common, "-u", "alice", "-P", "wonderland", "-t", "alice/m",
                            "-C", "1", "-W", "10"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    subprocess.run(["mosquitto_pub", *common, "-u", "alice", "-P", "wonderland", "-t", "alice/m",
                    "-m", "via mosquitto"], check=True, timeout=10)
    out, _ = sub.communicate(timeout=15)
    assert out.strip() == "via mosquitto"
    # A wrong CA: the handshake fails.
    r = subprocess.run(["mosquitto_pub", "-h", "127.0.0.1", "-p", port, "--cafile", str(certs / "alice.pem"),
                        "-u", "alice", "-P", "wonderland", "-t", "alice/x", "-m", "x"], capture_output=True,
                       timeout=10)
    assert r.returncode != 0


def test_native_cli_with_a_ca(hayate, certs):
    server = f"tls://127.0.0.1:{hayate.ports['native protocol over tls']}"
    env = dict(os.environ, HAYATE_TLS_CA=str(certs / "ca.pem"), HAYATE_USER="alice",
               HAYATE_PASSWORD="wonderland")
    sub = subprocess.Popen([str(HAYATE), "sub", "alice/cli", "--count", "1", "--server", server], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.7)
    subprocess.run([str(HAYATE), "pub", "alice/cli", "over tls", "--server", server], env=env, check=True,
                   timeout=10)
    out, err = sub.communicate(timeout=15)
    assert "over tls" in out, (out, err)
    r = subprocess.run([str(HAYATE), "pub", "alice/cli", "x", "--server", server],
                       env=dict(env, HAYATE_PASSWORD="wrong"), capture_output=True, text=True, timeout=10)
    assert r.returncode != 0 and "wrong" not in r.stderr


def test_mqtt_permissions_and_client_id_ownership(hayate, certs):
    bob, _ = mqtt_client(hayate, certs, user="bob", password="builder", client_id="bobs-client",
                         port_kind="mqtt")
    acks = {}
    acked = threading.Event()

    def on_publish(client, userdata, mid, rc, props=None):
        acks[mid] = rc
        acked.set()

    bob.on_publish = on_publish
    # Bob may publish under bob/** only: elsewhere PUBACK says Not authorized (0x87).
    info = bob.publish("elsewhere/x", b"no", qos=1)
    assert acked.wait(10)
    assert acks[info.mid] == 0x87, acks
    # Subscribing to secret/# is refused (SUBACK 0x87); public/# granted.
    codes = {}
    subacked = threading.Event()

    def on_subscribe(client, userdata, mid, reason_codes, props=None):
        codes[mid] = [int(getattr(rc, "value", rc)) for rc in reason_codes]
        subacked.set()

    bob.on_subscribe = on_subscribe
    _, mid = bob.subscribe([("secret/#", 1), ("public/#", 1)])
    assert subacked.wait(10)
    assert codes[mid] == [0x87, 1], codes
    # $SYS is read-only for everyone.
    acked.clear()
    info = bob.publish("$SYS/broker/uptime", b"forged", qos=1)
    assert acked.wait(10)
    assert acks[info.mid] == 0x87
    # Alice may not take over bob's client id.
    c, rc = mqtt_client(hayate, certs, user="alice", password="wonderland", client_id="bobs-client",
                        port_kind="mqtt")
    assert c is None and rc == 0x87, rc
    assert bob.is_connected()
    # A wildcard subscriber does not see what it may not read: alice's `public/#` misses
    # public/secret/x.
    alice, _ = mqtt_client(hayate, certs, user="alice", password="wonderland", port_kind="mqtt")
    seen = []
    alice.on_message = lambda client, userdata, msg: seen.append(msg.topic)
    ready = threading.Event()
    alice.on_subscribe = lambda *a, **k: ready.set()
    alice.subscribe("public/#", qos=1)
    assert ready.wait(10)
    svc, _ = mqtt_client(hayate, certs, cert=True)  # alice again, by certificate, over TLS
    for t in ("public/secret/x", "public/ok"):
        svc.publish(t, b"m", qos=1).wait_for_publish(10)
    deadline = time.monotonic() + 5
    while "public/ok" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert seen == ["public/ok"], seen
    for x in (bob, alice, svc):
        x.loop_stop()
        x.disconnect()


def test_stomp_permissions(hayate, certs):
    port = hayate.ports["stomp"]
    errors = []

    class L(stomp.ConnectionListener):
        def on_error(self, frame):
            errors.append(frame.headers.get("message", ""))

    c = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    c.set_listener("l", L())
    c.connect("bob", "builder", wait=True)
    c.subscribe("/topic/secret/x", id="1", ack="auto")
    deadline = time.monotonic() + 5
    while not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert errors and "access refused" in errors[0], errors
    errors.clear()
    c2 = stomp.Connection([("127.0.0.1", port)], heartbeats=(0, 0))
    c2.set_listener("l", L())
    c2.connect("alice", "wonderland", wait=True)
    c2.send("/topic/$SYS/broker/uptime", "forged")
    deadline = time.monotonic() + 5
    while not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert errors and "access refused" in errors[0], errors


def test_client_id_ownership_survives_kill_9(tmp_path, certs):
    """bob's persistent MQTT session (3.1.1, clean session off) is SUBACKed, then the broker is
    killed with SIGKILL at once: after the restart (journal replay), alice still cannot take
    bob's client id, and bob finds his session."""
    h = Hayate(tmp_path, certs)
    try:
        bob = paho.Client(CallbackAPIVersion.VERSION2, client_id="bobs-persistent",
                          protocol=paho.MQTTv311, clean_session=False)
        bob.username_pw_set("bob", "builder")
        subscribed = threading.Event()
        bob.on_subscribe = lambda *a, **k: subscribed.set()
        bob.connect("127.0.0.1", h.ports["mqtt"], keepalive=30)
        bob.loop_start()
        bob.subscribe("bob/#", qos=1)
        assert subscribed.wait(10), "no SUBACK"
        h.proc.kill()  # SIGKILL, right after the SUBACK
        h.proc.wait()
        bob.loop_stop()
    finally:
        h.stop()
    h = Hayate(tmp_path, certs)
    try:
        c, rc = mqtt_client(h, certs, user="alice", password="wonderland", client_id="bobs-persistent",
                            port_kind="mqtt")
        assert c is None and rc == 0x87, rc
        present = {}
        back = threading.Event()

        def on_connect(client, userdata, flags, rc, props=None):
            present["session"] = flags.session_present
            back.set()

        bob = paho.Client(CallbackAPIVersion.VERSION2, client_id="bobs-persistent",
                          protocol=paho.MQTTv311, clean_session=False)
        bob.username_pw_set("bob", "builder")
        bob.on_connect = on_connect
        bob.connect("127.0.0.1", h.ports["mqtt"], keepalive=30)
        bob.loop_start()
        assert back.wait(10), "no CONNACK"
        assert present["session"] is True
        bob.disconnect()
        bob.loop_stop()
    finally:
        h.stop()
