"""The admin listener's web dashboard, loaded in headless Chromium (Debian's `chromium`) while
traffic flows. paho-mqtt publishes and subscribes, and stomp.py sends. The page that
Chromium rendered must show non-zero message rates and list the test's clients. A
screenshot is taken too. With DASHBOARD_SCREENSHOT=PATH it is kept there (docs/dashboard.png
came from such a run).

Chromium is installed by .ci/run, where DASHBOARD_REQUIRED=1 turns a missing browser into a
failure. Elsewhere the test is skipped without it."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import stomp
from paho.mqtt.enums import CallbackAPIVersion

from conftest import KIND, REPO, start_hayate, stop_process, tail

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's admin listener")

HAYATE = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("DASHBOARD_REQUIRED") == "1":
        pytest.fail("chromium is not installed (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def browse(browser: str, url: str, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    """Headless Chromium on `url` with a fresh profile. Virtual time lets the page's scripts
    run and its requests finish before the DOM is dumped or the screenshot taken."""
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp / 'profile'}",
         "--virtual-time-budget=5000", *extra, url],
        capture_output=True, text=True, timeout=90)


@pytest.fixture
def broker(tmp_path):
    cfg = tmp_path / "hayate.toml"
    cfg.write_text("""
[server]
data_dir = ""
[admin]
listen = ["127.0.0.1:0"]
[native]
listen = ["127.0.0.1:0"]
shm = false
[mqtt]
listen = ["127.0.0.1:0"]
ws = []
[amqp]
listen = []
[stomp]
listen = ["127.0.0.1:0"]
""")
    log = tmp_path / "broker.log"
    proc, ports = start_hayate(HAYATE, cfg, log)
    yield ports
    stop_process(proc)


def test_dashboard_shows_live_rates_and_the_clients(broker, tmp_path):
    browser = chromium()
    tag = uuid.uuid4().hex[:8]
    stop = threading.Event()
    received = [0]

    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"dash-sub-{tag}")
    sub.on_message = lambda c, u, m: received.__setitem__(0, received[0] + 1)
    sub.connect("127.0.0.1", broker["mqtt"])
    sub.subscribe(f"dash/{tag}/#", qos=0)
    sub.loop_start()
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"dash-pub-{tag}")
    pub.connect("127.0.0.1", broker["mqtt"])
    pub.loop_start()
    st = stomp.Connection12([("127.0.0.1", broker["stomp"])])
    st.connect(wait=True)

    def traffic():
        n = 0
        while not stop.is_set():
            pub.publish(f"dash/{tag}/mqtt", b"x" * 100, qos=0)
            if n % 10 == 0:
                st.send(f"/topic/dash/{tag}/stomp", "y" * 100)
            n += 1
            time.sleep(0.0005)

    t = threading.Thread(target=traffic, daemon=True)
    t.start()
    try:
        # Two sampler ticks with traffic: the rates the page gets first are non-zero.
        time.sleep(2.5)
        # `?poll`: the page fetches once a second instead of holding an EventSource open,
        # which headless Chromium's virtual time would wait for forever. The event stream
        # itself is tested in crates/hayate-server/tests/admin.rs.
        url = f"http://127.0.0.1:{broker['admin http']}/dashboard?poll"
        r = browse(browser, url, tmp_path, "--dump-dom")
        assert r.returncode == 0, r.stderr[-2000:]
        dom = r.stdout
        rate_in = re.search(r'id="rate-in" data-value="([0-9.eE+-]+)"', dom)
        rate_out = re.search(r'id="rate-out" data-value="([0-9.eE+-]+)"', dom)
        assert rate_in and rate_out, dom[:3000]
        print(f"dashboard: published {float(rate_in.group(1)):.0f} msg/s, "
              f"delivered {float(rate_out.group(1)):.0f} msg/s")
        assert float(rate_in.group(1)) > 0, dom[:3000]
        assert float(rate_out.group(1)) > 0, dom[:3000]
        clients = {html.unescape(c) for c in re.findall(r'data-client="([^"]*)"', dom)}
        assert {f"dash-sub-{tag}", f"dash-pub-{tag}"} <= clients, clients
        # The STOMP client (STOMP has no client id): a stomp connection row that published.
        rows = re.findall(r'data-protocol="([^"]*)" data-in="([0-9]+)"', dom)
        assert any(p == "stomp" and int(n) > 0 for p, n in rows), rows
        assert f"dash/{tag}" in dom, "the busiest key prefix is listed"

        shot = Path(os.environ.get("DASHBOARD_SCREENSHOT", tmp_path / "dashboard.png"))
        r = browse(browser, url, tmp_path, f"--screenshot={shot}", "--window-size=1400,1250")
        assert r.returncode == 0, r.stderr[-2000:]
        assert shot.stat().st_size > 10_000, "a screenshot with something in it"
    finally:
        stop.set()
        t.join(5)
        st.disconnect()
        pub.loop_stop()
        sub.loop_stop()
    assert received[0] > 0
