#!/usr/bin/env python3
"""Capture known-answer frames from a real RabbitMQ for acemq-codec's tests.

    scripts/rabbitmq.sh start
    pip install pika            # capture only; CI never runs this script
    python3 scripts/capture_kat.py [--port 5672] [--out amqp-codec/tests/data/rabbitmq-3.10]
    scripts/rabbitmq.sh stop

Every pika connection goes through a small recording TCP proxy in this script
(127.0.0.1:<ephemeral> -> 127.0.0.1:<port>). The proxy keeps every byte the
server sends to the client; afterwards the stream is split into frames
(type u8, channel u16 BE, size u32 BE, payload, 0xCE) and the selected frames
are written, byte for byte as received, to <out>/<name>.bin. A decoded summary
of every written file is printed (and written to <out>/summary.txt).

The blocked/unblocked capture sets the node's memory watermark to 0 and back
to 0.4 through scripts/rabbitmq.sh ctl.
"""

import argparse
import datetime
import decimal
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pika
from pika.compat import long as pika_long

# pika 1.x cannot encode a float; send Python floats as 'd' (double).
_pika_encode_value = pika.data.encode_value


def _encode_value(pieces, value):
    if isinstance(value, float):
        pieces.append(struct.pack(">cd", b"d", value))
        return 9
    return _pika_encode_value(pieces, value)


pika.data.encode_value = _encode_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAME_END = 0xCE

# ------------------------------------------------------------------ proxy --


