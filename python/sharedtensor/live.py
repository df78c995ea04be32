"""Live keys (docs/views.md, section 3): a
key put with live=True is updated in place, so the tensors readers hold
keep their addresses while the values behind them change.

    # publisher
    c.put("policy", model.state_dict(), live=True)
    c.update("policy", new_state)               # copies in place, by name
    with c.updating("policy") as t:             # or write the tensors yourself
        t["w"].mul_(0.5)

    # reader
    b = c.bind(model, "policy")                 # parameters point at the key
    b.wait_version(b.version + 1, timeout=5)
    for attempt in b.consistent():              # re-runs on a torn read
        with attempt:
            y = model(x)

A LiveKey is the handle (st_key_t of include/st/client.h); a Binding is a
module bound to one.
"""
import contextlib
import ctypes
import sys

from . import _lib
from . import into as _into
from . import errors as _errors
from .errors import from_library

_l = _lib.lib
_GET_READONLY = 1
_LONE = "__tensor__"


def _check(rc):
    if rc != 0:
        raise from_library(rc, (_l.st_key_error(None) or b"").decode(errors="replace"))


def _ms(timeout):
    return -1 if timeout is None else int(max(0.0, timeout) * 1000)


class LiveKey:
    """An open live key: `tensors` (name -> torch tensor, mapped once: their
    data_ptr never changes), `version`, and the reads and updates. The
    handle publishes (`publisher` is True) when its client's connection
    put the key; every other handle maps the key read-only."""

    def __init__(self, client, key, readonly=False, view=None):
        out = ctypes.c_void_p()
        readonly = _errors.flag("live", "readonly", readonly)
        if view is not None and not isinstance(view, str):
            raise TypeError("live: view must be a str (a view spec), not %s"
                            % type(view).__name__)
        with client._lock:
            rc = _l.st_key_open_view(client._h(), key.encode(),
                                     _GET_READONLY if readonly else 0,
                                     None if view is None else view.encode(), ctypes.byref(out))
        _check(rc)
        self._k = out.value
        self.key = key
        self.view = view
        self.publisher = bool(_l.st_key_is_publisher(self._k))
        self._open_update = False
        r = _l.st_key_result(self._k)
        _l.st_result_ref(r)
        summary = _lib.ResultSummary()
        _l.st_result_summary(r, ctypes.byref(summary))
        value = client._wrap(r, summary, True)
        if not isinstance(value, dict):
            value = {_LONE: value}
        self.tensors = {k: v for k, v in value.items() if hasattr(v, "data_ptr")}
        cuda = [t.device for t in self.tensors.values() if t.is_cuda]
        self.device = cuda[0] if cuda else None
        self._plan = _into.plan_of(self.tensors)   # update's copies by address
        self._ranges = ()                            # the last update's Ranges

    def close(self):
        k, self._k = self._k, None
        if k:
            _l.st_key_close(k)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _h(self):
        if not self._k:
            raise ValueError("the live key handle is closed")
        return self._k

    def _stream(self):
        """torch's current stream of the key's device (None: the CPU, or
        the default stream, for which the whole context is synchronized)."""
        if self.device is None:
            return None
        return _into.raw_stream(self.device) or None

    @property
    def version(self):
        """The last complete version."""
        return _l.st_key_version(self._h())

    def wait_version(self, version, timeout=None):
        """Waits until the version is at least `version` (timeout in seconds;
        None: no limit); returns it. TimeoutError, StaleHandleError (torn),
        NotFoundError (deleted)."""
        got = ctypes.c_uint64()
        _check(_l.st_key_wait_version(self._h(), version, _ms(timeout), ctypes.byref(got)))
        return got.value

    def read_begin(self, timeout=None):
        """The even sequence word a consistent read starts from (waits while
        an update runs)."""
        seq = ctypes.c_uint64()
        _check(_l.st_key_read_begin(self._h(), _ms(timeout), ctypes.byref(seq)))
        return seq.value

    def read_end(self, seq):
        """True when no update began since read_begin gave `seq`. On CUDA it
        first synchronizes torch's current stream (the GPU fence)."""
        ok = ctypes.c_int()
        _check(_l.st_key_read_end(self._h(), seq, self._stream(), ctypes.byref(ok)))
        return bool(ok.value)

    def begin_update(self):
        """Starts an update (publisher only): readers see the key updating
        until end_update."""
        _check(_l.st_key_begin_update(self._h()))
        self._open_update = True

    def end_update(self):
        """Ends the update: synchronizes torch's current stream (CUDA), then
        publishes the next version and wakes waiters. Returns it."""
        _check(_l.st_key_end_update(self._h(), self._stream()))
        self._open_update = False
        return self.version

    def check(self, tensors):
        """Raises ValueError listing every name, shape and dtype of
        `tensors` (a mapping) that does not match the key's."""
        bad = []
        for name, t in tensors.items():
            mine = self.tensors.get(name)
            if mine is None:
                bad.append("%r: no such tensor in key %r" % (name, self.key))
            elif mine.shape != t.shape or mine.dtype != t.dtype:
                bad.append("%r: the key has %s %s, the update gives %s %s" % (
                    name, mine.dtype, tuple(mine.shape), t.dtype, tuple(t.shape)))
        if bad:
            raise ValueError("update of live key %r: %s" % (self.key, "; ".join(bad)))

    @contextlib.contextmanager
    def updating(self):
        """`with key.updating() as t:` write t[name] in place (on the current
        stream); the update ends when the block does. A block that raises
        leaves the update open: readers keep waiting, and the next update
        completes it."""
        if not self._open_update:
            self.begin_update()
        yield self.tensors
        self.end_update()

    def update(self, tensors):
        """Copies `tensors` (name -> tensor; a Module's state_dict, numpy
        arrays too) into the key in place, as one update; every name, shape
        and dtype is checked first. Returns the new version.

        Every tensor of the key, each contiguous on the key's device: the
        check is one pass and the copies go by address (st_copy_ranges,
        tensors that follow each other on both sides as one copy).
        Otherwise each is a copy_ (host sources, other layouts)."""
        sig = _into.signature(tensors)
        r = _into.prepared(self._ranges, sig)
        if r is None:
            torch = sys.modules["torch"]
            tensor = torch.Tensor
            src = {k: v if isinstance(v, tensor) else torch.as_tensor(v)
                   for k, v in (tensors if hasattr(tensors, "items") else dict(tensors)).items()}
            fast = _into.ranges(self._plan, src)
            self._ranges = ()
            if fast is None:
                self.check(src)
            else:
                device, theirs, mine, sizes = fast
                r = _into.Ranges(device, mine, theirs, sizes, sig)
                self._ranges = (r,)
        with self.updating() as t:
            if r is not None:
                r.run()
            else:
                for name, v in src.items():
                    t[name].copy_(v, non_blocking=True)
        return self.version


