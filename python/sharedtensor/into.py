"""get_into: loads a key's (or a result's) tensors into torch tensors the
caller owns (docs/views.md, section 2; docs/python.md): the call behind
Client.get_into.

Every name, shape and dtype is checked before anything is copied. When
every destination is contiguous, on the source's device, with its shape
and dtype (the common case: parameters loaded from their own state dict),
the check and the copy plan are one pass over the destinations and the
copies go by address through st_copy_ranges on the current stream
(tensors that follow each other in both source and destination as one
copy, the rest of a call in one launch of libstclient's batched copy
kernel). Otherwise each tensor is one `dst.copy_(src)`
on the current stream (device to device when both are on a GPU; the
dtype cast in the same kernel with dtype_cast=True). The source of a key is mapped read-only and kept per
(key, view) (at most _KEEP), with its version: the next get_into asks the
server with that version (`have`) and, while it has not moved, gets a
`same` reply (one round trip: nothing mapped or converted again). A CUDA
source is let go only once the copies queued from it are done (an event
recorded after them).
"""
import collections
import ctypes
import operator
import sys

from . import _lib
from . import errors as _errors
from . import keys as _keys

_KEEP = 16          # keys whose last source a client keeps mapped
_LIST_MAX = 8       # differences a refusal names; the rest are counted
_RANGES = 4         # prepared copies a kept source remembers (Ranges)
_COPY_DEVICE = 2    # ST_COPY_DEVICE: every range is memory of the device


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


def copy(src, dst, after=None):
    """dst[name].copy_(src[name]) for every name, on the current stream;
    the CUDA event recorded after them (None when no copy touched a GPU).
    `after` (an event, may be None): the returned one also follows it."""
    torch = _torch()
    cuda = None
    with torch.no_grad():
        for name, d in dst.items():
            s = src[name]
            d.copy_(s)
            if cuda is None and (d.is_cuda or s.is_cuda):
                cuda = d.device if d.is_cuda else s.device
    return None if cuda is None else _event_after(cuda, after)


def _event_after(device, after):
    """A CUDA event recorded on torch's current stream of device, after
    what is queued there and after the event `after` (may be None), which
    is recorded again and returned when given (one event per source)."""
    torch = _torch()
    stream = torch.cuda.current_stream(device)
    if after is not None:
        stream.wait_event(after)
    event = after or torch.cuda.Event()
    event.record(stream)
    return event


def plan_of(named):
    """name -> (shape, dtype, device, address, bytes) of every tensor of
    `named`, which the fast path copies from (or into) by address; None
    when one is not contiguous, or when they are on more than one device
    (one st_copy_ranges copies on one device; the general path copies
    those)."""
    plan = {}
    for name, t in named.items():
        if not t.is_contiguous():
            return None
        plan[name] = (t.shape, t.dtype, t.device, t.data_ptr(), t.numel() * t.element_size())
    if len({p[2] for p in plan.values()}) > 1:
        return None
    return plan


def ranges(plan, tensors):
    """(device, [addresses of tensors], [the plan's addresses], [bytes])
    when `tensors` (name -> tensor) names exactly the plan's tensors, each
    contiguous with the plan's shape, dtype and device, all on one device;
    else None (the general path checks, and copies with copy_)."""
    if plan is None or len(tensors) != len(plan):
        return None
    mine, theirs, sizes = [], [], []
    device = None
    for name, t in tensors.items():
        p = plan.get(name)
        if (p is None or t.shape != p[0] or t.dtype != p[1] or t.device != p[2]
                or not t.is_contiguous()):
            return None
        mine.append(t.data_ptr())
        theirs.append(p[3])
        sizes.append(p[4])
        device = p[2]
    if device is None:
        return None
    return device, mine, theirs, sizes


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def signature(tensors):
    """What a prepared copy into (or from) `tensors` depends on: the names
    in order and each tensor's address, shape, dtype and contiguity; None
    when `tensors` is not a dict of tensors. The same tensors passed again
    (a module's parameters loaded every step) are matched in one cheap pass
    instead of being checked one by one: one map per attribute, faster
    than a loop over the tensors (docs/benchmarks.md, "Views, `get_into`
    and live keys")."""
    if not isinstance(tensors, dict):
        return None
    tensor = _torch().Tensor
    v = tuple(tensors.values())
    try:
        return (tuple(tensors), tuple(map(tensor.data_ptr, v)), tuple(map(_SHAPE, v)),
                tuple(map(_DTYPE, v)), tuple(map(tensor.is_contiguous, v)))
    except (AttributeError, TypeError):
        return None


def raw_stream(device):
    """torch's current CUDA stream of `device` (a torch.device with an
    index) as the CUstream address, 0 for the legacy default stream."""
    torch = _torch()
    fast = getattr(torch._C, "_cuda_getCurrentRawStream", None)   # far cheaper
    if fast is not None:                                           # than current_stream
        return fast(device.index)                                  # (docs/benchmarks.md)
    return torch.cuda.current_stream(device).cuda_stream


