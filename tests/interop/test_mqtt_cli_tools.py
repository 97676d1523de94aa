"""Round trips with Mosquitto's command-line clients (mosquitto_pub / mosquitto_sub)."""

import shutil
import subprocess
import time

import pytest

from helpers import unique

pytestmark = pytest.mark.skipif(not (shutil.which("mosquitto_pub") and shutil.which("mosquitto_sub")),
                                reason="mosquitto_pub / mosquitto_sub not installed (apt-get install mosquitto-clients)")

PROTOCOLS = pytest.mark.parametrize("proto", ["mqttv311", "mqttv5"])
FMT = "MSG|%q|%r|%t|%p"  # mosquitto_sub -F: qos, retain flag, topic, payload


class Sub:
    """mosquitto_sub in the background, started in debug mode so we know when it subscribed."""

    def __init__(self, broker, tmp_path, proto, topic, qos=0, count=1, extra=()):
        self.out = tmp_path / f"sub-{unique()}.out"
        self.file = open(self.out, "w")
        self.proc = subprocess.Popen(
            ["stdbuf", "-oL", "mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-V", proto, "-d",
             "-t", topic, "-q", str(qos), "-C", str(count), "-W", "8", "-F", FMT, *extra],
            stdout=self.file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 5
        while "SUBACK" not in self.out.read_text(errors="replace"):
            assert self.proc.poll() is None, f"mosquitto_sub exited: {self.out.read_text()}"
            assert time.monotonic() < deadline, f"mosquitto_sub did not subscribe: {self.out.read_text()}"
            time.sleep(0.02)

    def result(self, timeout=5.0):
        try:
            rc = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.file.close()
        text = self.out.read_text(errors="replace")
        msgs = [tuple(l.split("|", 4)[1:]) for l in text.splitlines() if l.startswith("MSG|")]
        return rc, msgs, text


def pub(broker, proto, topic, *args, stdin=None):
    r = subprocess.run(["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-V", proto,
                        "-t", topic, *args], input=stdin, capture_output=True, text=True, timeout=5)
    assert r.returncode == 0, r.stderr
    return r


def sub_once(broker, proto, topic, *args, wait=2):
    r = subprocess.run(["mosquitto_sub", "-h", broker.host, "-p", str(broker.port), "-V", proto,
                        "-t", topic, "-W", str(wait), "-F", FMT, *args],
                       capture_output=True, text=True, timeout=wait + 5)
    msgs = [tuple(l.split("|", 4)[1:]) for l in r.stdout.splitlines() if l.startswith("MSG|")]
    return r.returncode, msgs


@PROTOCOLS
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_pub_sub_round_trip(broker, tmp_path, proto, qos):
    topic = unique("cli") + "/x"
    s = Sub(broker, tmp_path, proto, topic, qos=2, count=3)
    pub(broker, proto, topic, "-q", str(qos), "-l", stdin="one\ntwo\nthree\n")
    rc, msgs, text = s.result()
    assert rc == 0, text
    assert msgs == [(str(qos), "0", topic, p) for p in ("one", "two", "three")], text


@PROTOCOLS
def test_subscriber_qos_downgrade(broker, tmp_path, proto):
    topic = unique("cli") + "/x"
    s = Sub(broker, tmp_path, proto, topic, qos=1, count=1)
    pub(broker, proto, topic, "-q", "2", "-m", "downgraded")
    rc, msgs, text = s.result()
    assert msgs == [("1", "0", topic, "downgraded")], text


@PROTOCOLS
def test_retained(broker, proto):
    topic = unique("cli") + "/r"
    pub(broker, proto, topic, "-q", "1", "-r", "-m", "first")
    pub(broker, proto, topic, "-q", "1", "-r", "-m", "kept")
    rc, msgs = sub_once(broker, proto, topic, "-C", "1", "-q", "1")
    assert (rc, msgs) == (0, [("1", "1", topic, "kept")])
    pub(broker, proto, topic, "-q", "1", "-r", "-n")  # empty retained message: clear
    rc, msgs = sub_once(broker, proto, topic, "-C", "1", wait=1)
    assert msgs == [] and rc != 0  # timed out (-W) without a message


@PROTOCOLS
def test_wildcard_subscription(broker, tmp_path, proto):
    base = unique("cli")
    s = Sub(broker, tmp_path, proto, f"{base}/+/temp", count=2)
    for room, value in (("kitchen", "21"), ("hall", "19")):
        pub(broker, proto, f"{base}/{room}/hum", "-m", "skip")
        pub(broker, proto, f"{base}/{room}/temp", "-m", value)
    rc, msgs, text = s.result()
    assert [(t, p) for _, _, t, p in msgs] == [(f"{base}/kitchen/temp", "21"), (f"{base}/hall/temp", "19")]


def test_v5_properties_to_paho(broker, mqtt):
    topic = unique("cli") + "/props"
    sub = mqtt(broker, version=5)
    sub.subscribe(topic, qos=1)
    pub(broker, "mqttv5", topic, "-q", "1", "-m", "{}",
        "-D", "publish", "user-property", "origin", "mosquitto_pub",
        "-D", "publish", "content-type", "application/json",
        "-D", "publish", "response-topic", f"{topic}/reply",
        "-D", "publish", "correlation-data", "c0ffee",
        "-D", "publish", "message-expiry-interval", "120")
    m = sub.wait_messages(1)[0]
    assert m.payload == b"{}"
    assert m.prop("UserProperty") == [("origin", "mosquitto_pub")]
    assert m.prop("ContentType") == "application/json"
    assert m.prop("ResponseTopic") == f"{topic}/reply"
    assert m.prop("CorrelationData") == b"c0ffee"
    assert 115 <= m.prop("MessageExpiryInterval", 0) <= 120


@PROTOCOLS
def test_paho_to_mosquitto_sub(broker, mqtt, tmp_path, proto):
    topic = unique("cli") + "/paho"
    s = Sub(broker, tmp_path, proto, topic, qos=2, count=2)
    p = mqtt(broker, version=5 if proto == "mqttv5" else 4)
    p.publish(topic, b"paho q1", qos=1)
    p.publish(topic, b"paho q2", qos=2)
    rc, msgs, text = s.result()
    assert rc == 0 and msgs == [("1", "0", topic, "paho q1"), ("2", "0", topic, "paho q2")], text


@PROTOCOLS
def test_persistent_session_cli(broker, proto):
    topic = unique("cli") + "/persist"
    cid = unique("clisub")
    session = ["-c", "-i", cid, "-q", "1"] + (["-x", "600"] if proto == "mqttv5" else [])
    # Subscribe once to create the session, then leave.
    rc, msgs = sub_once(broker, proto, topic, *session, "-E")
    assert rc == 0 and msgs == []
    pub(broker, proto, topic, "-q", "1", "-m", "while away")
    rc, msgs = sub_once(broker, proto, topic, *session, "-C", "1")
    assert (rc, msgs) == (0, [("1", "0", topic, "while away")])
