"""Hand-offs: per-request tensors from one producer process to several
consumer processes through a named pool the server owns (docs/python.md,
"Hand-offs"; docs/pool.md, section 5).

    # producer                                  # each consumer
    h = Handoff.create(c, "feats", chunk_bytes=4 << 20, chunks=8,
                       consumers=2)             h = Handoff.open(c, "feats")
    chunk = h.acquire(timeout=5)
    chunk.tensor((1024, 1024), torch.float32).copy_(x)
    ticket = h.publish(chunk, (1024, 1024), torch.float32)
    queue.put(ticket)      # your own channel   ticket = queue.get()
                                                x = h.read(ticket)   # a view
                                                ...use x...
                                                h.ack(ticket)

A Ticket (chunk, seq, nbytes, shape, dtype) is a small picklable tuple: send
it over any channel of yours (a multiprocessing queue, a pipe, a socket).
Nothing per request goes to the server. Views are valid until close().
CUDA: publish() synchronizes the current stream before publishing, ack()
before acknowledging, so the other side never sees a half-written chunk
and a chunk is never recycled under a read still running on the GPU.
"""
import collections
import ctypes

from . import _lib
from . import errors as _errors
from .errors import from_library

_l = _lib.lib

Ticket = collections.namedtuple("Ticket", "chunk seq nbytes shape dtype")


def _torch():
    import torch
    return torch


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class _CudaMemory:
    """A device range for torch.as_tensor (__cuda_array_interface__), for
    hand-offs and buffers. The interface's read-only flag stays False:
    torch refuses it; a read-only buffer's range is mapped read-only on the
    device (cuMemSetAccess), so a kernel that writes it faults anyway."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "strides": None}


class Chunk:
    """An acquired chunk: its index, address and size (producer side)."""

    def __init__(self, handoff, index, ptr):
        self.handoff, self.index, self.ptr = handoff, index, ptr

    def tensor(self, shape, dtype):
        """A writable torch view of the chunk's first bytes as shape/dtype."""
        return self.handoff._view(self.ptr, shape, dtype)