class RecordingProxy:
    """Accepts one client connection and forwards it to upstream, recording
    the server->client bytes."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1)
        self.port = self.listener.getsockname()[1]
        self.s2c = bytearray()
        self.lock = threading.Lock()
        self.threads = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        client, _ = self.listener.accept()
        self.listener.close()
        server = socket.create_connection(("127.0.0.1", self.upstream_port))
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a = threading.Thread(target=self._pump, args=(client, server, False), daemon=True)
        b = threading.Thread(target=self._pump, args=(server, client, True), daemon=True)
        a.start()
        b.start()
        self.threads += [a, b]

    def _pump(self, src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record:
                    with self.lock:
                        self.s2c += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def frames(self):
        with self.lock:
            return split_frames(bytes(self.s2c))


def split_frames(buf):
    """[(raw_bytes, type, channel, payload)] for every complete frame."""
    out = []
    i = 0
    while i + 7 <= len(buf):
        ftype, channel, size = struct.unpack_from(">BHI", buf, i)
        end = i + 7 + size + 1
        if end > len(buf):
            break
        if buf[end - 1] != FRAME_END:
            raise ValueError("bad frame end at offset %d" % (end - 1))
        out.append((buf[i:end], ftype, channel, buf[i + 7:end - 1]))
        i = end
    return out


def connect(port, proxy=True, **kw):
    p = RecordingProxy(port) if proxy else None
    params = pika.ConnectionParameters(
        host="127.0.0.1",
        port=p.port if p else port,
        credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=0,  # no heartbeat frames in the captures
        **kw,
    )
    return pika.BlockingConnection(params), p


# ---------------------------------------------------------------- decoder --

METHODS = {
    (10, 10): "connection.start", (10, 11): "connection.start-ok",
    (10, 20): "connection.secure", (10, 21): "connection.secure-ok",
    (10, 30): "connection.tune", (10, 31): "connection.tune-ok",
    (10, 40): "connection.open", (10, 41): "connection.open-ok",
    (10, 50): "connection.close", (10, 51): "connection.close-ok",
    (10, 60): "connection.blocked", (10, 61): "connection.unblocked",
    (20, 10): "channel.open", (20, 11): "channel.open-ok",
    (20, 20): "channel.flow", (20, 21): "channel.flow-ok",
    (20, 40): "channel.close", (20, 41): "channel.close-ok",
    (50, 10): "queue.declare", (50, 11): "queue.declare-ok",
    (60, 20): "basic.consume", (60, 21): "basic.consume-ok",
    (60, 40): "basic.publish", (60, 50): "basic.return",
    (60, 60): "basic.deliver", (60, 71): "basic.get-ok",
    (60, 80): "basic.ack", (60, 90): "basic.reject", (60, 120): "basic.nack",
    (85, 10): "confirm.select", (85, 11): "confirm.select-ok",
}

PROPS = [
    ("content-type", "shortstr"), ("content-encoding", "shortstr"),
    ("headers", "table"), ("delivery-mode", "octet"), ("priority", "octet"),
    ("correlation-id", "shortstr"), ("reply-to", "shortstr"),
    ("expiration", "shortstr"), ("message-id", "shortstr"),
    ("timestamp", "timestamp"), ("type", "shortstr"), ("user-id", "shortstr"),
    ("app-id", "shortstr"), ("cluster-id", "shortstr"),
]


class Reader:
    def __init__(self, b):
        self.b, self.i = b, 0

    def take(self, n):
        v = self.b[self.i:self.i + n]
        if len(v) != n:
            raise ValueError("short read")
        self.i += n
        return v

    def unpack(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.i)
        self.i += struct.calcsize(fmt)
        return v[0] if len(v) == 1 else v

    def shortstr(self):
        return self.take(self.unpack(">B")).decode()

    def longstr(self):
        return self.take(self.unpack(">I"))

    def table(self):
        end_len = self.unpack(">I")
        sub = Reader(self.take(end_len))
        out = []
        while sub.i < len(sub.b):
            k = sub.shortstr()
            out.append((k, sub.value()))
        return out

    def value(self):
        tag = chr(self.take(1)[0])
        f = {
            "t": lambda: bool(self.unpack(">B")), "b": lambda: self.unpack(">b"),
            "B": lambda: self.unpack(">B"), "s": lambda: self.unpack(">h"),
            "u": lambda: self.unpack(">H"), "I": lambda: self.unpack(">i"),
            "i": lambda: self.unpack(">I"), "l": lambda: self.unpack(">q"),
            "f": lambda: self.unpack(">f"), "d": lambda: self.unpack(">d"),
            "D": lambda: self.unpack(">Bi"), "S": self.longstr, "x": self.longstr,
            "T": lambda: self.unpack(">Q"), "F": self.table, "V": lambda: None,
            "A": self.array,
        }[tag]
        return (tag, f())

    def array(self):
        sub = Reader(self.take(self.unpack(">I")))
        out = []
        while sub.i < len(sub.b):
            out.append(sub.value())
        return out


def fmt_value(tv, indent):
    tag, v = tv
    pad = "  " * indent
    if tag == "F":
        return "F{\n" + "".join(
            "%s  %s: %s\n" % (pad, k, fmt_value(x, indent + 1)) for k, x in v) + pad + "}"
    if tag == "A":
        return "A[\n" + "".join(
            "%s  %s\n" % (pad, fmt_value(x, indent + 1)) for x in v) + pad + "]"
    if tag in "Sx":
        return "%s %r" % (tag, bytes(v))
    return "%s %r" % (tag, v)


def describe(frames):
    lines = []
    for raw, ftype, ch, payload in frames:
        head = "type=%d channel=%d size=%d" % (ftype, ch, len(payload))
        r = Reader(payload)
        if ftype == 1:
            cid, mid = r.unpack(">HH")
            name = METHODS.get((cid, mid), "?")
            lines.append("%s  method %d.%d %s" % (head, cid, mid, name))
            lines += ["    " + x for x in describe_method(name, r)]
        elif ftype == 2:
            cid, weight, body_size, flags = r.unpack(">HHQH")
            lines.append("%s  content header class=%d weight=%d body-size=%d flags=0x%04x"
                         % (head, cid, weight, body_size, flags))
            for bit, (pname, ptype) in enumerate(PROPS):
                if flags & (1 << (15 - bit)):
                    if ptype == "shortstr":
                        v = repr(r.shortstr())
                    elif ptype == "octet":
                        v = str(r.unpack(">B"))
                    elif ptype == "timestamp":
                        v = str(r.unpack(">Q"))
                    else:
                        v = fmt_value(("F", r.table()), 2)
                    lines.append("    %s (%s) = %s" % (pname, ptype, v))
        elif ftype == 3:
            lines.append("%s  body %r" % (head, bytes(payload)))
        elif ftype == 8:
            lines.append("%s  heartbeat" % head)
    return lines


def describe_method(name, r):
    out = []
    if name == "connection.start":
        maj, mnr = r.unpack(">BB")
        out.append("version-major=%d version-minor=%d" % (maj, mnr))
        out.append("server-properties = " + fmt_value(("F", r.table()), 2))
        out.append("mechanisms = %r" % bytes(r.longstr()))
        out.append("locales = %r" % bytes(r.longstr()))
    elif name == "connection.tune":
        cmax, fmax, hb = r.unpack(">HIH")
        out.append("channel-max=%d frame-max=%d heartbeat=%d" % (cmax, fmax, hb))
    elif name in ("channel.close", "connection.close"):
        code = r.unpack(">H")
        text = r.shortstr()
        cid, mid = r.unpack(">HH")
        out.append("reply-code=%d reply-text=%r class-id=%d method-id=%d" % (code, text, cid, mid))
    elif name == "connection.blocked":
        out.append("reason=%r" % r.shortstr())
    elif name == "basic.deliver":
        ctag = r.shortstr()
        dtag, redel = r.unpack(">QB")
        out.append("consumer-tag=%r delivery-tag=%d redelivered=%d exchange=%r routing-key=%r"
                   % (ctag, dtag, redel, r.shortstr(), r.shortstr()))
    elif name == "basic.return":
        code = r.unpack(">H")
        out.append("reply-code=%d reply-text=%r exchange=%r routing-key=%r"
                   % (code, r.shortstr(), r.shortstr(), r.shortstr()))
    elif name in ("basic.ack", "basic.nack"):
        dtag, bits = r.unpack(">QB")
        out.append("delivery-tag=%d multiple=%d" % (dtag, bits & 1))
    return out


# --------------------------------------------------------------- captures --


def method_id(frame):
    _, ftype, _, payload = frame
    if ftype != 1:
        return None
    return struct.unpack_from(">HH", payload)


def find(frames, cid_mid, start=0):
    for i in range(start, len(frames)):
        if method_id(frames[i]) == cid_mid:
            return i
    raise LookupError("method %s not found in %d frames" % (cid_mid, len(frames)))


def content_frames(frames, i):
    """frames[i] is a content-carrying method: return it, its header and
    body frames (as many as the header's body-size needs)."""
    out = [frames[i]]
    hdr = frames[i + 1]
    assert hdr[1] == 2, "expected a content header after the method"
    out.append(hdr)
    body_size = struct.unpack_from(">Q", hdr[3], 4)[0]
    got, j = 0, i + 2
    while got < body_size:
        assert frames[j][1] == 3, "expected a body frame"
        got += len(frames[j][3])
        out.append(frames[j])
        j += 1
    return out


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise TimeoutError(what)


def cap_start_tune(args):
    conn, proxy = connect(args.port)
    conn.close()
    frames = proxy.frames()
    return {
        "connection_start": [frames[find(frames, (10, 10))]],
        "connection_tune": [frames[find(frames, (10, 30))]],
    }


SOURCE_Q = "acemq.kat.dlx.source"
TARGET_Q = "acemq.kat.dlx.target"
DLX_BODY = b'{"kat":"x-death","n":1}'

DLX_PROPS = dict(
    content_type="application/json",
    content_encoding="identity",
    delivery_mode=2,
    priority=7,
    correlation_id="corr-42",
    reply_to="acemq.kat.reply",
    message_id="msg-0001",
    timestamp=1700000000,
    type="kat.x-death",
    app_id="acemq-capture-kat",
    headers={
        "s-longstr": "hello, world",
        "i-int32": -123456,
        "l-int64": pika_long(9007199254740993),
        "t-bool": True,
        "d-double": 3.25,
        "T-timestamp": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "F-table": {"inner-str": "nested", "inner-int": 7, "inner-bool": False},
        "A-array": ["one", 2, True, {"k": "v"}],
        "D-decimal": decimal.Decimal("12.345"),
        "x-bytes": b"\x00\x01\xfe\xff",
        "V-void": None,
    },
)


def cap_deliver_x_death(args):
    setup, _ = connect(args.port, proxy=False)
    ch = setup.channel()
    for q in (SOURCE_Q, TARGET_Q):
        ch.queue_delete(q)
    ch.queue_declare(TARGET_Q, durable=True)
    ch.queue_declare(SOURCE_Q, durable=True, arguments={
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": TARGET_Q,
    })
    ch.confirm_delivery()
    ch.basic_publish("", SOURCE_Q, DLX_BODY, pika.BasicProperties(**DLX_PROPS), mandatory=True)
    method, _, _ = ch.basic_get(SOURCE_Q, auto_ack=False)
    assert method is not None, "message did not arrive in the source queue"
    ch.basic_reject(method.delivery_tag, requeue=False)
    wait_for(lambda: ch.queue_declare(TARGET_Q, passive=True).method.message_count == 1,
             10, "dead-lettered message in %s" % TARGET_Q)

    conn, proxy = connect(args.port)
    cch = conn.channel()
    got = []

    def on_msg(c, m, p, b):
        got.append((m, p, b))
        c.basic_ack(m.delivery_tag)

    cch.basic_consume(TARGET_Q, on_msg, auto_ack=False, consumer_tag="acemq-kat")
    wait_for(lambda: (conn.process_data_events(0.1), got)[1], 10, "delivery from target queue")
    cch.basic_cancel("acemq-kat")
    conn.close()

    ch.queue_delete(SOURCE_Q)
    ch.queue_delete(TARGET_Q)
    setup.close()

    frames = proxy.frames()
    return {"deliver_x_death": content_frames(frames, find(frames, (60, 60)))}


def cap_return_then_ack(args):
    conn, proxy = connect(args.port)
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("", "acemq.kat.no-such-queue", b"unroutable",
                         pika.BasicProperties(message_id="msg-return-1", content_type="text/plain"),
                         mandatory=True)
        raise AssertionError("publish was not returned")
    except pika.exceptions.UnroutableError:
        pass
    conn.close()
    frames = proxy.frames()
    i = find(frames, (60, 50))
    content = content_frames(frames, i)
    nxt = frames[i + len(content)]
    assert method_id(nxt) == (60, 80), "basic.ack does not follow the return"
    return {"return_then_ack": content + [nxt]}


def cap_channel_close_404(args):
    conn, proxy = connect(args.port)
    ch = conn.channel()
    try:
        ch.queue_declare("acemq.kat.no-such-queue", passive=True)
        raise AssertionError("passive declare succeeded")
    except pika.exceptions.ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    conn.close()
    frames = proxy.frames()
    return {"channel_close_404": [frames[find(frames, (20, 40))]]}


def ctl(*a):
    subprocess.run([os.path.join(ROOT, "scripts", "rabbitmq.sh"), "ctl", *a],
                   check=True, stdout=subprocess.DEVNULL)


def cap_blocked(args):
    conn, proxy = connect(args.port)
    ch = conn.channel()
    ch.queue_declare("", exclusive=True)
    events = []
    conn.add_on_connection_blocked_callback(lambda c, m: events.append("blocked"))
    conn.add_on_connection_unblocked_callback(lambda c, m: events.append("unblocked"))
    ch.basic_publish("", "acemq.kat.blocked", b"before the alarm")
    conn.process_data_events(0.2)
    try:
        ctl("set_vm_memory_high_watermark", "0")
        # The notification goes to a connection that publishes: keep publishing
        # (the socket stops being read once blocked; pika only buffers).
        deadline = time.time() + 20
        while "blocked" not in events and time.time() < deadline:
            ch.basic_publish("", "acemq.kat.blocked", b"during the alarm")
            conn.process_data_events(0.5)
        assert "blocked" in events, "no connection.blocked within 20 s"
    finally:
        ctl("set_vm_memory_high_watermark", "0.4")
    wait_for(lambda: (conn.process_data_events(0.2), "unblocked" in events)[1], 20,
             "connection.unblocked")
    conn.close()
    frames = proxy.frames()
    return {
        "connection_blocked": [frames[find(frames, (10, 60))]],
        "connection_unblocked": [frames[find(frames, (10, 61))]],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=int(os.environ.get("ACEMQ_RABBITMQ_PORT", "5672")))
    ap.add_argument("--out", default=os.path.join(ROOT, "amqp-codec", "tests", "data", "rabbitmq-3.10"))
    ap.add_argument("--no-blocked", action="store_true", help="skip the memory-alarm capture")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    captures = {}
    steps = [cap_start_tune, cap_deliver_x_death, cap_return_then_ack, cap_channel_close_404]
    if not args.no_blocked:
        steps.append(cap_blocked)
    for step in steps:
        captures.update(step(args))

    summary = []
    for name, frames in captures.items():
        data = b"".join(f[0] for f in frames)
        # Check the file re-splits into exactly the frames written.
        assert [f[0] for f in split_frames(data)] == [f[0] for f in frames]
        with open(os.path.join(args.out, name + ".bin"), "wb") as fh:
            fh.write(data)
        summary.append("== %s.bin (%d bytes, %d frames)" % (name, len(data), len(frames)))
        summary += describe(frames)
        summary.append("")
    text = "\n".join(summary)
    with open(os.path.join(args.out, "summary.txt"), "w") as fh:
        fh.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
