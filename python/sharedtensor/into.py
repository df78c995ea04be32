"""get_into: loads a key's (or a result's) tensors into torch tensors the
caller owns (docs/views.md, section 2; docs/python.md): the call behind
Client.get_into.

Every name, shape and dtype is checked before anything is copied; then
each tensor is one `dst.copy_(src)` on the current stream (device to
device when both are on a GPU; the dtype cast in the same kernel with
dtype_cast=True). The source of a key is mapped read-only and kept per key
(at most _KEEP keys), so that the next get_into of the key maps nothing
new; a CUDA source is let go only once the copies queued from it are done
(an event recorded after them).
"""
import collections
import sys

from . import errors as _errors
from . import keys as _keys

_KEEP = 16          # keys whose last source a client keeps mapped
_LIST_MAX = 8       # differences a refusal names; the rest are counted


def _torch():
    return sys.modules.get("torch") or __import__("torch")


def _named(value, what):
    """name -> tensor of a mapping, an nn.Module (its state_dict: parameters
    and persistent buffers, sharing their storage) or a lone tensor (named
    "__tensor__", as a key holds it); values that are not tensors are left
    out."""
    torch = _torch()
    if isinstance(value, torch.Tensor):
        return {_keys._LONE: value}
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if isinstance(value, collections.abc.Mapping):
        return collections.OrderedDict(
            (k, v) for k, v in value.items() if isinstance(v, torch.Tensor))
    raise TypeError("get_into: %s must be a mapping of names to tensors, an nn.Module or a "
                    "tensor, not %s" % (what, type(value).__name__))


def _differences(src, dst, dtype_cast):
    """Every way dst (the caller's) and src differ, as text."""
    out = []
    for name, d in dst.items():
        s = src.get(name)
        if s is None:
            out.append("missing '%s' (the source has no such tensor)" % name)
            continue
        if s.dtype != d.dtype and not dtype_cast:
            out.append("'%s': dtype %s here, %s in the source (dtype_cast=True casts)"
                       % (name, str(d.dtype).replace("torch.", ""),
                          str(s.dtype).replace("torch.", "")))
        if tuple(s.shape) != tuple(d.shape):
            out.append("'%s': shape %s here, %s in the source"
                       % (name, list(d.shape), list(s.shape)))
    out.extend("extra '%s' (no destination of that name)" % name
               for name in src if name not in dst)
    return out


def check(src, dst, dtype_cast, what):
    """Raises InvalidArgumentError listing what differs between the
    mappings src and dst (name -> tensor); nothing is copied then."""
    diffs = _differences(src, dst, dtype_cast)
    if diffs:
        more = "; ..." if len(diffs) > _LIST_MAX else ""
        raise _errors.BY_NAME["INVALID_ARGUMENT"](
            "%s: %d difference%s, nothing copied: %s%s"
            % (what, len(diffs), "" if len(diffs) == 1 else "s",
               "; ".join(diffs[:_LIST_MAX]), more))


def copy(src, dst):
    """dst[name].copy_(src[name]) for every name, on the current stream;
    the CUDA event recorded after them (None when no copy touched a GPU)."""
    torch = _torch()
    cuda = None
    with torch.no_grad():
        for name, d in dst.items():
            s = src[name]
            d.copy_(s)
            if cuda is None and (d.is_cuda or s.is_cuda):
                cuda = d.device if d.is_cuda else s.device
    if cuda is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(cuda))
    return event


def _keep(client, key, source, event):
    """Keeps source (and the event after its copies) as key's, letting go
    of the one it replaces (or of the least recently used key's) once its
    copies are done."""
    kept = client.__dict__.setdefault("_into_kept", collections.OrderedDict())
    old = kept.pop(key, None)
    kept[key] = (source, event)
    if old is None and len(kept) > _KEEP:
        old = kept.popitem(last=False)[1]
    if old is not None and old[1] is not None:
        old[1].synchronize()


def release(client):
    """Lets go of every kept source (Client.close), once its copies are
    done."""
    kept = client.__dict__.pop("_into_kept", None) or {}
    for _, event in kept.values():
        if event is not None:
            event.synchronize()


def get_into(client, key_or_result, tensors, version=None, view=None, dtype_cast=False):
    """See Client.get_into."""
    dst = _named(tensors, "tensors")
    if isinstance(key_or_result, str):
        opts = {} if view is None else {"view": view}
        value, got = _keys.get(client, key_or_result, version, readonly=True,
                               with_version=True, as_torch=True, **opts)
        what = "get_into '%s' version %d" % (key_or_result, got)
    else:
        if version is not None or view is not None:
            raise ValueError("get_into: version and view apply to a key; a result is "
                             "copied as it is")
        value = getattr(key_or_result, "value", key_or_result)   # a Handle's value
        got = getattr(value, "version", None)
        what = "get_into"
    src = _named(value, "the source")
    check(src, dst, dtype_cast, what)
    event = copy(src, dst)
    if isinstance(key_or_result, str):
        _keep(client, key_or_result, value, event)
    return got
