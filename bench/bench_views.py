#!/usr/bin/env python3
"""bench_views: loading a published state dict into caller-owned tensors
(Client.get_into, st_get_into) next to a plain copy of the same bytes, in
one run (docs/views.md, sections 2 and 5).

    python3 bench/bench_views.py --build build [--device cpu|cuda]
                                 [--sizes 1G,14G] [--iters N]

Starts its own stserver (a temp dir, a memory_budget that fits the largest
size). For each size, a publisher process puts a bfloat16 state dict of
LLM shapes (Llama-like: embedding, per layer q/k/v/o, gate/up/down and two
norms, lm_head; the layer count fits the size) as views of one allocation,
and exits. This process then times, into tensors it allocated with torch:

  - copy_ (floor): dst.copy_(src) per tensor from torch-allocated tensors
    of the same shapes, then a synchronize: a plain device-to-device copy
    (cudaMemcpy) of the same bytes;
  - get_into, first: Client.get_into on a new client, the mapping of the
    key included;
  - get_into: again (the mapping kept), the mean of --iters;
  - st_get_into (C): the library's one call (cuMemcpyAsync per tensor, one
    stream synchronize), the mean of --iters.

and prints GB/s and the ratio to the floor (target on CUDA: >= 80%).
Rows the lead adds (hooks below, printed as "not built" until then): a
zero-copy shard request's latency (target 50 us) and an in-place update of
1 GiB seen by 8 bound consumers (target 1.25x the copy).

On the CPU (CI has no GPU) it runs with small sizes as a smoke test; CTest
runs it with tiny ones (bench_views_smoke) so that it cannot rot. Timings
are printed, never asserted.
"""
import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from bench_percall import start_server  # noqa: E402

GIB = 1 << 30
ALIGN = 128          # elements (256 bytes of bfloat16) between tensors


def parse_size(text):
    """'14G', '512M', '64K' or bytes."""
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": GIB}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def size_text(n):
    for unit, m in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return "%.3g %s" % (n / m, unit)
    return "%d B" % n


