"""The request of bench_handoff_remote through the Python package: the
producer on server A acquires `blocks` chunks of a hand-off, stamps each
through a torch view, publishes them; the consumer behind server B reads
each ticket through B's mirror, checks the stamp and acknowledges. Run by
`bench_handoff_remote --python` on its two servers (A exports kvbench*).

    python3 bench_handoff_remote.py SOCKET_A SOCKET_B [--blocks 16]
        [--block-kib 2048] [--requests 50] [--device cpu|cuda]

Prints the request time p50/p99 (first acquire to last acknowledgement).
"""
import argparse
import sys
import time

import torch

import sharedtensor as st
from sharedtensor.handoff import Handoff

NAME = "kvbench_py"
PEER = "alpha"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket_a")
    ap.add_argument("socket_b")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--block-kib", type=int, default=2048)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    block = a.block_kib << 10
    words = block // 8
    with st.Client(path=a.socket_a) as pc, st.Client(path=a.socket_b) as cc:
        p = Handoff.create(pc, NAME, chunk_bytes=block, chunks=a.blocks, consumers=1,
                           device=a.device)
        h = Handoff.open(cc, "%s@%s" % (NAME, PEER))
        took = []
        for r in range(-2, a.requests):            # two warm-up requests
            t0 = time.perf_counter()
            tickets = []
            for i in range(a.blocks):
                c = p.acquire(timeout=10)
                x = c.tensor((words,), torch.int64)
                if r < 0:
                    x.fill_(0x3c)
                x[0] = x[-1] = (r + 2) * 1000 + i
                tickets.append(p.publish(c, (words,), torch.int64))
            for i, t in enumerate(tickets):
                y = h.read(t, timeout=30)
                if int(y[0]) != (r + 2) * 1000 + i or int(y[-1]) != int(y[0]):
                    sys.exit("bench_handoff_remote.py: block %d of request %d is not the "
                             "producer's" % (i, r))
                h.ack(t)
            if r >= 0:
                took.append((time.perf_counter() - t0) * 1e3)
        h.close()
        p.close()
    took.sort()
    nbytes = block * a.blocks
    p50 = took[len(took) // 2]
    print("%-40s p50 %8.3f ms (%6.2f GB/s)   p99 %8.3f ms   min %8.3f ms"
          % ("hand-off across servers (Python)", p50, nbytes / (p50 / 1e3) / 1e9,
             took[int(len(took) * 0.99)], took[0]))


if __name__ == "__main__":
    main()
