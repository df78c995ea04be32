"""Results as Python values, with as few crossings into the library as a
reply allows (docs/python.md, "What a call costs").

  - A reply is described by one struct (st_client_call_summary /
    st_result_summary): its kind, tensor count, object and identity.
  - Plain values come whole from st_result_marshal (the value in CPython's
    marshal format, read by marshal.loads); tensors stand there as (i,)
    and modules as ([i...], [names], metadata), replaced afterwards.
  - Every tensor's DLPack capsule comes from one st_result_dlpack_all.
  - A tensor on one of the call's own torch tensor arguments (a reply's
    {arg: i}) is that tensor object, or a view of it: no DLPack
    (targs.returned).
  - A result of an object this process already converted reuses the torch
    tensors of that conversion while they live: the cache holds them by
    weak reference, keyed by (server id, object id) and checked against
    the identity (addresses, dtypes, shapes, strides) of the new reply.
  - It holds the result they were converted from (one reference, while
    they live), by its address too: a `same` reply lends that very result
    (ST_CALL_LEND_SAME), so the call is answered with no further crossing.
"""
import collections
import ctypes
import functools
import marshal
import weakref

from . import _lib
from . import targs as _targs
from . import tensor as _tensor

_l = _lib.lib
_dlpack_all = _l.st_result_dlpack_all
_marshal = _l.st_result_marshal
_tensor_at = _l.st_result_tensor
_tensor_count = _l.st_result_tensor_count
_capsule = _lib.capsule
_returned = _targs.returned
_string_at = ctypes.string_at
_VOIDP = ctypes.c_void_p
_SIZE = ctypes.c_size_t

TENSOR, MODULE = _lib.ST_VALUE_TENSOR, _lib.ST_VALUE_MODULE


class Module(collections.OrderedDict):
    """A module result: name -> tensor in the server's order, plus
    `.metadata` (a dict)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.metadata = {}


# ------------------------------------------------------------- tensors

_torch_mod = None
_from_dlpack = None


def _torch():
    global _torch_mod, _from_dlpack
    if _torch_mod is None:
        torch = _tensor._torch()
        # A capsule goes straight to torch's C entry point when it has one.
        _from_dlpack = getattr(torch._C, "_from_dlpack", None) or torch.from_dlpack
        _torch_mod = torch
    return _torch_mod


def torch_tensors(res, n, mine=None):
    """The n tensors of `res` (a tensor.Result) as torch tensors: one
    library call exports them all. A tensor torch refuses this way (a
    dtype it lacks, bool on torch 1.13, a versioned capsule it does not
    take) goes through tensor.to_torch, which knows those cases, or stays
    a SharedTensor. mine: the call's torch tensor arguments (args.Args):
    a tensor on one of them is that tensor, or a view of it
    (targs.returned), with no DLPack; when every tensor is, nothing is
    exported."""
    _torch()
    out = None
    if mine:
        vp = _VOIDP(res.ptr)
        out = [_returned(vp, i, mine) for i in range(n)]
        for t in out:
            if t is None:   # (not `None in out`: a tensor's == is elementwise)
                break
        else:
            return out
    versioned = _tensor._torch_state["versioned"]
    ptrs = (_VOIDP * n)()
    _dlpack_all(res.ptr, 1 if versioned else 0, ptrs, n)
    if out is not None:
        for i, p in enumerate(ptrs):
            if out[i] is not None and p:
                _capsule(p, versioned)   # not taken: frees its export at once
                ptrs[i] = None
    else:
        out = [None] * n
    for i, p in enumerate(ptrs):
        if out[i] is not None:
            continue
        t = None
        if p:
            try:
                t = _from_dlpack(_capsule(p, versioned))
            except (TypeError, RuntimeError, BufferError, ValueError):
                t = None   # the refused capsule frees itself
        if t is None:
            t = _slow_tensor(res, i, "torch")
        out[i] = t
    return out


def _slow_tensor(res, i, framework):
    tptr = _tensor_at(res.ptr, i)
    st = _tensor.SharedTensor(res, tptr)
    if framework != "torch" or not _tensor.torch_knows(st.dtype):
        return st
    return _tensor.to_torch(res, tptr)


def tensors_of(res, n, framework, mine=None):
    if not n:
        return []
    if framework == "torch":
        return torch_tensors(res, n, mine)
    return [_tensor.SharedTensor(res, _tensor_at(res.ptr, i)) for i in range(n)]


# -------------------------------------------------------------- values

def _join(path, key):
    return "%s.%s" % (path, key) if path else str(key)


def _module(spec, tensors, path):
    indices, names, meta = spec
    prefix = path + "." if path else ""
    m = Module()
    for i, full in zip(indices, names):
        m[full[len(prefix):] if full.startswith(prefix) else full] = tensors[i]
    m.metadata = _place(meta, tensors, path) if meta is not None else {}
    return m


def _place(v, tensors, path):
    """v from marshal with its tensor and module tuples replaced."""
    t = type(v)
    if t is tuple:
        return tensors[v[0]] if len(v) == 1 else _module(v, tensors, path)
    if t is list:
        for i, x in enumerate(v):
            if type(x) in (tuple, list, dict):
                v[i] = _place(x, tensors, _join(path, i))
    elif t is dict:
        for k, x in v.items():
            if type(x) in (tuple, list, dict):
                v[k] = _place(x, tensors, _join(path, k))
    return v


def value_of(res, summary, framework, slow, mine=None):
    """The Python value of result `res` described by `summary`; `slow(res,
    framework)` converts node by node what marshal cannot carry. mine: the
    call's torch tensor arguments (torch_tensors)."""
    kind, n = summary.kind, summary.ntensors
    if kind == TENSOR and n == 1:
        return tensors_of(res, 1, framework, mine)[0]
    size = _SIZE()
    p = _marshal(res.ptr, ctypes.byref(size))
    if not p:
        return slow(res, framework)
    v = marshal.loads(_string_at(p, size.value))
    if not n:
        return v
    return _place(v, tensors_of(res, n, framework, mine), "")


