"""Published keys (docs/keys.md; docs/python.md, "Published keys"): the
calls behind Client.put, Client.get, Client.keys and Client.delete.

A value is a tensor, or a mapping of names to tensors and plain values (a
state dict: what Module.state_dict() returns). Tensors from
sharedtensor.empty/zeros are adopted by the server without a copy; any
other tensor is copied once by the library into a fresh allocation. A lone
tensor travels as the map {"__tensor__": t} and comes back as the tensor.
"""
import collections
import ctypes
import sys

from . import _lib
from . import errors as _errors
from . import targs as _targs
from .args import _put as _put_plain

_l = _lib.lib
_LONE = "__tensor__"
POLICIES = {"pinned": 0, "evictable": 1}
_POLICIES = POLICIES
_PUT_READONLY = 1
_PUT_LIVE = 2
_GET_READONLY = 1


class StateDict(collections.OrderedDict):
    """What get() returns for a mapping: name -> tensor (and plain values)
    in the order they were put, plus `.key` and `.version` (the version
    this is)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key = None
        self.version = 0


def _items(value):
    if _targs.kind_of(value) is not None:
        return [(_LONE, value)]
    if isinstance(value, collections.abc.Mapping):
        return list(value.items())
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return list(value.state_dict().items())
    raise TypeError("put: the value must be a tensor or a mapping of names to tensors (a "
                    "state dict), not %s" % type(value).__name__)


def _fill(p, value):
    """Sets every member of value on the st_args_t p; the CUDA ordinals to
    synchronize and the names that were copied."""
    cuda, copied = set(), []
    for k, v in _items(value):
        if not isinstance(k, str):
            raise TypeError("put: member names must be str, not %s" % type(k).__name__)
        kind = _targs.kind_of(v)
        if kind is None:
            _put_plain(p, k.encode(), v)
            continue
        ordinal, was_copied = _targs.add_copy(p, k, v, kind)
        if ordinal is not None:
            cuda.add(ordinal)
        if was_copied:
            copied.append(k)
    return cuda, copied


def put(client, key, value, policy="pinned", readonly=False, live=False, readers=None):
    """See Client.put."""
    _errors.choice("put", "policy", policy, tuple(_POLICIES))
    grant = _errors.readers("put", readers)
    readonly = _errors.flag("put", "readonly", readonly)
    if isinstance(live, str):
        raise _errors.BY_NAME["INVALID_ARGUMENT"](
            "put: live must be True or False, not %r (double buffering, live=\"double\", "
            "is not built: docs/views.md)" % (live,))
    live = _errors.flag("put", "live", live)
    p = _l.st_args_new()
    if not p:
        raise MemoryError("st_args_new")
    try:
        cuda, _ = _fill(p, value)
        _targs.synchronize(cuda)
        version = ctypes.c_uint64()
        client._do(_l.st_client_put_ex, key.encode(), p, _POLICIES[policy],
                   (_PUT_READONLY if readonly else 0) | (_PUT_LIVE if live else 0), grant,
                   ctypes.byref(version))
        return version.value
    finally:
        _l.st_args_free(p)


def get(client, key, version=None, readonly=False, with_version=False, as_torch=None,
        view=None, have=0):
    """See Client.get. `have`: the version the caller already holds
    (st_client_get_since): when the request still resolves to it the value
    is None and nothing is mapped."""
    out, got = ctypes.c_void_p(), ctypes.c_uint64()
    readonly = _errors.flag("get", "readonly", readonly)
    with_version = _errors.flag("get", "with_version", with_version)
    if as_torch is not None:
        _errors.flag("get", "as_torch", as_torch)
    if view is not None and not isinstance(view, str):
        raise TypeError("get: view must be a str (a view spec), not %s" % type(view).__name__)
    with client._lock:
        rc = _l.st_client_get_since(client._ptr or client._h(), key.encode(), int(version or 0),
                                    _GET_READONLY if readonly else 0,
                                    None if view is None else view.encode(), have,
                                    ctypes.byref(out), ctypes.byref(got))
        if rc != 0:
            client._fail(rc)
    if not out.value:
        return (None, got.value) if with_version else None
    summary = _lib.ResultSummary()
    _l.st_result_summary(out.value, ctypes.byref(summary))
    value = client._wrap(out.value, summary, as_torch)
    if isinstance(value, dict):
        if len(value) == 1 and _LONE in value:
            value = value[_LONE]
        else:
            sd = StateDict(value)
            sd.key, sd.version = key, got.value
            value = sd
    return (value, got.value) if with_version else value


def keys(client, prefix=None):
    """See Client.keys."""
    return client._value_call(_l.st_client_keys, None if prefix is None else prefix.encode())


def delete(client, key):
    """See Client.delete."""
    client._do(_l.st_client_delete, key.encode())
