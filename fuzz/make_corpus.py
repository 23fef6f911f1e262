#!/usr/bin/env python3
"""Writes the seed corpus in fuzz/corpus/<target>/ for the cargo-fuzz targets.

Run from anywhere: `python3 fuzz/make_corpus.py`. It removes the files it
owns (`seed-*`, `kat-*`) in each corpus directory and writes them again, so
the output is reproducible; it leaves any other file alone.

Wire format (AMQP 0-9-1, RabbitMQ dialect), as amqp-codec/src implements it:

    frame          = type:u8 channel:u16 size:u32 payload[size] 0xCE
    method payload = class:u16 method:u16 arguments
    header payload = class:u16 weight:u16 body-size:u64 flags:u16 properties
    bits           = consecutive `bit` fields packed LSB-first into octets
    table / array  = u32 byte length, then key:shortstr type:u8 value / type:u8 value
    field types    = t b B s u I i l L f d D S A T F V x (RabbitMQ's codes)

The first byte of a decode_frames, roundtrip or field_table input is a
selector (see amqp-codec/src/fuzzing.rs `limits`): bits 0-1 pick frame_max
(0 = none, 1 = 4096, 2 = 131072, 3 = 1 MiB), `1 + (selector >> 2) % 64` is the
nesting limit, and decode_frames feeds the stream in chunks of
`1 + selector % 13` bytes. trackers inputs have no selector byte.
"""

import glob
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")
KAT_DIR = os.path.join(HERE, "..", "amqp-codec", "tests", "data", "rabbitmq-3.10")

FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE


def selector(frame_max_code, depth):
    """The selector byte for a frame_max code (0-3) and a nesting limit (1-64)."""
    assert 0 <= frame_max_code <= 3 and 1 <= depth <= 64
    return bytes([((depth - 1) << 2) | frame_max_code])


# The usual selector: frame_max 131072, nesting limit 64, chunks of 8 bytes.
SEL = selector(2, 64)

# ---------------------------------------------------------------- primitives


def u8(v):
    return struct.pack(">B", v)


def u16(v):
    return struct.pack(">H", v)


def u32(v):
    return struct.pack(">I", v)


def u64(v):
    return struct.pack(">Q", v)


def shortstr(s):
    b = s.encode() if isinstance(s, str) else s
    assert len(b) <= 255
    return u8(len(b)) + b


def longstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u32(len(b)) + b


def bits(*flags):
    """Consecutive bit fields, packed LSB-first into as many octets as needed."""
    out = b""
    for i in range(0, len(flags), 8):
        octet = 0
        for j, f in enumerate(flags[i : i + 8]):
            if f:
                octet |= 1 << j
        out += u8(octet)
    return out


# ------------------------------------------------------------- field values
# A value is (type_code, encoded_bytes_without_code).


def t(v):
    return (b"t", u8(1 if v else 0))


def b_(v):
    return (b"b", struct.pack(">b", v))


def B(v):
    return (b"B", u8(v))


def s_(v):
    return (b"s", struct.pack(">h", v))


def u_(v):
    return (b"u", u16(v))


def I(v):
    return (b"I", struct.pack(">i", v))


def i_(v):
    return (b"i", u32(v))


def l_(v):
    return (b"l", struct.pack(">q", v))


def L(v):
    return (b"L", struct.pack(">q", v))


def f_(v):
    return (b"f", struct.pack(">f", v))


def d_(v):
    return (b"d", struct.pack(">d", v))


def D(scale, value):
    return (b"D", u8(scale) + u32(value))


def S(v):
    return (b"S", longstr(v))


def T(v):
    return (b"T", u64(v))


def V():
    return (b"V", b"")


def x(v):
    return (b"x", longstr(v))


def F(pairs):
    return (b"F", table(pairs))


def A(values):
    return (b"A", array(values))


def value(v):
    code, body = v
    return code + body


