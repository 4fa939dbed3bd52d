#!/usr/bin/env python3
"""Write the seed corpora under fuzz/corpus/. Deterministic: rerunning it
rewrites the same files, and leaves alone the inputs a fuzzer found (added
by hand, named for what they exercise). The byte layouts follow the interpreters in
core/src/fuzzing.rs (`frame_decoder`, `fsproxy_session`)."""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "corpus")


def frame(payload):
    if isinstance(payload, (dict, list)):
        payload = json.dumps(payload).encode()
    return struct.pack(">I", len(payload)) + payload


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- frame_decoder: [max/4] then ([size % 64] chunk)* ----------------------

def chunked(max4, stream, size):
    out = bytes([max4])
    for i in range(0, len(stream), size):
        c = stream[i:i + size]
        out += bytes([len(c)]) + c
    return out


OPEN = {"id": "1", "op": "open", "params": {"path": "test.txt", "mode": "w"}}
WRITE = {"id": "4", "op": "write", "params": {"h": 42, "data": "aGVsbG8=", "final": False}}
fd = {
    "empty_frame": chunked(1, frame(b""), 63),
    "seed_open_whole": chunked(255, frame(OPEN), 63),
    "two_frames_bytewise": chunked(255, frame(OPEN) + frame(WRITE), 1),
    "split_in_header": chunked(255, frame(OPEN), 2),
    "oversized_prefix": chunked(1, struct.pack(">I", 5) + b"hello", 63),
    "exactly_max": chunked(2, frame(b"12345678"), 5),
    "garbage": bytes([9]) + bytes(range(0, 256, 7)),
    "non_utf8_payload": chunked(16, frame(b"\xff\xfe\xc3\x28{\"id\":\"\x80\"}"), 7),
    "zero_max_empty_frames": chunked(0, frame(b"") * 5, 3),
    "long_payload_many_chunks": chunked(255, frame(b"x" * 900), 61),
    "partial_tail": chunked(255, frame(OPEN)[:-3], 10),
    "frames_then_oversized": chunked(8, frame(b"a") + frame(b"bb") + struct.pack(">I", 1 << 31), 4),
    "huge_prefix": chunked(255, b"\xff\xff\xff\xff", 4),
}
for name, data in fd.items():
    write("frame_decoder", name, data)


# ---- fsproxy_session: [cfg] then commands ----------------------------------
# cmd byte: bit 7 = client slot, low nibble = kind; then an arg byte.
# kinds: 0/1 raw bytes (arg = length), 2 framed payload (arg = length),
# 3..7 templated request (arg, then a selector byte), 8 complete effect
# arg % n, 9 pass a descriptor (arg bit 0: and send an attach; bit 1: the
# slot then drives the attached client), 10 fail effect, 11 settle, 12 EOF,
# 13 death, 14 reconnect slot, 15 append arg bytes to stdin.

def raw(data, slot=0):
    out = b""
    for i in range(0, len(data), 255):
        c = data[i:i + 255]
        out += bytes([slot << 7 | 0, len(c)]) + c
    return out


def framed(obj, slot=0):
    p = json.dumps(obj).encode() if isinstance(obj, (dict, list)) else obj
    assert len(p) < 256, p
    return bytes([slot << 7 | 2, len(p)]) + p


def tmpl(sel, arg, slot=0):
    return bytes([slot << 7 | 3, arg, sel])


def cmd(kind, arg=0, slot=0):
    return bytes([slot << 7 | kind, arg])


SETTLE = cmd(11)


def req(i, op, **params):
    return {"id": str(i), "op": op, "params": params}


