#!/usr/bin/env python3
"""bench_args (Python): what building a call's arguments costs, per call.

    ST_CLIENT_LIB=build/lib/libstclient.so python3 bench/bench_args.py [--reps 7]

Times sharedtensor's argument map (st_args_new, the values through the
nested builder, st_args_free) for a few shapes of keyword arguments, with
no server: the part of a call that runs in Python before the request goes.
Prints the best of --reps runs, in microseconds per call. Timings are
printed, never asserted; bench/bench_args.lua is the Lua twin.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from sharedtensor.args import Args  # noqa: E402

CASES = [
    ("4 scalars", dict(a=1, b=2.5, c="x", d=True)),
    ("small nested", dict(cfg={"a": 1, "b": [1, 2, 3], "c": "x", "d": None})),
    ("map of 5 mixed", dict(x={"a": 1, "b": 2.5, "c": "s", "d": None, "e": True})),
    ("map of 20 mixed", dict(x={"k%d" % i: (i if i % 2 else "v") for i in range(20)})),
    ("map of 100 ints", dict(x={"k%d" % i: i for i in range(100)})),
    ("list of 20 mixed", dict(x=[i if i % 2 else "v" for i in range(20)])),
    ("list of 16 ints", dict(x=list(range(16)))),
    ("list of 1000 ints", dict(x=list(range(1000)))),
    ("list of 1000 floats", dict(x=[i * 0.5 for i in range(1000)])),
    ("list of 100 strings", dict(x=["s%d" % i for i in range(100)])),
]


def best_us(args, reps, n):
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            with Args(args):
                pass
        dt = (time.perf_counter() - t0) / n * 1e6
        best = dt if best is None else min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    o = ap.parse_args()
    print("%-22s %12s" % ("arguments", "us per call"))
    for name, args in CASES:
        n = 200 if "1000" in name else 2000
        print("%-22s %12.2f" % (name, best_us(args, o.reps, n)))


if __name__ == "__main__":
    main()
