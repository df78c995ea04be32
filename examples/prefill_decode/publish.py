"""Publishes the model's weights (read-only for every other process) and an
empty paged KV pool, then exits: the server keeps both.

    python3 publish.py SOCKET DEVICE PROMPT
"""
import torch

from common import KV, WEIGHTS, args, sync
import model
import sharedtensor as st


def main():
    path, device, _, _, _ = args()
    with st.Client(path=path) as c:
        weights = {}
        for name, t in model.init_weights().items():
            weights[name] = st.empty(tuple(t.shape), dtype=torch.float32, device=device)
            weights[name].copy_(t)              # into shareable memory: put adopts it
        kv = st.zeros(model.kv_shape(), dtype=torch.float32, device=device)
        sync(device)
        wv = c.put(WEIGHTS, weights, readonly=True)
        kvv = c.put(KV, {"kv": kv})
        wbytes = sum(t.numel() * t.element_size() for t in weights.values())
        print("published %s v%d (%d tensors, %.1f KiB, read-only) and %s v%d (%.1f KiB) on %s"
              % (WEIGHTS, wv, len(weights), wbytes / 1024, KV, kvv,
                 kv.numel() * kv.element_size() / 1024, device))


if __name__ == "__main__":
    main()
