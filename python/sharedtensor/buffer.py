"""Named buffers and streams: a frame of one shape and dtype that any
process of the creator's uid opens by name, with pyshmem's semantics
(docs/python.md, "Buffers and streams"; docs/streams.md).

    import sharedtensor as st
    cam = st.buffer_create("cam", (480, 640, 3), "uint8", slots=4)   # writer
    cam.write(frame)                       # a copy into the next slot

    cam = st.buffer_open("cam", readonly=True)    # any reader process
    x = cam.read()                         # a consistent snapshot (a copy)
    x = cam.read_new(timeout=1.0)          # waits for a newer write
    cam.write_sequence, cam.write_time

Every Buffer has a connection of its own to the server, so the writer
lock (acquire/release/locked) belongs to the handle, and the server frees
it when the handle's process dies. Per frame nothing goes to the server:
writes, reads and waits work on shared memory and futexes.

Frames are torch tensors (framework="torch", the default) or numpy
arrays (framework="numpy", CPU buffers). CUDA buffers take and give torch
tensors on their device: a write copies on the current stream and
synchronizes it before the write is published; a read does the same
before it checks that the copy is consistent.
"""
import ctypes
import sys

from . import _lib
from . import errors as _errors
from .closing import Closing
from .alloc import _shape_of, dtype_of
from .client import Client
from .errors import (TimeoutError as _Timeout, StaleHandleError, InvalidArgumentError as _Invalid,
                     from_library)
from .handoff import _CudaMemory

_l = _lib.lib
_write = _l.st_buffer_write
_read = _l.st_buffer_read
_wait_new = _l.st_buffer_wait_new

FRAMEWORKS = ("torch", "numpy")


def _ms(timeout):
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError("timeout must be a number of seconds >= 0, or None")
    return int(timeout * 1000)


