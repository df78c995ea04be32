"""The trainer: publishes its model's weights as a live key, starts the
rollout processes, then takes a training step and updates the key in
place, STEPS times; prints the update time and bandwidth, how long until
every rollout saw each version, and what the rollouts checked.

    python3 trainer.py SOCKET DEVICE ROLLOUTS STEPS [ROLLOUT_SOCKET PEER]

With ROLLOUT_SOCKET, the rollouts use that server, which follows the
trainer's keys across servers: it pulls them live from PEER (the id it
knows the trainer's server by; docs/multihost.md, "Live replication").
"""
import json
import os
import subprocess
import sys
import time

from common import KEY, SUMS, checksum, model, sync
import sharedtensor as st
import torch

here = os.path.dirname(os.path.abspath(__file__))


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    if len(sys.argv) not in (5, 7):
        sys.exit("usage: trainer.py SOCKET DEVICE ROLLOUTS STEPS [ROLLOUT_SOCKET PEER]")
    path, device, nroll, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rpath, peer = (sys.argv[5], sys.argv[6]) if len(sys.argv) == 7 else (path, None)
    torch.manual_seed(0)
    m = model(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    target = torch.randn(m[0].in_features, m[0].in_features, device=device) / 32
    with st.Client(path=path) as c:
        # The key's memory: shareable allocations the put adopts (no copy).
        shared = {}
        for name, p in m.state_dict().items():
            shared[name] = st.empty(tuple(p.shape), dtype=p.dtype, device=device)
            shared[name].copy_(p)
        sync(device)
        nbytes = sum(t.numel() * t.element_size() for t in shared.values())
        v = c.put(KEY, shared, live=True)
        table = torch.zeros(steps + 2, dtype=torch.float64)
        table[v] = checksum(m)
        c.put(SUMS, {"sums": st.empty(steps + 2, dtype=torch.float64).copy_(table)}, live=True)
        print("trainer: %s v%d live, %d tensors, %.1f MiB on %s; %d rollouts"
              % (KEY, v, len(shared), nbytes / 2**20, device, nroll), flush=True)
        if peer:
            with st.Client(path=rpath) as r:
                for key in (KEY, SUMS):
                    got = r.pull(key, peer, live=True).result(timeout=120)
                    print("rollouts' server: follows %s:%s from v%d" % (peer, key, got["version"]),
                          flush=True)
        env = dict(os.environ)
        procs = [subprocess.Popen([sys.executable, os.path.join(here, "rollout.py"), rpath, device,
                                   str(i)], stdout=subprocess.PIPE, text=True, env=env)
                 for i in range(nroll)]
        try:
            for p in procs:
                line = p.stdout.readline().strip()
                if line != "ready":
                    sys.exit("a rollout did not start: %r" % line)
            began, took = {}, []
            for step in range(steps):
                x = torch.randn(64, m[0].in_features, device=device)
                loss = torch.nn.functional.mse_loss(m(x), torch.tanh(x @ target))
                opt.zero_grad()
                loss.backward()
                opt.step()
                sync(device)
                t0 = time.monotonic()
                v = c.update(KEY, m.state_dict())   # in place; complete when it returns
                t1 = time.monotonic()
                began[v] = t0
                took.append(t1 - t0)
                table[v] = checksum(m)
                if step == steps - 1:
                    table[0] = v
                c.update(SUMS, {"sums": table})
                time.sleep(0.01)      # rollouts run forward passes meanwhile
            reports = []
            for p in procs:
                out, _ = p.communicate(timeout=120)
                if p.returncode != 0:
                    sys.exit("a rollout failed (exit %d)" % p.returncode)
                reports.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if peer:
            with st.Client(path=rpath) as r:
                for key in (KEY, SUMS):
                    r.unsubscribe(key)
                    r.delete(key)
        c.delete(KEY)
        c.delete(SUMS)
    visible = []
    for v, t0 in began.items():
        ts = [r["seen"].get(str(v)) for r in reports]
        if all(t is not None for t in ts):
            visible.append(max(ts) - t0)
    forwards = sum(r["forwards"] for r in reports)
    verified = sum(r["verified"] for r in reports)
    torn = sum(r["torn"] for r in reports)
    p50 = percentile(took, 0.5)
    print("update: %d versions of %.1f MiB in place, p50 %.3f ms (%.1f GB/s), max %.3f ms"
          % (len(took), nbytes / 2**20, p50 * 1e3, nbytes / p50 / 1e9, max(took) * 1e3))
    if visible:
        print("visible to all %d rollouts after the update began: p50 %.3f ms, max %.3f ms"
              % (nroll, percentile(visible, 0.5) * 1e3, max(visible) * 1e3))
    print("rollouts: %d forward passes on %s versions, %d checked against the trainer's "
          "checksum, %d torn attempts run again"
          % (forwards, "/".join(str(r["versions"]) for r in reports), verified, torn))
    if peer:
        print("memory on %s: the weights once per server (%.1f MiB) for %d rollouts behind the "
              "second one" % (device, nbytes / 2**20, nroll))
    else:
        print("memory on %s: the weights once (%.1f MiB) for %d rollouts; private copies would be "
              "%.1f MiB" % (device, nbytes / 2**20, nroll, nroll * nbytes / 2**20))
    if verified != forwards:
        sys.exit("weight_update: %d forward passes used a torn or unknown version"
                 % (forwards - verified))
    print("weight_update: every forward pass used one consistent version")


if __name__ == "__main__":
    main()
