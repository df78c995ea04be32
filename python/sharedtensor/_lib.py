"""libstclient through ctypes: finding the library and declaring its API.

The library is found, first match wins, through:
  1. $ST_CLIENT_LIB, a path (an explicit choice always wins);
  2. libstclient.so.0 inside this package (a wheel built by `pip install`
     bundles the library it found at build time, python/build_backend.py);
  3. _libpath.py, written by `cmake --install`: the installed library,
     relative to this package;
  4. pkg-config's libdir of stclient (an install whose .pc file is on the
     pkg-config path);
  5. the system loader: ldconfig's cache and LD_LIBRARY_PATH.
"""
import ctypes
import ctypes.util
import os

c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p
c_int = ctypes.c_int
c_int64 = ctypes.c_int64
c_uint32 = ctypes.c_uint32
c_uint64 = ctypes.c_uint64
c_size_t = ctypes.c_size_t
c_double = ctypes.c_double


class Tensor(ctypes.Structure):
    """st_tensor_t (include/st/client.h)."""
    _fields_ = [
        ("name", c_char_p),
        ("data", c_void_p),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", ctypes.POINTER(c_int64)),
        ("strides", ctypes.POINTER(c_int64)),
        ("numel", c_int64),
        ("nbytes", c_size_t),
        ("device", c_int),
        ("device_index", c_int),
        ("device_uuid", c_char_p),
    ]


class Value(ctypes.Structure):
    pass


class _Str(ctypes.Structure):
    # ptr as c_void_p: strings may hold NULs (binary) and are counted.
    _fields_ = [("ptr", c_void_p), ("len", c_size_t)]


class _Array(ctypes.Structure):
    _fields_ = [("items", ctypes.POINTER(Value)), ("len", c_size_t)]


class _Map(ctypes.Structure):
    _fields_ = [("keys", ctypes.POINTER(Value)), ("values", ctypes.POINTER(Value)),
                ("len", c_size_t)]


class _Module(ctypes.Structure):
    _fields_ = [("tensors", ctypes.POINTER(ctypes.POINTER(Tensor))), ("len", c_size_t),
                ("metadata", ctypes.POINTER(Value))]


class _ValueUnion(ctypes.Union):
    _fields_ = [
        ("boolean", c_int),
        ("integer", c_int64),
        ("number", c_double),
        ("str", _Str),
        ("array", _Array),
        ("map", _Map),
        ("tensor", ctypes.POINTER(Tensor)),
        ("module", _Module),
    ]


Value._fields_ = [("kind", c_int), ("as_", _ValueUnion)]

# The constants of include/st/client.h (st_device_kind_t, st_value_kind_t,
# st_call_flags_t).
ST_DEVICE_CPU, ST_DEVICE_CUDA = 0, 1
(ST_VALUE_NIL, ST_VALUE_BOOL, ST_VALUE_INT, ST_VALUE_FLOAT, ST_VALUE_STRING, ST_VALUE_BINARY,
 ST_VALUE_ARRAY, ST_VALUE_MAP, ST_VALUE_TENSOR, ST_VALUE_MODULE) = range(10)
ST_CALL_LEND_SAME, ST_CALL_READONLY = 1, 2


class ObjectInfo(ctypes.Structure):
    """st_object_info_t."""
    _fields_ = [
        ("id", c_uint64),
        ("server_id", c_char_p),
        ("cache_key", c_char_p),
        ("device", c_char_p),
        ("cached", c_int),
        ("managed", c_int),
        ("lease", c_int),
        ("refcount", c_int64),
        ("bytes", c_uint64),
    ]


class ResultSummary(ctypes.Structure):
    """st_result_summary_t."""
    _fields_ = [
        ("value", ctypes.POINTER(Value)),
        ("kind", c_int),
        ("ntensors", c_size_t),
        ("has_object", c_int),
        ("object", ObjectInfo),
        ("identity", c_uint64),
        ("same", c_int),
    ]


class Readers(ctypes.Structure):
    """st_readers_t (include/st/client.h)."""
    _fields_ = [
        ("uids", ctypes.POINTER(c_uint32)),
        ("nuids", c_size_t),
        ("gids", ctypes.POINTER(c_uint32)),
        ("ngids", c_size_t),
    ]