def plain_value(res, slow):
    """value_of for a reply read without a summary (info, status, ...):
    one st_result_tensor_count instead of the summary struct."""
    n = _tensor_count(res.ptr)
    size = _SIZE()
    p = _marshal(res.ptr, ctypes.byref(size))
    if not p:
        return slow(res, "torch")
    v = marshal.loads(_string_at(p, size.value))
    return _place(v, tensors_of(res, n, "torch"), "") if n else v


# --------------------------------------------------------------- reuse

class _Slot:
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i


class _ModuleT:
    """A module's template: its names, the positions of its tensors, and
    the template of its metadata."""
    __slots__ = ("names", "slots", "metadata")

    def __init__(self, names, slots, metadata):
        self.names, self.slots, self.metadata = names, slots, metadata


def _template(v, index):
    """v with each tensor replaced by its _Slot (index: id -> position)."""
    t = type(v)
    if t is Module:
        slots = [index.get(id(x)) for x in v.values()]
        if None in slots:
            return v   # not reached: every module value is a tensor
        return _ModuleT(list(v.keys()), slots, _template(v.metadata, index))
    if t is list:
        return [_template(x, index) for x in v]
    if t is dict:
        return {k: _template(x, index) for k, x in v.items()}
    i = index.get(id(v))
    return _Slot(i) if i is not None else v


def _rebuild(v, tensors):
    """A fresh copy of template v with the live tensors in place."""
    t = type(v)
    if t is _Slot:
        return tensors[v.i]
    if t is _ModuleT:
        m = Module(zip(v.names, map(tensors.__getitem__, v.slots)))
        m.metadata = _rebuild(v.metadata, tensors)
        return m
    if t is list:
        return [_rebuild(x, tensors) for x in v]
    if t is dict:
        return {k: _rebuild(x, tensors) for k, x in v.items()}
    return v


class _Conversion:
    """What this process converted of one object: the template of the
    value, its torch tensors (weakly), the Result it was converted from
    (one reference, the memory's keeper for a `same` reply), and the
    Handle fields of that result."""
    __slots__ = ("key", "identity", "template", "refs", "single", "res", "fields",
                 "__weakref__")

    def value(self):
        """A new value of the live tensors; None when one of them died."""
        if self.single is not None:   # the value is that one tensor
            return self.single()
        tensors = [r() for r in self.refs]
        for t in tensors:
            if t is None:
                return None
        return _rebuild(self.template, tensors)


_reuse = {}   # (server id, object id) -> its last _Conversion
_held = {}    # st_result_t address -> the _Conversion holding a reference to it

# Kept results: the tensors of the last few cached (not managed) objects
# converted, held strongly after the caller dropped them, so that "drop
# and call again" is served like a kept result. (server id, object id) ->
# (tensors, bytes), least recently used first; bounded by keep_results.
_kept = collections.OrderedDict()
_kept_max, _kept_bytes_max, _kept_bytes = 8, 256 << 20, 0