seed_session = b"".join([
    framed(req(1, "open", path="test.txt", mode="w")),
    framed(req(4, "write", h=3, data="aGVsbG8=", final=False)),
    framed(req(5, "close", h=3)),
    framed(req(6, "open", path="test.txt", mode="r")),
    framed(req(2, "read", h=4, max=4096)),
    framed(req(3, "read", h=4, max=4096)),
    framed(req(7, "close", h=4)),
])
host_session = b"".join([
    framed(req(1, "open", path="/rw/notes.txt", mode="rw")), SETTLE,
    framed(req(2, "read", h=3, max=4)), SETTLE,
    framed(req(3, "write", h=3, data="aGk=")), SETTLE,
    framed(req(4, "close", h=3)), SETTLE,
])
pipelined = b"".join(frame(req(i, "open", path="/ro/hello.txt", mode="r")) for i in range(6))
ss = {
    "seed_examples_virtual": bytes([0]) + seed_session,
    "host_file_session": bytes([0]) + host_session,
    "seed_examples_bytewise": bytes([0]) + b"".join(
        cmd(0, 1) + bytes([b]) for b in b"".join(frame(req(i, "open", path="a", mode="w")) for i in range(2))),
    "oversized_prefix_small_limits": bytes([2]) + framed(req(1, "open", path="v", mode="w"))
        + raw(struct.pack(">I", 201) + b"{}"),
    "garbage_frames": bytes([0]) + framed(b"not json") + framed(b"[1]") + framed(b"{\"op\":\"open\"}")
        + framed(b"{\"id\":5}") + framed(req(9, "stat")),
    "non_utf8_frame": bytes([0]) + framed(b"{\"id\":\"\xff\xfe\",\"op\":\"open\"}") + raw(b"\x00\x00\x00\x02\xc3\x28"),
    "death_with_pending_effects": bytes([0]) + b"".join([
        framed(req(1, "open", path="/rw/notes.txt", mode="rw")), cmd(8, 0),
        framed(req(2, "write", h=3, data="aGk=")),
        framed(req(3, "open", path="/rw/new.txt", mode="w"), slot=1),
        cmd(13, 0), cmd(8, 1), cmd(8, 0), cmd(13, 0, slot=1), SETTLE]),
    "eof_mid_frame": bytes([0]) + framed(req(1, "open", path="v", mode="w")) + raw(frame(OPEN)[:9]) + cmd(12),
    "stdio_local": bytes([0]) + cmd(15, 4) + b"abcd" + framed(req(1, "read", h=0, max=3)) + SETTLE
        + framed(req(2, "write", h=1, data="aGk=")) + SETTLE + framed(req(3, "close", h=2)),
    "stdio_reject": bytes([1]) + framed(req(1, "read", h=0, max=3)) + framed(req(2, "write", h=2, data="")),
    "effect_failures": bytes([0]) + tmpl(0, 1) + cmd(10, 0) + tmpl(0, 1) + cmd(8, 0) + tmpl(3, 3) + cmd(10, 0)
        + tmpl(4, 3) + cmd(10, 0),
    "reconnect_two_clients": bytes([0]) + tmpl(0, 0) + tmpl(0, 11, slot=1) + SETTLE + cmd(12) + cmd(14)
        + tmpl(0, 3) + cmd(14, 0, slot=1) + SETTLE,
    "pipelined_one_chunk": bytes([2]) + raw(pipelined) + SETTLE,
    "reserved_and_bad_reads": bytes([0]) + tmpl(5, 0) + tmpl(5, 1) + tmpl(5, 2) + tmpl(6, 0) + tmpl(6, 1),
    "attach_and_drive_the_new_client": bytes([0]) + cmd(9, 3) + framed(req(1, "open", path="/rw/new.txt", mode="w"))
        + SETTLE + cmd(9, 1, slot=1) + cmd(9, 0, slot=1) + framed(req(2, "attach"), slot=1) + cmd(9, 1)
        + framed(req(3, "write", h=3, data="aGk=")) + SETTLE + cmd(12),
    "templates_mixed": bytes([0]) + b"".join(tmpl(s, a) for s, a in [(0, 0), (0, 9), (0, 26), (2, 3), (3, 4),
        (4, 3), (0, 4), (0, 5), (7, 3)]) + SETTLE,
    "path_ops_host_and_virtual": bytes([0]) + b"".join([
        framed(req(1, "mkdir", path="/rw/d/e", parents=True)), SETTLE,
        framed(req(2, "list", path="/rw", max=1)), SETTLE,
        framed(req(3, "list", path="/rw", after="d")), SETTLE,
        framed(req(4, "open", path="/rw/notes.txt", mode="r")), SETTLE,
        framed(req(5, "rename", **{"from": "/rw/notes.txt", "to": "/rw/d/n.txt"})), SETTLE,
        framed(req(6, "remove", path="/rw/d/n.txt")), cmd(10, 0),
        framed(req(7, "stat", path="/ro/hello.txt", follow=False)), SETTLE,
        framed(req(8, "open", path="v/a.txt", mode="w")),
        framed(req(9, "rename", **{"from": "v", "to": "w"})),
        framed(req(10, "remove", path="w/a.txt")),
        framed(req(11, "write", h=4, data="aGk=")),
        framed(req(12, "list", path=".")), cmd(13, 0), SETTLE]),
    "path_op_templates": bytes([2]) + b"".join(tmpl(5, a) for a in range(2, 256, 9)) + SETTLE,
}
# Broker commands (config bit 2 gives the machine a broker; bits 3.. pick
# its budget: 0, 1e-6 or 1 USD): a cmd byte with bits 4..6 set, then an
# arg byte: arg % 8 = 0/1 LLMCMD with token t(arg >> 6), 2 LLMCMD without
# token (model (arg >> 3) % 4 of none, gpt-4o-mini, gpt-5, nope; max_tokens
# when bit 5), 3 CANCEL t(arg >> 6), 4 QUOTA, 5/6 provider ok/error for
# running call (arg >> 3) % n (usage when bit 6), 7 timer (bit 7: fire the
# next one; else advance arg µs and tick).

