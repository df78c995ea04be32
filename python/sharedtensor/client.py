"""Client: a connection to one stserver socket (include/st/client.h)."""
import collections
import ctypes
import threading

from . import _lib
from . import tensor as _tensor
from .args import Args as _Args
from .errors import from_library, make

_l = _lib.lib


class Module(collections.OrderedDict):
    """A module result: name -> tensor in the server's order, plus
    `.metadata` (a dict)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.metadata = {}


class Handle:
    """The result of a managed or cached endpoint: `.value` (what a plain
    call would return), `.object_id`, `.cache_key`, `.refcount` (leases on
    the object after this reply), `.cached`, `.managed`, `.lease`,
    `.server_id`, `.bytes`. A context manager: leaving it releases this
    connection's lease (release() does the same, once). Tensors in
    `.value` stay valid after the release: mappings outlive leases."""

    def __init__(self, client, value, info):
        self._client = client
        self.value = value
        self.object_id = info.id
        self.server_id = info.server_id.decode()
        self.cache_key = info.cache_key.decode()
        self.device = info.device.decode()
        self.cached = bool(info.cached)
        self.managed = bool(info.managed)
        self.lease = bool(info.lease)
        self.refcount = info.refcount
        self.bytes = info.bytes
        self.released = False

    def release(self):
        """Gives back the lease (idempotent); returns the release result dict
        {released, destroyed, refcount}, or None when already released."""
        if self.released:
            return None
        self.released = True
        return self._client.release(self.object_id)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._client._ptr:   # closing the client gave leases back already
            self.release()
        return False

    def __repr__(self):
        return "Handle(object_id=%d, cache_key=%r, refcount=%d)" % (
            self.object_id, self.cache_key, self.refcount)


class Client:
    """A connection to a stserver.

    Client(device=0, path=None, base_path=None, timeout=None, framework="torch",
           server_uid=None)

    `path` names the socket; otherwise device N's socket "<base>-N.sock"
    (base: base_path, else $SHARED_TENSOR_BASE_PATH, else the first of
    $XDG_RUNTIME_DIR/sharedtensor/st, /run/sharedtensor/st and the
    fallback /tmp/shared-tensor where that socket exists: the C library's
    search). `timeout` (seconds) bounds connecting (connect and hello
    together; None or 0: 10 s) and then each reply (None or 0: no bound); a
    connect or call that times out raises TimeoutError (a built-in
    TimeoutError) and a call that does closes the connection.
    `server_uid`: the uid the server must run as, checked (SO_PEERCRED)
    before anything is sent; a server running as another uid raises
    AuthError. None: $SHARED_TENSOR_SERVER_UID if set, else this process's
    uid or root.
    `framework`: "torch" gives torch tensors, None gives SharedTensor
    objects (DLPack producers for numpy, cupy, jax, ...).

    One call at a time per client (calls are serialized by a lock);
    results are independent of the client and outlive it.
    """

    def __init__(self, device=0, path=None, base_path=None, timeout=None, framework="torch",
                 server_uid=None):
        if framework not in ("torch", None):
            raise ValueError('framework must be "torch" or None')
        self.framework = framework
        self._lock = threading.Lock()
        self._ptr = None
        opts = _lib.ClientOptions()
        _l.st_client_options_init(ctypes.byref(opts))
        if server_uid is not None:
            if not isinstance(server_uid, int) or isinstance(server_uid, bool) or server_uid < 0:
                raise ValueError("server_uid must be a uid (an integer >= 0) or None")
            opts.server_uid = server_uid
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                    0 <= timeout < 2 ** 31 / 1000):
                raise ValueError("timeout must be a number of seconds >= 0, or None")
            opts.timeout_ms = max(1, int(timeout * 1000)) if timeout > 0 else 0
        out = ctypes.c_void_p()
        err = ctypes.create_string_buffer(1024)
        if path is None:
            if not isinstance(device, int) or device < 0:
                raise ValueError("device must be an integer >= 0")
            base = None if base_path is None else str(base_path).encode()
            rc = _l.st_client_connect_device_opts(base, device, ctypes.byref(opts),
                                                  ctypes.byref(out), err, len(err))
        else:
            rc = _l.st_client_connect_opts(
                path if isinstance(path, bytes) else str(path).encode(), ctypes.byref(opts),
                ctypes.byref(out), err, len(err))
        if rc != 0:
            raise from_library(rc, err.value.decode(errors="replace"))
        self._ptr = out.value
        self.server_id = _l.st_client_server_id(self._ptr).decode()
        self.server_version = _l.st_client_server_version(self._ptr).decode()
        self.server_pid = _l.st_client_server_pid(self._ptr)

    # ------------------------------------------------------------ basics

    def close(self):
        """Closes the connection (gives back every lease it holds). Tensors
        already returned stay valid."""
        with self._lock:
            p, self._ptr = self._ptr, None
            if p:
                _l.st_client_close(p)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _h(self):
        if not self._ptr:
            raise ValueError("the client is closed")
        return self._ptr

    def _fail(self, rc):
        name = (_l.st_client_error_name(self._ptr) or b"").decode() if self._ptr else ""
        msg = (_l.st_client_error(self._ptr) or b"").decode(errors="replace") if self._ptr else ""
        raise make(rc, name or _l.st_err_name(rc).decode(), msg or _l.st_err_name(rc).decode())

    def _do(self, fn, *args):
        with self._lock:
            rc = fn(self._h(), *args)
            if rc != 0:
                self._fail(rc)

    def ping(self):
        """Round trip of `ping` in microseconds."""
        rtt = ctypes.c_double()
        self._do(_l.st_client_ping, ctypes.byref(rtt))
        return rtt.value

    # ------------------------------------------------------------ values

    def _value_call(self, fn, *args):
        """Runs a method whose reply is a plain value; returns it converted."""
        out = ctypes.c_void_p()
        self._do(fn, *args, ctypes.byref(out))
        res = _tensor.Result(out.value)
        try:
            return _convert(_l.st_result_value(res.ptr).contents, res, "", "torch")
        finally:
            res.close()

    def _wrap(self, out, as_torch):
        """Converts an owned result: a Handle when it names an object."""
        res = _tensor.Result(out.value)
        framework = self.framework if as_torch is None else ("torch" if as_torch else None)
        try:
            value = _convert(_l.st_result_value(res.ptr).contents, res, "", framework)
            info = _lib.ObjectInfo()
            if _l.st_result_object(res.ptr, ctypes.byref(info)) == 0:
                return Handle(self, value, info)
            return value
        finally:
            # torch tensors hold their own references; SharedTensor objects
            # hold `res` itself.
            if framework == "torch":
                res.close()

    def info(self):
        """The server's `info` (a dict)."""
        return self._value_call(_l.st_client_rpc, b"info", None)

    def metrics(self):
        """The server's metrics in the Prometheus text format (a str;
        docs/operations.md, "Monitoring")."""
        return self._value_call(_l.st_client_rpc, b"metrics", None)

    def endpoints(self):
        """The endpoints (the `endpoints` method's reply)."""
        return self._value_call(_l.st_client_rpc, b"endpoints", None)

    def rpc(self, method, **params):
        """Any method of docs/protocol.md with named parameters; a plain value."""
        with _Args(params) as a:
            return self._value_call(_l.st_client_rpc, method.encode(), a.ptr)

    def call(self, name, as_torch=None, **args):
        """Calls endpoint `name` with keyword arguments.

        Tensor arguments (torch tensors, numpy arrays, SharedTensors) must
        live in memory from sharedtensor.empty/zeros (any view of it); the
        endpoint reads and writes them in place. Torch CUDA tensors' devices
        are synchronized before the request goes.

        Returns a torch tensor for a tensor, a Module (OrderedDict of
        tensors, `.metadata`) for a module, plain Python values otherwise
        (tensors inside). A managed or cached endpoint gives a Handle whose
        `.value` is that. as_torch=False (or a client made with
        framework=None) gives SharedTensor objects instead of torch tensors.
        """
        out = ctypes.c_void_p()
        with _Args(args) as a:
            self._do(_l.st_client_call, name.encode(), a.ptr, ctypes.byref(out))
        return self._wrap(out, as_torch)

    # ------------------------------------------------------------- tasks

    def submit(self, name, **args):
        """Queues a build of `name`; returns the task id at once. Tensor
        arguments go as in call(); the task keeps the server's mapping of
        them until it ends."""
        tid = ctypes.c_uint64()
        with _Args(args) as a:
            self._do(_l.st_client_submit, name.encode(), a.ptr, ctypes.byref(tid))
        return tid.value

    def status(self, task_id):
        """Task info now (dict: id, endpoint, status, error, progress, ...)."""
        return self._value_call(_l.st_client_task_status, task_id)

    def wait(self, task_id, timeout=30):
        """Waits until the task ends or `timeout` seconds pass; its info."""
        return self._value_call(_l.st_client_task_wait, task_id, float(timeout))

    def result(self, task_id, as_torch=None):
        """The result of a finished task, as call() returns it."""
        out = ctypes.c_void_p()
        self._do(_l.st_client_task_result, task_id, ctypes.byref(out))
        return self._wrap(out, as_torch)

    def cancel(self, task_id):
        """Cancels a task; its info after the request."""
        return self._value_call(_l.st_client_task_cancel, task_id)

    def tasks(self, status=None, before=None, limit=None):
        """One page of task infos, newest first (optionally only those in
        `status`): at most `limit` (default 100, at most 1000) of the tasks
        whose id is below `before` (None: from the newest). The next page:
        before = the id of the last entry; a shorter page is the last."""
        return self._value_call(_l.st_client_tasks, None if status is None else status.encode(),
                                before or 0, limit or 0)

    # ----------------------------------------------------------- objects

    def release(self, object_id):
        """Gives back this connection's lease on an object (idempotent):
        {released, destroyed, refcount}."""
        rel, des, ref = ctypes.c_int(), ctypes.c_int(), ctypes.c_int64()
        self._do(_l.st_client_release, object_id, ctypes.byref(rel), ctypes.byref(des),
                 ctypes.byref(ref))
        return {"released": bool(rel.value), "destroyed": bool(des.value),
                "refcount": ref.value}

    def object_info(self, object_id):
        """Object info (dict); StaleHandleError when the object is gone."""
        return self._value_call(_l.st_client_object_info, object_id)

    def objects(self):
        """Every object of the server (list of dicts)."""
        return self._value_call(_l.st_client_objects)

    def ensure_live(self, object_id, server_id=None):
        """Raises StaleHandleError unless the object still lives."""
        self._do(_l.st_client_ensure_live, object_id,
                 None if server_id is None else server_id.encode())

    def invalidate(self, name, **args):
        """Drops the cache entry of this call; True if one existed."""
        dropped = ctypes.c_int()
        with _Args(args) as a:
            self._do(_l.st_client_invalidate_call, name.encode(), a.ptr, ctypes.byref(dropped))
        return bool(dropped.value)

    def invalidate_all(self, name):
        """Drops every cache entry of an endpoint; how many there were."""
        count = ctypes.c_int64()
        self._do(_l.st_client_invalidate_endpoint, name.encode(), ctypes.byref(count))
        return count.value

    def reload(self):
        """Reloads the endpoint files: {ok, generation, error, changed, ...}."""
        return self._value_call(_l.st_client_reload)


