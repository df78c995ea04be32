"""The prefill process: runs the prompt on the shared weights and writes
its K/V into blocks of the shared pool.

One server: it publishes where they are (the prompt's length, the first
token and the block table) in the META buffer, which wakes the decode
process.

Two servers (PEER CHANNEL given): the decode process is behind another
server. Prefill puts each block the prompt filled into a chunk of the
hand-off BLOCKS_OUT, whose consumer is the decode's server (it mirrors
the hand-off), and sends the tickets with the block table over the
request channel, and closes the hand-off once decode says it has them.

    python3 prefill.py SOCKET DEVICE PROMPT [PEER CHANNEL]
"""
import time

import torch

from common import (BLOCKS_OUT, KV, META, WEIGHTS, args, channel_connect, recv_line, retry,
                    send_line, sync)
import model
import sharedtensor as st
from sharedtensor.handoff import Handoff


def send_blocks(c, w, kv, table, prompt, device, channel):
    """Prefill with the filled blocks sent through a hand-off and the
    tickets over the channel."""
    used = (len(prompt) + model.BLOCK - 1) // model.BLOCK
    nbytes = kv[0].numel() * kv.element_size()
    h = Handoff.create(c, BLOCKS_OUT, chunk_bytes=nbytes, chunks=used, consumers=1,
                       device=device)
    try:
        with channel_connect(channel) as sock:
            send_line(sock, {"handoff": BLOCKS_OUT})
            if recv_line(sock) != "ready":           # the decode's server mirrors it now
                raise SystemExit("prefill: the decode process did not open the hand-off")
            first = model.prefill(w, kv, table, prompt)
            sync(device)
            t0 = time.monotonic()
            tickets = [list(h.put(kv[b], timeout=30)) for b in table[:used]]
            send_line(sock, {"prompt_len": len(prompt), "first": first, "table": table,
                             "tickets": tickets})
            reply = recv_line(sock)
            took = time.monotonic() - t0
        if reply != "done":
            raise SystemExit("prefill: the decode process answered %r" % (reply,))
        print("prefill: %d prompt tokens into blocks %s, first token %d, sent as %d chunks "
              "of %.1f KiB; in decode's pool %.1f ms after the first publish"
              % (len(prompt), table[:used], first, used, nbytes / 1024, took * 1e3))
    finally:
        h.close()          # the server lets the hand-off go once the mirror left too


def main():
    path, device, prompt, peer, channel = args()
    with st.Client(path=path) as c:
        w = c.get(WEIGHTS)                       # mapped read-only (put so)
        kv = c.get(KV)["kv"]                     # the shared pool, writable
        table = model.block_table()
        if peer:
            send_blocks(c, w, kv, table, prompt, device, channel)
            return
        used = (len(prompt) + model.BLOCK - 1) // model.BLOCK
        meta = retry(lambda: st.buffer_open(META, path=path), "buffer " + META)
        first = model.prefill(w, kv, table, prompt)
        sync(device)                             # the K/V are in memory before we say so
        frame = torch.tensor([len(prompt), first] + table, dtype=torch.int64)
        seq = meta.write(frame)
        print("prefill: %d prompt tokens into blocks %s, first token %d, published as write %d"
              % (len(prompt), table[:used], first, seq))
        meta.close()


if __name__ == "__main__":
    main()