class Attempt:
    """One try of Binding.consistent(): `with attempt:` runs the block
    between the two sequence reads; `ok` says whether it read one version,
    `version` which."""

    def __init__(self, live, timeout):
        self._live = live
        self._timeout = timeout
        self.entered = False
        self.ok = False
        self.version = 0

    def __enter__(self):
        self.entered = True
        self._seq = self._live.read_begin(self._timeout)
        self.version = self._seq // 2
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.ok = self._live.read_end(self._seq)
        return False


class Binding:
    """A module whose parameters (and buffers) are the tensors of a live
    key: their .data is the key's memory, so every update shows in the
    next forward pass without a copy."""

    def __init__(self, module, live):
        self.module = module
        self.live = live
        targets = dict(module.named_parameters())
        targets.update(module.named_buffers())
        bad = []
        for name in targets:
            if name not in live.tensors and name in dict(module.named_parameters()):
                bad.append("parameter %r is not in key %r" % (name, live.key))
        for name, t in live.tensors.items():
            p = targets.get(name)
            if p is None:
                bad.append("key tensor %r is no parameter or buffer of the module" % name)
            elif tuple(p.shape) != tuple(t.shape) or p.dtype != t.dtype:
                bad.append("%r: the module has %s %s, the key %s %s" % (
                    name, p.dtype, tuple(p.shape), t.dtype, tuple(t.shape)))
        if bad:
            raise ValueError("bind to live key %r: %s" % (live.key, "; ".join(bad)))
        self._targets = {name: targets[name] for name in live.tensors}
        self.refresh()

    @property
    def version(self):
        """The key's last complete version."""
        return self.live.version

    def wait_version(self, version, timeout=None):
        """Waits until the key's version is at least `version`; returns it."""
        return self.live.wait_version(version, timeout)

    def refresh(self):
        """Points every bound parameter at the key's tensor again (after
        code that replaced a .data); returns the version."""
        for name, p in self._targets.items():
            t = self.live.tensors[name]
            if p.data_ptr() != t.data_ptr():
                p.data = t
        return self.version

    def consistent(self, timeout=None, attempts=None):
        """Attempts until one reads a single version:

            for attempt in binding.consistent():
                with attempt:
                    y = model(x)

        Each attempt waits while an update runs, runs the block, then
        synchronizes torch's current stream (the GPU fence: the block's
        kernels have read the memory) and checks that no update began
        meanwhile; a torn attempt is followed by another. `attempts` (None:
        no limit) bounds them (TimeoutError after the last torn one);
        StaleHandleError when the key is torn by a dead publisher."""
        n = 0
        while True:
            a = Attempt(self.live, timeout)
            yield a
            if not a.entered:
                raise RuntimeError("consistent(): run the block inside `with attempt:`")
            if a.ok:
                return
            n += 1
            if attempts is not None and n >= attempts:
                from .errors import TimeoutError as _Timeout
                raise _Timeout("live key %r: %d reads were all torn by updates" % (
                    self.live.key, n))

    def read(self, fn, timeout=None):
        """fn() inside consistent(): its result from a read of one version."""
        for attempt in self.consistent(timeout):
            with attempt:
                out = fn()
        return out