def brk(arg, slot=0):
    return bytes([slot << 7 | 0x70, arg])


ss["broker_llmcmd_cancel_quota"] = bytes([4 | 2 << 3]) + b"".join([
    brk(0x00), brk(0x41, slot=1), brk(0x02), brk(0x43, slot=1), brk(0x04), tmpl(0, 3),
    brk(0x45), brk(0x87), brk(0x0e), brk(0x18), brk(0x03), brk(0x04, slot=1)])
ss["broker_timeouts_and_death"] = bytes([4 | 1 << 3]) + b"".join([
    brk(0x20), brk(0x28, slot=1), brk(0x30), brk(0x87), cmd(13, 0, slot=1), brk(0x87), brk(0x46),
    brk(0x7f), brk(0x02), cmd(12), brk(0x45)])
for name, data in ss.items():
    write("fsproxy_session", name, data)


# ---- fsproxy_nested: [cfg] then (cmd, arg) pairs -----------------------------
# cfg: bit 0 three levels (else two), bit 1 small limits, bit 2 broker at the
# top (bits 5..6 budget), bits 3..4 lower levels' policy (top's, /rw only,
# read-only, none), bit 7 top refuses stdio.
# cmd: bits 6..7 level (0 = top), bit 5 client slot, bits 0..4 kind (see the
# table in core/src/fuzzing/nested.rs): 0 raw, 1 framed, 2..4 template (then a
# selector byte), 5 broker request or provider/timer, 6/7 complete/fail
# effect, 8 settle level, 9 EOF, 10 death, 11 new client, 12 descriptor
# (+attach), 13/14 deliver up/down arg bytes, 15 pump all, 16 cut link,
# 17 kill level, 18 stdin bytes.

def n_cmd(level, kind, arg=0, slot=0):
    return bytes([level << 6 | slot << 5 | kind, arg])


def n_framed(level, obj, slot=0):
    p = json.dumps(obj).encode() if isinstance(obj, (dict, list)) else obj
    assert len(p) < 256, p
    return n_cmd(level, 1, len(p), slot) + p


def n_tmpl(level, sel, arg, slot=0):
    return n_cmd(level, 2, arg, slot) + bytes([sel])


N_PUMP = n_cmd(0, 15)


def n_round(*levels):
    """Settle each level in turn, pumping the links after each."""
    return b"".join(n_cmd(lv, 8) + N_PUMP for lv in levels)


def n_call(level, obj, slot=0, depth=2):
    return n_framed(level, obj, slot) + N_PUMP + n_round(*range(depth - 1, -1, -1)) + n_round(*range(depth))


