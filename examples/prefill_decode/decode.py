"""The decode process: waits for the prefill process's prompt, then
generates tokens attending over the K/V blocks (appending its own). Checks
that its tokens equal those of the same model run start to end in this
process on private copies.

One server: it creates the META buffer and wakes on the prefill's write
(read_new); it attends over the shared pool in place and says how much
memory the sharing saves.

Two servers (PEER CHANNEL given; SOCKET is the decode's own server): it
pulls the weights from PEER once, listens on the request channel, opens
the prefill's hand-off as BLOCKS_OUT@PEER (its server mirrors it), and
copies each block of the request from the mirror into its own pool.

    python3 decode.py SOCKET DEVICE PROMPT [PEER CHANNEL]
"""
import sys
import time

import torch

from common import (BLOCKS_OUT, KV, META, STEPS, WEIGHTS, args, channel_listen, recv_line,
                    send_line, sync)
import model
import sharedtensor as st
from sharedtensor.handoff import Handoff, Ticket


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def receive_blocks(c, kv, peer, channel):
    """One request from the channel: its blocks from the mirror into kv.
    Returns (prompt length, first token, block table)."""
    with channel_listen(channel) as listener:
        sock, _ = listener.accept()
    with sock:
        hello = recv_line(sock)
        with Handoff.open(c, "%s@%s" % (hello["handoff"], peer)) as h:
            send_line(sock, "ready")
            req = recv_line(sock)
            t0 = time.monotonic()
            table = req["table"]
            for b, t in zip(table, req["tickets"]):
                ticket = Ticket(*t[:3], tuple(t[3]), t[4])
                kv[b].copy_(h.read(ticket, timeout=30))
                h.ack(ticket)
            sync(kv.device.type)
            took = time.monotonic() - t0
            send_line(sock, "done")
        print("decode: blocks %s of the prompt from %s's hand-off through this server's "
              "mirror, %.1f ms from the tickets to its own pool"
              % (table[:len(req["tickets"])], peer, took * 1e3))
        return req["prompt_len"], req["first"], table


def main():
    path, device, prompt, peer, channel = args()
    if peer:
        with st.Client(path=path) as c:
            got = c.pull(WEIGHTS, peer).result(timeout=120)
            print("decode's server: pulled %s v%d from %s (%.1f KiB)"
                  % (WEIGHTS, got["version"], peer, got["bytes"] / 1024))
            w = c.get(WEIGHTS)
            kv = torch.zeros(model.kv_shape(), device=device)    # the decode's own pool
            prompt_len, first, table = receive_blocks(c, kv, peer, channel)
            tokens = model.decode(w, kv, table, prompt_len, first, STEPS)
            sync(device)
            c.delete(WEIGHTS)
    else:
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
        meta.unlink()
        meta.close()

    # The reference: one process, its own weights and its own KV cache.
    w_ref = {k: t.to(device) for k, t in model.init_weights().items()}
    kv_ref = torch.zeros(model.kv_shape(), device=device)
    ref_first = model.prefill(w_ref, kv_ref, table, prompt)
    ref = model.decode(w_ref, kv_ref, table, len(prompt), ref_first, STEPS)

    print("decode: %d tokens: %s" % (len(tokens), " ".join(map(str, tokens))))
    if not peer:
        print("memory on %s: weights + KV pool %.1f KiB, held once for both processes; "
              "two private copies would hold %.1f KiB" % (device, shared / 1024, 2 * shared / 1024))
    if tokens != ref:
        print("MISMATCH: the single-process run gives %s" % ref)
        sys.exit(1)
    print("tokens match the single-process run")


if __name__ == "__main__":
    main()