def table(pairs):
    """A field table: pairs is a list of (key, value), duplicates allowed."""
    body = b"".join(shortstr(k) + value(v) for k, v in pairs)
    return u32(len(body)) + body


def array(values):
    body = b"".join(value(v) for v in values)
    return u32(len(body)) + body


def nested_table(levels, leaf=None):
    """A table holding a table holding ... `levels` tables deep in total."""
    inner = [("leaf", leaf or I(1))]
    for n in range(levels - 1):
        inner = [("n%d" % n, F(inner))]
    return inner


def nested_array_in_table(levels):
    """A table whose value is an array of an array ... `levels` containers deep in total."""
    v = S("deep")
    for _ in range(levels - 1):
        v = A([v])
    return [("a", v)]


EVERY_TYPE = [
    ("bool-true", t(True)),
    ("bool-false", t(False)),
    ("i8", b_(-5)),
    ("u8", B(250)),
    ("i16", s_(-1234)),
    ("u16", u_(65000)),
    ("i32", I(-70000)),
    ("u32", i_(4_000_000_000)),
    ("i64", l_(-(2**40))),
    ("i64-L", L(2**50)),
    ("f32", f_(1.5)),
    ("f64", d_(-2.25)),
    ("decimal", D(2, 12345)),
    ("longstr", S("hello, world")),
    ("array", A([I(1), S("two"), t(True), V(), A([])])),
    ("timestamp", T(1_764_508_980)),
    ("table", F([("inner", S("x")), ("n", l_(7))])),
    ("void", V()),
    ("bytes", x(b"\x00\x01\x02\xff")),
]

CAPABILITIES = [
    ("publisher_confirms", t(True)),
    ("exchange_exchange_bindings", t(True)),
    ("basic.nack", t(True)),
    ("consumer_cancel_notify", t(True)),
    ("connection.blocked", t(True)),
    ("consumer_priorities", t(True)),
    ("authentication_failure_close", t(True)),
    ("per_consumer_qos", t(True)),
    ("direct_reply_to", t(True)),
]

SERVER_PROPERTIES = [
    ("capabilities", F(CAPABILITIES)),
    ("cluster_name", S("rabbit@seed")),
    ("copyright", S("Copyright (c) 2007-2022 VMware, Inc. or its affiliates.")),
    ("information", S("Licensed under the MPL 2.0.")),
    ("platform", S("Erlang/OTP 25.2.3")),
    ("product", S("RabbitMQ")),
    ("version", S("3.10.8")),
]

X_DEATH = [
    ("x-death", A([F([
        ("count", l_(1)),
        ("reason", S("rejected")),
        ("queue", S("orders.work")),
        ("time", T(1_764_508_980)),
        ("exchange", S("")),
        ("routing-keys", A([S("orders.work")])),
    ])])),
    ("x-first-death-exchange", S("")),
    ("x-first-death-queue", S("orders.work")),
    ("x-first-death-reason", S("rejected")),
]

ACEMQ_HEADERS = [
    ("x-acemq-attempt", I(3)),
    ("x-acemq-first-seen", T(1_764_508_000)),
    ("x-acemq-causation-id", S("0b7f3c1e-2a4d-4c8e-9f10-5d6e7a8b9c0d")),
]

# ------------------------------------------------------------------- frames


def frame(ftype, channel, payload):
    return u8(ftype) + u16(channel) + u32(len(payload)) + payload + u8(FRAME_END)


def method(channel, class_id, method_id, args=b""):
    return frame(FRAME_METHOD, channel, u16(class_id) + u16(method_id) + args)


HEARTBEAT = frame(FRAME_HEARTBEAT, 0, b"")