nn = {
    "host_file_roundtrip": bytes([0]) + b"".join([
        n_call(1, req(1, "open", path="/rw/notes.txt", mode="rw")),
        n_call(1, req(2, "read", h=3, max=4)),
        n_call(1, req(3, "write", h=3, data="aGk=")),
        n_call(1, req(4, "close", h=3))]),
    "stdio_stays_local": bytes([0]) + n_cmd(1, 18, 3) + b"abc" + b"".join([
        n_call(1, req(1, "read", h=0, max=2)),
        n_call(1, req(2, "write", h=1, data="aGk=")),
        n_call(1, req(3, "write", h=2, data="aGk=")),
        n_call(1, req(4, "close", h=1)),
        n_call(1, req(5, "read", h=1, max=1))]),
    "three_levels_virtual_and_host": bytes([1]) + b"".join([
        n_call(2, req(1, "open", path="v.txt", mode="w"), depth=3),
        n_call(2, req(2, "write", h=3, data="aGVsbG8="), depth=3),
        n_call(2, req(3, "open", path="/ro/hello.txt", mode="r"), slot=1, depth=3),
        n_call(2, req(4, "read", h=4, max=10), slot=1, depth=3)]),
    "bytewise_delivery_both_ways": bytes([0]) + n_framed(1, req(1, "open", path="/ro/hello.txt", mode="r"))
        + n_cmd(1, 13, 1) * 90 + n_cmd(0, 8) + n_cmd(1, 14, 1) * 60 + N_PUMP,
    "client_dies_mid_request": bytes([0]) + n_framed(1, req(1, "open", path="/rw/notes.txt", mode="r"))
        + n_cmd(1, 13, 5) + n_cmd(1, 10) + N_PUMP + n_round(0, 1),
    "client_dies_holding_handles": bytes([0]) + n_call(1, req(1, "open", path="/rw/notes.txt", mode="r"))
        + n_call(1, req(2, "open", path="/ro/hello.txt", mode="r")) + n_cmd(1, 9) + N_PUMP + n_round(0, 1),
    "kill_middle_level": bytes([1]) + n_call(2, req(1, "open", path="/rw/notes.txt", mode="r"), depth=3)
        + n_call(1, req(2, "open", path="/ro/hello.txt", mode="r"), depth=3) + n_cmd(1, 17) + N_PUMP
        + n_call(2, req(3, "read", h=3, max=2), depth=3),
    "cut_link_with_requests_in_flight": bytes([0]) + n_call(1, req(1, "open", path="/rw/notes.txt", mode="r"))
        + n_framed(1, req(2, "read", h=3, max=2)) + n_framed(1, req(3, "open", path="x", mode="w"), slot=1)
        + N_PUMP + n_cmd(1, 16) + N_PUMP + n_round(0, 1) + n_framed(1, req(4, "read", h=3, max=2)),
    "broker_through_two_levels": bytes([4 | 2 << 5]) + b"".join([
        n_cmd(1, 5, 0x00), N_PUMP, n_cmd(1, 5, 0x41, slot=1), N_PUMP, n_cmd(1, 5, 0x04), N_PUMP,
        n_cmd(0, 5, 0x45), N_PUMP, n_cmd(1, 5, 0x43, slot=1), N_PUMP, n_cmd(0, 5, 0x87), N_PUMP]),
    "broker_owner_dies_below": bytes([5 | 2 << 5]) + b"".join([
        n_cmd(2, 5, 0x00), N_PUMP, n_cmd(2, 5, 0x02, slot=1), N_PUMP, n_cmd(2, 10), N_PUMP,
        n_cmd(0, 5, 0x45), N_PUMP, n_cmd(0, 5, 0x46), N_PUMP]),
    "attach_at_the_middle": bytes([0]) + n_cmd(1, 12, 3) + n_call(1, req(1, "open", path="/rw/new.txt", mode="w"))
        + n_call(1, req(2, "write", h=3, data="aGk=")) + n_cmd(1, 12, 1, slot=1) + n_cmd(1, 12, 0),
    "narrow_policy_below": bytes([1 | 1 << 3]) + b"".join(n_tmpl(2, 0, a) for a in range(8)) + N_PUMP
        + n_round(0, 1, 2, 0, 1, 2),
    "no_roots_below": bytes([3 << 3]) + b"".join(n_tmpl(1, 0, a) for a in [3, 7, 11, 1, 9])
        + N_PUMP + n_round(0, 1),
    "small_limits_full_tables": bytes([2]) + b"".join(n_tmpl(1, 0, 0) for _ in range(7)) + N_PUMP
        + n_round(0, 1) + n_framed(1, b"{\"id\":\"\",\"op\":\"open\",\"params\":{\"path\":\"/rw/"
        + b"x" * 100 + b"\",\"mode\":\"w\"}}") + N_PUMP + n_round(0, 1),
    "failed_effects_at_the_top": bytes([0]) + n_framed(1, req(1, "open", path="/rw/notes.txt", mode="rw"))
        + N_PUMP + n_cmd(0, 7) + N_PUMP + n_call(1, req(2, "open", path="/rw/notes.txt", mode="rw"))
        + n_framed(1, req(3, "read", h=4, max=3)) + N_PUMP + n_cmd(0, 7) + N_PUMP,
    "path_ops_through_two_levels": bytes([1 << 3]) + b"".join([
        n_call(1, req(1, "mkdir", path="/rw/d", parents=True)),
        n_call(1, req(2, "list", path="/rw")),
        n_call(1, req(3, "rename", **{"from": "/rw/d", "to": "/rw/e"})),
        n_call(1, req(4, "stat", path="/ro/hello.txt")),
        n_call(1, req(5, "mkdir", path="mine")),
        n_call(1, req(6, "list", path=".")),
        n_call(1, req(7, "remove", path="/rw/e"))]) + b"".join(n_tmpl(1, 5, a) for a in range(2, 256, 17))
        + N_PUMP + n_round(0, 1),
}
for name, data in nn.items():
    write("fsproxy_nested", name, data)


