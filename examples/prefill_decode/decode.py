"""The decode process: creates the META buffer, waits (read_new) for the
prefill process to publish a prompt, then generates tokens attending over
the shared K/V blocks (appending its own). Checks that its tokens equal
those of the same model run start to end in this process on private
copies, and says how much memory the sharing saves.

    python3 decode.py SOCKET DEVICE PROMPT
"""
import sys

import torch

from common import KV, META, STEPS, WEIGHTS, args, sync
import model
import sharedtensor as st


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def main():
    path, device, prompt = args()
    meta = st.buffer_create(META, (2 + model.BLOCKS,), "int64", device="cpu", path=path)
    frame = meta.read_new(timeout=60.0)          # the prefill's write
    prompt_len, first = int(frame[0]), int(frame[1])
    table = [int(b) for b in frame[2:]]
    with st.Client(path=path) as c:
        w = c.get(WEIGHTS)
        kv = c.get(KV)["kv"]
        tokens = model.decode(w, kv, table, prompt_len, first, STEPS)
        sync(device)
        shared = nbytes(w.values()) + nbytes([kv])

    # The reference: one process, its own weights and its own KV cache.
    w_ref = {k: t.to(device) for k, t in model.init_weights().items()}
    kv_ref = torch.zeros(model.kv_shape(), device=device)
    ref_first = model.prefill(w_ref, kv_ref, table, prompt)
    ref = model.decode(w_ref, kv_ref, table, len(prompt), ref_first, STEPS)

    print("decode: %d tokens: %s" % (len(tokens), " ".join(map(str, tokens))))
    print("memory on %s: weights + KV pool %.1f KiB, held once for both processes; "
          "two private copies would hold %.1f KiB" % (device, shared / 1024, 2 * shared / 1024))
    if tokens != ref:
        print("MISMATCH: the single-process run gives %s" % ref)
        sys.exit(1)
    print("tokens match the single-process run")
    meta.unlink()
    meta.close()


if __name__ == "__main__":
    main()
