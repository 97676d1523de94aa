"""Broker launcher for the MQTT and STOMP interop suites.

`INTEROP_BROKER=hayate` (default) runs `$HAYATE_BIN` (default `target/debug/hayate` under the
repository root); `INTEROP_BROKER=mosquitto` runs `mosquitto` (from PATH or /usr/sbin), for the
MQTT tests only; `INTEROP_BROKER=rabbitmq` uses RabbitMQ's STOMP plugin, for the STOMP tests
only. Every Hayate or Mosquitto broker binds 127.0.0.1 on an ephemeral port, uses a temporary
data directory, and is stopped at the end of the test whatever happened. RabbitMQ is slow to
start (~15 s): one node (`bench/peers/rabbitmq.sh start`, STOMP on 127.0.0.1:61613 or
`$INTEROP_RABBITMQ_STOMP_PORT`) serves the whole session, tests keep apart by unique destination
names, and it is stopped at the end unless it was already running. Broker settings are given in
Hayate's configuration names (see `SETTINGS`); for Mosquitto they are translated, and a test
asking for a setting that the other broker has no equivalent for is skipped. With
`INTEROP_BUSY_POLL_US=N` every Hayate broker runs with `--busy-poll-us N` (scripts/test-all runs
the suite once without and once with it).
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

os.environ.setdefault("STOMP_SKIP_HOSTNAME_SCAN", "1")  # stomp.py: no DNS look-ups at import

from helpers import MqttClient  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KIND = os.environ.get("INTEROP_BROKER", "hayate").strip().lower()
if KIND not in ("hayate", "mosquitto", "rabbitmq"):
    raise SystemExit(f"INTEROP_BROKER must be hayate, mosquitto or rabbitmq, not {KIND!r}")
MQTT_KINDS = ("hayate", "mosquitto")
STOMP_KINDS = ("hayate", "rabbitmq")
# Hayate's STOMP front-end is being written: its tests run against Hayate only with
# INTEROP_STOMP=1 until it is ready (scripts/test-all runs this suite). Then make "1" the default.
STOMP_ON_HAYATE = os.environ.get("INTEROP_STOMP", "1") == "1"
# INTEROP_BUSY_POLL_US=N: every Hayate broker busy-polls (`--busy-poll-us N`, one I/O thread).
BUSY_POLL_US = os.environ.get("INTEROP_BUSY_POLL_US", "").strip()

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
    "journal": ("mqtt", None, False),
    "max_queued_bytes": ("mqtt", None, False),
    "allow_anonymous": ("auth", "allow_anonymous", False),
    "users": ("auth", "password_file", False),
    # STOMP (Hayate only; see RABBITMQ_SETTINGS for what the RabbitMQ mode does with them).
    "heart_beat_ms": ("stomp", None, False),
    "queue_max_backlog": ("stomp", None, False),
    "max_frame_size": ("stomp", None, False),
}

LINE = re.compile(r"(mqtt over websocket|mqtt|native protocol|stomp) on (\S+)")
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


BROKER_LINE = re.compile(r"hayate broker: (.+?) on (\S+)")


def start_hayate(binary: Path, config: Path, log: Path) -> tuple[subprocess.Popen, dict[str, int]]:
    """`binary broker --config config`, its output in `log`; waits for "ready" (15 s) and
    returns the process and each listener's port by the name it logs (e.g. "mqtt over tls")."""
    with open(log, "wb") as f:
        proc = subprocess.Popen([str(binary), "broker", "--config", str(config)], stdout=f,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        text = log.read_text(errors="replace")
        if "ready" in text:
            return proc, {w: int(a.rsplit(":", 1)[1]) for w, a in BROKER_LINE.findall(text)}
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"hayate did not start:\n{tail(log)}")
        time.sleep(0.02)


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGINT, then SIGKILL after `timeout` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
    """One broker process; `restart()` keeps the data directory (and, for Mosquitto, the port).

    `protocols` (Hayate): the listeners wanted besides the native protocol, among "mqtt", "ws"
    and "stomp"; the others are turned off."""

    def __init__(self, kind: str, settings: dict, tmp: Path, protocols=("mqtt", "ws")):
        self.kind = kind
        self.settings = dict(settings)
        self.protocols = tuple(protocols)
        self.tmp = tmp
        self.data_dir = tmp / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port: int | None = None          # MQTT over TCP
        self.ws_port: int | None = None       # MQTT over WebSocket (path /mqtt)
        self.native_port: int | None = None   # Hayate's native protocol
        self.stomp_port: int | None = None    # STOMP (Hayate)
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
            # Plaintext passwords are refused: `hayate user add` hashes each (argon2).
            for name, password in users.items():
                out = subprocess.run(
                    [str(self.bin), "user", "add", name, "--password", password],
                    check=True, capture_output=True, text=True,
                ).stdout
                text += out + "\n"
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
        cmd = [str(self.bin), "broker", "--listen", "127.0.0.1:0"]
        for proto in ("mqtt", "ws", "stomp"):
            cmd += [f"--{proto}", "127.0.0.1:0" if proto in self.protocols else "off"]
        cmd += ["--amqp", "off", "--data", str(self.data_dir), "--admin", "off"]
        if BUSY_POLL_US:
            cmd += ["--busy-poll-us", BUSY_POLL_US]
        if self.config:
            cmd += ["--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.tmp)
        logf.close()
        deadline = time.monotonic() + START_TIMEOUT
        self.port = self.ws_port = self.native_port = self.stomp_port = None
        while True:
            text = self.log.read_text(errors="replace")
            for what, addr in LINE.findall(text):
                port = int(addr.rsplit(":", 1)[1])
                if what == "mqtt":
                    self.port = port
                elif what == "mqtt over websocket":
                    self.ws_port = port
                elif what == "stomp":
                    self.stomp_port = port
                else:
                    self.native_port = port
            wanted = {"mqtt": self.port, "ws": self.ws_port, "stomp": self.stomp_port}
            if "ready" in text and all(wanted[p] for p in self.protocols):
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"hayate exited with {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"hayate not ready within {START_TIMEOUT}s:\n{tail(self.log)}")
            time.sleep(0.02)
        for port in (self.port, self.ws_port, self.native_port, self.stomp_port):
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


def stop_brokers(brokers, request) -> None:
    """Stops the brokers a test started; prints a broker's log tail if the test failed or
    the broker died during it."""
    for b in brokers:
        was_alive = b.alive() or b.proc is None
        b.stop(graceful=False)
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(f"--- {b.kind} log ({b.log}) ---\n{tail(b.log, 60)}")
        elif not was_alive:
            print(f"--- {b.kind} died during the test ---\n{tail(b.log, 60)}")


@pytest.fixture(scope="session")
def broker_kind() -> str:
    return KIND


@pytest.fixture
def make_broker(tmp_path_factory, request):
    """Factory: `make_broker(max_packet_size=1024, ...)` starts a broker with those settings."""
    brokers: list[Broker] = []

    def make(**settings) -> Broker:
        if KIND not in MQTT_KINDS:
            pytest.skip(f"the MQTT tests run against {' or '.join(MQTT_KINDS)}, not {KIND}")
        tmp = Path(tempfile.mkdtemp(prefix=f"{KIND}-", dir=tmp_path_factory.getbasetemp()))
        b = Broker(KIND, settings, tmp)
        brokers.append(b)
        return b.start()

    yield make
    stop_brokers(brokers, request)


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


# -- STOMP ----------------------------------------------------------------------------------

# Hayate's STOMP settings the RabbitMQ mode accepts, and why it may ignore them; a test asking
# for any other setting is skipped there.
RABBITMQ_SETTINGS = {
    # RabbitMQ has no server-side heart-beat setting: it answers the client's `heart-beat` with
    # its own values (whole seconds, at least 1000 ms); the heart-beat tests read CONNECTED.
    "heart_beat_ms": "RabbitMQ negotiates from the client's heart-beat",
}


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class RabbitMQ:
    """The session's RabbitMQ node (STOMP plugin), started through bench/peers/rabbitmq.sh."""

    SCRIPT = REPO / "bench/peers/rabbitmq.sh"

    def __init__(self):
        self.host = "127.0.0.1"
        self.port = int(os.environ.get("INTEROP_RABBITMQ_STOMP_PORT", "61613"))
        self.started = False

    def _server_header(self) -> str:
        from stompraw import RawStomp
        try:
            with RawStomp(self.host, self.port) as r:
                f = r.connect(version="1.2", login="guest", passcode="guest", host="/")
                return f.get("server", "")
        except Exception as e:  # noqa: BLE001
            return f"(no answer: {e})"

    def start(self) -> None:
        if port_open(self.host, self.port):
            server = self._server_header()
            if not server.startswith("RabbitMQ"):
                raise RuntimeError(f"127.0.0.1:{self.port} is taken by something else than RabbitMQ: {server}")
            return  # a node someone else started: use it, leave it running
        r = subprocess.run([str(self.SCRIPT), "start", "5672", str(self.port), "11883"],
                           capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"{self.SCRIPT} start failed:\n{r.stdout}\n{r.stderr}")
        self.started = True

    def stop(self) -> None:
        if self.started:
            subprocess.run([str(self.SCRIPT), "stop"], capture_output=True, timeout=120,
                           stdin=subprocess.DEVNULL)
            self.started = False

    def alive(self) -> bool:
        return port_open(self.host, self.port)


class StompServer:
    """What a STOMP test talks to: a Hayate broker of its own, or the session's RabbitMQ.

    `login`/`passcode`: the credentials clients use by default (None: anonymous). `native_port`,
    `mqtt_port` and `bin` exist for Hayate only."""

    def __init__(self, kind: str, host: str, port: int, login=None, passcode=None,
                 broker: Broker | None = None, node: RabbitMQ | None = None):
        self.kind = kind
        self.host = host
        self.port = port
        self.login = login
        self.passcode = passcode
        self.broker = broker
        self.node = node
        self.native_port = broker.native_port if broker else None
        self.mqtt_port = broker.port if broker else None
        self.bin = broker.bin if broker else None

    def alive(self) -> bool:
        return self.broker.alive() if self.broker else self.node.alive()

    def topic(self, *parts: str) -> str:
        """A /topic/ destination of several segments: Hayate separates them with `/` (`/topic/a/b`
        is the key `a/b`), RabbitMQ with `.` (an AMQP topic routing key; it refuses `/`)."""
        return "/topic/" + ("/" if self.kind == "hayate" else ".").join(parts)

    def pattern(self, *parts: str) -> str:
        """A /topic/ subscription with wildcards: `*` one segment, `**` any number (RabbitMQ: `#`)."""
        if self.kind == "hayate":
            return "/topic/" + "/".join(parts)
        return "/topic/" + ".".join("#" if p == "**" else p for p in parts)

    def __repr__(self):
        return f"StompServer({self.kind} {self.host}:{self.port})"


@pytest.fixture(scope="session")
def rabbitmq_node():
    node = RabbitMQ()
    node.start()
    yield node
    node.stop()


@pytest.fixture
def make_stomp_server(tmp_path_factory, request):
    """Factory: `make_stomp_server(heart_beat_ms=500, ..., mqtt=False)` gives a STOMP server with
    those settings: a Hayate broker of the test's own (with an MQTT listener too if `mqtt`), or
    the session's RabbitMQ."""
    brokers: list[Broker] = []

    def make(mqtt: bool = False, **settings) -> StompServer:
        if KIND == "rabbitmq":
            for key in settings:
                if key not in RABBITMQ_SETTINGS:
                    pytest.skip(f"RabbitMQ has no equivalent of {key}")
            if mqtt:
                pytest.skip("cross-protocol test: Hayate only")
            node = request.getfixturevalue("rabbitmq_node")
            return StompServer("rabbitmq", node.host, node.port, login="guest", passcode="guest", node=node)
        if KIND != "hayate":
            pytest.skip(f"the STOMP tests run against {' or '.join(STOMP_KINDS)}, not {KIND}")
        tmp = Path(tempfile.mkdtemp(prefix=f"{KIND}-stomp-", dir=tmp_path_factory.getbasetemp()))
        b = Broker(KIND, settings, tmp, protocols=("stomp", "mqtt") if mqtt else ("stomp",))
        brokers.append(b)
        b.start()
        return StompServer("hayate", b.host, b.stomp_port, broker=b)

    yield make
    stop_brokers(brokers, request)


@pytest.fixture
def stomp_server(make_stomp_server) -> StompServer:
    return make_stomp_server()


@pytest.fixture
def stomp():
    """Factory for connected stomp.py clients: `stomp(server, version="1.2", ...)` (see
    stomphelpers.StompClient); all are torn down at the end of the test."""
    from stomphelpers import StompClient
    made = []

    def make(server: StompServer, version: str = "1.2", connect: bool = True, **kw):
        c = StompClient(server, version=version, **kw)
        made.append(c)
        if connect:
            c.connect()
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def raw_stomp():
    """Factory for raw STOMP sockets: `raw_stomp(server)` (stompraw.RawStomp), closed at the end."""
    from stompraw import RawStomp
    made = []

    def make(server: StompServer):
        r = RawStomp(server.host, server.port)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


def pytest_configure(config):
    config.addinivalue_line("markers", "hayate_only: needs Hayate (native protocol, its CLI)")


def pytest_collection_modifyitems(config, items):
    skip_hayate = pytest.mark.skip(reason="Hayate-only test")
    skip_mqtt = pytest.mark.skip(reason=f"MQTT tests run against {' or '.join(MQTT_KINDS)}")
    skip_stomp = pytest.mark.skip(reason=f"STOMP tests run against {' or '.join(STOMP_KINDS)}")
    skip_stomp_hayate = pytest.mark.skip(reason="STOMP tests against Hayate need INTEROP_STOMP=1 (for now)")
    for item in items:
        name = item.path.name
        if name.startswith("test_mqtt_") and KIND not in MQTT_KINDS:
            item.add_marker(skip_mqtt)
        elif name.startswith("test_stomp_") and KIND not in STOMP_KINDS:
            item.add_marker(skip_stomp)
        elif name.startswith("test_stomp_") and KIND == "hayate" and not STOMP_ON_HAYATE:
            item.add_marker(skip_stomp_hayate)
        elif "hayate_only" in item.keywords and KIND != "hayate":
            item.add_marker(skip_hayate)


def pytest_report_header(config):
    stomp = " (STOMP tests off: INTEROP_STOMP=1 turns them on)" if KIND == "hayate" and not STOMP_ON_HAYATE else ""
    return f"interop broker: {KIND}{stomp}"
