#!/usr/bin/env python3
"""MQTT soak test: one persistent-session subscriber, one publisher, a reconnect in the middle.

The subscriber holds a persistent session (MQTT 5.0: Session Expiry Interval 3600; 3.1.1: clean
session 0) subscribed at --qos. The publisher sends --count messages at --qos, each payload
starting with its 8-byte sequence number. When the publisher reaches --reconnect-at, the
subscriber disconnects (a normal DISCONNECT, or with --abrupt a dropped TCP connection), stays
away --away seconds while the publisher goes on, and reconnects with the same client id; the
broker must have queued what it missed. At the end (everything received, or no progress for
--stall-timeout seconds) it prints published / received / unique / duplicates / missing and
exits 1 if anything is missing (with QoS 0 nothing is promised; it only reports).

It talks to an already running broker at --host:--port, e.g.:

    mosquitto -c conf &   # with max_queued_messages 0 (unlimited), or Hayate's broker
    python3 tests/interop/mqtt_soak.py --port 1883 --count 100000
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import struct
import sys
import time

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

# paho's threaded loop costs a thread switch per packet, and its loop() reads one packet per
# call; each client is driven here by `pump` instead, the subscriber in its own process, so
# the soak measures the broker rather than Python's GIL.


class Pump:
    """Drive one paho client without its network thread."""

    def __init__(self, client: paho.Client):
        self.c = client
        self.events = 0  # bumped by the callbacks: tells whether a loop_read made progress

    def __call__(self, timeout: float) -> bool:
        c = self.c
        sock = c.socket()
        if sock is None:
            return False
        r, _, _ = select.select([sock], [sock] if c.want_write() else [], [], timeout)
        if r:
            for _ in range(512):
                before = self.events
                if c.loop_read() != paho.MQTT_ERR_SUCCESS:
                    return False
                if self.events == before:
                    break
        if c.want_write() and c.loop_write() != paho.MQTT_ERR_SUCCESS:
            return False
        c.loop_misc()
        return True


def wait_for(pump: Pump, cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} within {timeout}s")
        pump(0.05)


def new_client(a, client_id: str, clean: bool) -> paho.Client:
    v5 = a.version == 5
    return paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                       clean_session=None if v5 else clean,
                       protocol=paho.MQTTv5 if v5 else paho.MQTTv311, reconnect_on_failure=False)


def connect(a, c: paho.Client, pump: Pump, clean: bool, expiry: int | None, who: str) -> bool:
    """Connect and wait for CONNACK; returns the session present flag. Records the broker's
    Receive Maximum (MQTT 5.0) in `c.soak_receive_maximum`: paho does not enforce it."""
    state = {}

    def on_connect(client, userdata, flags, rc, properties):
        state["rc"], state["present"] = rc, bool(flags.session_present)
        c.soak_receive_maximum = getattr(properties, "ReceiveMaximum", 65535) if properties else 65535
        pump.events += 1

    c.on_connect = on_connect
    if a.version == 5:
        p = None
        if expiry:
            p = Properties(PacketTypes.CONNECT)
            p.SessionExpiryInterval = expiry
        c.connect(a.host, a.port, 60, clean_start=clean, properties=p)
    else:
        c.connect(a.host, a.port, 60)
    wait_for(pump, lambda: "rc" in state, 10, f"{who}: no CONNACK")
    if state["rc"].is_failure:
        raise SystemExit(f"{who}: connection refused: {state['rc']}")
    return state["present"]


def subscriber(a, topic: str, client_id: str, ready, leave, stop, shared, result) -> None:
    """Child process: the persistent-session subscriber."""
    seen = bytearray(a.count)
    stats = {"received": 0, "duplicates": 0, "reordered": 0, "last": -1, "unique": 0}

    def on_message(client, userdata, msg):
        pump.events += 1
        seq = struct.unpack_from(">Q", msg.payload)[0]
        stats["received"] += 1
        if seq >= a.count:
            return
        if seen[seq]:
            stats["duplicates"] += 1
        else:
            seen[seq] = 1
            stats["unique"] += 1
        if seq < stats["last"]:
            stats["reordered"] += 1
        stats["last"] = seq

    # One paho client for the whole run: its session state (QoS 2 messages waiting for PUBREL,
    # which paho hands to the application only then) must survive the reconnect.
    c = new_client(a, client_id, clean=False)
    c.on_message = on_message
    pump = Pump(c)

    def open_session(first: bool) -> None:
        # v5: clean start on the first connection; 3.1.1: the fresh client id is a fresh session.
        present = connect(a, c, pump, clean=first and a.version == 5, expiry=3600, who="subscriber")
        if not first and not present:
            print("subscriber: WARNING: session not present on reconnect", file=sys.stderr)

    open_session(first=True)
    acked = []
    c.on_subscribe = lambda *x: acked.append(1)
    c.subscribe(topic, a.qos)
    wait_for(pump, lambda: acked, 10, "subscriber: no SUBACK")
    ready.set()
    left = False
    last_share = 0.0
    while not stop.is_set():
        if not pump(0.05):
            print("subscriber: connection lost", file=sys.stderr)
            time.sleep(0.2)
            open_session(first=False)
        if leave.is_set() and not left:
            left = True
            if a.abrupt:
                c.socket().close()
            else:
                c.disconnect()
                pump(0.1)
            time.sleep(a.away)
            open_session(first=False)
        now = time.monotonic()
        if now - last_share > 0.05:
            last_share = now
            shared[0], shared[1], shared[2] = stats["received"], stats["unique"], stats["duplicates"]
    shared[0], shared[1], shared[2] = stats["received"], stats["unique"], stats["duplicates"]
    # End the session so the broker does not keep it.
    if a.version == 5:
        p = Properties(PacketTypes.DISCONNECT)
        p.SessionExpiryInterval = 0
        c.disconnect(properties=p)
        pump(0.1)
    else:
        c.disconnect()
        pump(0.1)
        end = new_client(a, client_id, clean=True)
        try:
            connect(a, end, Pump(end), clean=True, expiry=None, who="cleanup")
            end.disconnect()
        except (OSError, SystemExit):
            pass
    missing = seen.count(0)
    result.send({"received": stats["received"], "unique": a.count - missing,
                 "duplicates": stats["duplicates"], "reordered": stats["reordered"],
                 "missing": missing, "first_missing": seen.find(0)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=1883)
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    ap.add_argument("--payload", type=int, default=64, help="payload bytes (at least 8)")
    ap.add_argument("--reconnect-at", type=int, default=None, help="default: count/2")
    ap.add_argument("--away", type=float, default=1.0, help="seconds the subscriber stays away")
    ap.add_argument("--abrupt", action="store_true", help="drop the TCP connection instead of DISCONNECT")
    ap.add_argument("--version", type=int, choices=(4, 5), default=5, help="4 = MQTT 3.1.1, 5 = MQTT 5.0")
    ap.add_argument("--inflight", type=int, default=1000, help="publisher's max in-flight messages")
    ap.add_argument("--stall-timeout", type=float, default=15.0,
                    help="give up after this many seconds without progress")
    a = ap.parse_args()
    if a.payload < 8:
        ap.error("--payload must be at least 8 bytes (the sequence number)")
    reconnect_at = a.count // 2 if a.reconnect_at is None else a.reconnect_at

    run = f"{os.getpid()}-{int(time.time())}"
    topic = f"soak/{run}"
    ctx = mp.get_context("fork")
    ready, leave, stop = ctx.Event(), ctx.Event(), ctx.Event()
    shared = ctx.Array("q", 3, lock=False)  # received, unique, duplicates
    result_r, result_w = ctx.Pipe(duplex=False)
    child = ctx.Process(target=subscriber, args=(a, topic, f"soak-sub-{run}", ready, leave, stop,
                                                 shared, result_w), daemon=True)
    child.start()
    if not ready.wait(15):
        child.terminate()
        raise SystemExit("subscriber did not get ready")

    acked = 0

    def on_publish(client, userdata, mid, rc, properties):
        nonlocal acked
        acked += 1
        pump.events += 1

    pub = new_client(a, f"soak-pub-{run}", clean=True)
    pub.on_publish = on_publish
    pub.max_inflight_messages_set(a.inflight)
    pump = Pump(pub)
    connect(a, pub, pump, clean=True, expiry=None, who="publisher")
    # MQTT-3.3.4-7: never more unacknowledged QoS 1/2 PUBLISHes than the broker's Receive
    # Maximum; paho does not enforce it (nor allow changing its window once connected), so the
    # loop below does.
    inflight = min(a.inflight, pub.soak_receive_maximum)
    if inflight < a.inflight:
        print(f"publisher: in-flight window {inflight} (the broker's Receive Maximum)", file=sys.stderr)

    pad = b"\x00" * (a.payload - 8)
    window = inflight  # messages handed to paho and not yet acknowledged
    t0 = time.monotonic()
    stalled = False
    for seq in range(a.count):
        if seq == reconnect_at:
            leave.set()
            print(f"subscriber leaves at message {seq} for {a.away}s "
                  f"({'abrupt close' if a.abrupt else 'DISCONNECT'})", file=sys.stderr)
        if seq - acked >= window:
            deadline = time.monotonic() + a.stall_timeout
            while seq - acked >= window and time.monotonic() < deadline:
                if not pump(0.05):
                    raise SystemExit("publisher: connection lost")
            if seq - acked >= window:
                print(f"publisher stalled at {seq} ({acked} acknowledged)", file=sys.stderr)
                stalled = True
                break
        info = pub.publish(topic, struct.pack(">Q", seq) + pad, a.qos)
        if info.rc != paho.MQTT_ERR_SUCCESS:
            print(f"publish {seq} failed: {info.rc}", file=sys.stderr)
            break
        if seq % 64 == 0:
            pump(0)
        if seq and seq % max(1, a.count // 10) == 0:
            el = time.monotonic() - t0
            print(f"  {seq} published, {shared[0]} received, {seq / el:.0f} msg/s", file=sys.stderr)
    deadline = time.monotonic() + a.stall_timeout
    while not stalled and acked < a.count and time.monotonic() < deadline:
        pump(0.05)
    published_at = time.monotonic()

    last, last_change = -1, time.monotonic()
    while shared[1] < a.count and time.monotonic() - last_change < a.stall_timeout:
        if shared[1] != last:
            last, last_change = shared[1], time.monotonic()
        pump(0.1)  # keeps the publisher's connection alive
    elapsed = time.monotonic() - t0
    stop.set()
    res = result_r.recv() if result_r.poll(15) else None
    child.join(5)
    pub.disconnect()
    pump(0.1)
    if res is None:
        print("subscriber process gave no result", file=sys.stderr)
        return 1

    print(f"published:  {acked} acknowledged of {a.count} (qos {a.qos}, {a.payload} B payload, MQTT "
          f"{'5.0' if a.version == 5 else '3.1.1'}) in {published_at - t0:.1f}s")
    print(f"received:   {res['received']}")
    print(f"unique:     {res['unique']}")
    print(f"duplicates: {res['duplicates']}")
    print(f"missing:    {res['missing']}" + (f" (first: {res['first_missing']})" if res["missing"] else ""))
    print(f"reordered:  {res['reordered']}")
    print(f"elapsed:    {elapsed:.1f}s, {res['received'] / elapsed:.0f} msg/s end to end")
    if res["missing"] and a.qos == 0:
        print("(qos 0: losses are allowed)")
        return 0
    return 1 if res["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