# Property bits, in wire order: (name, bit, encoder).
PROPS = [
    ("content_type", 15, shortstr),
    ("content_encoding", 14, shortstr),
    ("headers", 13, bytes),  # already encoded: pass table(...) or raw bytes
    ("delivery_mode", 12, u8),
    ("priority", 11, u8),
    ("correlation_id", 10, shortstr),
    ("reply_to", 9, shortstr),
    ("expiration", 8, shortstr),
    ("message_id", 7, shortstr),
    ("timestamp", 6, u64),
    ("type", 5, shortstr),
    ("user_id", 4, shortstr),
    ("app_id", 3, shortstr),
    ("cluster_id", 2, shortstr),
]


def properties(**props):
    flags, out = 0, b""
    for name, bit, enc in PROPS:
        if name in props:
            flags |= 1 << bit
            out += enc(props.pop(name))
    assert not props, props
    return u16(flags) + out


def header(channel, body_size, props=b"\x00\x00", class_id=60, weight=0):
    return frame(FRAME_HEADER, channel, u16(class_id) + u16(weight) + u64(body_size) + props)


def bodies(channel, body, frame_max=0):
    """Body frames of at most frame_max bytes each (0 = one frame)."""
    if frame_max == 0:
        return frame(FRAME_BODY, channel, body)
    step = frame_max - 8
    return b"".join(frame(FRAME_BODY, channel, body[i : i + step]) for i in range(0, len(body), step))


def content(channel, method_frame, body, props=b"\x00\x00", frame_max=0):
    out = method_frame + header(channel, len(body), props)
    return out + (bodies(channel, body, frame_max) if body else b"")


# --------------------------------------------------------------- methods


def connection_start(props=SERVER_PROPERTIES):
    return method(0, 10, 10, u8(0) + u8(9) + table(props) + longstr("PLAIN AMQPLAIN") + longstr("en_US"))


def connection_start_ok():
    client = [
        ("product", S("acemq")),
        ("version", S("0.1.0")),
        ("capabilities", F([("publisher_confirms", t(True)), ("connection.blocked", t(True)),
                            ("consumer_cancel_notify", t(True)), ("basic.nack", t(True))])),
        ("connection_name", S("seed")),
    ]
    return method(0, 10, 11, table(client) + shortstr("PLAIN") + longstr(b"\x00guest\x00guest") + shortstr("en_US"))


def connection_tune(channel_max=2047, frame_max=131072, heartbeat=60):
    return method(0, 10, 30, u16(channel_max) + u32(frame_max) + u16(heartbeat))


def connection_tune_ok(channel_max=2047, frame_max=131072, heartbeat=60):
    return method(0, 10, 31, u16(channel_max) + u32(frame_max) + u16(heartbeat))


def connection_open(vhost="/"):
    return method(0, 10, 40, shortstr(vhost) + shortstr("") + bits(False))


def connection_open_ok():
    return method(0, 10, 41, shortstr(""))


def connection_close(code=320, text="CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
                     class_id=0, method_id=0):
    return method(0, 10, 50, u16(code) + shortstr(text) + u16(class_id) + u16(method_id))


def connection_close_ok():
    return method(0, 10, 51)


def connection_blocked(reason="low on memory"):
    return method(0, 10, 60, shortstr(reason))


def connection_unblocked():
    return method(0, 10, 61)


def connection_update_secret(secret="eyJhbGciOiJSUzI1NiJ9.e30.c2ln", reason="token refresh"):
    return method(0, 10, 70, longstr(secret) + shortstr(reason))


def channel_open(ch):
    return method(ch, 20, 10, shortstr(""))


def channel_open_ok(ch):
    return method(ch, 20, 11, longstr(""))


def channel_flow(ch, active):
    return method(ch, 20, 20, bits(active))


def channel_close(ch, code=404, text="NOT_FOUND - no queue 'missing' in vhost '/'", class_id=50, method_id=10):
    return method(ch, 20, 40, u16(code) + shortstr(text) + u16(class_id) + u16(method_id))


def channel_close_ok(ch):
    return method(ch, 20, 41)