class Buffer(Closing):
    """One handle of a named buffer (sharedtensor.buffer_create / sharedtensor.buffer_open)."""

    def __init__(self, client, ptr, framework):
        if framework not in FRAMEWORKS:
            raise ValueError('framework must be "torch" or "numpy"')
        self._client, self._ptr, self.framework = client, ptr, framework
        info = _lib.BufferInfo()
        _l.st_buffer_info(ptr, ctypes.byref(info))
        self.name = info.name.decode()
        self.shape = tuple(info.shape[i] for i in range(info.ndim))
        self.dtype_name = _l.st_dtype_name(info.dtype).decode()
        self.slots, self.nbytes = info.slots, info.frame_bytes
        self.readonly, self.device_index = bool(info.readonly), info.device_index
        self.device = "cpu" if info.device_index < 0 else "cuda:%d" % info.device_index
        self.connection = info.connection
        if framework == "numpy" and self.device_index >= 0:
            raise ValueError("numpy arrays live on the cpu, not on %s" % self.device)
        self._last = [(None, 0), (None, 0)]   # the last out= array, the last written one
        self._seq, self._time = ctypes.c_uint64(), ctypes.c_int64()
        self._seq_ref, self._time_ref = ctypes.byref(self._seq), ctypes.byref(self._time)
        if framework == "numpy":
            import numpy as np
            self._np = np
            self.dtype = np.dtype(self.dtype_name)
        else:
            import torch
            self._torch = torch
            self.dtype = getattr(torch, self.dtype_name, None)
            if not isinstance(self.dtype, torch.dtype):
                # uint16/uint32/uint64 before torch 2.3, float8 before 2.1
                if self.device_index >= 0:
                    raise TypeError("this torch has no dtype %s: a %s buffer of it needs a "
                                    "newer torch" % (self.dtype_name, self.device))
                import numpy as np
                try:
                    self.dtype = np.dtype(self.dtype_name)
                except TypeError:
                    raise TypeError("neither this torch nor numpy has dtype %s"
                                    % self.dtype_name) from None
                self._np, self.framework = np, "numpy"

    @classmethod
    def _attach(cls, client, own, framework, fn, *args):
        out = ctypes.c_void_p()
        try:
            client._do(fn, *args, ctypes.byref(out))
            return cls(client if own else None, out.value, framework)
        except BaseException:
            if out.value:
                _l.st_buffer_close(out.value)
            if own:
                client.close()
            raise

    # ------------------------------------------------------------ helpers

    def _h(self):
        p = self._ptr
        if not p:
            raise ValueError("buffer '%s' is closed" % self.name)
        return p

    def _check(self, rc):
        if rc != 0:
            raise from_library(rc, (_l.st_buffer_error(None) or b"").decode(errors="replace"))

    def _empty(self):
        if self.framework == "numpy":
            return self._np.empty(self.shape, self.dtype)
        return self._torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def _view(self, ptr):
        """The frame at ptr as a tensor/array (no copy)."""
        n = self.nbytes
        if self.framework == "numpy":
            raw = (ctypes.c_uint8 * n).from_address(ptr)
            arr = self._np.frombuffer(raw, dtype=self._np.uint8)
            return arr.view(self.dtype).reshape(self.shape)
        torch = self._torch
        if self.device_index < 0:
            raw = (ctypes.c_uint8 * n).from_address(ptr)
            flat = torch.frombuffer(raw, dtype=torch.uint8)
        else:
            flat = torch.as_tensor(_CudaMemory(ptr, n), device=self.device)
        return flat.view(self.dtype).reshape(self.shape)

    def _host_ptr(self, value, writing):
        """The address of `value` (a contiguous host tensor or array of
        the frame's bytes) and the object that holds that memory;
        TypeError/ValueError when it is not one. A numpy array's address
        never changes, so the last one is remembered (its object too, so
        that it stays alive and the address stays its own)."""
        last = self._last[writing]
        if value is last[0]:
            return last[1], value
        if hasattr(value, "data_ptr"):
            if writing and value.is_cuda:
                value = value.cpu()
            ok = not value.is_cuda and value.is_contiguous()
            if not ok and writing:
                value, ok = value.contiguous(), True
            if not ok or value.numel() * value.element_size() != self.nbytes:
                raise ValueError("buffer '%s' holds %s %s (%d bytes): %s a contiguous cpu tensor "
                                 "of that size" % (self.name, self.shape, self.dtype_name,
                                                   self.nbytes, "write" if writing else "out is"))
            return value.data_ptr(), value
        np = sys.modules.get("numpy")
        if np is None or not isinstance(value, np.ndarray):
            raise TypeError("a buffer takes torch tensors or numpy arrays, not %s" %
                            type(value).__name__)
        if writing and not value.flags.c_contiguous:
            value = np.ascontiguousarray(value)
        if not value.flags.c_contiguous or value.nbytes != self.nbytes or (
                not writing and not value.flags.writeable):
            raise ValueError("buffer '%s' holds %s %s (%d bytes): %s a contiguous%s array of "
                             "that size" % (self.name, self.shape, self.dtype_name, self.nbytes,
                                            "write" if writing else "out is",
                                            "" if writing else ", writable"))
        ptr = value.__array_interface__["data"][0]
        self._last[writing] = (value, ptr)
        return ptr, value

    def _sync(self):
        self._torch.cuda.current_stream(self.device_index).synchronize()

    # ------------------------------------------------------------ writes

    def write(self, value, timeout=None):
        """Copies `value` (a tensor or array of the frame's size) into the
        next slot and publishes it; returns its write_sequence. Waits up
        to `timeout` seconds (None: no limit) while another handle holds
        the writer lock (sharedtensor's TimeoutError)."""
        h = self._ptr or self._h()
        if self.device_index < 0:
            ptr, keep = self._host_ptr(value, True)
            rc = _write(h, ptr, self.nbytes, -1 if timeout is None else _ms(timeout),
                        self._seq_ref)
            if rc != 0:
                self._check(rc)
            return self._seq.value
        src = self._torch.as_tensor(value)
        if src.numel() * src.element_size() != self.nbytes:
            raise ValueError("buffer '%s' holds %d bytes, not %d" %
                             (self.name, self.nbytes, src.numel() * src.element_size()))
        ptr = ctypes.c_void_p()
        self._check(_l.st_buffer_write_begin(h, _ms(timeout), ctypes.byref(ptr)))
        try:
            self._view(ptr.value).copy_(src.reshape(self.shape))
            self._sync()
        except BaseException:
            _l.st_buffer_write_abort(h)
            raise
        self._check(_l.st_buffer_write_end(h, self._seq_ref))
        return self._seq.value

    # ------------------------------------------------------------- reads

    def read(self, safe=True, out=None, timeout=1.0):
        """The newest complete write. safe=True: a consistent copy (into
        `out` when given, a tensor/array of the frame's shape and dtype);
        a copy that raced with a writer is made again, for up to `timeout`
        seconds. safe=False: a view of the newest slot, no copy, only while
        this handle holds the writer lock (acquire() or `with
        b.locked():`), as pyshmem's read(safe=False); without it
        InvalidArgumentError. The view stays a view of that slot after the
        release, when later writes change it."""
        h = self._ptr or self._h()
        if not safe:
            if _l.st_buffer_held(h) <= 0:
                raise _Invalid(
                    "buffer '%s': read(safe=False) gives a view that only stays put while this "
                    "handle holds the writer lock: take it first (b.acquire() ... b.release(), "
                    "or with b.locked(): ...), or read() for a copy%s"
                    % (self.name, " (a read-only handle cannot hold the lock: use read() or "
                       "read(out=...))" if self.readonly else ""))
            ptr, seq = ctypes.c_void_p(), ctypes.c_uint64()
            self._check(_l.st_buffer_read_begin(h, _ms(timeout), ctypes.byref(ptr),
                                                ctypes.byref(seq)))
            self._check(_l.st_buffer_read_check(h, seq.value, None))
            return self._view(ptr.value)
        if out is None:
            out = self._empty()
        if self.device_index < 0:
            ptr, _ = self._host_ptr(out, False)
            rc = _read(h, ptr, self.nbytes, 1000 if timeout == 1.0 else _ms(timeout),
                       self._seq_ref, self._time_ref)
            if rc != 0:
                self._check(rc)
            return out
        return self._read_cuda(h, out, timeout)

    def _read_cuda(self, h, out, timeout):
        ptr, seq = ctypes.c_void_p(), ctypes.c_uint64()
        while True:
            self._check(_l.st_buffer_read_begin(h, _ms(timeout), ctypes.byref(ptr),
                                                ctypes.byref(seq)))
            out.copy_(self._view(ptr.value).reshape(out.shape))
            self._sync()
            rc = _l.st_buffer_read_check(h, seq.value, self._time_ref)
            if rc == 0:
                self._seq.value = seq.value
                return out
            try:
                self._check(rc)
            except StaleHandleError:
                continue

    def read_new(self, timeout=None, safe=True, out=None):
        """Waits up to `timeout` seconds (None: no limit) for a write newer
        than the last one this handle read, then reads it as read() does.
        Raises sharedtensor's TimeoutError when none comes."""
        rc = _wait_new(self._h(), _ms(timeout), None)
        if rc != 0:
            self._check(rc)
        return self.read(safe=safe, out=out, timeout=1.0 if timeout is None else max(timeout, 1.0))

    def set_spin(self, spin_us):
        """How long read_new polls for the next write before it sleeps on
        the futex, in microseconds (0 to 1000000; -1: the default, 50 on a
        process that may run on four CPUs or more, $ST_CLIENT_SPIN_US)."""
        self._check(_l.st_buffer_set_spin(self._h(), int(spin_us)))

    @property
    def last_sequence(self):
        """The write_sequence of the last read() of this handle."""
        return self._seq.value

    @property
    def write_sequence(self):
        """The number of the newest complete write (0: none yet)."""
        return _l.st_buffer_write_sequence(self._h())

    @property
    def write_time(self):
        """When the newest complete write completed: seconds since the epoch
        (CLOCK_REALTIME, like time.time()); 0.0 before any write."""
        return _l.st_buffer_write_time(self._h()) / 1e9

    @property
    def write_time_ns(self):
        """write_time in integer nanoseconds."""
        return _l.st_buffer_write_time(self._h())

    # -------------------------------------------------------------- lock

    def clear(self, timeout=None):
        """Zeroes every slot, published as one more write: returns its
        write_sequence (sequences never go back, so read_new wakes and
        reads zeros). Takes the writer lock for it unless this handle
        holds it, waiting up to `timeout` seconds (None: no limit;
        TimeoutError)."""
        self._check(_l.st_buffer_clear(self._h(), _ms(timeout), self._seq_ref))
        return self._seq.value

    def acquire(self, timeout=None):
        """Takes the writer lock for this handle, waiting up to `timeout`
        seconds (None: no limit). True when taken, False on timeout.
        Re-entrant: while this handle holds it, acquire() only counts, and
        the release() that balances the first acquire() frees it."""
        rc = _l.st_buffer_acquire(self._h(), _ms(timeout))
        if rc == -_Timeout.code:
            return False
        self._check(rc)
        return True

    def release(self):
        """Undoes one acquire() of this handle; the last frees the lock
        (InvalidArgumentError when this handle holds none)."""
        self._check(_l.st_buffer_release(self._h()))

    def locked(self, timeout=None):
        """Both a query and a context manager: true (bool()) while some
        handle holds the writer lock, as it was when locked() was called;
        `with b.locked(timeout=None):` acquires for the block (TimeoutError
        when `timeout` seconds pass) and releases after it."""
        return _Locked(self, bool(_l.st_buffer_locked(self._h(), None, None, None)), timeout)

    @property
    def held(self):
        """How many acquire() calls of this handle are not yet released."""
        return _l.st_buffer_held(self._h())

    @property
    def owner(self):
        """(connection, pid, mine) of the lock's holder, or None when free."""
        conn, pid, mine = ctypes.c_uint64(), ctypes.c_int(), ctypes.c_int()
        if not _l.st_buffer_locked(self._h(), ctypes.byref(conn), ctypes.byref(pid),
                                   ctypes.byref(mine)):
            return None
        return conn.value, pid.value, bool(mine.value)

    # ----------------------------------------------------------- closing

    def close(self):
        """Closes this handle (frees a lock it holds) and its connection.
        Views from read(safe=False) die with it."""
        p, self._ptr = self._ptr, None
        if p:
            rc = _l.st_buffer_close(p)
            if self._client is not None:
                self._client.close()
            self._check(rc)

    def unlink(self):
        """Removes the name (creator's uid only): open handles keep working;
        the memory goes with the last of them."""
        self._client_of()._do(_l.st_buffer_unlink, self.name.encode())

    def _client_of(self):
        self._h()
        return self._client

    @property
    def closed(self):
        return self._ptr is None

    def __repr__(self):
        return "<Buffer %r %s %s slots=%d %s%s%s>" % (
            self.name, self.shape, self.dtype_name, self.slots, self.device,
            " readonly" if self.readonly else "", " closed" if self.closed else "")