class PullOpts(ctypes.Structure):
    """st_pull_opts_t (include/st/client.h)."""
    _fields_ = [
        ("version", c_uint64),
        ("as_", c_char_p),
        ("device", c_char_p),
        ("policy", c_int),
        ("readers", ctypes.POINTER(Readers)),
        ("live", c_int),
    ]


class ReplicateOpts(ctypes.Structure):
    """st_replicate_opts_t (include/st/client.h)."""
    _fields_ = [
        ("version", c_uint64),
        ("as_", c_char_p),
    ]


class BufferInfo(ctypes.Structure):
    """st_buffer_info_t (include/st/client.h)."""
    _fields_ = [
        ("name", c_char_p),
        ("dtype", c_int),
        ("ndim", c_int),
        ("shape", ctypes.POINTER(c_int64)),
        ("slots", c_int),
        ("frame_bytes", c_uint64),
        ("device_index", c_int),
        ("readonly", c_int),
        ("handle", c_uint64),
        ("connection", c_uint64),
    ]


class ClientOptions(ctypes.Structure):
    """st_client_options_t."""
    _fields_ = [
        ("server_uid", c_int64),
        ("timeout_ms", c_int),
    ]



class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    """The head of DLManagedTensor (legacy): DLTensor comes first."""
    _fields_ = [("data", c_void_p), ("device_type", c_int), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", c_void_p), ("strides", c_void_p), ("byte_offset", c_uint64)]


KDL_UINT, KDL_BOOL = 1, 6

P = ctypes.POINTER
# Every function of include/st/client.h and include/st/errors.h, and those
# of dtype.h and dlpack.h the package uses, as (restype, argtypes). Opaque
# handles (st_client_t *, st_args_t *, st_result_t *) are c_void_p; a
# returned char * that the caller frees is c_void_p too.
# tests/python/test_mirrors.py compares this table with the headers.
_PROTOS = {
    # errors.h
    "st_err_name": (c_char_p, [c_int]),
    "st_strerror": (c_char_p, [c_int]),
    "st_err_from_name": (c_int, [c_char_p]),
    # dtype.h
    "st_dtype_name": (c_char_p, [c_int]),
    "st_dtype_size": (c_size_t, [c_int]),
    "st_dtype_from_name": (c_int, [c_char_p]),
    # dlpack.h
    "st_tensor_dlpack": (c_void_p, [c_void_p, P(Tensor), c_int]),
    # client.h: values
    "st_value_get": (P(Value), [P(Value), c_char_p]),
    "st_value_json": (c_void_p, [P(Value), c_int]),
    "st_tensor_get": (c_double, [P(Tensor), c_int64]),
    "st_tensor_copy_to_host": (c_int, [P(Tensor), c_void_p, c_size_t]),
    "st_tensor_is_contiguous": (c_int, [P(Tensor)]),
    # results
    "st_result_value": (P(Value), [c_void_p]),
    "st_result_tensor_count": (c_size_t, [c_void_p]),
    "st_result_tensor": (P(Tensor), [c_void_p, c_size_t]),
    "st_result_find": (P(Tensor), [c_void_p, c_char_p]),
    "st_result_object": (c_int, [c_void_p, P(ObjectInfo)]),
    "st_result_ref": (None, [c_void_p]),
    "st_result_free": (None, [c_void_p]),
    # arguments
    "st_args_new": (c_void_p, []),
    "st_args_free": (None, [c_void_p]),
    "st_args_nil": (c_int, [c_void_p, c_char_p]),
    "st_args_bool": (c_int, [c_void_p, c_char_p, c_int]),
    "st_args_int": (c_int, [c_void_p, c_char_p, c_int64]),
    "st_args_float": (c_int, [c_void_p, c_char_p, c_double]),
    "st_args_string": (c_int, [c_void_p, c_char_p, c_char_p]),
    "st_args_str": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "st_args_bytes": (c_int, [c_void_p, c_char_p, c_void_p, c_size_t]),
    "st_args_begin_list": (c_int, [c_void_p, c_char_p]),
    "st_args_begin_map": (c_int, [c_void_p, c_char_p]),
    "st_args_end": (c_int, [c_void_p]),
    "st_args_key": (c_int, [c_void_p, c_char_p, c_size_t]),
    "st_args_keys": (c_int, [c_void_p, c_char_p, P(c_size_t), c_size_t]),
    "st_args_ints": (c_int, [c_void_p, P(c_int64), c_size_t]),
    "st_args_floats": (c_int, [c_void_p, P(c_double), c_size_t]),
    "st_args_strs": (c_int, [c_void_p, c_char_p, P(c_size_t), c_size_t]),
    "st_args_error": (c_char_p, [c_void_p]),
    "st_args_parse_kv": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "st_args_parse_json": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    # tensor arguments
    "st_tensor_alloc": (c_int, [c_char_p, c_int, c_int, P(c_int64), P(c_void_p), c_char_p,
                                c_size_t]),
    "st_args_tensor": (c_int, [c_void_p, c_char_p, P(Tensor), c_char_p, c_size_t]),
    "st_tensor_is_shareable": (c_int, [P(Tensor)]),
    "st_args_tensor_copy": (c_int, [c_void_p, c_char_p, P(Tensor), P(c_int), c_char_p,
                                    c_size_t]),
    # client
    "st_socket_path": (c_int, [c_char_p, c_int, c_char_p, c_size_t]),
    "st_client_options_init": (None, [P(ClientOptions)]),
    "st_client_connect_opts": (c_int, [c_char_p, P(ClientOptions), P(c_void_p), c_char_p,
                                       c_size_t]),
    "st_client_connect_device_opts": (c_int, [c_char_p, c_int, P(ClientOptions), P(c_void_p),
                                              c_char_p, c_size_t]),
    "st_client_connect": (c_int, [c_char_p, P(c_void_p), c_char_p, c_size_t]),
    "st_client_connect_device": (c_int, [c_char_p, c_int, P(c_void_p), c_char_p, c_size_t]),
    "st_client_close": (None, [c_void_p]),
    "st_client_error": (c_char_p, [c_void_p]),
    "st_client_error_name": (c_char_p, [c_void_p]),
    "st_client_set_timeout": (None, [c_void_p, c_int]),
    "st_client_server_id": (c_char_p, [c_void_p]),
    "st_client_server_version": (c_char_p, [c_void_p]),
    "st_client_server_pid": (c_int, [c_void_p]),
    "st_client_ping": (c_int, [c_void_p, P(c_double)]),
    "st_client_call": (c_int, [c_void_p, c_char_p, c_void_p, P(c_void_p)]),
    "st_client_rpc": (c_int, [c_void_p, c_char_p, c_void_p, P(c_void_p)]),
    "st_client_info": (c_int, [c_void_p, P(c_void_p)]),
    "st_client_endpoints": (c_int, [c_void_p, P(c_void_p)]),
    "st_client_peers": (c_int, [c_void_p, P(c_void_p)]),
    # tasks
    "st_client_submit": (c_int, [c_void_p, c_char_p, c_void_p, P(c_uint64)]),
    "st_client_task_status": (c_int, [c_void_p, c_uint64, P(c_void_p)]),
    "st_client_task_wait": (c_int, [c_void_p, c_uint64, c_double, P(c_void_p)]),
    "st_client_task_result": (c_int, [c_void_p, c_uint64, P(c_void_p)]),
    "st_client_task_cancel": (c_int, [c_void_p, c_uint64, P(c_void_p)]),
    "st_client_tasks": (c_int, [c_void_p, c_char_p, c_uint64, c_int, P(c_void_p)]),
    # keys between servers
    "st_client_pull": (c_int, [c_void_p, c_char_p, c_char_p, P(PullOpts), P(c_uint64)]),
    "st_client_unsubscribe": (c_int, [c_void_p, c_char_p, P(c_uint64)]),
    "st_client_replicas": (c_int, [c_void_p, c_char_p, P(c_void_p)]),
    "st_client_replicate": (c_int, [c_void_p, c_char_p, P(c_char_p), c_size_t,
                                    P(ReplicateOpts), P(c_uint64)]),
    # objects and caches
    "st_client_release": (c_int, [c_void_p, c_uint64, P(c_int), P(c_int), P(c_int64)]),
    "st_client_object_info": (c_int, [c_void_p, c_uint64, P(c_void_p)]),
    "st_client_ensure_live": (c_int, [c_void_p, c_uint64, c_char_p]),
    "st_client_objects": (c_int, [c_void_p, P(c_void_p)]),
    "st_client_invalidate_call": (c_int, [c_void_p, c_char_p, c_void_p, P(c_int)]),
    "st_client_invalidate_endpoint": (c_int, [c_void_p, c_char_p, P(c_int64)]),
    "st_client_reload": (c_int, [c_void_p, P(c_void_p)]),
    # published keys
    "st_client_put": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_int, P(c_uint64)]),
    "st_client_put_ex": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_int, P(Readers),
                                 P(c_uint64)]),
    "st_client_get": (c_int, [c_void_p, c_char_p, c_uint64, c_int, P(c_void_p),
                              P(c_uint64)]),
    "st_client_keys": (c_int, [c_void_p, c_char_p, P(c_void_p)]),
    "st_client_delete": (c_int, [c_void_p, c_char_p]),
    # live keys (sharedtensor.live)
    "st_key_open": (c_int, [c_void_p, c_char_p, c_int, P(c_void_p)]),
    "st_key_open_view": (c_int, [c_void_p, c_char_p, c_int, c_char_p, P(c_void_p)]),
    "st_key_close": (None, [c_void_p]),
    "st_key_result": (c_void_p, [c_void_p]),
    "st_key_is_publisher": (c_int, [c_void_p]),
    "st_key_version": (c_uint64, [c_void_p]),
    "st_key_wait_version": (c_int, [c_void_p, c_uint64, c_int64, P(c_uint64)]),
    "st_key_read_begin": (c_int, [c_void_p, c_int64, P(c_uint64)]),
    "st_key_read_end": (c_int, [c_void_p, c_uint64, c_void_p, P(c_int)]),
    "st_key_begin_update": (c_int, [c_void_p]),
    "st_key_end_update": (c_int, [c_void_p, c_void_p]),
    "st_key_update": (c_int, [c_void_p, P(P(Tensor)), c_size_t]),
    "st_key_error": (c_char_p, [c_void_p]),
    # loading into caller-owned tensors
    "st_result_copy_into": (c_int, [c_void_p, P(Tensor), c_size_t, c_void_p, c_char_p,
                                    c_size_t]),
    "st_copy_ranges": (c_int, [c_int, P(c_uint64), P(c_uint64), P(c_uint64), c_size_t,
                               c_void_p, c_int, c_char_p, c_size_t]),
    "st_get_into": (c_int, [c_void_p, c_char_p, c_uint64, c_char_p, P(Tensor), c_size_t,
                            c_void_p, P(c_uint64)]),
    "st_copy_stats": (None, [P(c_uint64), P(c_uint64)]),
    "st_client_call_flags": (c_int, [c_void_p, c_char_p, c_void_p, c_int, P(c_void_p)]),
    # views
    "st_client_get_view": (c_int, [c_void_p, c_char_p, c_uint64, c_int, c_char_p, P(c_void_p),
                                   P(c_uint64)]),
    "st_client_get_since": (c_int, [c_void_p, c_char_p, c_uint64, c_int, c_char_p, c_uint64,
                                    P(c_void_p), P(c_uint64)]),
    "st_client_call_view": (c_int, [c_void_p, c_char_p, c_void_p, c_int, c_char_p,
                                    P(c_void_p)]),
    "st_open_cache_stats": (None, [P(c_size_t), P(c_uint64)]),
    # bindings
    "st_result_summary": (c_int, [c_void_p, P(ResultSummary)]),
    "st_client_call_summary": (c_int, [c_void_p, c_char_p, c_void_p, c_int, P(c_void_p),
                                       P(ResultSummary)]),
    "st_result_dlpack_all": (c_size_t, [c_void_p, c_int, P(c_void_p), c_size_t]),
    "st_result_tensor_is": (c_int, [c_void_p, c_size_t, P(Tensor)]),
    "st_result_marshal": (c_void_p, [c_void_p, P(c_size_t)]),
    "st_client_rpc_marshal": (c_int, [c_void_p, c_char_p, c_void_p, P(c_void_p), P(c_size_t),
                                      P(c_void_p)]),
    "st_open_cache_keep": (None, [c_size_t, c_uint64]),
    "st_open_cache_kept": (None, [P(c_size_t), P(c_uint64)]),
    # hand-offs (sharedtensor.handoff)
    "st_handoff_create": (c_int, [c_void_p, c_char_p, c_char_p, c_uint64, c_int, c_int,
                                  P(c_void_p)]),
    "st_handoff_create_ex": (c_int, [c_void_p, c_char_p, c_char_p, c_uint64, c_int, c_int,
                                     P(Readers), P(c_void_p)]),
    "st_handoff_open": (c_int, [c_void_p, c_char_p, P(c_void_p)]),
    "st_handoff_open_ex": (c_int, [c_void_p, c_char_p, c_int, c_char_p, P(c_void_p)]),
    "st_handoff_shape": (c_int, [c_void_p, P(c_int), P(c_uint64), P(c_int), P(c_int), P(c_int)]),
    "st_handoff_acquire": (c_int, [c_void_p, c_int, P(c_int), P(c_void_p)]),
    "st_handoff_publish": (c_int, [c_void_p, c_int, c_uint64, P(c_uint64)]),
    "st_handoff_cancel": (c_int, [c_void_p, c_int]),
    "st_handoff_read": (c_int, [c_void_p, c_int, c_uint64, c_int, P(c_void_p), P(c_uint64)]),
    "st_handoff_ack": (c_int, [c_void_p, c_int, c_uint64]),
    "st_handoff_pending": (c_int, [c_void_p, c_int, P(c_uint64), P(c_uint64)]),
    "st_handoff_error": (c_char_p, [c_void_p]),
    "st_handoff_close": (c_int, [c_void_p]),
    "st_handoff_delete": (c_int, [c_void_p, c_char_p]),
    # buffers and streams (sharedtensor.buffer)
    "st_buffer_create": (c_int, [c_void_p, c_char_p, c_char_p, c_int, c_int, P(c_int64), c_int,
                                 P(c_void_p)]),
    "st_buffer_create_ex": (c_int, [c_void_p, c_char_p, c_char_p, c_int, c_int, P(c_int64),
                                    c_int, P(Readers), P(c_void_p)]),
    "st_buffer_open": (c_int, [c_void_p, c_char_p, c_int, P(c_void_p)]),
    "st_buffer_info": (c_int, [c_void_p, P(BufferInfo)]),
    "st_buffer_write": (c_int, [c_void_p, c_void_p, c_uint64, c_int, P(c_uint64)]),
    "st_buffer_write_begin": (c_int, [c_void_p, c_int, P(c_void_p)]),
    "st_buffer_write_end": (c_int, [c_void_p, P(c_uint64)]),
    "st_buffer_write_abort": (c_int, [c_void_p]),
    "st_buffer_read": (c_int, [c_void_p, c_void_p, c_uint64, c_int, P(c_uint64), P(c_int64)]),
    "st_buffer_read_new": (c_int, [c_void_p, c_void_p, c_uint64, c_int, P(c_uint64),
                                   P(c_int64)]),
    "st_buffer_wait_new": (c_int, [c_void_p, c_int, P(c_uint64)]),
    "st_buffer_set_spin": (c_int, [c_void_p, c_int]),
    "st_buffer_read_begin": (c_int, [c_void_p, c_int, P(c_void_p), P(c_uint64)]),
    "st_buffer_read_check": (c_int, [c_void_p, c_uint64, P(c_int64)]),
    "st_buffer_slot": (c_void_p, [c_void_p, c_int]),
    "st_buffer_write_sequence": (c_uint64, [c_void_p]),
    "st_buffer_write_time": (c_int64, [c_void_p]),
    "st_buffer_acquire": (c_int, [c_void_p, c_int]),
    "st_buffer_release": (c_int, [c_void_p]),
    "st_buffer_held": (c_int, [c_void_p]),
    "st_buffer_clear": (c_int, [c_void_p, c_int, P(c_uint64)]),
    "st_buffer_locked": (c_int, [c_void_p, P(c_uint64), P(c_int), P(c_int)]),
    "st_buffer_error": (c_char_p, [c_void_p]),
    "st_buffer_close": (c_int, [c_void_p]),
    "st_buffer_unlink": (c_int, [c_void_p, c_char_p]),
}


