"""Exceptions: one class per stable error name of docs/errors.md.

Every failure of the library or the server raises a subclass of Error with
`.code` (the positive wire code), `.name` (the stable name, "ENDPOINT") and
the message as str(e). The classes come from the library's own table
(st_err_name, st_strerror of include/st/errors.h: codes 1, 2, ... up to the
first one it does not know), so they cannot drift from it:
PROTOCOL -> ProtocolError, STALE_HANDLE -> StaleHandleError, ...
TimeoutError is also the built-in TimeoutError, IoError (no server, a
lost connection) a ConnectionError and so an OSError, AuthError a
PermissionError, InvalidArgumentError a ValueError.
"""
import ctypes

from . import _lib

_l = _lib.lib


def _library_table():
    """[(stable name, wire code, description)] in code order."""
    out = []
    code = 1
    while True:
        name = _l.st_err_name(code).decode()
        if name == "UNKNOWN":
            return out
        out.append((name, code, _l.st_strerror(code).decode()))
        code += 1


class Error(Exception):
    """A sharedtensor failure: `.code`, `.name`, message in str(e)."""
    code = 0
    name = "UNKNOWN"

    def __init__(self, message, code=None, name=None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if name is not None:
            self.name = name

    @property
    def message(self):
        return self.args[0] if self.args else ""


def _class_name(name):
    return "".join(p.capitalize() for p in name.split("_")) + "Error"


# Errors that are also built-in ones, so `except TimeoutError`,
# `except ConnectionError` (an OSError) or `except ValueError` catches
# them too.
_BUILTIN_BASES = {"TIMEOUT": TimeoutError, "IO": ConnectionError, "AUTH": PermissionError,
                  "INVALID_ARGUMENT": ValueError}

BY_NAME = {}
BY_CODE = {}
for _name, _code, _what in _library_table():
    _bases = (Error, _BUILTIN_BASES[_name]) if _name in _BUILTIN_BASES else (Error,)
    _cls = type(_class_name(_name), _bases,
                {"code": _code, "name": _name,
                 "__doc__": "Stable error %s (%d): %s." % (_name, _code, _what)})
    globals()[_cls.__name__] = _cls
    BY_NAME[_name] = _cls
    BY_CODE[_code] = _cls

__all__ = ["Error"] + [c.__name__ for c in BY_NAME.values()]


def make(code, name, message):
    """The Error subclass instance for a stable name (else the code)."""
    cls = BY_NAME.get(name) or BY_CODE.get(abs(code)) or Error
    return cls(message, abs(code) if code else cls.code, name or cls.name)


def from_library(rc, message):
    """The Error for a negative ST_ERR_* the library returned."""
    return make(rc, _l.st_err_name(rc).decode(), message)


def flag(where, name, v):
    """v as a bool when it is one (True, False, 1 or 0); else
    InvalidArgumentError naming the allowed values (no other value, e.g.
    live="double", is taken as true)."""
    if v is True or v is False:
        return v
    if type(v) is int and v in (0, 1) or type(v).__name__ == "bool_":
        return bool(v)
    raise BY_NAME["INVALID_ARGUMENT"]("%s: %s must be True or False, not %r" % (where, name, v))


def readers(where, v):
    """The st_readers_t of a `readers` argument, {"uids": [int],
    "gids": [int]} (both optional; docs/protocol.md, "Owners"), as a
    ctypes pointer (None: v is None, no grant sent); else
    InvalidArgumentError. The Readers keeps its arrays."""
    if v is None:
        return None
    if not isinstance(v, dict) or set(v) - {"uids", "gids"}:
        raise BY_NAME["INVALID_ARGUMENT"](
            "%s: readers must be a dict with 'uids' and/or 'gids' (lists of ints), not %r"
            % (where, v))
    lists = []
    for name in ("uids", "gids"):
        ids = v.get(name) or []
        if not isinstance(ids, (list, tuple)) or not all(
                type(i) is int and 0 <= i < 2 ** 32 for i in ids):
            raise BY_NAME["INVALID_ARGUMENT"](
                "%s: readers['%s'] must be a list of uids/gids (ints), not %r" % (where, name, ids))
        lists.append((_lib.c_uint32 * max(len(ids), 1))(*ids))
        lists.append(len(ids))
    r = _lib.Readers(ctypes.cast(lists[0], ctypes.POINTER(_lib.c_uint32)), lists[1],
                     ctypes.cast(lists[2], ctypes.POINTER(_lib.c_uint32)), lists[3])
    r._keep = lists
    return ctypes.pointer(r)


def choice(where, name, v, allowed):
    """v when it is one of `allowed` (a tuple); else InvalidArgumentError
    naming them."""
    if any(v is a or (type(v) is type(a) and v == a) for a in allowed):
        return v
    raise BY_NAME["INVALID_ARGUMENT"]("%s: %s must be one of %s, not %r" % (
        where, name, ", ".join(repr(a) for a in allowed), v))