# ---------------------------------------------------------------- values

def _tensor_of(result, tptr, framework):
    st = _tensor.SharedTensor(result, tptr)
    if framework != "torch":
        return st
    if not _tensor.torch_knows(st.dtype):
        return st   # e.g. float8 on a torch older than 2.1
    return _tensor.to_torch(result, tptr)


def _join(path, key):
    return "%s.%s" % (path, key) if path else str(key)


def _convert(v, result, path, framework):
    """A Python value for an st_value_t (depth is bounded by the server)."""
    k = v.kind
    a = v.as_
    if k == _lib.ST_VALUE_NIL:
        return None
    if k == _lib.ST_VALUE_BOOL:
        return bool(a.boolean)
    if k == _lib.ST_VALUE_INT:
        return a.integer
    if k == _lib.ST_VALUE_FLOAT:
        return a.number
    if k == _lib.ST_VALUE_STRING:
        return ctypes.string_at(a.str.ptr, a.str.len).decode("utf-8", errors="replace")
    if k == _lib.ST_VALUE_BINARY:
        return ctypes.string_at(a.str.ptr, a.str.len)
    if k == _lib.ST_VALUE_ARRAY:
        return [_convert(a.array.items[i], result, _join(path, i), framework)
                for i in range(a.array.len)]
    if k == _lib.ST_VALUE_MAP:
        out = {}
        for i in range(a.map.len):
            key = _convert(a.map.keys[i], result, path, framework)
            out[key] = _convert(a.map.values[i], result, _join(path, key), framework)
        return out
    if k == _lib.ST_VALUE_TENSOR:
        return _tensor_of(result, a.tensor, framework)
    if k == _lib.ST_VALUE_MODULE:
        m = Module()
        prefix = path + "." if path else ""
        for i in range(a.module.len):
            tptr = a.module.tensors[i]
            full = tptr.contents.name.decode()
            name = full[len(prefix):] if full.startswith(prefix) else full
            m[name] = _tensor_of(result, tptr, framework)
        if a.module.metadata:
            m.metadata = _convert(a.module.metadata.contents, result, path, framework)
        return m
    raise ValueError("unknown value kind %d" % k)