def llama_shapes(target_bytes):
    """[(name, shape)] of a Llama-like bfloat16 state dict of about
    target_bytes: the width by size (4096 from 4 GiB, 2048 from 256 MiB,
    else 256), layers as many as fit (at least 1)."""
    if target_bytes >= 4 * GIB:
        h, i, v = 4096, 11008, 32000
    elif target_bytes >= 256 << 20:
        h, i, v = 2048, 5632, 32000
    else:
        h, i, v = 256, 688, 1024
    per_layer = 2 * (4 * h * h + 3 * h * i + 2 * h)
    fixed = 2 * (2 * v * h + h)
    layers = max(1, round((target_bytes - fixed) / per_layer))
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(layers):
        p = "model.layers.%d." % n
        out += [(p + "self_attn.%s_proj.weight" % x, (h, h)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def layout(shapes):
    """[(name, shape, offset)] in elements of one flat buffer, and its
    length: tensors 256-byte aligned, as a loader places them."""
    out, at = [], 0
    for name, shape in shapes:
        n = 1
        for s in shape:
            n *= s
        out.append((name, shape, at))
        at += -(-n // ALIGN) * ALIGN
    return out, at


def views(flat, places):
    return collections.OrderedDict(
        (name, flat[off:off + _numel(shape)].view(shape)) for name, shape, off in places)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def fill(flat):
    """Random bfloat16 values (normal_ on the GPU; through float32 on the
    CPU, in chunks)."""
    import torch
    if flat.is_cuda:
        return flat.normal_()
    step = 1 << 24
    for at in range(0, flat.numel(), step):
        part = flat[at:at + step]
        part.copy_(torch.randn(part.numel()))
    return flat


def publish(sock, key, size, device):
    """--publish: puts key as views of one sharedtensor allocation, then
    exits (the server keeps the memory)."""
    import torch
    import sharedtensor as st
    places, total = layout(llama_shapes(size))
    flat = fill(st.empty((total,), dtype=torch.bfloat16, device=device))
    if device != "cpu":
        torch.cuda.synchronize()
    with st.Client(path=sock) as c:
        c.put(key, views(flat, places))


def timed(fn, sync):
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


class Ctx:
    """What each row gets: the socket, the device, the key, the caller's
    tensors (dst), torch-allocated sources of the same shapes (src), the
    bytes, --iters, a synchronize for the device and the floor's time."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def row(what, nbytes, seconds, floor):
    gbs = nbytes / seconds / 1e9
    ratio = "" if floor is None else "%6.0f%%" % (100.0 * floor / seconds)
    print("  %-40s %9.2f ms %9.1f GB/s %s" % (what, seconds * 1e3, gbs, ratio), flush=True)


def row_copy_floor(ctx):
    def go():
        for name, d in ctx.dst.items():
            d.copy_(ctx.src[name])
    go()
    ctx.sync()
    t = sum(timed(go, ctx.sync) for _ in range(ctx.iters)) / ctx.iters
    row("copy_ (floor: plain copy, same bytes)", ctx.nbytes, t, None)
    return t


def row_get_into(ctx):
    import sharedtensor as st
    with st.Client(path=ctx.sock) as c:
        row("get_into, first (mapping included)", ctx.nbytes,
            timed(lambda: c.get_into(ctx.key, ctx.dst), ctx.sync), ctx.floor)
        t = sum(timed(lambda: c.get_into(ctx.key, ctx.dst), ctx.sync)
                for _ in range(ctx.iters)) / ctx.iters
        row("get_into (mapping kept)", ctx.nbytes, t, ctx.floor)


def row_c_get_into(ctx):
    """st_get_into through ctypes: one call, the copies on the current
    stream and one synchronize (the library's)."""
    import torch
    import sharedtensor as st
    from sharedtensor import _lib, targs
    keep, structs = [], (_lib.Tensor * len(ctx.dst))()
    for k, (name, d) in enumerate(ctx.dst.items()):
        (t, dims), _ = targs._from_torch(name, d)
        t.name = name.encode()
        keep.append(dims)
        structs[k] = t
    stream = torch.cuda.current_stream().cuda_stream if ctx.device == "cuda" else None
    with st.Client(path=ctx.sock) as c:
        def go():
            rc = _lib.lib.st_get_into(c._ptr, ctx.key.encode(), 0, None, structs, len(ctx.dst),
                                      stream, None)
            if rc != 0:
                c._fail(rc)
        go()
        t = sum(timed(go, ctx.sync) for _ in range(ctx.iters)) / ctx.iters
        row("st_get_into (C, mapping kept)", ctx.nbytes, t, ctx.floor)


def row_shard_request(ctx):
    """Hook: the latency of a zero-copy shard request (a get with a view
    that is a strided window of the arena; target 50 us). Needs views
    (docs/views.md, section 1)."""
    print("  %-40s not built (needs get(view=...))" % "zero-copy shard request", flush=True)


def row_bound_update(ctx):
    """Hook: an in-place update of 1 GiB seen by 8 bound consumers (target
    1.25x the copy). Needs live keys and bind (docs/views.md, section 3)."""
    print("  %-40s not built (needs put(live=True), bind)" % "in-place update, 8 bound",
          flush=True)


ROWS = [row_get_into, row_c_get_into, row_shard_request, row_bound_update]


def run_size(a, sock, size, n):
    import torch
    key = "bench/views/%d" % n
    places, total = layout(llama_shapes(size))
    env = dict(os.environ)
    subprocess.run([sys.executable, os.path.abspath(__file__), "--publish", key, "--socket", sock,
                    "--device", a.device, "--sizes", str(size)], check=True, env=env)
    dev = "cuda:0" if a.device == "cuda" else "cpu"
    dst = views(torch.empty(total, dtype=torch.bfloat16, device=dev), places)
    src = views(fill(torch.empty(total, dtype=torch.bfloat16, device=dev)), places)
    nbytes = sum(_numel(s) for _, s, _ in places) * 2
    print("%s: %d tensors, %s bfloat16 (%d layers)" %
          (size_text(size), len(places), size_text(nbytes),
           sum(1 for name, _, _ in places if name.endswith("q_proj.weight"))), flush=True)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    ctx = Ctx(sock=sock, device=a.device, key=key, dst=dst, src=src, nbytes=nbytes,
              iters=a.iters, sync=sync, floor=None)
    ctx.floor = row_copy_floor(ctx)
    for r in ROWS:
        r(ctx)
    import sharedtensor as st
    with st.Client(path=sock) as c:
        c.delete(key)
    del ctx, dst, src
    if a.device == "cuda":
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                    help="the build tree (bin/stserver, lib/)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None,
                    help="default: cuda when torch sees a GPU, else cpu")
    ap.add_argument("--sizes", default=None,
                    help="state dict sizes, e.g. 1G,14G (default: 1G,14G on cuda, 8M,32M on cpu)")
    ap.add_argument("--iters", type=int, default=5, help="timed repetitions of each row")
    ap.add_argument("--publish", metavar="KEY", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.environ.setdefault("ST_CLIENT_LIB", os.path.join(a.build, "lib", "libstclient.so.0"))
    try:
        import torch
    except ImportError:
        print("bench_views: torch is not installed; skipped")
        sys.exit(77)
    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.publish:
        publish(a.socket, a.publish, parse_size(a.sizes), a.device)
        return
    sizes = [parse_size(s) for s in (a.sizes or ("1G,14G" if a.device == "cuda" else "8M,32M"))
             .split(",")]
    largest = max(layout(llama_shapes(s))[1] * 2 for s in sizes)
    budget = ("cpu = %d" % (largest + (256 << 20)) if a.device == "cpu" else
              'cpu = 256 * 2^20, ["cuda:0"] = %d' % (largest + GIB))
    d, sock, proc = start_server(a.build, a.device, budget=budget)
    try:
        print("bench_views on %s (%s), %d iterations per row" %
              (a.device, torch.cuda.get_device_name(0) if a.device == "cuda" else "host memory",
               a.iters), flush=True)
        for n, size in enumerate(sizes):
            run_size(a, sock, size, n)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
