"""Broker launcher for the MQTT interop suite.

`INTEROP_BROKER=hayate` (default) runs `$HAYATE_BIN` (default `target/debug/hayate` under the
repository root); `INTEROP_BROKER=mosquitto` runs `mosquitto` (from PATH or /usr/sbin). Every
broker binds 127.0.0.1 on an ephemeral port, uses a temporary data directory, and is stopped at
the end of the test whatever happened. Broker settings are given in Hayate's configuration
names (see `SETTINGS`); for Mosquitto they are translated, and a test asking for a setting that
Mosquitto has no equivalent for is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import MqttClient  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KIND = os.environ.get("INTEROP_BROKER", "hayate").strip().lower()
if KIND not in ("hayate", "mosquitto"):
    raise SystemExit(f"INTEROP_BROKER must be hayate or mosquitto, not {KIND!r}")

# Hayate setting -> (TOML section, Mosquitto option or None, is a Mosquitto listener option).
SETTINGS = {
    "max_packet_size": ("mqtt", "max_packet_size", False),
    # Mosquitto advertises max_inflight_messages as its receive maximum in CONNACK.
    "receive_maximum": ("mqtt", "max_inflight_messages", False),
    "max_inflight": ("mqtt", "max_inflight_messages", False),
    "max_queued_messages": ("mqtt", "max_queued_messages", False),
    "topic_alias_maximum": ("mqtt", "max_topic_alias", True),
    "max_keep_alive": ("mqtt", "max_keepalive", False),
    "sys_interval_secs": ("mqtt", "sys_interval", False),
    "allow_anonymous": ("auth", "allow_anonymous", False),
    "users": ("auth", "password_file", False),
}

LINE = re.compile(r"(mqtt over websocket|mqtt|native protocol) on (\S+)")
START_TIMEOUT = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(host: str, port: int, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited with {proc.returncode}:\n{tail(log)}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"broker did not accept on {host}:{port} within {timeout}s:\n{tail(log)}")


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class Broker:
    """One broker process; `restart()` keeps the data directory (and, for Mosquitto, the port)."""

    def __init__(self, kind: str, settings: dict, tmp: Path):
        self.kind = kind
        self.settings = dict(settings)
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port: int | None = None          # MQTT over TCP
        self.ws_port: int | None = None       # MQTT over WebSocket (path /mqtt)
        self.native_port: int | None = None   # Hayate's native protocol
        self.proc: subprocess.Popen | None = None
        self.runs = 0
        self.config: Path | None = None
        if kind == "hayate":
            self.bin = Path(os.environ.get("HAYATE_BIN", REPO / "target/debug/hayate"))
            if not self.bin.is_absolute():
                self.bin = REPO / self.bin
            if not self.bin.exists():
                pytest.fail(f"HAYATE_BIN {self.bin} does not exist (cargo build -p hayate)")
            self._write_hayate_config()
        else:
            self.bin = Path(shutil.which("mosquitto") or "/usr/sbin/mosquitto")
            self.port = free_port()
            self.ws_port = free_port()
            self._write_mosquitto_config()

    @property
    def log(self) -> Path:
        return self.tmp / f"broker-{self.runs}.log"

    # -- configuration --------------------------------------------------------------------
    def _write_hayate_config(self) -> None:
        sections: dict[str, list[str]] = {}
        users = None
        for key, value in self.settings.items():
            if key not in SETTINGS:
                raise KeyError(f"unknown broker setting {key}")
            section = SETTINGS[key][0]
            if key == "users":
                users = value
                continue
            sections.setdefault(section, []).append(f"{key} = {toml_value(value)}")
        if not sections and users is None:
            return
        text = ""
        for section, lines in sections.items():
            text += f"[{section}]\n" + "\n".join(lines) + "\n\n"
        if users is not None:
            if "auth" not in sections:
                text += "[auth]\n\n"
            text += "[auth.users]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in users.items())
        self.config = self.tmp / "hayate.toml"
        self.config.write_text(text)

    def _write_mosquitto_config(self) -> None:
        general = [
            "persistence true",
            f"persistence_location {self.data_dir}/",
            "log_dest stderr",
            "log_type all",
            "max_queued_messages 0",
            "allow_anonymous true",
        ]
        if os.geteuid() == 0:
            general.append("user root")  # otherwise it drops to `mosquitto`, who can't write tmp
        listener: list[str] = []
        for key, value in self.settings.items():
            if key not in SETTINGS:
                raise KeyError(f"unknown broker setting {key}")
            _, option, per_listener = SETTINGS[key]
            if option is None:
                pytest.skip(f"mosquitto has no equivalent of {key}")
            if key == "users":
                pwfile = self.tmp / "passwd"
                for i, (user, password) in enumerate(value.items()):
                    cmd = ["mosquitto_passwd", "-b"] + (["-c"] if i == 0 else []) + [str(pwfile), user, password]
                    subprocess.run(cmd, check=True, capture_output=True)
                line = f"password_file {pwfile}"
            elif isinstance(value, bool):
                line = f"{option} {'true' if value else 'false'}"
            else:
                line = f"{option} {value}"
            target = listener if per_listener else general
            target[:] = [l for l in target if not l.startswith(option + " ")]
            target.append(line)
        ws = ["protocol websockets"] + listener
        text = "\n".join(general) + "\n"
        text += f"listener {self.port} 127.0.0.1\n" + "\n".join(listener) + "\n"
        text += f"listener {self.ws_port} 127.0.0.1\n" + "\n".join(ws) + "\n"
        self.config = self.tmp / "mosquitto.conf"
        self.config.write_text(text)

    # -- process --------------------------------------------------------------------------
    def start(self) -> "Broker":
        assert self.proc is None
        self.runs += 1
        logf = open(self.log, "wb")
        if self.kind == "mosquitto":
            self.proc = subprocess.Popen([str(self.bin), "-c", str(self.config)],
                                         stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            logf.close()
            wait_port(self.host, self.port, self.proc, START_TIMEOUT, self.log)
            wait_port(self.host, self.ws_port, self.proc, START_TIMEOUT, self.log)
            return self
        cmd = [str(self.bin), "broker", "--listen", "127.0.0.1:0", "--mqtt", "127.0.0.1:0",
               "--ws", "127.0.0.1:0", "--data", str(self.data_dir)]
        if self.config:
            cmd += ["--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.tmp)
        logf.close()
        deadline = time.monotonic() + START_TIMEOUT
        self.port = self.ws_port = self.native_port = None
        while True:
            text = self.log.read_text(errors="replace")
            for what, addr in LINE.findall(text):
                port = int(addr.rsplit(":", 1)[1])
                if what == "mqtt":
                    self.port = port
                elif what == "mqtt over websocket":
                    self.ws_port = port
                else:
                    self.native_port = port
            if "ready" in text and self.port:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"hayate exited with {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"hayate not ready within {START_TIMEOUT}s:\n{tail(self.log)}")
            time.sleep(0.02)
        for port in (self.port, self.ws_port, self.native_port):
            if port:
                wait_port(self.host, port, self.proc, START_TIMEOUT, self.log)
        return self

    def stop(self, graceful: bool = True, timeout: float = 10.0) -> None:
        """SIGINT (both brokers save state on it) and wait; SIGKILL if it does not exit."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        if graceful:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        proc.kill()
        proc.wait()

    def restart(self) -> "Broker":
        self.stop(graceful=True)
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@pytest.fixture(scope="session")
def broker_kind() -> str:
    return KIND