_SONAME = "libstclient.so.0"


def _pkg_config_libdir():
    import shutil
    import subprocess
    if not shutil.which("pkg-config"):
        return None
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "stclient"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _candidates():
    """(where, path) pairs in search order (module docstring)."""
    env = os.environ.get("ST_CLIENT_LIB")
    if env:
        yield "$ST_CLIENT_LIB", env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield "the package", os.path.join(here, _SONAME)
    try:
        from . import _libpath
        yield "the install prefix", os.path.normpath(os.path.join(here, _libpath.LIBDIR, _SONAME))
    except ImportError:
        pass
    libdir = _pkg_config_libdir()
    if libdir:
        yield "pkg-config", os.path.join(libdir, _SONAME)
    yield "the system loader", ctypes.util.find_library("stclient") or _SONAME


def _load():
    tried = []
    lib = path = None
    for where, cand in _candidates():
        if where != "the system loader" and where != "$ST_CLIENT_LIB" \
                and not os.path.exists(cand):
            continue
        try:
            lib, path = ctypes.CDLL(cand), cand
            break
        except OSError as e:
            tried.append("%s (%s): %s" % (cand, where, e))
    if lib is None:
        raise ImportError(
            "sharedtensor: cannot load libstclient. Tried: %s. Install sharedtensor "
            "(`cmake --install`, or the Debian package), reinstall this package after "
            "building it (`pip install ./python` bundles build/lib/libstclient.so.0), "
            "or set ST_CLIENT_LIB to the library's path" % "; ".join(tried)) from None
    for name, (res, args) in _PROTOS.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError("sharedtensor: %s lacks %s: it is older than this package"
                              % (path, name)) from None
        fn.restype = res
        fn.argtypes = args
    return lib, path


