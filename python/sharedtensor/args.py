"""Call arguments: Python values as an st_args_t, through the nested builder
of libstclient (st_args_begin_list / _map, st_args_end, ...).

    None                  nil, in any place (a list keeps its length, a
                          dict its key)
    bool, int, float      themselves (ints must fit int64)
    str                   a string, every character (NULs included)
    bytes, bytearray      binary (an endpoint sees a string)
    list, tuple           a list
    dict                  a map; keys must be str

Long lists of one type (ints, floats, strs) go in one library call
(st_args_ints, st_args_floats, st_args_strs), not one per element; so do
long runs of a dict's members whose values share such a type (keys by
st_args_keys; members are grouped by the type of their values: an
endpoint sees a Lua table, where member order is not kept anyway).
    tensors               only as keyword arguments of their own (targs.py)

Anything else raises TypeError. A value nests at most 28 levels of lists
and dicts (the library says so: InvalidArgumentError).
"""
import array
import ctypes

from . import _lib
from . import targs as _targs
from .errors import Error as _Error, from_library

_l = _lib.lib
_new, _free, _error = _l.st_args_new, _l.st_args_free, _l.st_args_error
_nil, _bool, _int, _float = _l.st_args_nil, _l.st_args_bool, _l.st_args_int, _l.st_args_float
_str, _bytes, _key = _l.st_args_str, _l.st_args_bytes, _l.st_args_key
_begin_list, _begin_map, _end = _l.st_args_begin_list, _l.st_args_begin_map, _l.st_args_end
_keys, _ints, _floats, _strs = _l.st_args_keys, _l.st_args_ints, _l.st_args_floats, _l.st_args_strs
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_C_INT64, _C_DOUBLE, _C_SIZE = ctypes.c_int64, ctypes.c_double, ctypes.c_size_t
_VOIDP = ctypes.c_void_p
# Below this many values, one call each costs less than preparing a bulk call.
_BULK = 8


class Args:
    """Keyword arguments as an st_args_t, freed on exit. Entering it also
    synchronizes the CUDA devices of torch tensor arguments. `mine`: the
    (tensor, targs.Described) of its torch tensor arguments, for
    targs.returned."""

    def __init__(self, args):
        self.args = args
        self.ptr = None
        self.cuda = set()
        self.mine = []

    def __enter__(self):
        if not self.args:
            return self
        self.ptr = _new()
        if not self.ptr:
            raise MemoryError("st_args_new")
        self.vptr = _VOIDP(self.ptr)
        try:
            for k, v in self.args.items():
                self._set(k, v)
            _targs.synchronize(self.cuda)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        p, self.ptr = self.ptr, None
        if p:
            _free(p)
        return False

    def _set(self, k, v):
        """Argument k = v (k: the keyword)."""
        if "\0" in k:
            raise ValueError("argument %r: a name cannot hold a NUL character" % k)
        kind = _targs.kind_of(v)
        if kind is not None:
            ordinal = _targs.add(self.vptr, k, v, kind, self.mine)
            if ordinal is not None:
                self.cuda.add(ordinal)
            return
        try:
            _put(self.ptr, k.encode(), v)
        except _Error:
            raise           # the library's own, its message names the argument
        except (TypeError, OverflowError, ValueError) as e:
            cls = type(e) if type(e) in (TypeError, OverflowError, ValueError) else ValueError
            raise cls("argument %r: %s" % (k, e)) from None


def _check(p, rc):
    if rc != 0:
        raise from_library(rc, (_error(p) or b"").decode(errors="replace"))


def _put(p, key, v):
    """Places v under key (bytes; None inside a list) in the open value."""
    t = type(v)
    if v is None:
        rc = _nil(p, key)
    elif t is bool:
        rc = _bool(p, key, v)
    elif t is int:
        if not _INT64_MIN <= v <= _INT64_MAX:
            raise OverflowError("%d does not fit int64" % v)
        rc = _int(p, key, v)
    elif t is float:
        rc = _float(p, key, v)
    elif t is str:
        b = v.encode()
        rc = _str(p, key, b, len(b))
    elif t is list or t is tuple:
        return _list(p, key, v)
    elif t is dict:
        return _map(p, key, v)
    else:
        return _put_other(p, key, v)
    if rc != 0:
        _check(p, rc)