def exchange_declare(ch, name, kind="topic", durable=True, arguments=()):
    return method(ch, 40, 10, u16(0) + shortstr(name) + shortstr(kind)
                  + bits(False, durable, False, False, False) + table(list(arguments)))


def exchange_bind(ch, dest, source, rk, arguments=()):
    return method(ch, 40, 30, u16(0) + shortstr(dest) + shortstr(source) + shortstr(rk)
                  + bits(False) + table(list(arguments)))


def exchange_unbind_ok(ch):
    return method(ch, 40, 51)


def queue_declare(ch, name, durable=True, exclusive=False, auto_delete=False, arguments=()):
    return method(ch, 50, 10, u16(0) + shortstr(name)
                  + bits(False, durable, exclusive, auto_delete, False) + table(list(arguments)))


def queue_declare_ok(ch, name, messages=0, consumers=0):
    return method(ch, 50, 11, shortstr(name) + u32(messages) + u32(consumers))


def queue_bind(ch, queue, exchange, rk, arguments=()):
    return method(ch, 50, 20, u16(0) + shortstr(queue) + shortstr(exchange) + shortstr(rk)
                  + bits(False) + table(list(arguments)))


def queue_delete(ch, queue, if_unused=False, if_empty=True):
    return method(ch, 50, 40, u16(0) + shortstr(queue) + bits(if_unused, if_empty, False))


def basic_qos(ch, count=1000, global_=False):
    return method(ch, 60, 10, u32(0) + u16(count) + bits(global_))


def basic_consume(ch, queue, tag="", no_ack=False, arguments=()):
    return method(ch, 60, 20, u16(0) + shortstr(queue) + shortstr(tag)
                  + bits(False, no_ack, False, False) + table(list(arguments)))


def basic_consume_ok(ch, tag):
    return method(ch, 60, 21, shortstr(tag))


def basic_cancel(ch, tag, no_wait=True):
    return method(ch, 60, 30, shortstr(tag) + bits(no_wait))


def basic_publish(ch, exchange, rk, mandatory=False, immediate=False):
    return method(ch, 60, 40, u16(0) + shortstr(exchange) + shortstr(rk) + bits(mandatory, immediate))


def basic_return(ch, exchange, rk, code=312, text="NO_ROUTE"):
    return method(ch, 60, 50, u16(code) + shortstr(text) + shortstr(exchange) + shortstr(rk))


def basic_deliver(ch, tag, delivery_tag, redelivered, exchange, rk):
    return method(ch, 60, 60, shortstr(tag) + u64(delivery_tag) + bits(redelivered) + shortstr(exchange) + shortstr(rk))


def basic_get(ch, queue, no_ack=False):
    return method(ch, 60, 70, u16(0) + shortstr(queue) + bits(no_ack))


def basic_get_ok(ch, delivery_tag, redelivered, exchange, rk, count):
    return method(ch, 60, 71, u64(delivery_tag) + bits(redelivered) + shortstr(exchange) + shortstr(rk) + u32(count))


def basic_get_empty(ch):
    return method(ch, 60, 72, shortstr(""))


def basic_ack(ch, tag, multiple=False):
    return method(ch, 60, 80, u64(tag) + bits(multiple))


def basic_reject(ch, tag, requeue=False):
    return method(ch, 60, 90, u64(tag) + bits(requeue))


def basic_recover(ch, requeue=True):
    return method(ch, 60, 110, bits(requeue))


def basic_nack(ch, tag, multiple=False, requeue=False):
    return method(ch, 60, 120, u64(tag) + bits(multiple, requeue))


def confirm_select(ch, no_wait=False):
    return method(ch, 85, 10, bits(no_wait))


def confirm_select_ok(ch):
    return method(ch, 85, 11)


def tx(ch, method_id):
    return method(ch, 90, method_id)


# ----------------------------------------------------------------- seeds

UUID = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b"


