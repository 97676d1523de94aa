"""Hayate only: STOMP, MQTT and the native protocol share one key space (`/topic/a/b` is the
key `a/b`, MQTT's `a/b` and the native protocol's `a/b`), driven by Hayate's own CLI and paho."""

import subprocess
import time

import pytest

from stomphelpers import bodies, unique

pytestmark = pytest.mark.hayate_only


def cli(server, *args):
    return [str(server.bin), *args, "--server", f"127.0.0.1:{server.native_port}"]


def wait_file(path, text, proc, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {text!r} from {proc.args}: {path.read_text(errors='replace')}")


class Cli:
    """A long-running CLI command (sub, reply) with its output in files; killed at the end."""

    def __init__(self, server, tmp_path, *args, ready: str):
        self.out, self.err = tmp_path / f"{args[0]}.out", tmp_path / f"{args[0]}.err"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(cli(server, *args), stdout=o, stderr=e, stdin=subprocess.DEVNULL)
        wait_file(self.err, ready, self.proc)

    def wait(self, timeout=5.0) -> str:
        rc = self.proc.wait(timeout)
        assert rc == 0, f"{self.proc.args} exited with {rc}: {self.err.read_text()}"
        return self.out.read_text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def clis():
    made = []
    yield made
    for c in made:
        c.kill()


def test_stomp_send_reaches_native_subscriber(stomp_server, stomp, tmp_path, clis):
    base = unique("xs")
    sub = Cli(stomp_server, tmp_path, "sub", f"{base}/**", "--count", "1", ready="subscribed")
    clis.append(sub)
    stomp(stomp_server).send(f"/topic/{base}/a/b", b"hello from stomp", sync=True)
    assert sub.wait().splitlines() == [f"{base}/a/b: hello from stomp"]


def test_native_publish_reaches_stomp_subscriber(stomp_server, stomp):
    base = unique("xs")
    c = stomp(stomp_server)
    c.subscribe(f"/topic/{base}/x")
    wild = c.subscribe(f"/topic/{base}/*")
    r = subprocess.run(cli(stomp_server, "pub", f"{base}/x", "hello"), capture_output=True, text=True, timeout=5)
    assert r.returncode == 0, r.stderr
    got = c.wait_messages(2)
    assert bodies(got) == [b"hello", b"hello"]
    assert {m.headers["destination"] for m in got} == {f"/topic/{base}/x"}
    assert sorted(m.headers["subscription"] for m in got) == sorted(["sub-1", wild])


@pytest.fixture
def mqtt_stomp_server(make_stomp_server):
    server = make_stomp_server(mqtt=True)
    assert server.mqtt_port, "the broker reported no MQTT listener"
    return server


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_mqtt_publish_reaches_stomp_subscriber(mqtt_stomp_server, stomp, mqtt, version):
    server = mqtt_stomp_server
    base = unique("xm")
    c = stomp(server)
    c.subscribe(f"/topic/{base}/m")
    p = mqtt(server.broker, version=version)
    p.publish(f"{base}/m", b"hello from mqtt", qos=1)
    m = c.wait_messages(1)[0]
    assert m.body == b"hello from mqtt"
    assert m.headers["destination"] == f"/topic/{base}/m"


@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_stomp_send_reaches_mqtt_subscriber(mqtt_stomp_server, stomp, mqtt, version):
    server = mqtt_stomp_server
    base = unique("xm")
    s = mqtt(server.broker, version=version)
    s.subscribe(f"{base}/#", qos=1)
    stomp(server).send(f"/topic/{base}/a/b", bytes(range(256)), sync=True)
    m = s.wait_messages(1)[0]
    assert (m.topic, m.payload) == (f"{base}/a/b", bytes(range(256)))


def test_native_reply_service_answers_stomp_request(stomp_server, stomp, tmp_path, clis):
    base = unique("xr")
    svc = Cli(stomp_server, tmp_path, "reply", f"{base}/svc/echo", "--count", "1", ready="echoing")
    clis.append(svc)
    c = stomp(stomp_server)
    c.send(f"/topic/{base}/svc/echo", b"ping over stomp", headers={"reply-to": "/temp-queue/r1"})
    m = c.wait_messages(1)[0]
    assert m.body == b"ping over stomp"
    assert m.headers["subscription"] == "/temp-queue/r1"
    svc.wait()


def test_native_request_answered_by_stomp(stomp_server, stomp):
    """The other way round: `hayate request` to a STOMP responder, which SENDs its answer to
    the MESSAGE's reply-to."""
    base = unique("xq")
    responder = stomp(stomp_server)
    responder.subscribe(f"/topic/{base}/svc")
    proc = subprocess.Popen(cli(stomp_server, "request", f"{base}/svc", "question", "--timeout", "4s"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = responder.wait_messages(1)[0]
        assert m.body == b"question", (m.headers, m.body)
        assert m.headers.get("reply-to"), f"a native request arrives without reply-to: {m.headers}"
        responder.send(m.headers["reply-to"], b"answer")
        out, err = proc.communicate(timeout=5)
        assert proc.returncode == 0, err
        assert out.strip() == "answer"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
