"""Tensor arguments: a torch tensor, a numpy array or a SharedTensor as an
st_tensor_t for st_args_tensor (include/st/client.h).

The struct is filled from the object's own geometry (data pointer of the
first element, shape, strides in elements, dtype, device), so any view
(a slice, a transpose, a storage offset) goes as it is. The library checks
that the bytes lie inside one allocation of st_tensor_alloc
(sharedtensor.empty) and refuses anything else.

A torch tensor's struct is kept while the tensor lives (Described, by the
tensor's id and a weak reference to it) and used again while the
tensor's geometry (data pointer, shape, strides, dtype, device) is what
it was: a call with the same tensor builds nothing. The struct describes
the tensor only; the library finds its allocation afresh at each
st_args_tensor, so memory freed and reused (by this tensor, after a
set_, or by another tensor at the same address) is always found as it
is now.

A result that is one of the call's own tensor arguments (the reply names
it by {arg: i}: docs/protocol.md, "Tensor arguments") lies on the
caller's memory at the caller's address; returned() gives the caller's
torch tensor itself for it (the library compares the result's tensor
with the kept struct: one crossing), or a view of it for a window.
"""
import ctypes
import sys
import weakref

from . import _lib
from . import tensor as _tensor
from .errors import BY_NAME, from_library

InvalidArgumentError = BY_NAME["INVALID_ARGUMENT"]

_l = _lib.lib
_P64 = ctypes.POINTER(ctypes.c_int64)
# The per-call entry takes ctypes objects only (_lib.unchecked).
_args_tensor = _lib.unchecked("st_args_tensor")
_tensor_is = _lib.unchecked("st_result_tensor_is")
_tensor_at = _lib.unchecked("st_result_tensor")
_NO_ERR = _ZERO = ctypes.c_size_t(0)

_COPY_ROUTE = {
    "torch": "sharedtensor.empty_like(t).copy_(t)",
    "numpy": "b = sharedtensor.empty_like(a); b[...] = a",
    "shared": "sharedtensor.empty_like(t.torch()).copy_(t.torch())",
}


def kind_of(v):
    """"torch", "numpy" or "shared" when v is a tensor this package can
    send, else None (a plain value). Never imports a framework."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        return "torch"
    np = sys.modules.get("numpy")
    if np is not None and isinstance(v, np.ndarray):
        return "numpy"
    if isinstance(v, _tensor.SharedTensor):
        return "shared"
    return None


_codes = {}   # dtype name -> (st_dtype_t code, element size), as the library says


def _code(key, name):
    got = _codes.get(name)
    if got is None:
        code = _l.st_dtype_from_name(name.encode())
        if code == 0:
            raise TypeError("argument %r: dtype %s cannot be sent" % (key, name))
        got = _codes[name] = (code, _l.st_dtype_size(code))
    return got


def _fill(code, ptr, shape, strides, cuda_index):
    """A Tensor struct and the array its shape and strides point into (keep
    both alive until st_args_tensor returns); code: _code's pair."""
    code, size = code
    n = len(shape)
    dims = (ctypes.c_int64 * max(2 * n, 1))(*shape, *strides)
    numel = 1
    for s in shape:
        numel *= s
    t = _lib.Tensor()
    t.name = b""
    t.data = ptr
    t.dtype = code
    t.ndim = n
    t.shape = ctypes.cast(dims, _P64)
    t.strides = ctypes.cast(ctypes.addressof(dims) + 8 * n, _P64)
    t.numel = numel
    t.nbytes = numel * size
    t.device = _tensor.DEVICE_CUDA if cuda_index is not None else _tensor.DEVICE_CPU
    t.device_index = -1 if cuda_index is None else cuda_index
    t.device_uuid = b""
    return t, dims


def _from_torch(key, v):
    torch = sys.modules["torch"]
    if v.layout != torch.strided:
        raise TypeError("argument %r: a %s tensor cannot be sent, only dense (strided) ones"
                        % (key, v.layout))
    if v.device.type not in ("cpu", "cuda"):
        raise TypeError("argument %r: a tensor on %s cannot be sent (cpu and cuda only)"
                        % (key, v.device))
    for lazy in ("is_neg", "is_conj"):
        if getattr(v, lazy, None) is not None and getattr(v, lazy)():
            raise ValueError("argument %r: the tensor has a lazy %s bit: its memory does not "
                             "hold its values (resolve it first)" % (key, lazy[3:]))
    code = _code(key, str(v.dtype).rpartition(".")[2])
    cuda = None
    if v.device.type == "cuda":
        cuda = v.device.index if v.device.index is not None else torch.cuda.current_device()
    return _fill(code, v.data_ptr(), tuple(v.shape), tuple(v.stride()), cuda), cuda


