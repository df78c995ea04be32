"""Exceptions: one class per stable error name of docs/errors.md.

Every failure of the library or the server raises a subclass of Error with
`.code` (the positive wire code), `.name` (the stable name, "ENDPOINT") and
the message as str(e).
"""

# (stable name, wire code) as in include/st/errors.h.
_NAMES = [
    ("PROTOCOL", 1), ("UNKNOWN_ENDPOINT", 2), ("SERIALIZATION", 3), ("CAPABILITY", 4),
    ("TASK", 5), ("CONFIGURATION", 6), ("ENDPOINT", 7), ("STALE_HANDLE", 8), ("LIMIT", 9),
    ("AUTH", 10), ("BUSY", 11), ("TIMEOUT", 12), ("OUT_OF_MEMORY", 13),
    ("INVALID_ARGUMENT", 14), ("IO", 15), ("UNKNOWN_METHOD", 16), ("NOT_FOUND", 17),
    ("CANCELLED", 18), ("SHUTTING_DOWN", 19), ("INTERNAL", 20),
]


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


BY_NAME = {}
BY_CODE = {}
for _name, _code in _NAMES:
    _cls = type(_class_name(_name), (Error,), {"code": _code, "name": _name,
                                               "__doc__": "Stable error %s (%d)." % (_name, _code)})
    globals()[_cls.__name__] = _cls
    BY_NAME[_name] = _cls
    BY_CODE[_code] = _cls

__all__ = ["Error"] + [c.__name__ for c in BY_NAME.values()]


def make(code, name, message):
    """The Error subclass instance for a stable name (else the code)."""
    cls = BY_NAME.get(name) or BY_CODE.get(abs(code)) or Error
    return cls(message, abs(code) if code else cls.code, name or cls.name)