# ---- broker_events: [setup] then steps -------------------------------------
# setup byte: bit 0 short timers (1 ms wait, 2.5 ms timeout), bit 1 inject
# remaining context, bits 2.. budget index (0, 1e-6, 1e-3, 0.01, 2 USD).
# step: cmd byte, low nibble = kind, then args (see broker::check::decode_steps):
# 0..3 submit [a: slot a%3, model a/3%5] [token: bit 7 = none, else t&3]
#   [max_tokens u16, 0 = none]; 4 cancel [a: slot a%3, token a/3%4];
# 5 owner gone [slot]; 6/7 provider ok [usage]; 8 provider error [usage]
# (with bit 4: an HTTP status [index into 429, 500, 502, 503, 504, 501, 400,
# 401] [Retry-After: bit 7 = none, else quarter seconds] [usage]);
# 9 late result [pick u16] [usage]; 10/11 advance [u16 micros] (bit 4: ×1000,
# bit 5: jump without ticks); 12 clock to next deadline; 13 tick;
# 14/15 advance [u16 seconds].
# usage: [0 = none] or [1] [prompt/4 u16] [cached/64] [completion u16].

def b_submit(slot=0, model=0, token=None, max_tokens=0):
    return bytes([0, model * 3 + slot, 0x80 if token is None else token]) + struct.pack(">H", max_tokens)