class _Locked:
    """What Buffer.locked() returns: its truth is whether the lock was held
    at the call; as a context manager it holds the lock for the block."""

    __slots__ = ("_b", "_held", "_timeout")

    def __init__(self, b, held, timeout):
        self._b, self._held, self._timeout = b, held, timeout

    def __bool__(self):
        return self._held

    def __eq__(self, other):
        return bool(self) == other if isinstance(other, (bool, int, _Locked)) else NotImplemented

    def __hash__(self):
        return hash(self._held)

    def __repr__(self):
        return repr(self._held)

    def __enter__(self):
        if not self._b.acquire(self._timeout):
            raise _Timeout("buffer '%s': the writer lock was not taken within %s s"
                           % (self._b.name, self._timeout))
        return self._b

    def __exit__(self, *exc):
        self._b.release()
        return False


def _client(client, device, path, timeout):
    """(client, own): the caller's, or a new connection this buffer owns."""
    if client is not None:
        return client, False
    return Client(device=device, path=path, timeout=timeout), True


def create(name, shape, dtype="float32", device="cpu", slots=1, framework="torch",
           path=None, server_device=0, timeout=None, readers=None):
    """Creates buffer `name` (1 to 64 of A-Z a-z 0-9 . _ -) of `slots`
    zero-filled frames of `shape` and `dtype` on `device` ("cpu", "cuda",
    "cuda:N", a torch.device or an ordinal), opened read-write. `path` /
    `server_device` pick the server socket as Client does. Raises
    InvalidArgumentError (a bad name, shape, dtype or slots; the name
    exists), LimitError, OutOfMemoryError (memory_budget).
    readers={"uids": [int], "gids": [int]} lets those uids (and callers in
    those groups) open it read-only (docs/protocol.md, "Owners"); other
    uids get NotFoundError."""
    dims = _shape_of(shape)
    grant = _errors.readers("buffer_create", readers)
    wire, code = dtype_of(dtype)
    dev = "cuda:%d" % device if isinstance(device, int) and not isinstance(device, bool) \
        else str(device)
    client, own = _client(None, server_device, path, timeout)
    arr = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    return Buffer._attach(client, own, framework, _l.st_buffer_create_ex, name.encode(),
                          dev.encode(), code, len(dims), arr, int(slots), grant)


def open(name, readonly=False, framework="torch", path=None, server_device=0, timeout=None):
    """Opens buffer `name` (NotFoundError when there is none), read-only
    when `readonly`: writes then raise InvalidArgumentError, and a write
    through a view faults in this process."""
    client, own = _client(None, server_device, path, timeout)
    return Buffer._attach(client, own, framework, _l.st_buffer_open, name.encode(),
                          1 if readonly else 0)


def unlink(name, path=None, server_device=0):
    """Unlinks buffer `name` without a handle of it."""
    with Client(device=server_device, path=path) as c:
        c._do(_l.st_buffer_unlink, name.encode())
