#!/usr/bin/env python3
"""Writes the seed corpus of the fuzz targets: tests/fuzz/corpus/<target>/.

Each seed is a small valid input or an edge case the decoders must refuse
(docs/fuzzing.md). Run it after changing a seed here; the files are kept
in the tree so that a build needs no Python. Needs only the standard
library (a minimal msgpack writer is below)."""
import json
import os
import struct
import sys


class Ext:
    def __init__(self, code, data):
        self.code, self.data = code, data


class Raw:
    """Bytes written as they are (hand-made headers, broken framing)."""
    def __init__(self, data):
        self.data = data


def pack(v):
    if isinstance(v, Raw):
        return v.data
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v < 2**32:
            return b"\xce" + struct.pack(">I", v)
        if v >= 0:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xa0 | len(b)]) + b
        return (b"\xd9" + bytes([len(b)]) if len(b) < 256 else b"\xda" + struct.pack(">H", len(b))) + b
    if isinstance(v, bytes):
        return b"\xc4" + bytes([len(v)]) + v
    if isinstance(v, (list, tuple)):
        return (bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))) + \
            b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        return (bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))) + \
            b"".join(pack(k) + pack(x) for k, x in v.items())
    if isinstance(v, Ext):
        n = len(v.data)
        return b"\xc7" + bytes([n]) + struct.pack("b", v.code) + v.data if n < 256 else \
            b"\xc8" + struct.pack(">H", n) + struct.pack("b", v.code) + v.data
    raise TypeError(type(v))


def tensor(arena=0, offset=0, dtype="float32", shape=(2, 2), strides=None):
    if strides is None:
        strides, s = [], 1
        for d in reversed(shape):
            strides.insert(0, s)
            s *= d
    return Ext(1, pack({"arena": arena, "offset": offset, "dtype": dtype,
                        "shape": list(shape), "strides": list(strides)}))


def module(pairs, metadata=None):
    return Ext(2, pack({"tensors": [[n, t] for n, t in pairs], "metadata": metadata or {}}))


def cpu_arena(fd=0, nbytes=4096, ident=1, backend="memfd"):
    return {"fd": fd, "bytes": nbytes, "device": "cpu", "backend": backend, "id": ident}


UUID = "GPU-12345678-1234-1234-1234-123456789abc"


def cuda_arena(fd=0, nbytes=1 << 21, ident=2):
    return {"fd": fd, "bytes": nbytes, "device": "cuda", "uuid": UUID, "backend": "vmm",
            "id": ident}


def legacy_arena():
    return {"bytes": 1 << 21, "device": "cuda", "uuid": UUID, "backend": "legacy", "id": 3,
            "ipc_handle": bytes(64), "device_index": 0, "storage_bytes": 1 << 20}


def request(method, params, ident=1):
    return pack([0, ident, method, [params]])


def response(result, error=None, ident=1):
    return pack([1, ident, error, result])