def uuid(n):
    return "%08x-4d5e-4f60-8a7b-9c0d1e2f3a4b" % n


def full_props(message_id=UUID, headers=ACEMQ_HEADERS):
    return properties(
        content_type="application/json",
        delivery_mode=2,
        message_id=message_id,
        timestamp=1_764_508_980,
        headers=table(headers),
    )


def all_props():
    return properties(
        content_type="text/plain",
        content_encoding="gzip",
        headers=table(EVERY_TYPE),
        delivery_mode=1,
        priority=9,
        correlation_id="corr-1",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id=UUID,
        timestamp=1_764_508_980,
        type="order.placed",
        user_id="guest",
        app_id="acemq-seed",
        cluster_id="c1",
    )


BODY = bytes(range(256))
JSON = b'{"order":42,"items":[1,2,3]}'


def frame_seeds():
    """Streams of frames: (name, selector, bytes)."""
    seeds = []

    def add(name, data, sel=SEL):
        seeds.append((name, sel, data))

    add("connection_start", connection_start())
    add("connection_start_ok", connection_start_ok())
    add("handshake_server", connection_start() + connection_tune() + connection_open_ok()
        + channel_open_ok(1) + confirm_select_ok(1), selector(1, 64))
    add("handshake_client", connection_start_ok() + connection_tune_ok() + connection_open("/")
        + channel_open(1) + confirm_select(1), selector(3, 16))
    add("tune_open_close", connection_tune(0, 0, 0) + connection_open("acemq-vhost") + connection_close()
        + connection_close_ok())
    add("blocked_unblocked", connection_blocked() + HEARTBEAT + connection_unblocked()
        + connection_blocked("low on disk") + connection_unblocked())
    add("heartbeats", HEARTBEAT * 3, selector(0, 1))
    add("update_secret", connection_update_secret() + method(0, 10, 71))
    add("channel_lifecycle", channel_open(2) + channel_open_ok(2) + channel_flow(2, False) + method(2, 20, 21, bits(True))
        + channel_close(2) + channel_close_ok(2))
    add("topology", exchange_declare(1, "orders", arguments=[("alternate-exchange", S("orders.ae"))])
        + method(1, 40, 11)
        + queue_declare(1, "orders.work", arguments=[
            ("x-queue-type", S("quorum")), ("x-message-ttl", I(60000)), ("x-max-length", l_(100000)),
            ("x-dead-letter-exchange", S("")), ("x-dead-letter-routing-key", S("orders.dlq")),
            ("x-delivery-limit", L(5))])
        + queue_declare_ok(1, "orders.work", 12, 3)
        + queue_bind(1, "orders.work", "orders", "order.*")
        + method(1, 50, 21)
        + exchange_bind(1, "orders.audit", "orders", "#", [("x-match", S("any")), ("region", S("eu"))])
        + exchange_unbind_ok(1)
        + queue_delete(1, "orders.tmp")
        + method(1, 50, 41, u32(0)), selector(2, 8))
    add("consume_setup", basic_qos(1, 1000) + method(1, 60, 11)
        + basic_consume(1, "orders.work", "", arguments=[("x-priority", I(10)), ("x-stream-offset", S("first"))])
        + basic_consume_ok(1, "amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A")
        + basic_cancel(1, "amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A") + method(1, 60, 31, shortstr("amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A")))
    add("publish_full_props", content(1, basic_publish(1, "orders", "order.placed", mandatory=True),
                                      BODY, full_props()))
    add("publish_all_props", content(1, basic_publish(1, "", "orders.work"), JSON, all_props()), selector(3, 64))
    add("publish_no_props_empty_body", content(1, basic_publish(1, "", "q"), b""))
    # Body frames of at most 100 bytes (the splitting is the sender's choice;
    # a real split at frame_max 4096 would make a seed larger than 4 KiB).
    add("publish_split_body", content(1, basic_publish(1, "orders", "big"), bytes(range(250)) + bytes(100),
                                      properties(content_type="application/octet-stream"), frame_max=108),
        selector(1, 64))
    add("publish_x_death_headers", content(3, basic_publish(3, "", "orders.work"), JSON,
                                           properties(headers=table(X_DEATH), delivery_mode=2)))
    deliveries = b"".join(
        content(1, basic_deliver(1, "amq.ctag-Zx1y2W3v4U5t6S7r8Q9p0A", n, n == 3, "orders", "order.placed"),
                BODY, full_props(uuid(n)))
        for n in range(1, 4))
    add("deliver_three", deliveries, selector(2, 63))  # chunks of 1 + 0xFA % 13 = 4 bytes
    add("deliver_interleaved_channels",
        basic_deliver(1, "c1", 1, False, "", "q1") + basic_deliver(2, "c2", 1, False, "", "q2")
        + header(1, 3) + header(2, 2) + bodies(2, b"hi") + bodies(1, b"abc"))
    add("get_ok_get_empty", content(1, basic_get_ok(1, 7, True, "orders", "order.placed", 41), JSON,
                                    properties(content_type="application/json", priority=5))
        + basic_get(1, "orders.work") + basic_get_empty(1))
    add("acks_rejects", basic_ack(1, 5, True) + basic_ack(1, 6) + basic_reject(1, 7, True)
        + basic_nack(1, 9, True, True) + basic_nack(1, 10) + basic_recover(1) + method(1, 60, 100, bits(False))
        + method(1, 60, 111))
    add("return_then_ack", content(1, basic_return(1, "orders", "order.unroutable"), JSON,
                                   properties(message_id=UUID, content_type="application/json"))
        + basic_ack(1, 1))
    add("tx", tx(1, 10) + tx(1, 11) + tx(1, 20) + tx(1, 21) + tx(1, 30) + tx(1, 31))
    # A header whose properties go 12 levels deep, under a limit of 8: an
    # UndecodableHeader, then the body, then a normal heartbeat.
    add("header_too_deep", content(1, basic_publish(1, "", "q"), b"x",
                                   properties(headers=table(nested_table(12)))) + HEARTBEAT, selector(2, 8))
    add("header_array_deep", content(1, basic_publish(1, "", "q"), b"x",
                                     properties(headers=table(nested_array_in_table(20)))), selector(3, 24))
    # Unknown field type 'U' in headers: undecodable header, stream intact.
    bad = properties(headers=u32(7) + shortstr("k") + b"U" + u32(0)[:4])
    add("header_unknown_type", content(1, basic_publish(1, "", "q"), b"x", bad))
    # Undefined property flag bits 0-1 set.
    add("header_bad_flags", content(1, basic_publish(1, "", "q"), b"x", u16(0x0003)))
    # Not-basic class in the header.
    add("header_other_class", basic_publish(1, "", "q") + header(1, 1, class_id=50) + bodies(1, b"z"))
    # Stream errors after good frames: bad end byte, oversized, unknown type, unknown method.
    add("then_bad_end", HEARTBEAT + basic_ack(1, 1)[:-1] + b"\x00")
    add("then_too_large", basic_ack(1, 1) + u8(3) + u16(1) + u32(200_000), selector(2, 64))
    add("then_unknown_frame_type", HEARTBEAT + b"\x04\x00\x00\x00\x00\x00\x00\xce")
    add("then_unknown_method", basic_ack(1, 1) + method(1, 60, 99))
    add("then_trailing_args", basic_ack(1, 1) + method(1, 60, 80, u64(1) + bits(True) + b"\x00"))
    add("truncated_tail", deliveries[:-40], selector(0, 64))
    # Publishes that repeat the last one's method or properties, changing one
    # thing at a time (the PublishEncoder's kept frames, in roundtrip).
    same = properties(delivery_mode=2, content_type="application/json")
    add("publish_repeats",
        content(1, basic_publish(1, "orders", "order.placed"), b"a", same)
        + content(1, basic_publish(1, "orders", "order.placed"), b"bb", same)
        + content(1, basic_publish(1, "orders", "order.placed", mandatory=True), b"c", same)
        + content(1, basic_publish(1, "orders", "order.paid", mandatory=True), b"d", same)
        + content(2, basic_publish(2, "orders", "order.paid", mandatory=True), b"e", same)
        + content(2, basic_publish(2, "orders", "order.paid", mandatory=True), b"f",
                  properties(delivery_mode=2, content_type="application/json", expiration="60000"))
        + content(2, basic_publish(2, "", "order.paid"), b"", same)
        + content(2, basic_publish(2, "", "order.paid"), bytes(5000), same, frame_max=4096), selector(1, 16))
    return seeds