def _from_numpy(key, v):
    if not v.dtype.isnative:
        raise TypeError("argument %r: a non-native byte order (%s) cannot be sent"
                        % (key, v.dtype.str))
    code = _code(key, v.dtype.name)
    size = v.itemsize
    if any(s % size for s in v.strides):
        raise ValueError("argument %r: strides %s (bytes) are not whole elements of %d bytes"
                         % (key, v.strides, size))
    strides = tuple(s // size for s in v.strides)
    return _fill(code, v.__array_interface__["data"][0], v.shape, strides, None), None


class Described:
    """A torch tensor's st_tensor_t (`t`, with `ref_t`, its byref, and
    `keep`, the array its shape and strides point into), kept for the next
    call that passes the same tensor object: `geometry` (data pointer,
    shape, strides, dtype, device) says whether it still describes it.
    `cuda`: the CUDA ordinal or None. For the windows of returned():
    `data`, `code`, `where` (device kind and index), `esize`; `plain`: a
    torch.Tensor itself, not a subclass (only those are viewed)."""
    __slots__ = ("ref", "geometry", "t", "ref_t", "keep", "cuda", "data", "code", "where",
                 "esize", "plain")


# id(tensor) -> its Described, while the tensor lives (the weak
# reference's callback drops it); each entry is checked against its
# tensor (the same object, the same geometry) before it is used.
_described = {}


def _forget(i, ref, described=_described):
    """Drops the entry of the tensor whose id was i (dead now), unless a
    newer tensor of that id has one already."""
    e = described.get(i)
    if e is not None and e.ref is ref:
        described.pop(i, None)


def _geometry(v):
    return (v.data_ptr(), v.shape, v.stride(), v.dtype, v.device)


def described(key, v):
    """The Described of torch tensor v (key: the argument's name, for the
    errors of what cannot be described)."""
    e = _described.get(id(v))
    if e is not None and e.ref() is v and e.geometry == _geometry(v):
        return e
    (t, keep), cuda = _from_torch(key, v)   # checks first what cannot go
    geometry = _geometry(v)
    e = Described()
    e.geometry, e.t, e.ref_t, e.keep, e.cuda = geometry, t, ctypes.byref(t), keep, cuda
    e.data, e.code, e.esize = t.data, t.dtype, v.element_size()
    e.where = (t.device, t.device_index)
    e.plain = type(v) is sys.modules["torch"].Tensor
    i = id(v)
    try:
        e.ref = weakref.ref(v, lambda r, i=i, forget=_forget: forget(i, r))
    except TypeError:
        return e   # no weak reference: described afresh each call
    _described[i] = e
    return e


def add(args_ptr, key, v, kind, mine=None):
    """Sets argument `key` of the st_args_t at args_ptr (a c_void_p) to
    tensor v (kind from kind_of). Returns the CUDA ordinal whose work must
    be synchronized before the request goes (v is a torch CUDA tensor),
    else None; appends (v, its Described) to `mine` (a list, or None) for
    returned(). Raises InvalidArgumentError naming the way out when v's
    memory is not from sharedtensor.empty, TypeError/ValueError for what
    cannot be described."""
    kb = key.encode()
    if kind == "torch":
        e = described(key, v)
        # No message asked for: the call is made again for one on a refusal.
        if _args_tensor(args_ptr, kb, e.ref_t, None, _NO_ERR) == 0:
            if mine is not None:
                mine.append((v, e))
            return e.cuda
        ref, keep, cuda = e.ref_t, None, e.cuda
    elif kind == "shared":
        if not v._result.ptr:
            raise ValueError("argument %r: the result of this tensor was closed" % key)
        ref, keep, cuda = v._t, None, None
    else:
        (t, keep), cuda = _from_numpy(key, v)
        ref = ctypes.byref(t)
    device = "cpu" if cuda is None else "cuda:%d" % cuda
    if kind == "shared":
        device = v.device
    err = ctypes.create_string_buffer(512)
    rc = _l.st_args_tensor(args_ptr, kb, ref, err, 512)
    if rc != 0 and not _l.st_tensor_is_shareable(ref):
        _not_shareable(key, v, kind, device)
    del keep
    if rc != 0:
        raise from_library(rc, err.value.decode(errors="replace"))
    if kind == "torch" and mine is not None:
        mine.append((v, e))
    return cuda


def returned(res, i, mine):
    """The caller's own torch tensor that tensor i of result `res` (a
    c_void_p) is (st_result_tensor_is: the same address and geometry),
    or, for a window of a plain torch.Tensor's storage, a view of it
    (as_strided, detached from autograd); None when it lies on none of
    them (or the view cannot be had: another dtype, an offset that is not
    whole elements, bytes outside the tensor's storage). mine: (tensor,
    Described) of the call's torch tensor arguments (add())."""
    ci = _ZERO if i == 0 else ctypes.c_size_t(i)
    for v, e in mine:
        if _tensor_is(res, ci, e.ref_t):
            return v
    t = _tensor_at(res, ci).contents
    data = t.data
    if not data:
        return None
    where = (t.device, t.device_index)
    n = t.ndim
    for v, e in mine:
        if e.where != where or e.code != t.dtype or not e.plain or not e.data:
            continue
        base = e.data - v.storage_offset() * e.esize
        offset, rem = divmod(data - base, e.esize)
        if offset < 0 or rem:
            continue
        if v.requires_grad:
            v = v.detach()
        try:
            # Checked by torch against the storage's bounds.
            return v.as_strided(t.shape[:n], t.strides[:n], offset)
        except (RuntimeError, ValueError):
            continue
    return None


def _not_shareable(key, v, kind, device):
    """Raises InvalidArgumentError naming the way out for tensor v (of
    `kind`, on `device`), whose memory is not from sharedtensor.empty."""
    if kind == "torch" and device == "cpu" and v.is_shared():
        raise InvalidArgumentError(
            "argument %r: this tensor lives in torch's own shared memory, not in "
            "sharedtensor's: torch.multiprocessing moves every CPU tensor put on its "
            "queues there (share_memory_), also one from sharedtensor.empty. Allocate "
            "the argument with sharedtensor.empty in the process that makes the call "
            "(and copy into it), or pass the producer's tensor to the endpoint from "
            "the producer itself (docs/python.md, 'torch.multiprocessing')" % key)
    raise InvalidArgumentError(
        "argument %r: this %s tensor's memory was not allocated by sharedtensor (a "
        "framework's own allocation, or a result of a call, which is the server's memory); "
        "only memory from sharedtensor.empty/zeros passes to an endpoint, without a copy: "
        "allocate it with sharedtensor.empty(...) or copy it: %s"
        % (key, device, _COPY_ROUTE[kind]))


def add_copy(args_ptr, key, v, kind):
    """As add(), but memory that is not from sharedtensor.empty is copied
    once into a fresh allocation by the library (st_args_tensor_copy; a
    CUDA tensor is made contiguous first). Returns (CUDA ordinal or None,
    whether it was copied)."""
    if kind == "torch" and v.device.type == "cuda" and not v.is_contiguous():
        v = v.contiguous()
    if kind == "shared":
        if not v._result.ptr:
            raise ValueError("argument %r: the result of this tensor was closed" % key)
        ref, keep, cuda = v._t, None, None
    else:
        (t, keep), cuda = _from_torch(key, v) if kind == "torch" else _from_numpy(key, v)
        ref = ctypes.byref(t)
    copied = ctypes.c_int()
    err = ctypes.create_string_buffer(512)
    if cuda is not None:
        synchronize({cuda})   # the copy reads the caller's memory
    rc = _l.st_args_tensor_copy(args_ptr, key.encode(), ref, ctypes.byref(copied), err, 512)
    del keep
    if rc != 0:
        raise from_library(rc, err.value.decode(errors="replace"))
    return cuda, bool(copied.value)


def synchronize(ordinals):
    """Waits for every stream of this process on those CUDA devices, so the
    server (which reads as soon as the request arrives) sees the caller's
    writes."""
    if ordinals:
        torch = sys.modules["torch"]
        for i in sorted(ordinals):
            torch.cuda.synchronize(i)
