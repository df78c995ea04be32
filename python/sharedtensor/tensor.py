"""Tensors of a result: SharedTensor (any DLPack consumer) and torch tensors.

A Result owns one st_result_t reference. Every DLPack export takes one
more (st_tensor_dlpack), released by the consumer through the C deleter,
so a framework tensor keeps its mapping alive on its own after the Result
is gone.
"""
import threading

from . import _lib
from .errors import BY_NAME

_lib_ = _lib.lib

DEVICE_CPU, DEVICE_CUDA = _lib.ST_DEVICE_CPU, _lib.ST_DEVICE_CUDA
_BOOL = None   # set below from the library's dtype names
KDL_CPU, KDL_CUDA = 1, 2


class Result:
    """An owned st_result_t*; freed by close() or when garbage collected."""

    __slots__ = ("ptr", "__weakref__")

    def __init__(self, ptr):
        self.ptr = ptr

    def close(self):
        p, self.ptr = self.ptr, None
        if p:
            _lib_.st_result_free(p)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter teardown
            pass


def export(result, ctensor, versioned, bool_as_uint8=False):
    """A fresh DLPack capsule for `ctensor` of `result` (keeps it alive)."""
    if not result.ptr:
        raise ValueError("the result of this tensor was closed")
    ptr = _lib_.st_tensor_dlpack(result.ptr, ctensor, 1 if versioned else 0)
    if not ptr:
        raise BY_NAME["OUT_OF_MEMORY"]("cannot export tensor %r through DLPack"
                                       % ctensor.contents.name.decode())
    if bool_as_uint8 and not versioned:
        _lib.retag_bool_as_uint8(ptr)
    return _lib.capsule(ptr, versioned)


class SharedTensor:
    """A mapped tensor of a result, for any DLPack consumer.

    `__dlpack__` / `__dlpack_device__` follow the array API: torch, numpy,
    cupy and jax take it with their from_dlpack. Attributes: name, dtype
    (wire name, "float32"), shape, strides (elements), device ("cpu" or
    "cuda:N"), data_ptr, nbytes. No copy is ever made: writes through any
    consumer are seen by every process mapping the same object.
    """

    def __init__(self, result, ctensor):
        self._result = result
        self._t = ctensor
        t = ctensor.contents
        self.name = t.name.decode()
        self.dtype = _lib_.st_dtype_name(t.dtype).decode()
        self.shape = tuple(t.shape[i] for i in range(t.ndim))
        self.strides = tuple(t.strides[i] for i in range(t.ndim))
        self.numel = t.numel
        self.nbytes = t.nbytes
        self.data_ptr = t.data or 0
        if t.device == DEVICE_CUDA:
            self.device = "cuda:%d" % t.device_index
            self._dl_device = (KDL_CUDA, t.device_index)
        else:
            self.device = "cpu"
            self._dl_device = (KDL_CPU, 0)
        self.device_uuid = t.device_uuid.decode()

    def __repr__(self):
        return "SharedTensor(%r, dtype=%s, shape=%s, device=%s)" % (
            self.name, self.dtype, list(self.shape), self.device)

    def __dlpack_device__(self):
        return self._dl_device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A capsule: "dltensor_versioned" when the consumer allows DLPack 1.x
        (max_version >= (1, 0)), else a legacy "dltensor". `stream` is
        ignored: the server synchronized before replying, the memory is
        ready on every stream."""
        if copy:
            raise BufferError("sharedtensor exports without copying (copy=True refused)")
        if dl_device is not None and tuple(dl_device) != self._dl_device:
            raise BufferError("tensor is on %s, not on DLPack device %r"
                              % (self.device, tuple(dl_device)))
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return export(self._result, self._t, versioned)

    def torch(self):
        """This tensor as a torch.Tensor sharing the memory."""
        return to_torch(self._result, self._t)


def _dtype_code(name):
    for i in range(1, 64):
        n = _lib_.st_dtype_name(i)
        if n is None:
            break
        if n.decode() == name:
            return i
    return -1


_BOOL = _dtype_code("bool")

# ----------------------------------------------------------------- torch

_torch_state = {"checked": False, "versioned": False, "bool": True}
_torch_lock = threading.Lock()


def _torch():
    import torch
    if not _torch_state["checked"]:
        with _torch_lock:
            parts = torch.__version__.split("+")[0].split(".")
            try:
                major, minor = int(parts[0]), int(parts[1])
            except (ValueError, IndexError):
                major, minor = 0, 0
            _torch_state["versioned"] = (major, minor) >= (2, 1)
            _torch_state["checked"] = True
    return torch


def torch_knows(dtype_name):
    """Whether the installed torch has a dtype of this wire name."""
    torch = _torch()
    return hasattr(torch, dtype_name) and isinstance(getattr(torch, dtype_name), torch.dtype)


def to_torch(result, ctensor):
    """torch.from_dlpack on a capsule of `ctensor`: versioned when the torch
    takes DLPack 1.x, legacy otherwise or when a versioned one is refused
    (the refused capsule frees itself: its destructor runs the deleter)."""
    torch = _torch()
    if _torch_state["versioned"]:
        try:
            return torch.from_dlpack(export(result, ctensor, True))
        except (TypeError, RuntimeError, BufferError, ValueError):
            t = torch.from_dlpack(export(result, ctensor, False))
            _torch_state["versioned"] = False   # the version was refused
            return t
    if ctensor.contents.dtype == _BOOL and not _torch_state["bool"]:
        return _bool_via_uint8(torch, result, ctensor)
    try:
        return torch.from_dlpack(export(result, ctensor, False))
    except RuntimeError:
        if ctensor.contents.dtype != _BOOL:
            raise
        _torch_state["bool"] = False   # a torch without kDLBool (1.13)
        return _bool_via_uint8(torch, result, ctensor)


def _bool_via_uint8(torch, result, ctensor):
    # Same bytes, reinterpreted: still no copy.
    return torch.from_dlpack(export(result, ctensor, False, True)).view(torch.bool)