def _put_other(p, key, v):
    """Subclasses of the types above, bytes, and what cannot go."""
    if isinstance(v, bool):
        _put(p, key, bool(v))
    elif isinstance(v, int):
        _put(p, key, int(v))
    elif isinstance(v, float):
        _put(p, key, float(v))
    elif isinstance(v, str):
        _put(p, key, str(v))
    elif isinstance(v, (bytes, bytearray)):
        b = bytes(v)
        _check(p, _bytes(p, key, b, len(b)))
    elif isinstance(v, (list, tuple)):
        _list(p, key, v)
    elif isinstance(v, dict):
        _map(p, key, v)
    elif _targs.kind_of(v):
        raise TypeError("a tensor goes only as a keyword argument of its own (x=t), "
                        "not inside a list or dict")
    else:
        raise TypeError("cannot send a %s" % type(v).__name__)


def _packed(strs):
    """Strings as (bytes back to back, their byte lengths) for the bulk
    calls of the library."""
    joined = "".join(strs)
    if joined.isascii():
        blob, lens = joined.encode(), array.array("Q", map(len, strs))
    else:
        enc = [x.encode() for x in strs]
        blob, lens = b"".join(enc), array.array("Q", map(len, enc))
    return blob, (_C_SIZE * len(lens)).from_buffer(lens)


def _fill(p, values):
    """The values, in order, into the open list (or map, keys queued)."""
    n = len(values)
    types = set(map(type, values)) if n >= _BULK else ()
    if len(types) == 1:
        (t,) = types
        if t is int:
            try:
                buf = array.array("q", values)
            except OverflowError:
                raise OverflowError("an integer of the list does not fit int64") from None
            return _check(p, _ints(p, (_C_INT64 * n).from_buffer(buf), n))
        if t is float:
            buf = array.array("d", values)
            return _check(p, _floats(p, (_C_DOUBLE * n).from_buffer(buf), n))
        if t is str:
            blob, lens = _packed(values)
            return _check(p, _strs(p, blob, lens, n))
    for x in values:
        _put(p, None, x)


def _list(p, key, v):
    _check(p, _begin_list(p, key))
    if v:
        _fill(p, v)
    _check(p, _end(p))


def _member(p, k, v):
    """One member of the open map, its key with it."""
    if not isinstance(k, str):
        raise TypeError("map keys must be str, not %s" % type(k).__name__)
    kb = k.encode()
    if b"\0" in kb:
        _check(p, _key(p, kb, len(kb)))
        _put(p, None, v)
    else:
        _put(p, kb, v)


def _members(p, keys, values):
    """Members of the open map: keys queued in one call, then the values."""
    for k in keys:
        if not isinstance(k, str):
            raise TypeError("map keys must be str, not %s" % type(k).__name__)
    blob, lens = _packed(keys)
    _check(p, _keys(p, blob, lens, len(keys)))
    _fill(p, values)


def _map(p, key, d):
    _check(p, _begin_map(p, key))
    if len(d) < _BULK:
        for k, v in d.items():
            _member(p, k, v)
    else:
        # Grouped by the type of the values, so that the large groups go
        # in bulk: the order of a map's members means nothing to an
        # endpoint (a Lua table).
        groups = {}
        for k, v in d.items():
            groups.setdefault(type(v), []).append((k, v))
        for t, items in groups.items():
            if len(items) >= _BULK and t in (int, float, str):
                ks, vs = zip(*items)
                _members(p, ks, vs)
            else:
                for k, v in items:
                    _member(p, k, v)
    _check(p, _end(p))
