"""What the example's three processes share: the command line, the import
of sharedtensor from this repository, the names of the shared state."""
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
sys.path.insert(0, here)

WEIGHTS = "prefill_decode/weights"   # published key: the model, read-only
KV = "prefill_decode/kv"             # published key: the paged KV pool
META = "prefill_decode.meta"         # buffer: prompt length, first token, block table
STEPS = 24                           # tokens decode generates


def args():
    """SOCKET DEVICE PROMPT (comma-separated token ids) from argv."""
    if len(sys.argv) != 4:
        sys.exit("usage: %s SOCKET DEVICE PROMPT" % os.path.basename(sys.argv[0]))
    return sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")]


def sync(device):
    """CUDA work of this process is complete (before others may read it)."""
    if device != "cpu":
        import torch
        torch.cuda.synchronize()


def retry(fn, what, seconds=30.0):
    """fn() until it stops raising NotFoundError, at most `seconds`."""
    from sharedtensor.errors import NotFoundError
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except NotFoundError:
            if time.monotonic() > deadline:
                sys.exit("%s did not appear within %g s" % (what, seconds))
            time.sleep(0.01)
