"""The prefill process: runs the prompt on the shared weights, writes its
K/V into blocks of the shared pool, and publishes where they are (the
prompt's length, the first token and the block table) in the META buffer,
which wakes the decode process.

    python3 prefill.py SOCKET DEVICE PROMPT
"""
import torch

from common import KV, META, WEIGHTS, args, retry, sync
import model
import sharedtensor as st


def main():
    path, device, prompt = args()
    with st.Client(path=path) as c:
        w = c.get(WEIGHTS)                       # mapped read-only (put so)
        kv = c.get(KV)["kv"]                     # the shared pool, writable
        meta = retry(lambda: st.buffer_open(META, path=path), "buffer " + META)
        table = model.block_table()
        first = model.prefill(w, kv, table, prompt)
        sync(device)                             # the K/V are in memory before we say so
        frame = torch.tensor([len(prompt), first] + table, dtype=torch.int64)
        seq = meta.write(frame)
        used = (len(prompt) + model.BLOCK - 1) // model.BLOCK
        print("prefill: %d prompt tokens into blocks %s, first token %d, published as write %d"
              % (len(prompt), table[:used], first, seq))
        meta.close()


if __name__ == "__main__":
    main()