def safetensors(header, data=b"", raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def seeds():
    s = {}
    # --- reader: control byte (chunking, reserve/commit, small limit), stream
    call = request("call", {"endpoint": "echo", "args": {"a": 1}})
    s["reader"] = {
        "request": b"\x00" + call,
        "pipelined_bytewise": b"\x01" + call + request("ping", {}, 2) + pack([2, "note", []]),
        "response_reserve": b"\x13" + response({"value": [1, 2.5, "x", b"\x00"]}),
        "error_response": b"\x10" + response(None, {"code": 5, "name": "NOT_FOUND",
                                                    "message": "no"}),
        "notification": b"\x05" + pack([2, "note", [{"k": None}]]),
        "over_limit": b"\x22" + request("call", {"endpoint": "echo", "args": {"s": "y" * 300}}),
        "deep": b"\x00" + pack([0, 1, "call", [Raw(b"\x91" * 40 + b"\xc0")]]),
        "huge_str_header": b"\x00" + Raw(b"\x94\x00\x01\xdb\xff\xff\xff\xff").data,
        "never_byte": b"\x00" + b"\x94\x00\x01\xc1",
        "bad_shape": b"\x03" + pack([0, 2**32, "call", []]) + pack([3]),
        "ext_args": b"\x07" + request("call", {"endpoint": "scale", "args": {"x": tensor()},
                                              "arenas": [cpu_arena()]}),
    }
    # --- viewspec: 2 bytes (little endian) the spec's length, the spec,
    # then the value the view sees (one msgpack value)
    def view(spec, value=None):
        b = spec.encode()
        return struct.pack("<H", len(b)) + b + (pack(value) if value is not None else b"")
    grid = {"m": tensor(shape=(6, 10)), "layers": [{"q.weight": tensor(offset=64, shape=(4, 4))},
                                                    {"k.weight": tensor(shape=(4, 4))}]}
    mod = module([("q.weight", tensor(shape=(3, 4))), ("k.weight", tensor(offset=48, shape=(2, 4))),
                  ("b", tensor(offset=80, shape=(5,)))], {"format": "pt"})
    s["viewspec"] = {
        "window": view("m:shard(1,1,2)|transpose(0,1)", grid),
        "rules": view("*.q.weight:narrow(0,1,2);*.k.weight:slice(1,0,4,2)|contiguous;"
                      "m:permute(1,0)", grid),
        "blanks": view(" m : narrow( 0 , -2 , 1 ) | contiguous ", grid),
        "module": view("q.weight:transpose(0,1)|contiguous", {"mod": mod}),
        "lone": view("shard(0,0,3)", tensor(shape=(7, 2))),
        "globs": view("l?.*:narrow(0,0,1);*a*a*a*b:narrow(0,0,1);*:contiguous",
                      {"l1": {"w": tensor()}, "aaab": tensor(), "z": tensor()}),
        "pathological": view("*a" * 120 + "*b:narrow(0,0,1)", {"a" * 200 + "b": tensor()}),
        "no_tensor": view("x*:narrow(0,0,1)", grid),
        "bad_step": view("m:narrow(0,5,4)", grid),
        "unknown": view("m:nope(1)", grid),
        "int_edges": view("m:slice(0,-9223372036854775808,9223372036854775807,"
                          "9223372036854775807)", grid),
        "contiguous_first": view("m:contiguous|narrow(0,0,1)", grid),
        "empty": view("", grid),
        "deep": view("*:narrow(0,0,1)", Raw(b"\x91" * 40 + pack(tensor()))),
        "bad_tensor": view("*:narrow(0,0,1)", {"t": Ext(1, pack({"dtype": "float32"}))}),
    }
    # --- desc: one value (tensor ext, module ext, arena map, array of them)
    s["desc"] = {
        "tensor": pack(tensor()),
        "tensor_0d": pack(tensor(dtype="int64", shape=(), strides=())),
        "tensor_broadcast": pack(tensor(dtype="bfloat16", offset=64, shape=(3, 4), strides=(0, 1))),
        "tensor_empty": pack(tensor(shape=(0, 5))),
        "tensor_big": pack(tensor(dtype="float64", offset=2**62, shape=(2**31, 2**31))),
        "module": pack(module([("w", tensor()), ("b", tensor(offset=16, shape=(4,)))],
                              {"step": 3, "name": "m"})),
        "arena_cpu": pack(cpu_arena()),
        "arena_cuda": pack(cuda_arena()),
        "arena_legacy": pack(legacy_arena()),
        "list": pack([tensor(), cpu_arena(), module([("x", tensor())])]),
    }
    # --- args: a request as the server reads it (endpoints: fuzz_args.c)
    s["args"] = {
        "echo": request("call", {"endpoint": "echo", "args": {"a": [1, {"k": "v"}], "b": True,
                                                              "i": -4, "n": 1.5, "s": "x",
                                                              "t": {"z": None}}}),
        "echo_missing": request("call", {"endpoint": "echo", "args": {}}),
        "echo_unknown": request("submit", {"endpoint": "echo", "args": {"a": 1, "q": 2}}),
        "scale": request("call", {"endpoint": "scale", "args": {"x": tensor(), "factor": 3},
                                  "arenas": [cpu_arena()]}),
        "scale_cuda": request("call", {"endpoint": "scale",
                                       "args": {"x": tensor(arena=1), "y": tensor(arena=0)},
                                       "arenas": [cuda_arena(), cpu_arena(fd=1)]}),
        "scale_past_end": request("call", {"endpoint": "scale",
                                           "args": {"x": tensor(offset=4090)},
                                           "arenas": [cpu_arena()]}),
        "cached": request("call", {"endpoint": "cached", "args": {"n": 7, "s": "k\n\"/"}}),
        "cached_tensor": request("call", {"endpoint": "cached",
                                          "args": {"n": 1, "s": "a"}, "arenas": [cpu_arena()]}),
        "join_nested": request("call", {"endpoint": "join",
                                        "args": {"v": {"a": [1, 2, {"b": [tensor()]}]}},
                                        "arenas": [cpu_arena()]}),
        "none": request("invalidate_endpoint", {"endpoint": "none"}),
        "nul_name": request("call", {"endpoint": "echo\x00", "args": {"a": 1}}),
        "legacy_arena": request("call", {"endpoint": "echo", "args": {"a": 1},
                                         "arenas": [legacy_arena()]}),
    }
    # --- result: control byte (bit 0 unwrap, bits 1-3 descriptors), reply
    one_fd, two_fds = 1 << 1, 2 << 1
    s["result"] = {
        "value": b"\x01" + response({"value": {"a": [1, -2, 2.5, "s", b"b", None, True]}}),
        "plain": b"\x00" + response([{"id": 4, "bytes": 16}, 2**64 - 1]),
        "tensor": bytes([1 | one_fd]) + response({"value": tensor(), "arenas": [cpu_arena()]}),
        "tensor_strided": bytes([1 | one_fd]) + response(
            {"value": [tensor(dtype="int16", offset=8, shape=(3, 5), strides=(10, 2))],
             "arenas": [cpu_arena()]}),
        "module": bytes([1 | one_fd]) + response(
            {"value": module([("w", tensor()), ("b", tensor(offset=16, shape=(4,)))],
                             {"epoch": 1}),
             "arenas": [cpu_arena()]}),
        "object": bytes([1 | one_fd]) + response(
            {"value": tensor(), "arenas": [cpu_arena()],
             "object": {"id": 9, "cache_key": "k", "cached": True, "device": "cpu",
                        "bytes": 4096, "refcount": 1}}),
        "unsealed": bytes([1 | two_fds]) + response(
            {"value": tensor(arena=1, shape=(2,)), "arenas": [cpu_arena(), cpu_arena(1, 64, 2)]}),
        "past_end": bytes([1 | one_fd]) + response({"value": tensor(offset=4090),
                                                   "arenas": [cpu_arena()]}),
        "error": b"\x01" + response(None, {"code": 5, "name": "NOT_FOUND", "message": "gone"}),
        "error_bad": b"\x01" + response(None, {"code": 999, "name": "x\x00"}),
        "refused": b"\x01" + response(None, {"code": 12, "name": "AUTH", "message": "no"}, 0),
        "other_id": b"\x01" + response({"value": 1}, None, 2),
        "cuda": bytes([1 | one_fd]) + response({"value": tensor(), "arenas": [cuda_arena()]}),
        "legacy": b"\x01" + response({"value": tensor(), "arenas": [legacy_arena()]}),
        "notification_first": b"\x01" + pack([2, "x", []]) + response({"value": 1}),
    }
    # --- safetensors: whole files
    f32 = struct.pack("<4f", 1, 2, 3, 4)
    s["safetensors"] = {
        "two": safetensors({"__metadata__": {"format": "pt"},
                            "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                            "b": {"dtype": "F16", "shape": [2], "data_offsets": [16, 20]}},
                           f32 + b"\x00\x3c\x00\x40"),
        "scalar": safetensors({"s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}},
                              bytes(8)),
        "empty": safetensors({}, b""),
        "zero_size": safetensors({"e": {"dtype": "BF16", "shape": [0, 3],
                                        "data_offsets": [0, 0]}}),
        "overlap": safetensors({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}},
                               bytes(6)),
        "padded": safetensors(None, f32, b'{"x":{"dtype":"F32","shape":[4],'
                                         b'"data_offsets":[0,16]}}    '),
        "escapes": safetensors(None, bytes(2), b'{"a\\u0000b":{"dtype":"BOOL","shape":[2],'
                                               b'"data_offsets":[0,2]},"\\u00e9\\"":'
                                               b'{"dtype":"I8","shape":[0],"data_offsets":[2,2]}}'),
        "numbers": safetensors(None, b"", b'{"n":{"dtype":"F64","shape":[1e3,-0,'
                                          b'18446744073709551616],"data_offsets":[0,0]}}'),
    }
    # --- config: config.lua texts
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(root, "config.lua"), "rb") as f:
        shipped = f.read()
    s["config"] = {
        "shipped": shipped,
        "minimal": b"return { workers = 2 }\n",
        "every_key": b"""local G = 1024 * 1024 * 1024
return {
  base_path = "/tmp/st-fuzz", devices = { 0, 1 }, workers = 8, endpoints = "ep",
  log_level = "debug", socket_mode = "0660", socket_group = "ml",
  allow_uids = { 1000, 1001 }, allow_gids = { 50 },
  limits = { max_message_bytes = 64 * 1024, max_connections = 16, max_inflight = 4,
             frame_timeout_ms = 500, max_object_bytes = 0 },
  tasks = { ttl_s = 0.5, capacity = 3 },
  memory_budget = { cpu = 4 * G, ["cuda:0"] = 60 * G },
  default_device = "cpu", data_dirs = { "/data", "models" },
  loader_threads = 2, staging_bytes = 8 * 1024 * 1024, shutdown_grace_s = 1.5,
}
""",
        "bad_values": b"return { workers = 0, devices = { 0, 0 }, log_level = 'loud',"
                      b" socket_mode = '999', limits = { nope = 1 }, extra = true }\n",
        "lua_error": b"local t = {}\nreturn t.x.y\n",
        "not_a_table": b"return 42\n",
        "computed": b"local n = 0\nfor i = 1, 10 do n = n + i end\n"
                    b"return { workers = n % 7 + 1, data_dirs = { string.rep('d', 3) } }\n",
    }
    return s


DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
          "float64", "float8_e4m3fn", "float8_e5m2"]
