#!/usr/bin/env python3
"""Baseline for bench_cuda's cold open: the same state dict shared by
torch.multiprocessing CUDA IPC.

    python3 bench/torch_ipc_baseline.py [--n 300] [--numel 1750000] [--runs 3]

A producer process makes `n` float16 tensors of `numel` elements on cuda:0
and keeps them alive (torch's IPC needs the producer to outlive its
consumers). For each run it starts a FRESH consumer process (spawn), which:

  1. optionally creates its CUDA context first (timed apart: "CUDA init"),
  2. tells the producer it is ready and starts the clock,
  3. receives the list through a torch.multiprocessing Queue (the producer
     pickles it then: cudaIpcGetMemHandle per block; the consumer's
     unpickling opens each block with cudaIpcOpenMemHandle),
  4. reads the first element of the last tensor (a 1-element copy),

and reports receipt start -> all tensors usable. Each mode runs `runs`
times; the medians are printed. Timings are printed, never asserted.
"""
import argparse
import statistics
import time

T_IMPORT0 = time.monotonic()
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

T_IMPORT1 = time.monotonic()


def consumer(q_data, q_ctl, q_out, init_first, t_spawn):
    t_main = time.monotonic()
    t0 = time.monotonic()
    if init_first:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    t_init = time.monotonic()
    q_ctl.put("ready")
    t1 = time.monotonic()
    tensors = q_data.get()
    t2 = time.monotonic()
    v = tensors[-1][0].item()
    t3 = time.monotonic()
    q_out.put({
        "spawn_to_main_ms": (t_main - t_spawn) * 1e3,
        "import_torch_ms": (T_IMPORT1 - T_IMPORT0) * 1e3,
        "init_ms": (t_init - t0) * 1e3,
        "receive_ms": (t2 - t1) * 1e3,
        "first_elem_ms": (t3 - t2) * 1e3,
        "total_ms": (t3 - t1) * 1e3,
        "n": len(tensors),
        "last_first": v,
    })
    del tensors
    q_ctl.get()  # the producer's go-ahead to exit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--numel", type=int, default=1750000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    tensors = [torch.full((a.numel,), float(i), dtype=torch.float16, device="cuda")
               for i in range(a.n)]
    torch.cuda.synchronize()
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    print(f"torch.multiprocessing CUDA IPC baseline: torch {torch.__version__}, "
          f"{torch.cuda.get_device_name(0)}, {a.n} float16 tensors, {nbytes / 1e9:.2f} GB",
          flush=True)
    for init_first in (True, False):
        rows = []
        for _ in range(a.runs):
            q_data, q_ctl, q_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=consumer,
                            args=(q_data, q_ctl, q_out, init_first, time.monotonic()))
            p.start()
            # q_ctl carries the consumer's "ready", then the producer's "exit"
            # (the consumer asks for it only after "ready" was taken).
            assert q_ctl.get() == "ready"
            q_data.put(tensors)
            r = q_out.get()
            q_ctl.put("exit")
            p.join()
            if r["n"] != a.n or r["last_first"] != a.n - 1:
                print(f"  consumer got {r['n']} tensors, last starts with {r['last_first']}")
            rows.append(r)

        def med(k):
            return statistics.median(r[k] for r in rows)

        mode = "CUDA init first" if init_first else "CUDA init inside receipt"
        print(f"  fresh consumer, {mode} (median of {len(rows)}):")
        print(f"    spawn -> consumer function {med('spawn_to_main_ms'):8.1f} ms "
              f"(import torch {med('import_torch_ms'):.0f} ms; not counted)")
        if init_first:
            print(f"    CUDA init (context)        {med('init_ms'):8.1f} ms")
        print(f"    receive + rebuild {a.n:4d}     {med('receive_ms'):8.1f} ms")
        print(f"    last tensor's first elem   {med('first_elem_ms'):8.1f} ms")
        print(f"    total, receipt -> usable   {med('total_ms'):8.1f} ms   "
              f"(min {min(r['total_ms'] for r in rows):.1f}, "
              f"max {max(r['total_ms'] for r in rows):.1f})", flush=True)


if __name__ == "__main__":
    main()
