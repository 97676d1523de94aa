"""A thin synchronous wrapper around paho-mqtt 2.x (callback API version 2) for the tests.

Each `MqttClient` runs paho's network loop in its own thread, records everything it receives,
and offers blocking waits with short timeouts. Incoming topic aliases (MQTT 5.0 section
3.3.2.3.4) are resolved here, as an application using paho must do: paho hands the raw
PUBLISH over with an empty topic and a TopicAlias property.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

WAIT = 5.0  # seconds: the longest any single wait in the suite may take


def persistent(version: int, expiry: int = 3600) -> dict:
    """Keyword arguments of the `mqtt` fixture for a session that outlives the connection
    (MQTT 5: with this session expiry)."""
    if version == 5:
        return {"clean": False, "connect_props": {"SessionExpiryInterval": expiry}}
    return {"clean": False}


def unique(prefix: str = "t") -> str:
    """A topic / client id prefix unique to this call, so tests never see each other's data."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def props(packet_type: int, values: dict | None) -> Properties | None:
    if not values:
        return None
    p = Properties(packet_type)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def prop(p, name, default=None):
    """A property of a paho Properties object (or None) by name, `default` when absent."""
    if p is None:
        return default
    return getattr(p, name, default)


@dataclass
class Msg:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    mid: int
    properties: object = None
    alias: int | None = None
    dup: bool = False
    at: float = field(default_factory=time.monotonic)

    def prop(self, name, default=None):
        return prop(self.properties, name, default)


