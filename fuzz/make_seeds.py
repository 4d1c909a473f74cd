#!/usr/bin/env python3
"""Writes the seed corpora of the T7 fuzz targets into fuzz/corpus/<target>/.

Valid inputs first, then one edge case per refusal the decoders make. The
layouts mirror the static_asserts of src/task/args_blob.h and
src/ipc/mailbox_layout.h; a seed that drifts from them only seeds worse, the
fuzzer still runs. Rerun after a wire change and commit the diff:
    python3 fuzz/make_seeds.py
The files named by a hash are inputs a fuzzing run found, merged back with
    build/fuzz/fuzz/<target> -merge=1 fuzz/corpus/<target> build/fuzz/corpus/<target>
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# --- args blob (src/task/args_blob.h) ---
ARGS_MAGIC, ARGS_VERSION, MAX_ARGS, MAX_DIMS = 0x47524153, 1, 32, 5
TENSOR, SCALAR = 0, 1
INPUT, OUTPUT, INOUT, OUTPUT_EXISTING, NODEP = range(5)
F32, F16, BF16, I8, I16, I32, I64, U8, U32, U64, F64 = range(11)


def header(count, total=None, magic=ARGS_MAGIC, version=ARGS_VERSION):
    return struct.pack("<IHHII", magic, version, count, 16 + 120 * count if total is None else total, 0)


def record(kind=TENSOR, tag=INPUT, dtype=F32, shape=(), stride=None, addr=0x10000, nbytes=4096, offset=0,
           scalar=0):
    if stride is None:  # dense row-major
        stride, s = [], 1
        for n in reversed(shape):
            stride.insert(0, s)
            s *= max(n, 1)
    sh = list(shape) + [0] * (MAX_DIMS - len(shape))
    st = list(stride) + [0] * (MAX_DIMS - len(stride))
    return struct.pack("<BBBBIQQq5q5qQ", kind, tag, dtype, len(shape), 0, addr, nbytes, offset, *sh, *st, scalar)


def scalar(v):
    return record(kind=SCALAR, scalar=v & 0xFFFFFFFFFFFFFFFF)


def blob(*records):
    return header(len(records)) + b"".join(records)


ARGS = {
    "empty": blob(),
    "one_scalar": blob(scalar(-42)),
    "dense_2d": blob(record(shape=(16, 16))),
    "mixed": blob(record(shape=(16, 16)), record(tag=INOUT, dtype=I64, shape=(4, 32), stride=(64, 1), offset=528,
                                                 addr=0x20000, nbytes=1 << 20),
                  scalar(7), record(tag=OUTPUT, dtype=BF16, shape=(7, 9), addr=0, nbytes=0),
                  record(tag=OUTPUT_EXISTING, dtype=F16, shape=(3, 2, 5), offset=7),
                  record(tag=NODEP, dtype=U8, shape=(1, 1, 1, 1, 8)), scalar(0xFEDCBA9876543210)),
    "max_args": blob(*[record(shape=(4,), offset=4 * i) if i % 2 else scalar(i) for i in range(MAX_ARGS)]),
    "rank0": blob(record(shape=(), dtype=F64)),
    "exact_fit": blob(record(dtype=U8, shape=(4096,))),
    "negative_stride": blob(record(shape=(4, 4), stride=(-4, 1), offset=12)),
    "zero_extent": blob(record(shape=(0, 16))),
    "zero_extent_negative_stride": blob(record(shape=(0, 1 << 40), stride=(1, -(1 << 40)))),
    "broadcast_stride0": blob(record(shape=(8, 8), stride=(0, 1))),
    "limit_2e40": blob(record(dtype=U8, shape=(1 << 40,), nbytes=1 << 40)),
    "top_of_address_space": blob(record(addr=0xFFFFFFFFFFFFF000, nbytes=4096, shape=(1024,))),
    # refusals
    "truncated_header": header(1)[:10],
    "bad_magic": header(0, magic=0x12345678),
    "bad_version": header(0, version=2),
    "count_over": header(MAX_ARGS + 1),
    "total_disagrees": header(1, total=100) + scalar(1),
    "short_by_one": blob(scalar(1))[:-1],
    "extra_byte": blob(scalar(1)) + b"\0",
    "bad_kind": blob(record(kind=2)),
    "bad_tag": blob(record(tag=5, shape=(4,))),
    "bad_dtype": blob(record(dtype=11, shape=(4,))),
    "bad_ndim": header(1) + record(shape=(1,) * 5)[:3] + b"\x06" + record(shape=(1,) * 5)[4:],
    "negative_shape": blob(record(shape=(-1, 4))),
    "shape_overflow": blob(record(shape=(1 << 32, 1 << 32))),
    "stride_overflow": blob(record(shape=(2, 2), stride=(1 << 62, 1))),
    "past_buffer": blob(record(shape=(1025,))),
    "before_buffer": blob(record(shape=(4,), stride=(-1,))),
    "unbound_input": blob(record(addr=0, nbytes=0, shape=(4,))),
    "negative_offset": blob(record(shape=(4,), offset=-1)),
}

# --- request header (src/ipc/mailbox_layout.h) ---
PROTOCOL, K = 2, 2
CONFIG_CAP = 1024
ARGS_CAP = 65536 - 64 - 32 - CONFIG_CAP
TASK_READY, PREPARE_READY = 1, 8
IDLE, FRAME_STAGED = 0, 3


def frame(grant, index, generation, generations, publication=1, version=PROTOCOL, config=16, args=136,
          ready=TASK_READY, run_id=7, dispatch_id=3, task_slot=0, states=None, entry_run=7):
    hdr = struct.pack("<IIQQQQQIIII", ready, version, publication, index, generation, run_id, dispatch_id, task_slot,
                      config, args, 0)
    # Each entry: its generation, its state (IDLE unless `states` says
    # otherwise), then the run and dispatch ids the parent wrote (7 and 3,
    # the header's default, unless `entry_run` says otherwise).
    states = states or [IDLE] * len(generations)
    return bytes([grant - 1]) + hdr + b"".join(
        struct.pack("<QIQQ", g, s, entry_run, 3) for g, s in zip(generations, states))


G = 2
M = G + K
LIVE = [1, 3, 0, 5]  # entries 0, 1, 3 occupied; 2 free
HEADERS = {
    "accepted": frame(G, 1, 3, LIVE),
    "accepted_staged": frame(G, 3, 5, LIVE, ready=PREPARE_READY),
    "accepted_full_frame": frame(G, 0, 1, LIVE, config=CONFIG_CAP, args=ARGS_CAP),
    "accepted_grant8": frame(8, 9, 1, [1] * 10),
    "no_publication": frame(G, 1, 3, LIVE, publication=0),
    "replayed_to_a_served_entry": frame(G, 1, 3, LIVE, states=[IDLE, FRAME_STAGED, IDLE, IDLE]),
    "stale_older": frame(G, 1, 1, LIVE),
    "stale_future": frame(G, 1, 5, LIVE),
    "stale_free_entry": frame(G, 2, 1, LIVE),
    "another_run": frame(G, 1, 3, LIVE, entry_run=8),
    "another_dispatch": frame(G, 1, 3, LIVE, dispatch_id=4),
    "index_m": frame(G, M, 1, LIVE),
    "index_m_plus_1": frame(G, M + 1, 1, LIVE),
    "index_uint32_max": frame(G, 0xFFFFFFFF, 1, LIVE),
    "index_uint64_max": frame(G, 0xFFFFFFFFFFFFFFFF, 1, LIVE),
    "even_generation": frame(G, 1, 2, LIVE),
    "zero_generation": frame(G, 2, 0, LIVE),
    "bad_version": frame(G, 1, 3, LIVE, version=1),
    "config_over": frame(G, 1, 3, LIVE, config=CONFIG_CAP + 1),
    "args_over": frame(G, 1, 3, LIVE, args=ARGS_CAP + 1),
    "args_uint32_max": frame(G, 1, 3, LIVE, args=0xFFFFFFFF),
    "no_table": frame(G, 0, 1, []),
}


# --- MPI wire (src/dist/wire.h): 9 bytes of fuzzer prelude (entry count,
# 8 generations), then one message: the 64-byte header and its payload ---
WIRE_MAGIC, WIRE_VERSION = 0x49504D53, 3


def wire(kind, payload=b"", session=0x5E55, entry=0, tensors=0, generation=3, epoch=9, code=0, value=0,
         magic=WIRE_MAGIC, version=WIRE_VERSION, size=None):
    h = struct.pack("<IHHQIIQQQQiI", magic, version, kind, session, entry, tensors, generation, epoch, 0, value,
                    code, len(payload) if size is None else size)
    assert len(h) == 64
    return bytes([1, 3, 4, 5, 0, 0, 0, 0, 0]) + h + payload


def wire_files(name=b"chip0/task0/trace.json", data=b"{}", file_bytes=None, offset=0, index=0, files=2, total=64):
    head = struct.pack("<QQII", len(data) if file_bytes is None else file_bytes, offset, index, len(name))
    return wire(14, head + name + data, tensors=files, value=total)


def wire_request(generation=5, entry=0):
    rec = record(addr=0x10000, nbytes=4096)
    row = struct.pack("<QQQQII", 0x10000, 4096, 0, 4096, 1, 0)
    return wire(3, bytes(32) + row + blob(rec), entry=entry, tensors=1, generation=generation, epoch=0)


WIRE = {
    "ack": wire(4),
    "accepted": wire(5),
    "terminal_ok": wire(6, struct.pack("<Q", 4096), tensors=1),
    "terminal_failed": wire(6, b"task 0 failed: boom", code=13),
    "heartbeat": wire(7, generation=0, epoch=0),
    "stopped": wire(8, b"entry 9 is outside the 2 entries"),
    "hello_reply": wire(2, bytes(64), value=2),
    "memory_reply": wire(11, struct.pack("<Q", 10), value=100),
    "request": wire_request(),
    "request_stale": wire_request(generation=1),
    "request_unattributable": wire_request(entry=7),
    "request_config": wire(3, bytes(32) + struct.pack("<QQQQII", 0x10000, 4096, 0, 4096, 1, 0)
                           + blob(record(addr=0x10000, nbytes=4096)) + bytes(24), tensors=1, generation=5, epoch=0,
                           value=24),
    "clock_ping": wire(12, generation=0, epoch=0, value=12345),
    "clock_pong": wire(13, generation=0, epoch=0, value=12399),
    "files": wire_files(),
    "files_dotdot": wire_files(name=b"../../x.json"),
    "files_outside": wire_files(offset=60, file_bytes=61),
    "files_name_long": wire_files(name=b"a" * 600),
    "bad_magic": wire(4, magic=0),
    "bad_size": wire(4, size=4),
}

# trace.json (docs/diagnostics.md): a diamond with metadata, flows and other
# slices, and one input per kind of refusal.
def trace(events, version=1):
    return json.dumps({"displayTimeUnit": "ns", "otherData": {"simpler_trace_version": version, "swimlane_level": 2},
                       "traceEvents": events}).encode()


def task(tid, task_id, ts, dur, preds, run=0, pid=1):
    return {"name": "k%d" % task_id, "cat": "task", "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"task": task_id, "run": run, "func_id": 0, "core": "AIV%d" % tid, "preds": preds}}


TRACE_META = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "chip0"}},
              {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "AIV0"}},
              {"name": "thread_name", "ph": "M", "pid": 1, "tid": 2, "args": {"name": "AIV1"}},
              {"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": 2, "args": {"sort_index": 1}},
              {"name": "thread_name", "ph": "M", "pid": 1, "tid": 3, "args": {"name": "AICPU0"}}]
TRACE_DIAMOND = [task(1, 0, 0, 10, []), task(1, 1, 10, 20, [0]), task(2, 2, 11, 4, [0]), task(2, 3, 32, 8, [1, 2]),
                 {"ph": "s", "cat": "dep", "name": "dep", "id": 0, "pid": 1, "tid": 1, "ts": 10},
                 {"ph": "f", "bp": "e", "cat": "dep", "name": "dep", "id": 0, "pid": 1, "tid": 1, "ts": 10},
                 {"name": "poll", "cat": "sched", "ph": "X", "pid": 1, "tid": 3, "ts": 0, "dur": 5, "args": {}}]
TRACE = {
    "diamond": trace(TRACE_META + TRACE_DIAMOND),
    "two_runs": trace(TRACE_META + TRACE_DIAMOND + [task(1, 0, 50, 1, [], run=1), task(2, 1, 52, 1, [0], run=1)]),
    "empty": trace([]),
    "foreign": json.dumps({"traceEvents": []}).encode(),
    "version_2": trace([], version=2),
    "no_ts": trace(TRACE_META + [{"name": "k", "cat": "task", "ph": "X", "pid": 1, "tid": 1, "dur": 1}]),
    "dangling_pred": trace(TRACE_META + [task(1, 0, 0, 1, [7])]),
    "duplicate": trace(TRACE_META + [task(1, 0, 0, 1, []), task(1, 0, 2, 1, [])]),
    "cycle": trace(TRACE_META + [task(1, 0, 0, 1, [1]), task(1, 1, 2, 1, [0])]),
    "truncated": trace(TRACE_META + TRACE_DIAMOND)[:200],
}


def write(target, seeds):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


write("fuzz_args_blob", ARGS)
write("fuzz_frame_header", HEADERS)
write("fuzz_dist_wire", WIRE)
write("fuzz_trace_reader", TRACE)