WIRE_WORDS = ["arena", "offset", "dtype", "shape", "strides", "tensors", "metadata", "fd",
              "bytes", "device", "cpu", "cuda", "uuid", "backend", "memfd", "vmm", "legacy", "id",
              "ipc_handle", "device_index", "storage_bytes", "endpoint", "args", "arenas", "value",
              "object", "code", "name", "message", "call", "submit", "echo", "scale", "cached",
              "join", "none", "factor", "cache_key", "cached", "refcount", "server_id", UUID]
CONFIG_KEYS = ["base_path", "devices", "workers", "endpoints", "log_level", "socket_mode",
               "socket_group", "allow_uids", "allow_gids", "limits", "max_message_bytes",
               "max_connections", "max_inflight", "frame_timeout_ms", "max_object_bytes",
               "shutdown_grace_s", "tasks", "ttl_s", "capacity", "memory_budget", "cuda:0", "cpu",
               "default_device", "socket", "data_dirs", "loader_threads", "staging_bytes",
               "debug", "info", "warn", "error", "0600"]
LUA_WORDS = ["return", "local", "function", "end", "for", "in", "do", "if", "then", "else",
             "while", "repeat", "until", "nil", "true", "false", "and", "or", "not", "{", "}",
             "[[", "]]", "..", "...", "==", "~=", "<=", "#", "%", "^", "--", "1e308", "0x7fffffff",
             "2^53", "-0", "0/0", "math.huge", "string.rep", "string.format", "pairs", "ipairs",
             "select", "setmetatable", "tostring", "tonumber", "pcall", "error", "type", "rawset",
             "os.time", "table.concat", "\\0", "\\255"]