class MqttClient:
    def __init__(self, broker, client_id: str | None = None, version: int = 5, clean: bool = True,
                 keepalive: int = 30, connect_props: dict | None = None, will: tuple | None = None,
                 will_props: dict | None = None, username: str | None = None,
                 password: str | None = None, manual_ack: bool = False, transport: str = "tcp",
                 max_inflight: int | None = None):
        self.broker = broker
        self.version = version
        self.client_id = unique("c") if client_id is None else client_id
        self.clean = clean
        self.keepalive = keepalive
        self.connect_props = connect_props
        self.transport = transport
        protocol = paho.MQTTv5 if version == 5 else paho.MQTTv311
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             clean_session=None if version == 5 else clean, protocol=protocol,
                             transport=transport, reconnect_on_failure=False, manual_ack=manual_ack)
        if transport == "websockets":
            self.c.ws_set_options(path="/mqtt")
        if will:
            topic, payload, qos, retain = will
            self.c.will_set(topic, payload, qos, retain, props(PacketTypes.WILLMESSAGE, will_props))
        if username is not None:
            self.c.username_pw_set(username, password)
        if max_inflight is not None:
            self.c.max_inflight_messages_set(max_inflight)
        self.lock = threading.Condition()
        self.messages: list[Msg] = []
        self.aliases: dict[int, str] = {}
        self.alias_errors: list[str] = []
        self.subacks: dict[int, list] = {}
        self.connected = threading.Event()
        self.connack_event = threading.Event()
        self.disconnected = threading.Event()
        self.connack_rc: ReasonCode | None = None
        self.session_present: bool | None = None
        self.connack_props = None
        self.disconnect_rc: ReasonCode | None = None
        self.disconnect_props = None
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = self._on_disconnect
        self.c.on_message = self._on_message
        self.c.on_subscribe = self._on_subscribe

    # -- callbacks (paho's network thread) ------------------------------------------------
    def _on_connect(self, client, userdata, flags, rc, properties):
        self.connack_rc = rc
        self.session_present = bool(flags.session_present)
        self.connack_props = properties
        if not rc.is_failure:
            self.connected.set()
        self.connack_event.set()

    def _on_disconnect(self, client, userdata, flags, rc, properties):
        self.disconnect_rc = rc
        self.disconnect_props = properties
        self.connected.clear()
        self.disconnected.set()
        self.connack_event.set()

    def _on_message(self, client, userdata, m):
        alias = None
        topic = m.topic
        if self.version == 5:
            alias = prop(m.properties, "TopicAlias")
            if alias is not None:
                if topic:
                    self.aliases[alias] = topic
                elif alias in self.aliases:
                    topic = self.aliases[alias]
                else:
                    self.alias_errors.append(f"empty topic with unknown alias {alias}")
        with self.lock:
            self.messages.append(Msg(topic, m.payload, m.qos, bool(m.retain), m.mid, m.properties,
                                     alias, bool(m.dup)))
            self.lock.notify_all()

    def _on_subscribe(self, client, userdata, mid, rcs, properties):
        with self.lock:
            self.subacks[mid] = rcs
            self.lock.notify_all()

    # -- operations -----------------------------------------------------------------------
    def connect(self, timeout: float = WAIT, expect_ok: bool = True) -> "MqttClient":
        port = self.broker.ws_port if self.transport == "websockets" else self.broker.port
        kw = {}
        if self.version == 5:
            kw["clean_start"] = self.clean
            kw["properties"] = props(PacketTypes.CONNECT, self.connect_props)
        self.connected.clear()
        self.connack_event.clear()
        self.disconnected.clear()
        self.c.connect(self.broker.host, port, self.keepalive, **kw)
        self.c.loop_start()
        assert self.connack_event.wait(timeout), f"no CONNACK within {timeout}s"
        if expect_ok:
            assert self.connected.is_set(), f"connection refused/closed: {self.connack_rc} / {self.disconnect_rc}"
        return self

    def reconnect(self, clean: bool | None = None, connect_props: dict | None = None,
                  expect_ok: bool = True) -> "MqttClient":
        """Connect again with the same client id (the client must be disconnected)."""
        self.c.loop_stop()
        if clean is not None:
            self.clean = clean
            if self.version != 5:
                self.c._clean_session = clean  # paho fixes it at construction for 3.1.1
        if connect_props is not None:
            self.connect_props = connect_props
        return self.connect(expect_ok=expect_ok)

    def subscribe(self, topic: str, qos: int = 0, no_local: bool = False, rap: bool = False,
                  rh: int = 0, sub_id: int | None = None, timeout: float = WAIT,
                  expect_ok: bool = True) -> list:
        if self.version == 5:
            opts = SubscribeOptions(qos=qos, noLocal=no_local, retainAsPublished=rap, retainHandling=rh)
            p = props(PacketTypes.SUBSCRIBE, {"SubscriptionIdentifier": sub_id} if sub_id else None)
            rc, mid = self.c.subscribe(topic, options=opts, properties=p)
        else:
            rc, mid = self.c.subscribe(topic, qos)
        assert rc == paho.MQTT_ERR_SUCCESS, f"subscribe failed locally: {rc}"
        with self.lock:
            assert self.lock.wait_for(lambda: mid in self.subacks, timeout), f"no SUBACK for {topic}"
            rcs = self.subacks[mid]
        if expect_ok:
            codes = [int(r.value) if hasattr(r, "value") else int(r) for r in rcs]
            assert all(c < 0x80 for c in codes), f"subscription to {topic} refused: {rcs}"
        return rcs

    def unsubscribe(self, topic: str) -> None:
        self.c.unsubscribe(topic)

    def publish(self, topic: str, payload=b"", qos: int = 0, retain: bool = False,
                properties: dict | None = None, wait: bool = True, timeout: float = WAIT):
        info = self.c.publish(topic, payload, qos, retain, props(PacketTypes.PUBLISH, properties))
        assert info.rc == paho.MQTT_ERR_SUCCESS, f"publish failed locally: {info.rc}"
        if wait:
            info.wait_for_publish(timeout)
            assert info.is_published(), f"publish to {topic} (qos {qos}) not acknowledged in {timeout}s"
        return info

    def ack(self, msg: Msg) -> None:
        self.c.ack(msg.mid, msg.qos)

    def disconnect(self, reason: int | None = None, properties: dict | None = None,
                   timeout: float = WAIT) -> None:
        rc = ReasonCode(PacketTypes.DISCONNECT, identifier=reason) if reason is not None else None
        self.c.disconnect(reasoncode=rc, properties=props(PacketTypes.DISCONNECT, properties))
        self.disconnected.wait(timeout)
        self.c.loop_stop()

    def close(self) -> None:
        """Tear down without a DISCONNECT packet where possible (socket closed)."""
        try:
            if self.connected.is_set():
                self.c.disconnect()
        except Exception:
            pass
        try:
            self.c.loop_stop()
        except Exception:
            pass
        try:
            sock = self.c.socket()
            if sock:
                sock.close()
        except Exception:
            pass

    def drop(self) -> None:
        """Close the TCP connection without DISCONNECT (an abrupt network loss)."""
        self.c.loop_stop()
        sock = self.c.socket()
        if sock:
            try:
                sock.shutdown(2)
            except OSError:
                pass
            sock.close()
        self.connected.clear()

    # -- waits ----------------------------------------------------------------------------
    def wait_messages(self, n: int, timeout: float = WAIT, topic: str | None = None) -> list[Msg]:
        """The first `n` messages received (on `topic` if given); fails if fewer arrive in time."""
        def match():
            return [m for m in self.messages if topic is None or m.topic == topic]
        with self.lock:
            ok = self.lock.wait_for(lambda: len(match()) >= n, timeout)
            got = match()
        assert ok, f"expected {n} messages{' on ' + topic if topic else ''}, got {len(got)}: {got[:5]}"
        return got[:n]

    def quiet(self, timeout: float, topic: str | None = None) -> list[Msg]:
        """Wait `timeout` seconds, then return every message received (on `topic` if given)."""
        time.sleep(timeout)
        with self.lock:
            return [m for m in self.messages if topic is None or m.topic == topic]

    def received(self, topic: str | None = None) -> list[Msg]:
        with self.lock:
            return [m for m in self.messages if topic is None or m.topic == topic]

    def clear(self) -> None:
        with self.lock:
            self.messages.clear()