@pytest.fixture
def make_broker(tmp_path_factory, request):
    """Factory: `make_broker(max_packet_size=1024, ...)` starts a broker with those settings."""
    brokers: list[Broker] = []

    def make(**settings) -> Broker:
        tmp = Path(tempfile.mkdtemp(prefix=f"{KIND}-", dir=tmp_path_factory.getbasetemp()))
        b = Broker(KIND, settings, tmp)
        brokers.append(b)
        return b.start()

    yield make
    for b in brokers:
        was_alive = b.alive() or b.proc is None
        b.stop(graceful=False)
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"--- {b.kind} log ({b.log}) ---\n{tail(b.log, 60)}")
        elif not was_alive:
            print(f"--- {b.kind} died during the test ---\n{tail(b.log, 60)}")


@pytest.fixture
def broker(make_broker) -> Broker:
    return make_broker()


@pytest.fixture
def mqtt(request):
    """Factory for connected paho clients: `mqtt(broker, version=5, client_id=..., ...)`.

    Every client is torn down at the end of the test (its network loop stopped, socket closed)."""
    made: list[MqttClient] = []

    def make(broker: Broker, connect: bool = True, **kw) -> MqttClient:
        c = MqttClient(broker, **kw)
        made.append(c)
        if connect:
            c.connect()
        return c

    yield make
    for c in made:
        c.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "hayate_only: needs Hayate (native protocol, its CLI)")


def pytest_collection_modifyitems(config, items):
    if KIND == "hayate":
        return
    skip = pytest.mark.skip(reason="Hayate-only test")
    for item in items:
        if "hayate_only" in item.keywords:
            item.add_marker(skip)


def pytest_report_header(config):
    return f"interop broker: {KIND}"
