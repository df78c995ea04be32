"""Client: a connection to one stserver socket (include/st/client.h)."""
import ctypes
import marshal
import threading

from . import _lib
from .closing import Closing
from . import convert as _cv
from . import keys as _keys
from . import live as _live
from . import into as _into
from . import targs as _targs
from . import tensor as _tensor
from .args import Args as _Args
from .task import Task
from .convert import Module
from . import errors as _errors
from .errors import from_library, make

_l = _lib.lib
# The per-call entries take ctypes objects only (_lib.unchecked).
_call_fast = _lib.unchecked("st_client_call_summary")
_ping = _lib.unchecked("st_client_ping")
_result_summary = _l.st_result_summary
_result_ref = _l.st_result_ref
_LEND_SAME = _lib.ST_CALL_LEND_SAME
_held = _cv.held
_touch = _cv.touch
_release = _l.st_client_release
_rpc_marshal = _l.st_client_rpc_marshal
_loads = marshal.loads
_string_at = ctypes.string_at
_byref = ctypes.byref
_Summary = _lib.ResultSummary
_copy = _Summary.from_buffer_copy
_VOIDP = ctypes.c_void_p
_names = {}   # endpoint / method name -> its bytes, for names used again
_CALL_READONLY = _lib.ST_CALL_READONLY
_TENSOR = _lib.ST_VALUE_TENSOR
_result_free = _l.st_result_free
_returned = _targs.returned


def _name(name):
    b = _names.get(name)
    if b is None:
        b = name.encode()
        if len(_names) < 4096:
            _names[name] = b
    return b


class Handle:
    """The result of a managed or cached endpoint: `.value` (what a plain
    call would return), `.object_id`, `.cache_key`, `.refcount` (leases on
    the object after this reply), `.cached`, `.managed`, `.lease`,
    `.server_id`, `.bytes`. A context manager: leaving it releases this
    connection's lease (release() does the same, once). Tensors in
    `.value` stay valid after the release: mappings outlive leases."""

    def __init__(self, client, value, fields):
        self.__dict__.update(fields)
        self._client = client
        self.value = value
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
        # Closing the client gave leases back already. Nothing is asked
        # back: the release is one message, not waited for.
        if self._client._ptr and not self.released:
            self.released = True
            self._client.release(self.object_id, wait=False)
        return False

    def __repr__(self):
        return "Handle(object_id=%d, cache_key=%r, refcount=%d)" % (
            self.object_id, self.cache_key, self.refcount)


def _fields(info, like=None):
    """A Handle's attributes of object info `info` (an st_object_info_t);
    its strings from `like` (the fields of an earlier result of the same
    object) when given."""
    if like is None:
        sid, dev = info.server_id.decode(), info.device.decode()
        key = info.cache_key.decode(errors="backslashreplace")   # text already (cachekey.h)
    else:
        sid, key, dev = like["server_id"], like["cache_key"], like["device"]
    return {"object_id": info.id, "server_id": sid, "cache_key": key, "device": dev,
            "cached": bool(info.cached), "managed": bool(info.managed),
            "lease": bool(info.lease), "refcount": info.refcount, "bytes": info.bytes}


