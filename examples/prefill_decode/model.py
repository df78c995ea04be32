"""A small decoder-only transformer whose attention reads a paged KV cache.

Shared by the three processes of the example (publish.py, prefill.py,
decode.py) and by the single-process reference run in decode.py. The
weights are a plain dict of tensors (made on the CPU from a fixed seed, so
every process that makes them gets the same values); the KV cache is one
tensor of blocks:

    kv[block, layer, 0 or 1 (K or V), head, slot in block, head_dim]

and a sequence is a block table: position p lives in block table[p // BLOCK]
at slot p % BLOCK. Nothing here knows about sharedtensor.
"""
import math

import torch

VOCAB, DIM, HEADS, LAYERS = 96, 64, 4, 2
HEAD_DIM = DIM // HEADS
BLOCK, BLOCKS = 8, 32          # slots per block, blocks in the pool


def kv_shape():
    return (BLOCKS, LAYERS, 2, HEADS, BLOCK, HEAD_DIM)


def init_weights(seed=0):
    """name -> float32 CPU tensor, the same in every process."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale):
        return torch.randn(*shape, generator=g) * scale

    sd = {"embed": w(VOCAB, DIM, scale=1.0), "head": w(VOCAB, DIM, scale=DIM ** -0.5)}
    for i in range(LAYERS):
        for name in ("wq", "wk", "wv", "wo"):
            sd["l%d.%s" % (i, name)] = w(DIM, DIM, scale=DIM ** -0.5)
        sd["l%d.w1" % i] = w(4 * DIM, DIM, scale=DIM ** -0.5)
        sd["l%d.w2" % i] = w(DIM, 4 * DIM, scale=(4 * DIM) ** -0.5)
    return sd


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _positions(start, n, device):
    """Sinusoidal position codes of positions start..start+n-1, (n, DIM)."""
    pos = torch.arange(start, start + n, device=device, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, DIM, 2, device=device, dtype=torch.float32)
                     * (-math.log(10000.0) / DIM))
    out = torch.zeros(n, DIM, device=device)
    out[:, 0::2] = torch.sin(pos * freq)
    out[:, 1::2] = torch.cos(pos * freq)
    return out


def forward(w, kv, table, tokens, start):
    """Runs tokens (a list of ids) at positions start.., writes their K and V
    into kv's blocks (table: list of block numbers), attends over every
    position up to the last; returns the logits of the last token."""
    device = kv.device
    n = len(tokens)
    end = start + n
    x = w["embed"][torch.tensor(tokens, device=device)] + _positions(start, n, device)
    nb = (end + BLOCK - 1) // BLOCK
    blocks = torch.tensor(table[:nb], device=device)
    mask = torch.arange(end, device=device)[None, :] <= torch.arange(start, end, device=device)[:, None]
    for i in range(LAYERS):
        h = _rms(x)
        q = (h @ w["l%d.wq" % i].T).view(n, HEADS, HEAD_DIM)
        k = (h @ w["l%d.wk" % i].T).view(n, HEADS, HEAD_DIM)
        v = (h @ w["l%d.wv" % i].T).view(n, HEADS, HEAD_DIM)
        for j in range(n):
            p = start + j
            kv[table[p // BLOCK], i, 0, :, p % BLOCK] = k[j]
            kv[table[p // BLOCK], i, 1, :, p % BLOCK] = v[j]
        keys = kv[blocks, i, 0].permute(1, 0, 2, 3).reshape(HEADS, nb * BLOCK, HEAD_DIM)[:, :end]
        vals = kv[blocks, i, 1].permute(1, 0, 2, 3).reshape(HEADS, nb * BLOCK, HEAD_DIM)[:, :end]
        att = (q.transpose(0, 1) @ keys.transpose(1, 2)) / math.sqrt(HEAD_DIM)   # (H, n, end)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        out = (att @ vals).transpose(0, 1).reshape(n, DIM)
        x = x + out @ w["l%d.wo" % i].T
        x = x + torch.relu(_rms(x) @ w["l%d.w1" % i].T) @ w["l%d.w2" % i].T
    return _rms(x[-1]) @ w["head"].T


def prefill(w, kv, table, prompt):
    """The prompt's K/V into the cache; the first generated token."""
    return int(forward(w, kv, table, prompt, 0).argmax())


def decode(w, kv, table, prompt_len, first, steps):
    """Greedy tokens after `first` (which sits at position prompt_len)."""
    out, tok = [first], first
    for s in range(steps - 1):
        tok = int(forward(w, kv, table, [tok], prompt_len + s).argmax())
        out.append(tok)
    return out


def block_table(seed=1):
    """A shuffled block table: the sequence's blocks are not contiguous."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(BLOCKS, generator=g).tolist()