def table_seeds():
    """Field tables (length prefix included): (name, selector, bytes)."""
    seeds = []

    def add(name, data, sel=SEL):
        seeds.append((name, sel, data))

    add("empty", table([]))
    add("every_type", table(EVERY_TYPE))
    # One table per type code, so mutations start from each.
    for name, v in EVERY_TYPE[2:]:
        add("one_" + name, table([(name, v)]))
    add("duplicates", table([("k", I(1)), ("k", S("two")), ("", V()), ("k", t(False))]))
    add("capabilities", table(SERVER_PROPERTIES))
    add("x_death", table(X_DEATH))
    add("acemq_headers", table(ACEMQ_HEADERS))
    add("nested_10_limit_64", table(nested_table(10)))
    add("nested_10_limit_9", table(nested_table(10)), selector(2, 9))
    add("arrays_nested", table(nested_array_in_table(16)), selector(2, 16))
    add("array_every_type", table([("a", A([v for _, v in EVERY_TYPE]))]))
    add("special_floats", table([("nan", d_(float("nan"))), ("inf", f_(float("inf"))), ("negzero", d_(-0.0))]))
    add("bool_nonzero", u32(4) + shortstr("t") + b"t\x07")  # normalises to 1 on re-encode
    add("non_utf8_key", table([(b"\xff\xfe", S(b"\xc3\x28"))]))
    return seeds