lib, path = _load()


def unchecked(name):
    """A second entry to library function `name` with its return type and
    no argtypes, for the per-call paths (client.py): ctypes then converts
    no argument (about half the cost of a crossing with six). Its callers
    pass only ctypes objects (c_void_p for pointers), byref(), bytes,
    None and small ints for C ints: a Python int given for a pointer would
    go as a C int."""
    fn = lib[name]   # a new function object: `lib.name` keeps its argtypes
    fn.restype = _PROTOS[name][0]
    return fn

# The capsule destructor is passed to PyCapsule_New as a plain address: it
# is a C function of the library, never a Python callback.
capsule_destructor = ctypes.cast(lib.st_dlpack_capsule_destructor, c_void_p)

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [c_void_p, c_char_p, c_void_p]

# Capsule names must outlive every capsule: module-level buffers.
NAME_LEGACY = ctypes.create_string_buffer(b"dltensor")
NAME_VERSIONED = ctypes.create_string_buffer(b"dltensor_versioned")


def open_cache_stats():
    """(allocations mapped now, mappings reused since start) in this process."""
    mapped, reused = c_size_t(), c_uint64()
    lib.st_open_cache_stats(ctypes.byref(mapped), ctypes.byref(reused))
    return mapped.value, reused.value


def keep_arenas(max_arenas, max_bytes):
    """Sets how many received allocations (and bytes) this process keeps
    mapped after their last result is freed (st_open_cache_keep); 0, 0
    unmaps every kept one now and keeps none after."""
    lib.st_open_cache_keep(max_arenas, max_bytes)


def kept_arenas():
    """(allocations kept mapped for reuse now, their bytes)."""
    n, b = c_size_t(), c_uint64()
    lib.st_open_cache_kept(ctypes.byref(n), ctypes.byref(b))
    return n.value, b.value


def retag_bool_as_uint8(ptr):
    """Marks a legacy managed tensor of bools as uint8 (same bytes), for
    consumers that predate kDLBool (torch 1.13)."""
    dl = ctypes.cast(ptr, P(DLTensor)).contents
    if dl.dtype.code == KDL_BOOL and dl.dtype.bits == 8:
        dl.dtype.code = KDL_UINT


def capsule(ptr, versioned):
    """A PyCapsule owning the managed tensor at `ptr` (from st_tensor_dlpack)."""
    name = NAME_VERSIONED if versioned else NAME_LEGACY
    return _PyCapsule_New(ptr, ctypes.cast(name, c_char_p), capsule_destructor)