def dict_entry(b):
    """One libFuzzer dictionary line: the bytes quoted, \\xNN for the rest."""
    return '"' + "".join(chr(c) if 32 <= c < 127 and chr(c) not in '"\\' else "\\x%02x" % c
                         for c in b) + '"'


def dictionaries():
    msgpack_words = [pack(w) for w in WIRE_WORDS + DTYPES] + [
        b"\xc7", b"\xd4\x01", b"\xd5\x02", b"\xc0", b"\xc3", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00", b"\xdd\xff\xff\xff\xff", b"\xdf\x00\x01\x00\x00",
        b"\xdb\x7f\xff\xff\xff", b"\xc1", b"\x94\x00\x01", b"\x94\x01\x01", b"\x93\x02"]
    st_words = [b'"dtype"', b'"shape"', b'"data_offsets"', b'"__metadata__"', b"\\u0000",
                b"\\ud800", b"18446744073709551615", b"9223372036854775808", b"1e400", b"-1",
                b"[]", b"{}", b"null", b"true"] + \
        [b'"%s"' % w for w in [b"BF16", b"BOOL", b"F16", b"F32", b"F64", b"F8_E4M3", b"F8_E5M2",
                               b"I16", b"I32", b"I64", b"I8", b"U8"]]
    lua = [w.encode() for w in CONFIG_KEYS + LUA_WORDS]
    view_words = [w.encode() for w in [
        "narrow(", "slice(", "shard(", "transpose(", "permute(", "contiguous", "|contiguous",
        "(0,0,1)", ":", ";", "|", ",", ")", "*", "?", "*.", ".weight", "-1", "0", "1",
        "9223372036854775807", "-9223372036854775808", "  "]] + msgpack_words
    return {"reader": msgpack_words, "desc": msgpack_words, "args": msgpack_words,
            "result": msgpack_words, "safetensors": st_words, "config": lua,
            "viewspec": view_words}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    for target, files in seeds().items():
        d = os.path.join(here, "corpus", target)
        os.makedirs(d, exist_ok=True)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
    os.makedirs(os.path.join(here, "dict"), exist_ok=True)
    for name, words in dictionaries().items():
        with open(os.path.join(here, "dict", name + ".dict"), "w") as f:
            f.write("# Written by tests/fuzz/make_corpus.py.\n")
            for w in sorted(set(words)):
                f.write(dict_entry(w) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