def keep_results(n=8, nbytes=256 << 20):
    """Sets how many cached objects' converted tensors (at most n, nbytes
    of their objects' memory together) this process keeps after their
    last user dropped them (docs/python.md, "Kept results"); returns the
    previous (n, nbytes). keep_results(0, 0) drops the kept ones now and
    keeps none after."""
    global _kept_max, _kept_bytes_max
    if not isinstance(n, int) or not isinstance(nbytes, int) or n < 0 or nbytes < 0:
        raise ValueError("keep_results takes two integers >= 0")
    old = (_kept_max, _kept_bytes_max)
    _kept_max, _kept_bytes_max = n, nbytes
    _kept_trim()
    return old


def kept_results():
    """(count, bytes) of the results kept now."""
    return len(_kept), _kept_bytes


def _kept_trim():
    global _kept_bytes
    while _kept and (len(_kept) > _kept_max or _kept_bytes > _kept_bytes_max):
        _kept_bytes -= _kept.popitem(last=False)[1][1]


def _keep(key, tensors, fields):
    """Holds tensors (the conversion of object key) among the kept
    results, the most recently used, when the bound admits them."""
    global _kept_bytes
    nbytes = fields["bytes"]
    if fields["managed"] or not _kept_max or nbytes > _kept_bytes_max:
        return
    old = _kept.pop(key, None)
    if old is not None:
        _kept_bytes -= old[1]
    _kept[key] = (tensors, nbytes)
    _kept_bytes += nbytes
    _kept_trim()


def touch(key):
    """Marks the kept result of object key used (a reused conversion)."""
    if key in _kept:
        _kept.move_to_end(key)


def _forget(conv, _ref=None):
    """Drops conv from both maps and frees its reference (a tensor of it
    died, or a newer conversion of its object replaced it). Any thread."""
    try:
        if _reuse.get(conv.key) is conv:
            del _reuse[conv.key]
        res = conv.res
        if res is not None:
            conv.res = None
            if _held.get(res.ptr) is conv:
                del _held[res.ptr]
            res.close()
    except Exception:   # interpreter teardown: the modules are going
        pass


def reuse_get(key, identity, res):
    """A new value of the object `key` built from the tensors of its last
    conversion when they all live and `identity` matches, with that
    conversion's Handle fields; else None. On a hit the conversion takes
    over res (a tensor.Result of this reply: its reference) in place of
    the one it held, so that the connection that sent this reply finds it
    by address at its next `same` reply; res is then the caller's no
    more (res.ptr is None)."""
    conv = _reuse.get(key)
    if conv is None or conv.identity != identity:
        return None
    value = conv.value()
    if value is None:
        return None
    touch(key)
    old = conv.res
    if old is None or old.ptr != res.ptr:
        if old is not None and _held.get(old.ptr) is conv:
            del _held[old.ptr]
        conv.res = _tensor.Result(res.ptr)
        res.ptr = None
        if _held.get(conv.res.ptr) is None:
            _held[conv.res.ptr] = conv
        if old is not None:
            old.close()
    return value, conv.fields


def held(ptr):
    """The conversion holding a reference to the result at address ptr
    (a `same` reply lent that result: client.py), or None."""
    return _held.get(ptr)


def reuse_put(key, identity, value, tensors, res, fields):
    """Remembers value's tensors (weakly) for the next result of object
    key, and keeps res (a tensor.Result: its reference is taken over)
    while they all live. False, with res untouched, when a tensor takes no
    weak reference."""
    conv = _Conversion()
    drop = functools.partial(_forget, conv)
    try:
        refs = [weakref.ref(t, drop) for t in tensors]
    except TypeError:
        return False   # a tensor type without weak references: no reuse
    conv.key, conv.identity, conv.refs, conv.fields = key, identity, refs, fields
    conv.template = _template(value, {id(t): i for i, t in enumerate(tensors)})
    conv.single = refs[0] if type(conv.template) is _Slot else None
    conv.res = res
    _keep(key, tensors, fields)
    old = _reuse.get(key)
    _reuse[key] = conv
    old_held = _held.get(res.ptr)
    _held[res.ptr] = conv
    for o in (old, old_held):
        if o is not None and o is not conv:
            _forget(o)
    return True


def reuse_clear():
    """Forgets every remembered conversion and kept result (tests)."""
    global _kept_bytes
    _kept.clear()
    _kept_bytes = 0
    for conv in list(_reuse.values()) + list(_held.values()):
        _forget(conv)