def tracker_seeds():
    """Frame streams for the trackers (no selector byte): (name, bytes)."""
    seeds = []

    def add(name, data):
        seeds.append((name, data))

    def publish(ch, n, rk="order.placed", mandatory=True, body=JSON):
        return content(ch, basic_publish(ch, "orders", rk, mandatory=mandatory), body,
                       properties(message_id=uuid(n), content_type="application/json", delivery_mode=2))

    def ret(ch, n, rk="order.placed"):
        return content(ch, basic_return(ch, "orders", rk), JSON,
                       properties(message_id=uuid(n), content_type="application/json", delivery_mode=2))

    add("confirm_publish_ack_multiple",
        confirm_select(1) + confirm_select_ok(1) + b"".join(publish(1, n) for n in range(1, 6)) + basic_ack(1, 5, True))
    add("return_before_ack",
        confirm_select(1) + publish(1, 1) + publish(1, 2, "order.unroutable") + publish(1, 3)
        + ret(1, 2, "order.unroutable") + basic_ack(1, 3, True))
    add("nack_single_and_multiple",
        confirm_select(1) + b"".join(publish(1, n) for n in range(1, 7))
        + basic_nack(1, 2) + basic_ack(1, 4, True) + basic_nack(1, 6, True, False))
    add("acks_out_of_order",
        confirm_select(1) + b"".join(publish(1, n) for n in range(1, 5))
        + basic_ack(1, 3) + basic_ack(1, 1) + basic_ack(1, 4, True))
    add("unknown_and_double_acks",
        confirm_select(1) + publish(1, 1) + basic_ack(1, 0) + basic_ack(1, 9) + basic_ack(1, 1) + basic_ack(1, 1)
        + basic_nack(1, 1, True))
    add("unmatched_return",
        confirm_select(1) + publish(1, 1, mandatory=False) + ret(1, 1) + ret(1, 99) + basic_ack(1, 1))
    add("publish_before_select",
        publish(1, 1) + confirm_select(1) + publish(1, 2) + publish(1, 3) + basic_ack(1, 2, True))
    add("two_channels_blocked",
        connection_blocked() + confirm_select(1) + confirm_select(2) + publish(1, 1) + publish(2, 1)
        + ret(2, 1) + connection_unblocked() + basic_ack(2, 1) + basic_nack(1, 1) + HEARTBEAT + connection_unblocked())
    add("same_key_returns",
        confirm_select(1) + publish(1, 7) + publish(1, 7) + publish(1, 7) + ret(1, 7) + ret(1, 7)
        + basic_ack(1, 1) + basic_ack(1, 3, True))
    add("split_bodies_and_deliveries",
        confirm_select(1)
        + content(1, basic_publish(1, "orders", "big", mandatory=True), bytes(1000),
                  properties(message_id=uuid(1)), frame_max=264)
        + content(1, basic_deliver(1, "c", 1, False, "orders", "x"), BODY, full_props())
        + basic_ack(1, 1, True))
    add("undecodable_header_publish",
        confirm_select(1)
        + content(1, basic_publish(1, "", "q", mandatory=True), b"x", properties(headers=table(nested_table(70))))
        + content(1, basic_publish(1, "", "q", mandatory=True), b"y", properties(message_id=uuid(2)))
        + basic_ack(1, 2, True))
    add("content_sequence_errors",
        confirm_select(1) + header(1, 1) + bodies(1, b"a") + basic_publish(1, "", "q") + basic_ack(1, 1)
        + publish(1, 2) + basic_publish(1, "", "q") + header(1, 2) + bodies(1, b"abc") + publish(1, 3)
        + basic_ack(1, 2, True))
    add("tx_and_flow", tx(1, 10) + publish(1, 1) + tx(1, 20) + channel_flow(1, False) + confirm_select(1, True)
        + publish(1, 2) + basic_ack(1, 1))
    return seeds


