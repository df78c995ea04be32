"""Memory that endpoints can take as arguments: empty, zeros, empty_like,
zeros_like (docs/python.md, "Passing tensors to endpoints").

Each allocation is made by st_tensor_alloc (include/st/client.h): a sealed
memfd on the CPU, an exported VMM allocation on a GPU, always zero-filled.
It reaches the caller as
  - a torch tensor, through the DLPack path of results (the capsule holds
    a reference on the st_result_t, dropped by torch's deleter);
  - a numpy array, through __array_interface__: the array's base is a
    small object that holds the result, so the array is writable (numpy
    1.24 maps DLPack arrays read-only) and keeps its memory alive;
  - a SharedTensor (framework=None), for any other DLPack consumer.
Passing such a tensor (or any view of it) to Client.call / Client.submit
sends its descriptor; the endpoint writes into this very memory.
"""
import ctypes
import operator
import sys

from . import _lib
from . import tensor as _tensor
from .errors import from_library

_l = _lib.lib

FRAMEWORKS = ("torch", "numpy", None)


def dtype_of(dtype):
    """(wire name, library code) for a torch dtype, a numpy dtype (or
    anything numpy.dtype takes) or a wire name ("float32", "bf16", ...).
    TypeError for an element type sharedtensor does not have."""
    name = None
    if isinstance(dtype, str):
        name = dtype
    else:
        torch = sys.modules.get("torch")
        np = sys.modules.get("numpy")
        if torch is not None and isinstance(dtype, torch.dtype):
            name = str(dtype).rpartition(".")[2]
        elif np is not None:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = None
    code = _l.st_dtype_from_name(name.encode()) if name else 0
    if code == 0:
        raise TypeError("dtype %r: sharedtensor has no such element type (bool, uint8, uint16, "
                        "uint32, uint64, int8, int16, int32, int64, float16, bfloat16, "
                        "float32, float64, float8_e4m3fn, float8_e5m2)" % (dtype,))
    return _l.st_dtype_name(code).decode(), code


def _shape_of(shape):
    if isinstance(shape, int):
        shape = (shape,)
    try:
        dims = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError("shape must be an int or a sequence of ints, not %r" % (shape,)) from None
    if any(d < 0 for d in dims):
        raise ValueError("shape %s has a negative size" % (dims,))
    if len(dims) > 16:
        raise ValueError("shape %s has more than 16 dims" % (dims,))
    return dims


def _device_of(device):
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        return "cuda:%d" % device
    return str(device)   # "cpu", "cuda", "cuda:N", or a torch.device


class _Memory:
    """The base of a numpy array made by empty(): it holds the result (and
    so the mapping) while any array or view over it lives."""

    def __init__(self, result, ctensor, typestr):
        t = ctensor.contents
        self._result = result
        self.__array_interface__ = {
            "version": 3,
            "shape": tuple(t.shape[i] for i in range(t.ndim)),
            "typestr": typestr,
            "data": (t.data or 0, False),   # False: writable
            "strides": None,                # contiguous, row-major
        }


def empty(shape, dtype=None, device="cpu", framework="torch"):
    """A new contiguous tensor that endpoints can take as an argument, in
    memory shared with the server without a copy.

    shape: an int or a sequence of ints (at most 16 dims). dtype: a torch
    dtype, a numpy dtype or a wire name; default float32. device: "cpu",
    "cuda" (ordinal 0), "cuda:N" or a torch.device, ordinals of this
    process. framework: "torch" (a torch.Tensor), "numpy" (a writable
    numpy.ndarray; cpu only) or None (a SharedTensor). The memory is
    zero-filled (as every such allocation is: empty and zeros are one).

    Raises TypeError/ValueError for a malformed shape, dtype or framework,
    InvalidArgumentError for a bad device, CapabilityError without CUDA,
    OutOfMemoryError or LimitError when the memory cannot be had."""
    if framework not in FRAMEWORKS:
        raise ValueError('framework must be "torch", "numpy" or None')
    dims = _shape_of(shape)
    name, code = dtype_of("float32" if dtype is None else dtype)
    dev = _device_of(device)
    typestr = None
    if framework == "torch" and not _tensor.torch_knows(name):
        raise TypeError("this torch has no dtype %s: use framework=\"numpy\" or None" % name)
    if framework == "numpy":
        import numpy as np
        if dev != "cpu":
            raise ValueError("numpy arrays live on the cpu, not on %s" % dev)
        try:
            typestr = np.dtype(name).str
        except TypeError:
            raise TypeError("numpy has no dtype %s: use framework=None" % name) from None
    arr = (ctypes.c_int64 * max(len(dims), 1))(*dims)
    out = ctypes.c_void_p()
    err = ctypes.create_string_buffer(256)
    rc = _l.st_tensor_alloc(dev.encode(), code, len(dims), arr, ctypes.byref(out), err, 256)
    if rc != 0:
        raise from_library(rc, "empty: " + err.value.decode(errors="replace"))
    res = _tensor.Result(out.value)
    tptr = _l.st_result_tensor(res.ptr, 0)
    if framework is None:
        return _tensor.SharedTensor(res, tptr)
    if framework == "numpy":
        import numpy as np
        return np.asarray(_Memory(res, tptr, typestr))
    try:
        return _tensor.to_torch(res, tptr)
    finally:
        res.close()   # the torch tensor holds its own reference


def zeros(shape, dtype=None, device="cpu", framework="torch"):
    """empty(): the memory of every allocation starts zeroed."""
    return empty(shape, dtype=dtype, device=device, framework=framework)


def _like(t, dtype, device, framework):
    torch = sys.modules.get("torch")
    np = sys.modules.get("numpy")
    if torch is not None and isinstance(t, torch.Tensor):
        kind = ("torch", tuple(t.shape), t.dtype, t.device)
    elif np is not None and isinstance(t, np.ndarray):
        kind = ("numpy", t.shape, t.dtype, "cpu")
    elif isinstance(t, _tensor.SharedTensor):
        kind = (None, t.shape, t.dtype, t.device)
    else:
        raise TypeError("empty_like: expected a torch tensor, a numpy array or a SharedTensor, "
                        "not %s" % type(t).__name__)
    fw, shape, dt, dev = kind
    return empty(shape, dtype=dt if dtype is None else dtype,
                 device=dev if device is None else device,
                 framework=fw if framework == "same" else framework)


def empty_like(t, dtype=None, device=None, framework="same"):
    """empty() with t's shape, dtype, device and kind (torch tensor, numpy
    array or SharedTensor) unless given: always contiguous, whatever t's
    strides. `sharedtensor.empty_like(t).copy_(t)` makes a passable copy of
    any torch tensor."""
    return _like(t, dtype, device, framework)


def zeros_like(t, dtype=None, device=None, framework="same"):
    """empty_like(): the memory starts zeroed."""
    return _like(t, dtype, device, framework)
