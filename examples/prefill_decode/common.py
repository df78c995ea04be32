"""What the example's three processes share: the command line, the import
of sharedtensor from this repository, the names of the shared state, and
the channel that carries the block table from prefill to decode when they
use two servers."""
import json
import os
import socket
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
sys.path.insert(0, here)

WEIGHTS = "prefill_decode/weights"   # published key: the model, read-only
KV = "prefill_decode/kv"             # published key: the paged KV pool
META = "prefill_decode.meta"         # buffer: prompt length, first token, block table
BLOCKS_OUT = "prefill_decode.blocks"  # hand-off: KV blocks to a decode behind another server
STEPS = 24                           # tokens decode generates


def args():
    """SOCKET DEVICE PROMPT [PEER CHANNEL] from argv: the prompt is
    comma-separated token ids; with PEER (the prefill server's peer id on
    the decode's server) and CHANNEL (a file naming the decode's TCP
    port), prefill and decode use two servers. Returns (socket, device,
    prompt, peer or None, channel or None)."""
    if len(sys.argv) not in (4, 6):
        sys.exit("usage: %s SOCKET DEVICE PROMPT [PEER CHANNEL]" % os.path.basename(sys.argv[0]))
    extra = sys.argv[4:6] if len(sys.argv) == 6 else [None, None]
    return (sys.argv[1], sys.argv[2], [int(t) for t in sys.argv[3].split(",")]) + tuple(extra)


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


# The request channel between prefill and decode on two servers: one JSON
# line each way over TCP on loopback, as a router would carry the request
# between hosts. The tickets travel here; the bytes go between the servers.

def channel_listen(path):
    """Decode's end: listens on a loopback port and names it in `path`
    (written whole, then renamed). Returns the listening socket."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    with open(path + ".tmp", "w") as f:
        f.write(str(s.getsockname()[1]))
    os.rename(path + ".tmp", path)
    return s


def channel_connect(path, seconds=60.0):
    """Prefill's end: connects to the port `path` names once it exists."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit("the decode process did not listen within %g s" % seconds)
        time.sleep(0.01)
    with open(path) as f:
        return socket.create_connection(("127.0.0.1", int(f.read())), timeout=seconds)


def send_line(sock, obj):
    sock.sendall(json.dumps(obj).encode() + b"\n")


def recv_line(sock):
    """One JSON line (None when the other end closed first)."""
    buf = b""
    while not buf.endswith(b"\n"):
        part = sock.recv(65536)
        if not part:
            return None
        buf += part
    return json.loads(buf)
