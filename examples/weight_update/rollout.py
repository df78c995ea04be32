"""A rollout process: binds its own copy of the model's module to the live
key (no copy of the weights: the parameters point at the key's memory),
runs forward passes inside consistent() attempts, and checks each pass's
parameters against the trainer's checksum of the version it used (the
live key SUMS). SOCKET is the trainer's server, or the second server that
follows its keys (run.sh --two-servers).

    python3 rollout.py SOCKET DEVICE INDEX

Prints "ready" once bound, then one JSON line of what it saw when the
trainer's last version has been checked.
"""
import json
import sys
import threading
import time

from common import KEY, SUMS, checksum, model, read_sums
import sharedtensor as st
import torch


def watch(binding, seen, stop):
    """Stamps when each new version becomes visible (CLOCK_MONOTONIC, the
    same clock in every process)."""
    v = binding.version
    while not stop.is_set():
        try:
            got = binding.wait_version(v + 1, timeout=0.2)
        except st.TimeoutError:
            continue
        now = time.monotonic()
        for k in range(v + 1, got + 1):
            seen[k] = now
        v = got


def main():
    path, device, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.manual_seed(1000 + index)
    with st.Client(path=path) as c:
        m = model(device)                       # its own values: replaced by the binding
        b = c.bind(m, KEY)
        sums = c.live(SUMS)
        seen, stop = {}, threading.Event()
        watcher = threading.Thread(target=watch, args=(b, seen, stop), daemon=True)
        watcher.start()
        print("ready", flush=True)
        x = torch.randn(8, m[0].in_features, device=device)
        table = read_sums(sums)
        forwards = verified = mismatched = torn = 0
        used = set()
        while True:
            n = 0
            for attempt in b.consistent(timeout=10):
                n += 1
                with attempt:
                    m(x)
                    cs = checksum(m)
            torn += n - 1
            v = attempt.version
            forwards += 1
            used.add(v)
            deadline = time.monotonic() + 10
            while table[v].item() == 0.0 and time.monotonic() < deadline:
                try:   # the trainer writes it right after the update
                    sums.wait_version(sums.version + 1, timeout=1)
                except st.TimeoutError:
                    pass
                table = read_sums(sums)
            if table[v].item() == cs:
                verified += 1
            else:
                mismatched += 1
            last = int(table[0].item())
            if last and v >= last:
                break
        stop.set()
        watcher.join()
        sums.close()
        print(json.dumps({"rollout": index, "forwards": forwards, "verified": verified,
                          "mismatched": mismatched, "torn": torn, "versions": len(used),
                          "seen": {str(k): t for k, t in seen.items()}}), flush=True)


if __name__ == "__main__":
    main()
