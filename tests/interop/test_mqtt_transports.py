"""MQTT over WebSocket (paho, path /mqtt, subprotocol mqtt), and Hayate's cross-protocol
routing between MQTT and its native protocol, driven by Hayate's own CLI."""

import subprocess
import time

import pytest

from helpers import unique

VERSIONS = pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])


@VERSIONS
def test_websocket_round_trip(broker, mqtt, version):
    # Mosquitto gets a websockets listener too, so this test is checked against it as well.
    assert broker.ws_port, "the broker reported no MQTT over WebSocket listener"
    topic = unique("ws") + "/x"
    ws_sub = mqtt(broker, version=version, transport="websockets")
    ws_sub.subscribe(topic, qos=1)
    tcp_sub = mqtt(broker, version=version)
    tcp_sub.subscribe(topic, qos=1)
    ws_pub = mqtt(broker, version=version, transport="websockets")
    tcp_pub = mqtt(broker, version=version)
    big = bytes(range(256)) * 300  # 76.8 kB: several WebSocket frames / a 64-bit frame length
    ws_pub.publish(topic, b"from ws", qos=1)
    tcp_pub.publish(topic, b"from tcp", qos=2)
    ws_pub.publish(topic, big, qos=0)
    for c in (ws_sub, tcp_sub):
        got = c.wait_messages(3)
        assert [m.payload for m in got] == [b"from ws", b"from tcp", big]
    ws_sub.disconnect()
    assert ws_sub.disconnect_rc is not None and not ws_sub.disconnect_rc.is_failure


def run_cli(broker, *args, timeout=5.0):
    return subprocess.run([str(broker.bin), *args, "--server", f"127.0.0.1:{broker.native_port}"],
                          capture_output=True, timeout=timeout, text=True)


def wait_file(path, text, proc, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    raise AssertionError(f"no {text!r} from {proc.args}: {path.read_text(errors='replace')}")


@pytest.mark.hayate_only
@VERSIONS
def test_mqtt_publish_reaches_native_subscriber(broker, mqtt, version, tmp_path):
    assert broker.native_port, "the broker reported no native protocol listener"
    base = unique("xp")
    out, err = tmp_path / "sub.out", tmp_path / "sub.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([str(broker.bin), "sub", f"{base}/**", "--count", "1",
                                 "--server", f"127.0.0.1:{broker.native_port}"], stdout=o, stderr=e)
    try:
        wait_file(err, "subscribed", proc)
        mqtt(broker, version=version).publish(f"{base}/b/c", b"hello from mqtt", qos=1)
        assert proc.wait(5) == 0, err.read_text()
        assert out.read_text().splitlines() == [f"{base}/b/c: hello from mqtt"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.hayate_only
@VERSIONS
def test_native_publish_reaches_mqtt_subscriber(broker, mqtt, version):
    assert broker.native_port, "the broker reported no native protocol listener"
    base = unique("xp")
    sub = mqtt(broker, version=version)
    sub.subscribe(f"{base}/#", qos=1)
    r = run_cli(broker, "pub", f"{base}/x", "hello")
    assert r.returncode == 0, r.stderr
    m = sub.wait_messages(1)[0]
    assert (m.topic, m.payload, m.retain) == (f"{base}/x", b"hello", False)
    r = run_cli(broker, "pub", f"{base}/y/z", "again")
    assert r.returncode == 0, r.stderr
    assert [(m.topic, m.payload) for m in sub.wait_messages(2)][1] == (f"{base}/y/z", b"again")