def b_usage(prompt=0, cached=0, completion=0):
    return bytes([1]) + struct.pack(">H", prompt // 4) + bytes([cached // 64]) + struct.pack(">H", completion)


def b_ok(u=None):
    return bytes([6]) + (b_usage(*u) if u else b"\x00")


def b_err(u=None):
    return bytes([8]) + (b_usage(*u) if u else b"\x00")


STATUSES = [429, 500, 502, 503, 504, 501, 400, 401]


def b_status(code, quarter_seconds=None, u=None):
    hint = 0x80 if quarter_seconds is None else quarter_seconds
    return bytes([8 | 0x10, STATUSES.index(code), hint]) + (b_usage(*u) if u else b"\x00")


def b_advance(micros, ticks=True, milli=False):
    return bytes([10 | (0x10 if milli else 0) | (0 if ticks else 0x20)]) + struct.pack(">H", micros)


B_DEADLINE = bytes([12])
B_TICK = bytes([13])


def b_cancel(slot=0, token=0):
    return bytes([4, token * 3 + slot])


def b_gone(slot=0):
    return bytes([5, slot])


def b_late(pick=0, u=None):
    return bytes([9]) + struct.pack(">H", pick) + (b_usage(*u) if u else b"\x00")


be = {
    "fifo_three_waiters": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_submit(2) + b_ok((1000, 128, 50))
        + b_ok((400, 0, 10)) + b_ok(),
    "queue_timeout_short": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_advance(1000) + b_ok((40, 0, 4)),
    "handoff_at_deadline": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_submit(2) + B_DEADLINE
        + b_ok((100, 0, 100)),
    "provider_timeout_then_late_usage": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_advance(900)
        + b_submit(2) + b_advance(2000) + b_late(0, (4000, 64, 300)) + b_ok(),
    "cancel_before_and_after_start": bytes([0b1000]) + b_submit(0, token=0) + b_submit(0, token=1)
        + b_submit(1, token=0) + b_cancel(0, 1) + b_cancel(0, 0) + b_cancel(1, 3) + b_ok(),
    "busy_token_and_unknown_model": bytes([0b1000]) + b_submit(0, token=2) + b_submit(0, token=2)
        + b_submit(1, model=4) + b_ok((8, 0, 8)),
    "owner_dies_queued_and_mid_call": bytes([0b1001]) + b_submit(0) + b_submit(0) + b_submit(1) + b_gone(0)
        + b_ok((2000, 0, 20)) + b_ok(),
    "trim_and_exhaustion": bytes([0b0100]) + b_submit(0, max_tokens=2000) + b_ok((0, 0, 1500))
        + b_submit(1, max_tokens=500) + b_ok((60000, 0, 500)) + b_submit(2) + b_ok(),
    "zero_budget_floor": bytes([0b0000]) + b_submit(0, model=2, max_tokens=9000) + b_err((30, 0, 0)),
    "errors_with_partial_usage": bytes([0b1100]) + b_submit(0) + b_err((50000, 3200, 0)) + b_submit(1)
        + b_err() + b_submit(2, model=3) + b_ok((100, 0, 100)),
    "clock_jump_over_timers": bytes([0b1011]) + b_submit(0) + b_submit(1) + b_submit(2)
        + b_advance(60000, ticks=False) + b_gone(1) + B_TICK + b_submit(1),
    "stray_results": bytes([0b1000]) + b_late(5, (10, 0, 10)) + b_ok((10, 0, 10)) + b_submit(0) + b_late(0)
        + b_late(0, (10, 0, 10)),
    "retry_429_then_ok": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_status(429, u=(40, 0, 0))
        + b_advance(200) + b_ok((40, 0, 4)) + b_ok(),
    "retries_until_max": bytes([0b1100]) + b_submit(0) + b_submit(1) + b_status(503) + b_advance(500, milli=True)
        + b_status(500, 0) + b_advance(1000, milli=True) + b_status(502, 8) + b_advance(2000, milli=True)
        + b_status(504) + b_ok(),
    "cancel_during_backoff": bytes([0b1001]) + b_submit(0, token=0) + b_submit(1) + b_status(429)
        + b_cancel(0, 0) + b_ok() + b_ok(),
    "owner_dies_during_backoff": bytes([0b1001]) + b_submit(0) + b_submit(1) + b_status(500, u=(8, 0, 0))
        + b_gone(0) + b_ok((8, 0, 8)),
    "deadline_during_backoff_after_a_jump": bytes([0b1000]) + b_submit(0) + b_advance(59000, milli=True)
        + b_status(429, 0) + b_advance(2000, ticks=False, milli=True) + B_TICK + b_submit(1) + b_ok(),
    "stray_during_backoff_then_not_retried": bytes([0b1000]) + b_submit(0) + b_status(429, 127)
        + b_late(0, (10, 0, 10)) + B_DEADLINE + b_status(400, u=(10, 0, 0)) + b_submit(1) + b_ok(),
}
for name, data in be.items():
    write("broker_events", name, data)