class Client(Closing):
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
        self._ptr = self._cptr = None
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
        self._cptr = ctypes.c_void_p(self._ptr)   # for the unchecked entries
        self._rtt = ctypes.c_double()
        self._rtt_ref = ctypes.byref(self._rtt)
        self._rel = (ctypes.c_int(), ctypes.c_int(), ctypes.c_int64())
        self._rel_refs = tuple(map(ctypes.byref, self._rel))
        self._rpc_out = (ctypes.c_void_p(), ctypes.c_size_t(), ctypes.c_void_p())
        self._rpc_refs = tuple(map(ctypes.byref, self._rpc_out))
        # call()'s out-parameters, used under the lock.
        self._call_out = ctypes.c_void_p()
        self._summary = _Summary()
        self._call_refs = (ctypes.byref(self._call_out), ctypes.byref(self._summary))
        self._torch = framework == "torch"
        self.server_id = _l.st_client_server_id(self._ptr).decode()
        self.server_version = _l.st_client_server_version(self._ptr).decode()
        self.server_pid = _l.st_client_server_pid(self._ptr)

    # ------------------------------------------------------------ basics

    def close(self):
        """Closes the connection (gives back every lease it holds). Tensors
        already returned stay valid."""
        _into.release(self)
        with self._lock:
            p, self._ptr, self._cptr = self._ptr, None, None
            if p:
                _l.st_client_close(p)

    def _h(self):
        if not self._ptr:
            self._closed()
        return self._ptr

    def _closed(self):
        """Raises: the client is closed (`self._cptr or self._closed()` gives
        the unchecked entries a c_void_p or nothing)."""
        raise ValueError("the client is closed")

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
        rtt = self._rtt
        with self._lock:
            rc = _ping(self._cptr or self._closed(), self._rtt_ref)
            if rc != 0:
                self._fail(rc)
            return rtt.value

    # ------------------------------------------------------------ values

    def _value_call(self, fn, *args):
        """Runs a method whose reply is a plain value; returns it converted."""
        out = _VOIDP()
        with self._lock:
            rc = fn(self._ptr or self._h(), *args, _byref(out))
            if rc != 0:
                self._fail(rc)
        res = _tensor.Result(out.value)
        try:
            return _cv.plain_value(res, _slow_value)
        finally:
            res.close()

    def _rpc_value(self, method, params):
        """Runs a method whose reply is a plain value: one crossing into
        the library, which writes the value in marshal's format straight
        from the reply (st_client_rpc_marshal); each call's objects are
        new. A reply marshal cannot carry comes decoded instead."""
        data, size, fallback = self._rpc_out
        with self._lock:
            rc = _rpc_marshal(self._ptr or self._h(), method, params, *self._rpc_refs)
            if rc != 0:
                self._fail(rc)
            if data.value:
                blob = _string_at(data.value, size.value)
            else:
                res = _tensor.Result(fallback.value)
        if data.value:
            return _loads(blob)
        try:
            return _cv.plain_value(res, _slow_value)
        finally:
            res.close()

    def _wrap(self, ptr, summary, as_torch, mine=None):
        """Converts an owned result: a Handle when it names an object.
        mine: the call's torch tensor arguments (args.Args), which a plain
        result's tensors on them are (convert.torch_tensors)."""
        framework = self.framework if as_torch is None else ("torch" if as_torch else None)
        res = _tensor.Result(ptr)
        if not summary.has_object:
            try:
                return _cv.value_of(res, summary, framework, _slow_value, mine)
            finally:
                # torch tensors hold their own references; SharedTensor
                # objects hold `res` itself.
                if framework == "torch":
                    res.close()
        info = summary.object
        if framework != "torch":
            return Handle(self, _cv.value_of(res, summary, framework, _slow_value), _fields(info))
        try:
            key = (info.server_id, info.id)
            hit = _cv.reuse_get(key, summary.identity, res)
            if hit is not None:
                return Handle(self, hit[0], _fields(info, hit[1]))
            value = _cv.value_of(res, summary, framework, _slow_value)
            fields = _fields(info)
            leaves = []
            # The conversion keeps `res` (a `same` reply lends it again).
            if (summary.ntensors and _torch_leaves(value, leaves) and leaves and
                    _cv.reuse_put(key, summary.identity, value, leaves, res, fields)):
                res = None
            return Handle(self, value, fields)
        finally:
            if res is not None:
                res.close()

    def info(self):
        """The server's `info` (a dict)."""
        return self._rpc_value(b"info", None)

    def metrics(self):
        """The server's metrics in the Prometheus text format (a str;
        docs/operations.md, "Monitoring")."""
        return self._rpc_value(b"metrics", None)

    def endpoints(self):
        """The endpoints (the `endpoints` method's reply)."""
        return self._rpc_value(b"endpoints", None)

    def peers(self):
        """The configured peers and their links (a list of dicts: id, addr,
        state, engines, since, rtt_us, last_error, link, as_uid;
        docs/protocol.md, "peers")."""
        return self._rpc_value(b"peers", None)

    def handoffs(self, all=False):
        """The hand-offs of this uid (all=True: every uid's, for root and
        the server's uid): a list of dicts: name, uid, device, chunks,
        chunk_bytes, consumers, open, producer, pending, followers (the
        peers whose mirrors hold a slot), mirror (None, or what a mirror
        name@peer follows: peer, source, state, why, engine, chunks_in,
        bytes_in, queued, moving); docs/protocol.md, "handoffs"."""
        if not all:
            return self._rpc_value(b"handoffs", None)
        return self.rpc("handoffs", all=True)

    def rpc(self, method, **params):
        """Any method of docs/protocol.md with named parameters; a plain value."""
        with _Args(params) as a:
            return self._rpc_value(method.encode(), a.ptr)

    def call(self, name, as_torch=None, view=None, **args):
        """Calls endpoint `name` with keyword arguments.

        Tensor arguments (torch tensors, numpy arrays, SharedTensors) must
        live in memory from sharedtensor.empty/zeros (any view of it); the
        endpoint reads and writes them in place. Torch CUDA tensors' devices
        are synchronized before the request goes.

        Returns a torch tensor for a tensor, a Module (OrderedDict of
        tensors, `.metadata`) for a module, plain Python values otherwise
        (tensors inside). A tensor that is a torch tensor argument (the
        in-place pattern) is that very tensor object, or a view of it for
        a window of it (docs/python.md, "Passing tensors to endpoints"). A
        managed or cached endpoint gives a Handle whose `.value` is that.
        as_torch=False (or a client made with framework=None) gives
        SharedTensor objects instead of torch tensors.

        view="spec" returns the result seen through a view spec
        (docs/views.md, section 1): e.g. "w:shard(0,1,4)" or
        "*:transpose(0,1)|contiguous"; tensors keep their names. (So an
        endpoint parameter named `view` cannot be passed as a keyword.)
        """
        if as_torch is not None:
            _errors.flag("call", "as_torch", as_torch)
        if view is not None:
            return self._call_flags(name, as_torch, 0, view, args)
        ename = _names.get(name) or _name(name)
        if args:
            with _Args(args) as a:
                got = self._call_locked(ename, a.vptr, as_torch)
            if got.__class__ is not tuple:
                return got
            mine = a.mine
            if mine:
                # The in-place pattern: a plain result that is one tensor
                # on a torch tensor argument is that tensor (or a view).
                ptr, s = got
                if (s.kind == _TENSOR and s.ntensors == 1 and not s.has_object and
                        (self._torch if as_torch is None else as_torch)):
                    try:
                        v = _returned(_VOIDP(ptr), 0, mine)
                    except BaseException:
                        _result_free(ptr)
                        raise
                    if v is not None:
                        _result_free(ptr)
                        return v
            return self._wrap(got[0], got[1], as_torch, mine)
        got = self._call_locked(ename, None, as_torch)
        if got.__class__ is tuple:
            return self._wrap(got[0], got[1], as_torch)
        return got

    def _call_locked(self, ename, args, as_torch):
        """The call's one crossing, under the lock (ename: bytes; args: a
        c_void_p or None). A `same` reply lends the result the connection
        holds (until its next request, so while we hold the lock): when a
        conversion of this process holds it, its value as a new Handle.
        Else (the result's address, a copy of the summary) for _wrap, the
        result ours (a lent one referenced now)."""
        with self._lock:
            rc = _call_fast(self._cptr or self._closed(), ename, args, _LEND_SAME,
                            *self._call_refs)
            if rc != 0:
                self._fail(rc)
            ptr = self._call_out.value
            summary = self._summary
            if summary.same:
                conv = _held(ptr)
                if conv is not None and (self._torch if as_torch is None else as_torch):
                    value = conv.value()
                    if value is not None:
                        _touch(conv.key)
                        fields = conv.fields
                        if fields["managed"]:   # this reply's lease and refcount
                            fields = _fields(summary.object, fields)
                        return Handle(self, value, fields)
                _result_ref(ptr)
            return ptr, _copy(summary)

    def call_readonly(self, name, as_torch=None, **args):
        """call() whose result, when it is a server object (managed, cached,
        singleflight), is mapped read-only (docs/keys.md, section 5): a
        write to its tensors kills this process (SIGSEGV) on the CPU, or
        fails its kernel on CUDA. Plain results stay writable."""
        if as_torch is not None:
            _errors.flag("call_readonly", "as_torch", as_torch)
        return self._call_flags(name, as_torch, _CALL_READONLY, None, args)

    def _call_flags(self, name, as_torch, flags, view, args):
        """A call with flags (st_call_flags_t) and a view spec (or None),
        converted afresh: never the tensors an earlier call() converted."""
        if view is not None and not isinstance(view, str):
            raise TypeError("call: view must be a str (a view spec), not %s"
                            % type(view).__name__)
        out = _VOIDP()
        with _Args(args) as a, self._lock:
            rc = _l.st_client_call_view(self._ptr or self._h(), _name(name), a.ptr, flags,
                                        None if view is None else view.encode(), _byref(out))
            if rc != 0:
                self._fail(rc)
        summary = _Summary()
        _result_summary(out.value, _byref(summary))
        framework = self.framework if as_torch is None else ("torch" if as_torch else None)
        res = _tensor.Result(out.value)
        try:
            # Never the writable tensors an earlier call() converted.
            value = _cv.value_of(res, summary, framework, _slow_value)
            return Handle(self, value, _fields(summary.object)) if summary.has_object else value
        finally:
            if framework == "torch":
                res.close()

    # ------------------------------------------------------------- tasks

    def submit(self, name, **args):
        """Queues a build of `name`; returns its Task at once (an int, the
        task id, with wait(), result(), cancel(), progress: task.py).
        Tensor arguments go as in call(); the task keeps the server's
        mapping of them until it ends."""
        tid = ctypes.c_uint64()
        with _Args(args) as a:
            self._do(_l.st_client_submit, _name(name), a.ptr, _byref(tid))
        return Task(self, tid.value)

    def status(self, task_id):
        """Task info now (dict: id, endpoint, status, error, progress, ...)."""
        return self._value_call(_l.st_client_task_status, task_id)

    def wait(self, task_id, timeout=30):
        """Waits until the task ends or `timeout` seconds pass; its info."""
        return self._value_call(_l.st_client_task_wait, task_id, float(timeout))

    def result(self, task_id, as_torch=None):
        """The result of a finished task, as call() returns it."""
        out = _VOIDP()
        self._do(_l.st_client_task_result, task_id, _byref(out))
        summary = _Summary()
        _result_summary(out.value, _byref(summary))
        return self._wrap(out.value, summary, as_torch)

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

    # ---------------------------------------------- keys between servers

    def pull(self, key, peer, version=None, as_=None, device=None, policy=None, readers=None,
             live=False):
        """Copies key `key` published on peer `peer` (an id of config.lua's
        peer.peers) into this server (docs/multihost.md); returns its Task
        at once: task.wait(timeout), task.progress (the fraction of bytes
        moved), task.cancel(), and task.result(), which waits and gives
        {key, version, origin: {peer, key, version}, bytes, seconds}.
        version: the peer's version (None: its latest); as_: the name here
        (None: `key`); device: "cpu", "cuda" or "cuda:N" (None: the memory
        kind of the peer's key); policy: "pinned" (default) or
        "evictable"; readers: read grants of the copy, as put() takes them.
        Refusals the server sees at once raise here (NotFoundError: not a
        peer; CapabilityError: no peers, the peer not up, no usable
        engine); the rest make task.result() raise (AuthError: the key is
        not exported by the peer; NotFoundError; OutOfMemoryError: this
        server's memory_budget; IoError; CancelledError).

        live=True: the peer's key is a live key, and the copy follows it
        (docs/multihost.md, "Live replication"): it is published here as
        a live key at the peer's version number once whole, then every
        later version the peer's publisher completes is brought in place
        under the same number, so bind(), consistent() and wait_version()
        work here as on the peer. unsubscribe(key) ends that; replicas(key)
        says who follows what."""
        key, peer = _text("pull", "key", key), _text("pull", "peer", peer)
        opts = _lib.PullOpts()
        if live:
            opts.live = 1
        if version is not None:
            opts.version = _version("pull", version)
        if as_ is not None:
            opts.as_ = _text("pull", "as_", as_)
        if device is not None:
            if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
                device = "cuda:%d" % device
            opts.device = _text("pull", "device", device)
        if policy is not None:
            opts.policy = _keys.POLICIES[_errors.choice("pull", "policy", policy,
                                                        tuple(_keys.POLICIES))]
        grant = _errors.readers("pull", readers)
        if grant is not None:
            opts.readers = grant
        tid = ctypes.c_uint64()
        self._do(_l.st_client_pull, key, peer, _byref(opts), _byref(tid))
        return Task(self, tid.value)

    def replicate(self, key, to, version=None, as_=None):
        """Pushes key `key` of this server to each peer of `to` (a list of
        peer ids, or one id); returns its Task at once. Each peer pulls it
        under the uid its config names for this server
        (peer.peers[id].as_uid there; none: AuthError), so the key must be
        exported. task.result() gives {key, version, peers: {id: {ok,
        version}}} when every peer holds the version; else it raises the
        first failure's error, naming each peer's outcome ("replicate: 1
        of 2 peers failed: b: ok; c: ..."). version: this server's version
        (None: the latest); as_: the name on the peers (None: `key`)."""
        key = _text("replicate", "key", key)
        if isinstance(to, str):
            to = [to]
        try:
            ids = [_text("replicate", "to", p) for p in to]
        except TypeError:
            raise _errors.BY_NAME["INVALID_ARGUMENT"](
                "replicate: to must be a list of peer ids, not %r" % (to,)) from None
        if not ids:
            raise _errors.BY_NAME["INVALID_ARGUMENT"]("replicate: to names no peer")
        arr = (ctypes.c_char_p * len(ids))(*ids)
        opts = _lib.ReplicateOpts()
        if version is not None:
            opts.version = _version("replicate", version)
        if as_ is not None:
            opts.as_ = _text("replicate", "as_", as_)
        tid = ctypes.c_uint64()
        self._do(_l.st_client_replicate, key, arr, len(ids), _byref(opts), _byref(tid))
        return Task(self, tid.value)

    def unsubscribe(self, key):
        """Ends the subscription of live replica `key` (pull(..., live=True));
        the key stays here with the version it holds, which is returned.
        NotFoundError when `key` follows no peer's key."""
        v = ctypes.c_uint64()
        self._do(_l.st_client_unsubscribe, _text("unsubscribe", "key", key), _byref(v))
        return v.value

    def replicas(self, key):
        """Who follows this server's key `key`, and what `key` here follows:
        {key, subscribers: [{peer, version, since}], source: {peer, key,
        version, updates, torn, lost, why} or None}."""
        return self._value_call(_l.st_client_replicas, _text("replicas", "key", key))

    # ----------------------------------------------------------- objects

    def release(self, object_id, wait=True):
        """Gives back this connection's lease on an object (idempotent):
        {released, destroyed, refcount}. wait=False sends it without
        waiting for the answer (None): the server handles it before this
        client's next request."""
        if not wait:
            with self._lock:
                rc = _release(self._ptr or self._h(), object_id, None, None, None)
                if rc != 0:
                    self._fail(rc)
            return None
        rel, des, ref = self._rel
        with self._lock:
            rc = _release(self._ptr or self._h(), object_id, *self._rel_refs)
            if rc != 0:
                self._fail(rc)
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

    # ------------------------------------------------------ published keys

    def put(self, key, value, policy="pinned", readonly=False, live=False, readers=None):
        """Publishes `value` under `key` (docs/keys.md): a tensor, or a
        mapping of names to tensors and plain values (a state dict; an
        nn.Module gives its state_dict()). Tensors from
        sharedtensor.empty/zeros are adopted without a copy: writes made
        to them later are seen by every reader. Any other tensor is copied
        once. policy: "pinned" (kept until deleted) or "evictable"
        (dropped under the server's memory budget). readonly=True: readers
        other than this connection map it read-only. Returns the new
        version (1, 2, ...).
        live=True makes a live key, updated in place (update, updating,
        bind; docs/views.md section 3): every other connection maps it
        read-only. A live put into an existing live key makes this
        connection its publisher and copies the value into the key's
        memory by name: every tensor of the key, with its names, shapes and
        dtypes, checked by the server first (a mismatch raises
        InvalidArgumentError and changes nothing).
        readers={"uids": [int], "gids": [int]} grants those uids (and
        callers in those groups) read of the key: get, always read-only
        (docs/protocol.md, "Owners"; at most 16 of each). Other uids get
        NotFoundError. A put with readers replaces the key's grant ({}
        revokes it); a put without keeps it."""
        self._forget_publisher(key)
        return _keys.put(self, key, value, policy, readonly, live, readers)

    def _forget_publisher(self, key):
        h = self.__dict__.get("_published", {}).pop(key, None)
        if h is not None:
            h.close()

    def live(self, key, readonly=False, view=None):
        """A LiveKey handle on live key `key` (sharedtensor.live); view="spec"
        (windows only, docs/views.md) gives it windows of the key, e.g. a
        tensor-parallel rank's shard, that follow its updates."""
        return _live.LiveKey(self, key, readonly, view)

    def _publisher(self, key):
        """This connection's publishing handle of `key`, opened once."""
        pubs = self.__dict__.setdefault("_published", {})
        h = pubs.get(key)
        if h is None:
            h = pubs[key] = _live.LiveKey(self, key)
        if not h.publisher:
            raise ValueError("live key %r is published by another connection (a live put "
                             "into it takes it over)" % key)
        return h

    def update(self, key, tensors):
        """Copies `tensors` (name -> tensor) into live key `key` in place, as
        one update (publisher only; names, shapes and dtypes checked
        first). Readers' tensors keep their addresses. Returns the new
        version."""
        return self._publisher(key).update(tensors)

    def updating(self, key):
        """`with client.updating(key) as t:` write t[name] in place; the
        update (and its version) completes when the block ends."""
        return self._publisher(key).updating()

    def bind(self, module, key, readonly=True, view=None):
        """Points `module`'s parameters (and buffers) at live key `key`'s
        tensors, by name, without a copy: a Binding with version,
        wait_version, consistent(), read() and refresh(). view="spec" binds
        windows of the key (a tensor-parallel rank binds its shard:
        "*.q_proj.weight:shard(0,1,4)")."""
        return _live.Binding(module, self.live(key, readonly, view))

    def get(self, key, version=None, readonly=False, with_version=False, as_torch=None,
            view=None):
        """The value of `key` (version None: the latest): a tensor for a
        tensor, else a StateDict (an OrderedDict with `.key` and
        `.version`). with_version=True returns (value, version).
        readonly=True maps it read-only: a write faults in this process.
        view="spec" sees it through a view spec (docs/views.md, section 1):
        "w:shard(0,1,4)" maps rank 1's quarter of w's rows, no copy (a
        lone tensor is named "__tensor__"). NotFoundError for a missing key
        or version; ValueError (INVALID_ARGUMENT) for a bad view."""
        return _keys.get(self, key, version, readonly, with_version, as_torch, view)

    def get_into(self, key_or_result, tensors, version=None, view=None, dtype_cast=False):
        """Copies the tensors of a key (version None: the latest), or of a
        result (a dict or Module of tensors, a Handle, a StateDict), into
        the caller's `tensors`: a dict name -> torch tensor, an nn.Module
        (its parameters and buffers, by state_dict name) or one tensor (for
        a key that holds one). Every name, shape and dtype is checked first;
        any difference raises InvalidArgumentError listing them, with
        nothing copied. Then dst.copy_(src) per tensor on the current
        stream (device to device when both are on a GPU), casting when
        dtype_cast=True (else a dtype that differs is refused). A key is
        mapped read-only and its mapping kept for the next get_into of it
        (docs/views.md, section 2). `view` is passed to get. Returns the
        version copied (None for a result that has none)."""
        return _into.get_into(self, key_or_result, tensors, version, view, dtype_cast)

    def keys(self, prefix=None):
        """This uid's keys (list of dicts: key, version, versions, bytes,
        policy, device, readonly, uid, updated_at), by name."""
        return _keys.keys(self, prefix)

    def delete(self, key):
        """Drops every version of `key`; readers' tensors stay valid."""
        self._forget_publisher(key)
        _keys.delete(self, key)

    def reload(self):
        """Reloads the endpoint files: {ok, generation, error, changed, ...}."""
        return self._value_call(_l.st_client_reload)


