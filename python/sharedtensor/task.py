"""Task: a task of the server (docs/protocol.md, `submit` ... `tasks`), as
Client.submit, Client.pull and Client.replicate return it.

A Task is its id (an int: every Client method that takes a task id takes
it) with the client that started it:

    t = c.pull("w/model", "node-a")
    t.progress                 # 0.42 (or None before any byte), t.note
    info = t.wait(60)          # the task info once it ended, or after 60 s
    r = t.result()             # waits, then the result; raises its error
    t.cancel()
"""
from . import errors as _errors

_ENDED = ("completed", "failed", "cancelled")
# The longest single `wait` request (the server caps one at 3600 s).
_STEP_S = 600.0
_UNSET = object()


class Task(int):
    """A task id with its client: wait(timeout), result(timeout),
    cancel(), info(), and the properties status, progress, note, done.
    The client must stay open while the Task is used."""

    def __new__(cls, client, task_id):
        t = int.__new__(cls, task_id)
        t.client = client
        t._result = _UNSET
        return t

    @property
    def id(self):
        """The task id (an int)."""
        return int(self)

    def info(self):
        """The task info now (a dict: id, status, progress, note, error,
        times, ...; docs/protocol.md, `status`)."""
        return self.client.status(self)

    @property
    def status(self):
        """"pending", "running", "completed", "failed" or "cancelled"."""
        return self.info()["status"]

    @property
    def progress(self):
        """The fraction done in [0, 1], or None when the task reports none
        (a pull: the bytes moved of the key's bytes)."""
        return self.info().get("progress")

    @property
    def note(self):
        """The task's last note (a pull: "N of M bytes"), or None."""
        return self.info().get("note")

    @property
    def done(self):
        """Whether the task ended (completed, failed or cancelled)."""
        return self._result is not _UNSET or self.info()["status"] in _ENDED

    def wait(self, timeout=None):
        """Waits until the task ends or `timeout` seconds pass (None: no
        limit); returns its info either way (info["status"] says which).
        The server holds no thread while it waits."""
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or timeout < 0):
            raise _errors.BY_NAME["INVALID_ARGUMENT"](
                "wait: timeout must be seconds >= 0 or None, not %r" % (timeout,))
        left = None if timeout is None else float(timeout)
        while True:
            step = _STEP_S if left is None else min(left, _STEP_S)
            info = self.client.wait(self, step)
            if info["status"] in _ENDED:
                return info
            if left is not None:
                left -= step
                if left <= 0:
                    return info

    def result(self, timeout=None, as_torch=None):
        """Waits until the task ends (at most `timeout` seconds: None, no
        limit; TimeoutError after it), then its result, as Client.result
        gives it (a pull's: {key, version, origin, bytes, seconds}). A
        failed task raises its error (AuthError, OutOfMemoryError, ...), a
        cancelled one CancelledError. The result is kept: asking again
        returns the same value."""
        if self._result is not _UNSET:
            return self._result
        info = self.wait(timeout)
        if info["status"] not in _ENDED:
            raise _errors.BY_NAME["TIMEOUT"](
                "task %d is still %s after %s s" % (self, info["status"], timeout))
        value = self.client.result(self, as_torch=as_torch)
        self._result = value
        return value

    def cancel(self):
        """Cancels the task (a running pull stops and leaves nothing); its
        info after the request."""
        return self.client.cancel(self)

    def __repr__(self):
        return "Task(%d)" % self

    def __reduce__(self):
        return (int, (int(self),))
