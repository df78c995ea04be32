"""A request-scoped hand-off between processes (docs/python.md, "Hand-offs").

One producer process makes a tensor per request (vision features, say),
puts it in a chunk of a hand-off the server owns and sends a small ticket
(chunk, seq, shape, dtype) to two consumer processes over its own pipes;
each consumer reads the tensor in place, checks it and acknowledges; the
chunk is recycled when both have. Nothing per request goes through the
server, and its memory stays where it was.

    python3 handoff.py SOCKET [--requests N] [--device cuda] [--mib 4]
                              [--chunks 8] [--bench]

Prints per-request latency (acquire to the last acknowledgement) p50/p99
and the server's memory for the device before and after. --bench checks
a sample of each tensor instead of all of it (the hand-off, not the
checksum, is what it measures).
"""
import argparse
import multiprocessing as mp
import os
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
import sharedtensor as st  # noqa: E402
from sharedtensor.handoff import Handoff  # noqa: E402

NAME = "example-features"


def fill(x, i):
    """Writes request i's tensor into x (the chunk): every element depends
    on i, and it is cheap to make and to check."""
    torch.remainder(torch.arange(x.numel(), dtype=torch.float32, device=x.device), 1021, out=x)
    x.add_(float(i % 977))


def check(x, i, full):
    """The consumer's checksum of request i's tensor (True when right)."""
    n = x.numel()
    if full:
        want = (torch.arange(n, dtype=torch.float64, device=x.device) % 1021).sum() + \
            float(i % 977) * n
        return abs(float(x.double().sum()) - float(want)) < 1e-6 * max(1.0, float(want))
    idx = torch.tensor([0, n // 2, n - 1], device=x.device)
    return bool(torch.equal(x[idx], (idx.float() % 1021) + float(i % 977)))


def consumer(socket, tickets, results, full):
    """Opens the hand-off, then per ticket: read, check, ack. Sends back the
    acknowledgement times (time.monotonic_ns) and the failures at the end."""
    with st.Client(path=socket) as c, Handoff.open(c, NAME) as h:
        results.send(("ready", h.slot))
        acked, bad = [], 0
        while True:
            msg = tickets.recv()
            if msg is None:
                break
            i, ticket = msg
            x = h.read(ticket, timeout=10)
            if not check(x, i, full):
                bad += 1
            h.ack(ticket)
            acked.append(time.monotonic_ns())
        results.send(("done", acked, bad))


def server_memory(c, device):
    """(used_bytes of the device's budget, free device bytes or None)."""
    mem = c.info()["memory"]
    key = "cpu" if device == "cpu" else device
    m = mem.get(key, {})
    return m.get("used_bytes", 0), m.get("free_bytes")


def settle(c, device, want, timeout=5.0):
    """Polls until the server's used bytes are `want` again (it releases
    when the last connection has left)."""
    end = time.monotonic() + timeout
    while True:
        used = server_memory(c, device)
        if used[0] == want[0] or time.monotonic() > end:
            return used
        time.sleep(0.01)


def percentile(sorted_values, p):
    return sorted_values[min(len(sorted_values) - 1, int(p / 100.0 * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("socket")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N")
    ap.add_argument("--mib", type=float, default=4.0, help="tensor size per request")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--bench", action="store_true", help="check a sample, not every element")
    a = ap.parse_args()
    numel = int(a.mib * (1 << 20)) // 4
    device = a.device if a.device != "cuda" else "cuda:0"
    ctx = mp.get_context("spawn")   # CUDA cannot cross fork()

    with st.Client(path=a.socket) as c:
        before = server_memory(c, device)
        h = Handoff.create(c, NAME, chunk_bytes=numel * 4, chunks=a.chunks,
                           consumers=a.consumers, device=device)
        pipes, procs = [], []
        for _ in range(a.consumers):
            t_recv, t_send = ctx.Pipe(duplex=False)
            r_recv, r_send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=consumer, args=(a.socket, t_recv, r_send, not a.bench))
            p.start()
            pipes.append((t_send, r_recv))
            procs.append(p)
        for _, r in pipes:
            assert r.recv()[0] == "ready"
        during = server_memory(c, device)
        starts = []
        for i in range(a.requests):
            starts.append(time.monotonic_ns())
            chunk = h.acquire(timeout=30)
            fill(chunk.tensor((numel,), torch.float32), i)
            ticket = h.publish(chunk, (numel,), torch.float32)
            for t, _ in pipes:
                t.send((i, ticket))
        for t, _ in pipes:
            t.send(None)
        acks, bad = [], 0
        for _, r in pipes:
            kind, acked, b = r.recv()
            acks.append(acked)
            bad += b
        for p in procs:
            p.join()
        h.close()
        after = settle(c, device, before)

    lat = sorted((max(ack[i] for ack in acks) - starts[i]) / 1000.0 for i in range(a.requests))
    print("hand-off: %d requests of %.1f MiB to %d consumers on %s through %d chunks"
          % (a.requests, numel * 4 / 1048576.0, a.consumers, device, a.chunks))
    print("latency (acquire to last ack): p50 %.1f us, p99 %.1f us" %
          (percentile(lat, 50), percentile(lat, 99)))
    print("checksums: %d of %d requests wrong" % (bad, a.requests * a.consumers))
    fmt = lambda m: "%d bytes used%s" % (m[0], "" if m[1] is None else ", %d free" % m[1])
    print("server memory before: %s" % fmt(before))
    print("server memory during: %s" % fmt(during))
    print("server memory after:  %s" % fmt(after))
    ok = bad == 0 and after[0] == before[0] and all(p.exitcode == 0 for p in procs)
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