class Ranges:
    """Copies by address, checked once: the arrays st_copy_ranges takes,
    built once, and the signature of the caller's tensors they were
    checked against (None: not reusable)."""

    __slots__ = ("sig", "device", "ordinal", "n", "dst", "src", "sizes")

    def __init__(self, device, dst, src, sizes, sig):
        arr = ctypes.c_uint64 * len(sizes)
        self.device, self.n, self.sig = device, len(sizes), sig
        self.ordinal = device.index if device.type == "cuda" else -1
        self.dst, self.src, self.sizes = arr(*dst), arr(*src), arr(*sizes)

    def run(self):
        """The copies, on torch's current stream of the device when it is a
        GPU (queued, not waited for), else memcpy (done on return). Both
        sides of every range are tensors of that device (ranges() checked
        them), which st_copy_ranges is told (ST_COPY_DEVICE): it asks the
        driver nothing per range."""
        if self.ordinal >= 0:
            stream, flags = raw_stream(self.device) or None, _COPY_DEVICE
        else:
            stream, flags = None, 0
        err = ctypes.create_string_buffer(400)
        rc = _lib.lib.st_copy_ranges(self.ordinal, self.dst, self.src, self.sizes, self.n,
                                     stream, flags, err, len(err))
        if rc != 0:
            raise _errors.from_library(rc, err.value.decode(errors="replace"))


def prepared(made, sig):
    """The Ranges of `made` that were checked against tensors of signature
    `sig` (the same names, addresses, shapes, dtypes and layout), or None."""
    if sig is None:
        return None
    return next((r for r in made if r.sig == sig), None)


# A kept source: the value got (it holds the mapping), its tensors by name,
# their plan (plan_of), its version, the event after the last copies from
# it, and the Ranges of its last copies into different tensors (at most
# _RANGES, the most recent first).
_Source = collections.namedtuple("_Source", "value named plan version event ranges")


def _keep(client, name, src):
    """Keeps src as name's (the key, or the key and view), letting go of
    the source it replaces (or of the least recently used one) once the
    copies from it are done."""
    kept = client.__dict__.setdefault("_into_kept", collections.OrderedDict())
    old = kept.pop(name, None)
    kept[name] = src
    if old is not None and old.value is src.value:
        return          # the same source again: src.event follows old.event
    if old is None and len(kept) > _KEEP:
        old = kept.popitem(last=False)[1]
    if old is not None and old.event is not None:
        old.event.synchronize()


def release(client):
    """Lets go of every kept source (Client.close), once its copies are
    done."""
    kept = client.__dict__.pop("_into_kept", None) or {}
    for src in kept.values():
        if src.event is not None:
            src.event.synchronize()


def get_into(client, key_or_result, tensors, version=None, view=None, dtype_cast=False):
    """See Client.get_into."""
    dtype_cast = _errors.flag("get_into", "dtype_cast", dtype_cast)
    if not isinstance(key_or_result, str):
        dst = _named(tensors, "tensors")
        if version is not None or view is not None:
            raise ValueError("get_into: version and view apply to a key; a result is "
                             "copied as it is")
        value = getattr(key_or_result, "value", key_or_result)   # a Handle's value
        src = _named(value, "the source")
        check(src, dst, dtype_cast, "get_into")
        copy(src, dst)
        return getattr(value, "version", None)
    key = key_or_result
    name = key if view is None else key + "\x1f" + view
    kept = (client.__dict__.get("_into_kept") or {}).get(name)
    opts = {} if view is None else {"view": view}
    # The kept version, while still the one asked for, comes back `same`:
    # one round trip, nothing mapped or converted.
    value, got = _keys.get(client, key, version, readonly=True, with_version=True,
                           as_torch=True, have=kept.version if kept else 0, **opts)
    if value is None:
        src = kept
    else:
        named = _named(value, "the source")
        src = _Source(value, named, plan_of(named), got, None, ())
    sig = signature(tensors)
    made = src.ranges
    r = prepared(made, sig)
    if r is None:
        dst = _named(tensors, "tensors")
        fast = ranges(src.plan, dst)
        if fast is not None:        # every check passed: copies by address
            device, mine, theirs, sizes = fast
            r = Ranges(device, mine, theirs, sizes, sig)
            made = (r,) + made[:_RANGES - 1]
    if r is not None:
        r.run()
        event = _event_after(r.device, src.event) if r.ordinal >= 0 else None
    else:
        check(src.named, dst, dtype_cast, "get_into '%s' version %d" % (key, got))
        event = copy(src.named, dst, after=src.event)
    _keep(client, name, src._replace(event=event, ranges=made))
    return got