class Handoff:
    """One end of a hand-off (use create() or open())."""

    def __init__(self, client, ptr):
        self._client, self._ptr = client, ptr
        chunks, chunk_bytes = ctypes.c_int(), ctypes.c_uint64()
        consumers, slot, dev = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        _l.st_handoff_shape(ptr, ctypes.byref(chunks), ctypes.byref(chunk_bytes),
                            ctypes.byref(consumers), ctypes.byref(slot), ctypes.byref(dev))
        self.chunks, self.chunk_bytes = chunks.value, chunk_bytes.value
        self.consumers, self.slot, self.device_index = consumers.value, slot.value, dev.value
        self.device = "cpu" if dev.value < 0 else "cuda:%d" % dev.value

    @classmethod
    def create(cls, client, name, chunk_bytes, chunks, consumers, device="cpu", readers=None):
        """Creates hand-off `name`; this client's connection is its producer.
        readers={"uids": [int], "gids": [int]} lets those uids (and callers
        in those groups) open it as consumers (docs/protocol.md, "Owners")."""
        grant = _errors.readers("handoff_create", readers)
        out = ctypes.c_void_p()
        client._do(_l.st_handoff_create_ex, name.encode(), device.encode(), int(chunk_bytes),
                   int(chunks), int(consumers), grant, ctypes.byref(out))
        return cls(client, out.value)

    @classmethod
    def open(cls, client, name, consumers=None, device=None):
        """Opens hand-off `name` as a consumer (the lowest free slot).
        `name@peer` opens a peer server's hand-off through this server's
        mirror of it (docs/multihost.md, "Hand-offs across servers"); the
        first open of a mirror may choose its `consumers` (default 1) and
        `device` ("cpu", "cuda", "cuda:N"; default: the kind of the peer's
        hand-off). Both are refused for a hand-off of this server."""
        out = ctypes.c_void_p()
        client._do(_l.st_handoff_open_ex, name.encode(), int(consumers or 0),
                   device.encode() if device else None, ctypes.byref(out))
        return cls(client, out.value)

    @staticmethod
    def delete(client, name):
        """Deletes hand-off `name` (its creator's uid): the server lets go."""
        client._do(_l.st_handoff_delete, name.encode())

    # ------------------------------------------------------------ helpers

    def _h(self):
        if not self._ptr:
            raise ValueError("the hand-off is closed")
        return self._ptr

    def _check(self, rc):
        if rc != 0:
            raise from_library(rc, (_l.st_handoff_error(None) or b"").decode(errors="replace"))

    @staticmethod
    def _ms(timeout):
        return -1 if timeout is None else int(timeout * 1000)

    def _view(self, ptr, shape, dtype):
        torch = _torch()
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        n = 1
        for s in shape:
            n *= int(s)
        nbytes = n * itemsize
        if nbytes > self.chunk_bytes:
            raise ValueError("%d bytes do not fit a chunk of %d" % (nbytes, self.chunk_bytes))
        if self.device_index < 0:
            raw = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
            flat = torch.frombuffer(raw, dtype=torch.uint8)[:nbytes]
        else:
            flat = torch.as_tensor(_CudaMemory(ptr, nbytes), device=self.device)
        return flat.view(dtype).reshape(tuple(shape))

    def _sync(self):
        if self.device_index >= 0:
            _torch().cuda.current_stream(self.device_index).synchronize()

    # ------------------------------------------------------------ producer

    def acquire(self, timeout=None):
        """A free chunk, waiting up to `timeout` seconds (None: no limit);
        TimeoutError (sharedtensor's) when every chunk still waits for
        acknowledgements."""
        idx, ptr = ctypes.c_int(), ctypes.c_void_p()
        self._check(_l.st_handoff_acquire(self._h(), self._ms(timeout), ctypes.byref(idx),
                                          ctypes.byref(ptr)))
        return Chunk(self, idx.value, ptr.value)

    def publish(self, chunk, shape, dtype):
        """Publishes the chunk holding a tensor of shape/dtype; returns the
        Ticket to send to the consumers."""
        torch = _torch()
        dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        n = 1
        for s in shape:
            n *= int(s)
        nbytes = n * torch.empty((), dtype=dt).element_size()
        self._sync()
        seq = ctypes.c_uint64()
        self._check(_l.st_handoff_publish(self._h(), chunk.index, nbytes, ctypes.byref(seq)))
        return Ticket(chunk.index, seq.value, nbytes, tuple(int(s) for s in shape),
                      _dtype_name(dt))

    def put(self, tensor, timeout=None):
        """acquire + copy `tensor` in + publish: the Ticket."""
        chunk = self.acquire(timeout)
        try:
            chunk.tensor(tensor.shape, tensor.dtype).copy_(tensor)
        except BaseException:
            self.cancel(chunk)
            raise
        return self.publish(chunk, tensor.shape, tensor.dtype)

    def cancel(self, chunk):
        """Gives an acquired chunk back unpublished."""
        self._check(_l.st_handoff_cancel(self._h(), chunk.index))

    # ------------------------------------------------------------ consumers

    def read(self, ticket, timeout=0):
        """A torch view of the ticket's tensor (valid until ack())."""
        ptr, nbytes = ctypes.c_void_p(), ctypes.c_uint64()
        self._check(_l.st_handoff_read(self._h(), ticket.chunk, ticket.seq, self._ms(timeout),
                                       ctypes.byref(ptr), ctypes.byref(nbytes)))
        if nbytes.value != ticket.nbytes:
            raise ValueError("ticket says %d bytes, the chunk holds %d" %
                             (ticket.nbytes, nbytes.value))
        return self._view(ptr.value, ticket.shape, ticket.dtype)

    def ack(self, ticket):
        """This consumer is done with the ticket's chunk (CUDA: after the
        current stream's work)."""
        self._sync()
        self._check(_l.st_handoff_ack(self._h(), ticket.chunk, ticket.seq))

    def pending(self, chunk):
        """(seq, bits) of a chunk index: its last publish and the consumer
        slots that have not acknowledged it."""
        seq, bits = ctypes.c_uint64(), ctypes.c_uint64()
        self._check(_l.st_handoff_pending(self._h(), int(chunk), ctypes.byref(seq),
                                          ctypes.byref(bits)))
        return seq.value, bits.value

    # ------------------------------------------------------------ closing

    def close(self):
        """Leaves the hand-off and unmaps it (views die with it)."""
        p, self._ptr = self._ptr, None
        if p and self._client._ptr:
            with self._client._lock:
                rc = _l.st_handoff_close(p)
            self._check(rc)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