def kat_files():
    return sorted(glob.glob(os.path.join(KAT_DIR, "*.bin")))


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data)


def main():
    for target in ("decode_frames", "roundtrip", "field_table", "trackers"):
        d = os.path.join(CORPUS, target)
        os.makedirs(d, exist_ok=True)
        for old in glob.glob(os.path.join(d, "seed-*")) + glob.glob(os.path.join(d, "kat-*")):
            os.remove(old)

    frames = frame_seeds()
    kats = [(os.path.splitext(os.path.basename(p))[0], open(p, "rb").read()) for p in kat_files()]
    for name, sel, data in frames:
        write("decode_frames", "seed-" + name, sel + data)
        write("roundtrip", "seed-" + name, sel + data)
    for name, data in kats:
        # 0xFE: frame_max 131072 and nesting limit 64 (0x02 would be a limit of 1,
        # which refuses connection.start's capabilities table).
        write("decode_frames", "kat-" + name, b"\xfe" + data)
        write("roundtrip", "kat-" + name, b"\xfe" + data)
        write("trackers", "kat-" + name, data)
    for name, sel, data in table_seeds():
        write("field_table", "seed-" + name, sel + data)
    for name, data in tracker_seeds():
        write("trackers", "seed-" + name, data)

    for target in ("decode_frames", "roundtrip", "field_table", "trackers"):
        files = os.listdir(os.path.join(CORPUS, target))
        sizes = [os.path.getsize(os.path.join(CORPUS, target, f)) for f in files]
        print("%-14s %3d files, %6d bytes, largest %5d" % (target, len(files), sum(sizes), max(sizes)))


if __name__ == "__main__":
    main()