def _text(where, name, v):
    """A non-empty str argument as bytes; else InvalidArgumentError."""
    if not isinstance(v, str) or not v:
        raise _errors.BY_NAME["INVALID_ARGUMENT"](
            "%s: %s must be a non-empty str, not %r" % (where, name, v))
    return v.encode()


def _version(where, v):
    """A version argument (an int >= 1); else InvalidArgumentError."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2 ** 64:
        raise _errors.BY_NAME["INVALID_ARGUMENT"](
            "%s: version must be an int >= 1 (None: the latest), not %r" % (where, v))
    return v


# ---------------------------------------------------------------- values

def _torch_leaves(v, out):
    """Appends the torch tensors of a converted value to `out`, in order;
    False when it holds a SharedTensor (which holds its result: such a
    value is not remembered)."""
    t = type(v)
    if t is Module:
        out.extend(v.values())
        return _torch_leaves(v.metadata, out)
    if t is list:
        return all(_torch_leaves(x, out) for x in v)
    if t is dict:
        return all(_torch_leaves(x, out) for x in v.values())
    if t is _tensor.SharedTensor:
        return False
    if t not in _PLAIN:
        out.append(v)
    return True


_PLAIN = (type(None), bool, int, float, str, bytes)


def _slow_value(res, framework):
    """The value of `res` node by node, for what st_result_marshal refuses
    (strings that are not UTF-8 come with replacement characters)."""
    return _convert(_l.st_result_value(res.ptr).contents, res, "", framework)


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
