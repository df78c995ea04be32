/* sharedtensor client library (libstclient).
 *
 * Connects to a stserver over its Unix socket, calls endpoints and maps the
 * tensors they return, zero-copy: the server sends file descriptors and this
 * library maps them into the calling process.
 *
 * Threads: an st_client_t is used by one thread at a time (calls on one
 * client must not overlap); distinct clients may be used from distinct
 * threads. Results are independent of the client that produced them: they
 * stay valid after st_client_close() and may be read from any thread. The
 * per-process open-cache (an allocation received twice is mapped once) is
 * shared by all clients and locked internally.
 *
 * Errors: every int-returning function returns ST_OK (0) or a negative
 * ST_ERR_* (include/st/errors.h). A client remembers the last failure:
 * st_client_error() gives its message. The library never aborts and never
 * prints.
 *
 * Ownership: "owned" pointers are freed by the caller with the named
 * function; "borrowed" pointers belong to the object they came from and live
 * as long as it does.
 */
#ifndef ST_CLIENT_H
#define ST_CLIENT_H

#include "st/api.h"

#include <stddef.h>
#include <stdint.h>

#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_client st_client_t;
typedef struct st_args st_args_t;
typedef struct st_result st_result_t;

/* ---------------------------------------------------------------- values */

typedef enum {
  ST_DEVICE_CPU = 0,
  ST_DEVICE_CUDA = 1
} st_device_kind_t;

/* A mapped tensor. Everything here is borrowed from the st_result_t.
 *
 * CUDA tensors (device == ST_DEVICE_CUDA): `data` is a device address in
 * this process (the mapping's base + offset), valid on device
 * `device_index`, the ordinal in this process of the GPU whose UUID the
 * server named (so CUDA_VISIBLE_DEVICES is honoured). The memory is ready
 * when the call returns: the server synchronized its stream before it
 * replied, so no event or stream wait is needed. The mapping is made in
 * the device's primary context (the one the CUDA runtime, PyTorch and
 * CuPy use); the library leaves the calling thread's current context as it
 * found it. The mapping stays valid, readable and writable, until the last
 * result using it is freed, even if the server exits or is killed. */
typedef struct st_tensor {
  const char *name;          /* path in the result: "", "weight", "0.bias" */
  void *data;                /* first element: mapping base + offset (a
                                device address for CUDA)                   */
  st_dtype_t dtype;
  int ndim;
  const int64_t *shape;      /* ndim entries                               */
  const int64_t *strides;    /* ndim entries, in elements                  */
  int64_t numel;
  size_t nbytes;             /* numel * element size                       */
  st_device_kind_t device;
  int device_index;          /* CUDA ordinal in this process; -1 for CPU   */
  const char *device_uuid;   /* "GPU-..." for CUDA, "" for CPU             */
} st_tensor_t;

typedef enum {
  ST_VALUE_NIL,
  ST_VALUE_BOOL,
  ST_VALUE_INT,      /* int64; larger unsigned values arrive as FLOAT */
  ST_VALUE_FLOAT,
  ST_VALUE_STRING,   /* UTF-8, NUL-terminated as well as counted */
  ST_VALUE_BINARY,
  ST_VALUE_ARRAY,
  ST_VALUE_MAP,
  ST_VALUE_TENSOR,
  ST_VALUE_MODULE
} st_value_kind_t;

typedef struct st_value st_value_t;
struct st_value {
  st_value_kind_t kind;
  union {
    int boolean;
    int64_t integer;
    double number;
    struct { const char *ptr; size_t len; } str;              /* STRING, BINARY */
    struct { const st_value_t *items; size_t len; } array;
    struct { const st_value_t *keys; const st_value_t *values; size_t len; } map;
    const st_tensor_t *tensor;
    struct {
      const st_tensor_t *const *tensors;   /* in the module's order   */
      size_t len;
      const st_value_t *metadata;          /* a MAP (maybe empty)     */
    } module;
  } as;
};

/* Value in a MAP by string key, or NULL. Borrowed. */
ST_API const st_value_t *st_value_get(const st_value_t *map, const char *key);

/* JSON text for a value (tensors appear as {"tensor": {dtype, shape, ...}}).
 * Returns an owned string (free()) or NULL when out of memory. */
ST_API char *st_value_json(const st_value_t *v, int pretty);

/* Element `linear` (row-major over the tensor's shape, honouring strides)
 * as a double; NaN for an index outside [0, numel) or a failed copy. For a
 * CUDA tensor each call is a small synchronous device-to-host copy (tens
 * of microseconds): meant for inspection, not for loops; use
 * st_tensor_copy_to_host for more than a few elements. Any thread. */
ST_API double st_tensor_get(const st_tensor_t *t, int64_t linear);

/* Copies every element of t into dst (caller's host memory, `len` >=
 * t->nbytes bytes) in contiguous row-major order: t->nbytes bytes, whatever
 * t's strides are. CPU and CUDA tensors. A strided CUDA tensor is copied as
 * its whole spanned range into a temporary host buffer and gathered there.
 * The copy is synchronous. ST_OK; ST_ERR_INVALID_ARGUMENT (NULL, len too
 * small); ST_ERR_OUT_OF_MEMORY; a CUDA failure (ST_ERR_INTERNAL,
 * ST_ERR_CAPABILITY). Any thread, while t's result lives. */
ST_API int st_tensor_copy_to_host(const st_tensor_t *t, void *dst, size_t len);

/* 1 when t's elements lie in row-major order without gaps (dims of size 1
 * do not count, as in PyTorch); 0-element and 0-d tensors are contiguous.
 * 0 for NULL or a non-contiguous view. Reads only the struct. Any
 * thread. */
ST_API int st_tensor_is_contiguous(const st_tensor_t *t);

/* --------------------------------------------------------------- results */

/* The whole reply value. Borrowed from r. */
ST_API const st_value_t *st_result_value(const st_result_t *r);

/* Every tensor in the result, depth-first in reply order (module tensors
 * named by their module key, nested ones by dotted paths). Borrowed. */
ST_API size_t st_result_tensor_count(const st_result_t *r);
ST_API const st_tensor_t *st_result_tensor(const st_result_t *r, size_t i);
ST_API const st_tensor_t *st_result_find(const st_result_t *r, const char *name);

/* The server object a reply names (docs/protocol.md, "Objects, leases and
 * caching"): results of managed, cached or singleflight endpoints, from
 * st_client_call() or st_client_task_result(). Strings are borrowed from
 * the result and live as long as it does. */
typedef struct st_object_info {
  uint64_t id;               /* unique within one server process           */
  const char *server_id;     /* the server process that owns it            */
  const char *cache_key;     /* "" when the endpoint does not cache; text
                                in full, no NUL (binary as b"..." with
                                \xNN: docs/protocol.md)                    */
  const char *device;        /* "cpu", "cuda", ... ("" if not sent)        */
  int cached;                /* 1: the server's cache holds the object     */
  int managed;               /* 1: a managed endpoint produced it          */
  int lease;                 /* 1: this reply gave the connection a lease  */
  int64_t refcount;          /* leases held on it, all connections, after
                                this reply (a result that a `same` reply
                                returned again: after the latest one)      */
  uint64_t bytes;            /* memory the object holds                    */
} st_object_info_t;

/* Fills *out with the object of a call or task result. ST_ERR_NOT_FOUND
 * when the result names no object (plain endpoints, results of
 * st_client_rpc and the other methods); ST_ERR_INVALID_ARGUMENT for NULL.
 * Any thread while r lives. */
ST_API int st_result_object(const st_result_t *r, st_object_info_t *out);

/* Takes one more reference on r (DLPack exports keep their result alive
 * this way, include/st/dlpack.h): each reference is dropped by one
 * st_result_free. NULL is a no-op. Any thread while r lives. */
ST_API void st_result_ref(st_result_t *r);

/* Drops one reference on a result; the last one frees it. Its mappings are
 * unmapped when no other result of this process still maps the same
 * allocation (CUDA device memory is given back to the driver then, once no
 * process maps it). A result that came as a region of the connection's
 * result pool (docs/pool.md) is given back to the server instead, which
 * may write it for the next result at once: the caller's work on a CUDA
 * result (kernels, copies on any stream) must be complete when its last
 * reference goes, as it must before an allocation of its own is unmapped.
 * st_result_free records no CUDA event and waits for nothing.
 *
 * The exception is a result whose DLPack export was released by its
 * consumer (the deleter of st_tensor_dlpack, include/st/dlpack.h: torch
 * drops a tensor while kernels it queued on it may not have run yet).
 * When such a result's last reference goes (the deleter's or a later
 * st_result_free), each of its CUDA pool regions gets a CUDA event
 * recorded on its device's legacy default stream (CU_STREAM_LEGACY, which
 * waits for every blocking stream) and is given back only once the event
 * completed: checked without blocking before each request of the
 * connection, waited for when more than 64 such frees wait on one
 * connection, and waited for by st_client_close before the slabs are
 * unmapped. Work on a non-blocking stream (cudaStreamNonBlocking; torch's
 * torch.cuda.Stream()) is not covered: synchronize that stream, or make
 * the default stream wait for it, before the last tensor goes.
 * NULL is a no-op. Any thread. */
ST_API void st_result_free(st_result_t *r);

/* ------------------------------------------------------------- arguments
 *
 * An st_args_t is the map of named arguments of a call (or the parameters
 * of st_client_rpc). Owned by the caller (st_args_free); one thread at a
 * time. Setting a name twice keeps the last value.
 *
 * Every setter places one value. At the top level `key` names the argument
 * (a non-empty NUL-terminated string). Values may nest: st_args_begin_list
 * and st_args_begin_map open a list or a map as the value of `key`, and
 * until the matching st_args_end every setter adds to the innermost open
 * container instead: inside a list `key` must be NULL (elements keep their
 * order); inside a map `key` names the member (any string, "" too), or is
 * NULL when st_args_key / st_args_keys queued the member's key (a key
 * holding NUL bytes goes that way). Nil is a value like any other: it
 * keeps its place in a list and its key in a map. An argument's lists and
 * maps nest at most 28 levels (ST_MAX_DEPTH - 4: a request holds 32 levels
 * of containers, 4 of them its own).
 *
 *   st_args_begin_map(a, "opts");          // opts = {"n": 2, "dims": [3, nil]}
 *   st_args_int(a, "n", 2);
 *   st_args_begin_list(a, "dims");
 *   st_args_int(a, NULL, 3);
 *   st_args_nil(a, NULL);
 *   st_args_end(a);
 *   st_args_end(a);
 *
 * The bulk setters place n values at once in the innermost open list or
 * map (in a map, each takes the next queued key): what bindings use for
 * long lists, one call instead of n.
 *
 *   int64_t dims[3] = {2, 3, 4};           // shape = [2, 3, 4]
 *   st_args_begin_list(a, "shape");
 *   st_args_ints(a, dims, 3);
 *   st_args_end(a);
 *
 * Errors: ST_ERR_INVALID_ARGUMENT (NULL map, a key where none belongs or
 * none where one must be, NULL data with a nonzero length, st_args_end
 * with nothing open, keys queued and never used, nesting too deep) or
 * ST_ERR_OUT_OF_MEMORY; st_args_error() says why. Nothing aborts. A
 * failure at the top level changes nothing. A failure inside an open
 * value is kept: every later call returns it until the outermost
 * st_args_end, which returns it too and drops the unfinished value (so
 * checking that last call is enough; a failed st_args_begin_* still opens
 * its level, for its st_args_end to close). Arguments with a container
 * still open are refused by the calls (ST_ERR_INVALID_ARGUMENT). */

/* New empty argument map, owned by the caller; NULL when out of memory. */
ST_API st_args_t *st_args_new(void);
/* Frees the map, its values and its tensor references. NULL ok. */
ST_API void st_args_free(st_args_t *a);

/* Scalars. st_args_string copies a NUL-terminated string; st_args_str
 * copies `len` bytes (NUL bytes included; s may be NULL when len is 0);
 * both send a msgpack string, meant to hold UTF-8. st_args_bytes sends
 * `len` bytes as msgpack binary (an endpoint sees an st.bytes value, and
 * binary it returns comes back as ST_VALUE_BINARY). */
ST_API int st_args_nil(st_args_t *a, const char *key);
ST_API int st_args_bool(st_args_t *a, const char *key, int v);
ST_API int st_args_int(st_args_t *a, const char *key, int64_t v);
ST_API int st_args_float(st_args_t *a, const char *key, double v);
ST_API int st_args_string(st_args_t *a, const char *key, const char *v);
ST_API int st_args_str(st_args_t *a, const char *key, const char *s, size_t len);
ST_API int st_args_bytes(st_args_t *a, const char *key, const void *p, size_t len);

/* Containers: open a list or a map as the value of `key`; st_args_end
 * closes the innermost open one. */
ST_API int st_args_begin_list(st_args_t *a, const char *key);
ST_API int st_args_begin_map(st_args_t *a, const char *key);
ST_API int st_args_end(st_args_t *a);

/* Queues keys for the next members of the innermost open map: one of
 * `len` bytes (NUL bytes included), or n packed back to back in `data`
 * (key i: lens[i] bytes). The setters of those members pass key NULL. */
ST_API int st_args_key(st_args_t *a, const char *key, size_t len);
ST_API int st_args_keys(st_args_t *a, const char *data, const size_t *lens, size_t n);

/* Bulk: n integers, n floats, or n strings (packed back to back in `data`,
 * string i lens[i] bytes) as the next n values of the innermost open list
 * or map. v / data may be NULL when nothing is to be read. */
ST_API int st_args_ints(st_args_t *a, const int64_t *v, size_t n);
ST_API int st_args_floats(st_args_t *a, const double *v, size_t n);
ST_API int st_args_strs(st_args_t *a, const char *data, const size_t *lens, size_t n);

/* Message of the last failure of a setter, container, key or bulk call
 * on a ("" if none), e.g. "argument 'dims': a list element takes no key
 * (pass NULL)" (st_args_parse_* and st_args_tensor report in their `err`
 * instead). Borrowed; valid until the next call on a. */
ST_API const char *st_args_error(const st_args_t *a);

/* One shell word "key=value". The value is typed by its text: an integer,
 * a float, true/false, null, else a string. A type may be forced with
 * "key:int=", "key:float=", "key:bool=", "key:str=", "key:hex=" (binary,
 * two hex digits a byte) or "key:json=" (any JSON
 * value; null inside lists and objects keeps its place). Top level only
 * (no container open). ST_ERR_INVALID_ARGUMENT on a malformed word; `err`
 * (may be NULL, `errlen` bytes) then says why. */
ST_API int st_args_parse_kv(st_args_t *a, const char *word, char *err, size_t errlen);

/* A JSON object; each member becomes an argument (nested arrays and objects
 * are kept, null included). Checked whole before any member is set.
 * Top level only. ST_ERR_INVALID_ARGUMENT with a reason in `err`
 * otherwise. */
ST_API int st_args_parse_json(st_args_t *a, const char *json, char *err, size_t errlen);

/* ------------------------------------------------------ tensor arguments
 *
 * An endpoint may take tensors as arguments (docs/protocol.md, "Tensor
 * arguments"): they travel as file descriptors, not bytes, and the endpoint
 * reads and writes them in place. Only memory made by st_tensor_alloc can
 * go: it is shareable (a sealed memfd on the CPU, an exported VMM
 * allocation on a GPU). */

/* Allocates a zero-filled, contiguous tensor of `dtype` and `shape` (ndim
 * 0..16 sizes) on `device`: "cpu" (NULL too), "cuda" (ordinal 0) or
 * "cuda:N", ordinals of this process. *out is a result holding that one
 * tensor (st_result_tensor(*out, 0), named ""), owned by the caller
 * (st_result_free), writable, exportable with DLPack like any result. Fill
 * it, then pass it (or a view of it) with st_args_tensor. CUDA memory is
 * written by this process's own streams: synchronize them before the call
 * (the server reads as soon as the request arrives). Errors:
 * ST_ERR_INVALID_ARGUMENT (bad device, dtype or shape), ST_ERR_CAPABILITY
 * (no CUDA), ST_ERR_OUT_OF_MEMORY, with a reason in err. Any thread. */
ST_API int st_tensor_alloc(const char *device, st_dtype_t dtype, int ndim, const int64_t *shape,
                           st_result_t **out, char *err, size_t errlen);

/* Sets `key` to a tensor argument. `t` describes the tensor: its memory
 * (data ... the last element its shape and strides reach) must lie inside
 * one allocation of st_tensor_alloc on t->device / t->device_index; any
 * view (a slice, a transpose, an offset) of it is fine, and t may be a
 * struct the caller filled in (how the Python package passes a torch
 * tensor). The argument map keeps the allocation until st_args_free; the
 * call sends its descriptor, and the endpoint's writes land in it.
 * Tensor arguments go to st_client_call and st_client_submit only, each
 * as an argument of its own (not inside a list or map).
 * Errors: ST_ERR_INVALID_ARGUMENT (a malformed tensor; memory that is not
 * from st_tensor_alloc: st_tensor_is_shareable tells which),
 * ST_ERR_OUT_OF_MEMORY, with a reason in err. */
ST_API int st_args_tensor(st_args_t *a, const char *key, const st_tensor_t *t, char *err,
                          size_t errlen);

/* 1 when t->data points into memory of st_tensor_alloc on t's device (the
 * kind st_args_tensor takes), else 0 (NULL, foreign memory, a result's
 * tensor: the server's memory). Any thread. */
ST_API int st_tensor_is_shareable(const st_tensor_t *t);

/* ---------------------------------------------------------------- client */

/* Socket path for a device: "<base>-<device>.sock". `base` NULL (or "")
 * means $SHARED_TENSOR_BASE_PATH when it is set, else the default bases
 * of include/st/wire.h in order ($XDG_RUNTIME_DIR/sharedtensor/st,
 * /run/sharedtensor/st, /tmp/shared-tensor): the first where the device's
 * socket exists, else the first of them. Writes at most `len` bytes;
 * ST_ERR_INVALID_ARGUMENT if it does not fit. Any thread (reads the
 * environment and the file system). */
ST_API int st_socket_path(const char *base, int device, char *out, size_t len);

/* Who the client talks to. Anyone who can bind the socket path (a socket
 * in /tmp while the server is down) would receive the client's calls and
 * the descriptors of its tensor arguments, so before it sends a byte
 * (hello included) the client reads the credentials of the listening
 * side (SO_PEERCRED: the uid of the process that called listen(), which
 * that process cannot forge) and refuses any other uid than the one it
 * expects, with ST_ERR_AUTH naming both ("the server at PATH runs as uid
 * 1001; this client expects uid 1000 (its own) or root ..."). The same
 * check runs on every reconnection (st_client_ensure_live). */

/* server_uid: the expected uid is this one, exactly (root too is refused
 * unless it is 0), when >= 0. ST_SERVER_UID_DEFAULT: the value of
 * $SHARED_TENSOR_SERVER_UID (a decimal uid) when it is set and not empty,
 * else this process's effective uid or root (0). */
#define ST_SERVER_UID_DEFAULT (-1)
#define ST_ENV_SERVER_UID "SHARED_TENSOR_SERVER_UID"

/* Options of st_client_connect_opts. Fill with st_client_options_init,
 * then change what differs. */
typedef struct st_client_options {
  int64_t server_uid;          /* ST_SERVER_UID_DEFAULT, or a uid         */
  int timeout_ms;              /* > 0: the limit for connecting (connect
                                  and hello together, one deadline) and
                                  then for each reply, as
                                  st_client_set_timeout. 0 (default):
                                  ST_CONNECT_TIMEOUT_MS for connecting,
                                  no limit for replies                    */
} st_client_options_t;

/* The limit for connect + hello when options give none. */
#define ST_CONNECT_TIMEOUT_MS 10000

/* Every option at its default. Any thread. */
ST_API void st_client_options_init(st_client_options_t *o);

/* Connects to the socket `path`, checks who listens (above) and exchanges
 * `hello`, within opts->timeout_ms (else ST_CONNECT_TIMEOUT_MS) for the
 * whole. `opts` NULL means every default. On success *out is owned by
 * the caller (st_client_close). On failure *out is NULL and `err` (may be
 * NULL) holds a message: ST_ERR_IO when nothing listens, ST_ERR_TIMEOUT
 * when the accept queue stayed full or no hello reply came in time (the
 * message says which and the limit), ST_ERR_AUTH when the server runs as
 * another uid than expected or refuses this user, ST_ERR_PROTOCOL on a
 * version mismatch, ST_ERR_INVALID_ARGUMENT for a server_uid out of range
 * or a $SHARED_TENSOR_SERVER_UID that is no uid. */
ST_API int st_client_connect_opts(const char *path, const st_client_options_t *opts,
                                  st_client_t **out, char *err, size_t errlen);
/* st_client_connect_opts to the socket of `device` under `base`
 * (st_socket_path). Without a base ($SHARED_TENSOR_BASE_PATH unset too)
 * the socket is the first that exists in the default bases; when none
 * does: ST_ERR_IO naming every path tried. */
ST_API int st_client_connect_device_opts(const char *base, int device,
                                         const st_client_options_t *opts, st_client_t **out,
                                         char *err, size_t errlen);
/* The two above with every option at its default. */
ST_API int st_client_connect(const char *path, st_client_t **out, char *err, size_t errlen);
ST_API int st_client_connect_device(const char *base, int device, st_client_t **out,
                             char *err, size_t errlen);

/* Closes the connection. Results already returned stay valid. NULL ok. */
ST_API void st_client_close(st_client_t *c);

/* Message of the last failure on this client ("" if none). Borrowed; valid
 * until the next call on c. */
ST_API const char *st_client_error(const st_client_t *c);

/* Stable error name of the last failure as sent by the server ("ENDPOINT"),
 * or the local one. Borrowed. */
ST_API const char *st_client_error_name(const st_client_t *c);

/* Receive timeout for each reply in milliseconds; 0 (default) waits as long
 * as the server takes. A timed-out call fails with ST_ERR_TIMEOUT and the
 * connection is closed (its reply would arrive out of step). */
ST_API void st_client_set_timeout(st_client_t *c, int timeout_ms);

/* From the hello reply; borrowed. */
ST_API const char *st_client_server_id(const st_client_t *c);
ST_API const char *st_client_server_version(const st_client_t *c);
ST_API int st_client_server_pid(const st_client_t *c);

/* Round trip of `ping`. rtt_us (may be NULL) receives the measured time. */
ST_API int st_client_ping(st_client_t *c, double *rtt_us);

/* Calls an endpoint. `args` may be NULL (all defaults). On success *out is
 * owned by the caller (st_result_free). A reply carrying CUDA memory that
 * this process cannot map (no driver, no visible device with the UUID the
 * server named, a build without CUDA) fails with ST_ERR_CAPABILITY, "no
 * CUDA device: <reason> (arena N is on GPU-...)"; nothing of the reply is
 * kept (its descriptors are closed). The same holds for every function
 * below that returns a result. */
ST_API int st_client_call(st_client_t *c, const char *endpoint, const st_args_t *args,
                   st_result_t **out);

/* Flags of st_client_call_flags and st_client_call_summary. */
typedef enum {
  /* A `same` reply's result is lent, not given: *out is the result the
   * connection already holds of that object, and the caller receives no
   * reference to it (it must not free it). The connection holds one for
   * the caller until its next request (any method) or its close: a caller
   * that needs *out longer takes its own with st_result_ref before then.
   * A binding that keeps a reference to each result it converted
   * recognizes the pointer and answers such a call with no further
   * crossing. Any other reply is owned by the caller as usual. */
  ST_CALL_LEND_SAME = 1,
  /* A result that is a server object (managed, cached, singleflight) maps
   * read-only: on the CPU its descriptors cannot map writable
   * (docs/keys.md, section 5); plain results are the caller's and stay
   * writable. */
  ST_CALL_READONLY = 2
} st_call_flags_t;

/* st_client_call with flags (st_call_flags_t). Thread of the client. */
ST_API int st_client_call_flags(st_client_t *c, const char *endpoint, const st_args_t *args,
                                int flags, st_result_t **out);

/* Any method of docs/protocol.md with named parameters (`params` may be
 * NULL). The reply's result is the value of *out. Used for info, endpoints
 * and every method without a dedicated wrapper. */
ST_API int st_client_rpc(st_client_t *c, const char *method, const st_args_t *params,
                  st_result_t **out);

/* Shorthands for st_client_rpc(c, "info" / "endpoints" / "peers", NULL,
 * out). peers: an ARRAY value, one MAP per configured peer {id, addr,
 * state, engines, since, rtt_us, last_error, link, as_uid}
 * (docs/protocol.md, "peers"). */
ST_API int st_client_info(st_client_t *c, st_result_t **out);
ST_API int st_client_endpoints(st_client_t *c, st_result_t **out);
ST_API int st_client_peers(st_client_t *c, st_result_t **out);

/* ----------------------------------------------------------------- tasks
 *
 * A task is a build queued on the server (docs/protocol.md, `submit`).
 * Task info is a MAP value: {id, uid, endpoint, status, created_at, started_at,
 * completed_at, error, progress, note, object_id}; `status` is "pending",
 * "running", "completed", "failed" or "cancelled"; times are unix seconds
 * or nil; `error` is nil or {code, name, message}; `progress` a number in
 * [0, 1] or nil. Every function below runs on the client's thread (one
 * call at a time per client); results are owned by the caller
 * (st_result_free) and outlive the client. */

/* Queues a build of `endpoint` with `args` (NULL: all defaults) and
 * returns at once with its id in *task_id. Argument errors
 * (UNKNOWN_ENDPOINT, INVALID_ARGUMENT) come back here, not later. */
ST_API int st_client_submit(st_client_t *c, const char *endpoint, const st_args_t *args,
                            uint64_t *task_id);

/* Task info of task `id` now. ST_ERR_NOT_FOUND for an unknown or expired
 * task. */
ST_API int st_client_task_status(st_client_t *c, uint64_t id, st_result_t **info);

/* Waits until the task ends or `timeout_s` seconds pass (a negative value
 * means the server's default, 30 s; the server caps it at 3600), then
 * gives its task info: a task still running after the timeout is not an
 * error, its info says so. The server holds no thread while it waits. The
 * client's own timeout (st_client_set_timeout) is extended by timeout_s
 * for this call, so it does not fire before the server answers. */
ST_API int st_client_task_wait(st_client_t *c, uint64_t id, double timeout_s,
                               st_result_t **info);

/* The task's result, mapped like st_client_call: the value, its tensors
 * and, for managed/cached endpoints, the object (st_result_object) with a
 * lease for this connection. A failed task gives its error (e.g.
 * ST_ERR_ENDPOINT with file:line), a cancelled one ST_ERR_CANCELLED, one
 * not finished ST_ERR_TASK ("task 7 is running"). A plain result is
 * handed over once: a second fetch is ST_ERR_TASK. */
ST_API int st_client_task_result(st_client_t *c, uint64_t id, st_result_t **out);

/* Cancels a task: a pending one at once, a running one when its body
 * next checks (it then ends "cancelled"); a finished one is unchanged.
 * `info` (may be NULL) receives the task info after the request. */
ST_API int st_client_task_cancel(st_client_t *c, uint64_t id, st_result_t **info);

/* One page of task info, an ARRAY, newest first: at most `limit` entries
 * (0: the server's default, 100; at most 1000, else
 * ST_ERR_INVALID_ARGUMENT) of the tasks whose id is below `before` (0:
 * from the newest). `status` (may be NULL) keeps only tasks in that
 * state. The next page: `before` = the id of the last entry; a page
 * shorter than the limit is the last. */
ST_API int st_client_tasks(st_client_t *c, const char *status, uint64_t before, int limit,
                           st_result_t **out);

/* --------------------------------------------------- objects and caches
 *
 * Leases belong to the connection: st_client_close() (or the process
 * dying) gives back every lease the client holds. Mappings already in
 * results stay valid whatever happens to the object on the server. */

/* Gives back this connection's lease on object `object_id`. Idempotent:
 * without a lease *released is 0. Out pointers may be NULL: *released,
 * *destroyed (the object is gone from the server: no lease left and not
 * cached) and *refcount (leases left, all connections). With all three
 * NULL nothing is waited for: the release goes as one message without a
 * reply (a server that says "release_notify" in hello; any other gets the
 * request), and the server handles it before this client's next request
 * on the connection. */
ST_API int st_client_release(st_client_t *c, uint64_t object_id, int *released,
                             int *destroyed, int64_t *refcount);

/* Object info as a MAP: {id, server_id, endpoint, cache_key, cached,
 * managed, refcount, bytes, device, created_at, last_accessed_at}.
 * ST_ERR_STALE_HANDLE when the object is gone. */
ST_API int st_client_object_info(st_client_t *c, uint64_t object_id, st_result_t **out);

/* ST_OK when object `object_id` of server `server_id` still lives on the
 * server. `server_id` NULL (or "") means the server this client was
 * talking to when the call began; pass st_object_info_t.server_id to be
 * exact. Fast and bounded, never a long hang:
 *   - ST_ERR_STALE_HANDLE: the object is gone, or it belonged to another
 *     server process (the server restarted);
 *   - a broken connection is reconnected once (a new hello; leases of the
 *     old connection are already gone; the client stays on the new one);
 *     when nothing listens any more the answer is, at once, ST_ERR_IO
 *     "server at PATH is not running";
 *   - with no st_client_set_timeout limit the exchange is bounded by 5 s
 *     (ST_ERR_TIMEOUT). */
ST_API int st_client_ensure_live(st_client_t *c, uint64_t object_id, const char *server_id);

/* An ARRAY of object info (as st_client_object_info), by id. */
ST_API int st_client_objects(st_client_t *c, st_result_t **out);

/* Drops the cache entry of `endpoint` for these arguments (bound like a
 * call: defaults filled). *dropped (may be NULL): 1 if an entry existed.
 * Leased objects live on until their last lease is released. */
ST_API int st_client_invalidate_call(st_client_t *c, const char *endpoint,
                                     const st_args_t *args, int *dropped);

/* Drops every cache entry of `endpoint`; *count (may be NULL) receives how
 * many. */
ST_API int st_client_invalidate_endpoint(st_client_t *c, const char *endpoint,
                                         int64_t *count);

/* ------------------------------------------------------ published keys
 *
 * A client publishes tensors under a key (docs/keys.md): the server adopts
 * the memory of st_tensor_alloc without a copy and keeps its own
 * reference, so the state outlives the publisher. Each put makes the next
 * version (1, 2, ...); the server keeps the last keys.max_versions. Only
 * the publisher's uid may get or delete a key, and the uids it grants
 * read (st_client_put_ex) may get it. */

/* Policies of st_client_put. */
#define ST_KEY_PINNED 0      /* kept until deleted                           */
#define ST_KEY_EVICTABLE 1   /* dropped under the memory budget, least
                                recently used first, like cached objects     */

/* st_client_put flags. */
#define ST_PUT_READONLY 1    /* readers other than the publisher's
                                connection map it read-only              */
#define ST_PUT_LIVE 2        /* a live key, updated in place: see "live
                                keys" below                              */

/* Copies tensor t into a fresh st_tensor_alloc allocation of its dtype,
 * shape and device when its memory is not one (a CPU copy honours
 * strides; a CUDA tensor must be contiguous), then sets `key` to it as
 * st_args_tensor does; memory of st_tensor_alloc is set as is, without a
 * copy. *copied (may be NULL) says which. The argument map keeps the copy
 * until st_args_free. The copy is synchronous. Errors as st_args_tensor,
 * and ST_ERR_INVALID_ARGUMENT for a non-contiguous foreign CUDA tensor.
 * Any thread that owns a. */
ST_API int st_args_tensor_copy(st_args_t *a, const char *key, const st_tensor_t *t, int *copied,
                               char *err, size_t errlen);

/* Publishes `value` (a map: names to tensors of st_tensor_alloc memory,
 * and any other values, e.g. a state dict) under `key`: 1 to 128 of
 * A-Z a-z 0-9 . _ - / :. The server maps the allocations and keeps them
 * (no copy): writes the publisher makes later are seen by every reader
 * (the adoption contract, docs/keys.md). *version (may be NULL) gets the
 * new version. Errors: ST_ERR_INVALID_ARGUMENT (name, a tensor not from
 * st_tensor_alloc: use st_args_tensor_copy), ST_ERR_AUTH (the key belongs
 * to another uid), ST_ERR_LIMIT (keys.max_keys, keys.max_bytes),
 * ST_ERR_OUT_OF_MEMORY (the device's memory_budget). */
ST_API int st_client_put(st_client_t *c, const char *key, const st_args_t *value, int policy,
                         int flags, uint64_t *version);

/* Read grants (docs/protocol.md, "Owners"): a key, buffer or hand-off
 * belongs to the uid that made it, and is NOT_FOUND to every other uid
 * but those its owner grants read: each uid in `uids` and each caller
 * whose primary or a supplementary group is in `gids` (at most 16 each;
 * a NULL list with a count of 0). A reader may get a key (always
 * read-only), open a buffer read-only and open a hand-off as a consumer;
 * anything more is ST_ERR_AUTH. Used by st_client_put_ex,
 * st_buffer_create_ex and st_handoff_create_ex; the caller keeps the
 * lists. */
typedef struct st_readers {
  const uint32_t *uids;
  size_t nuids;
  const uint32_t *gids;
  size_t ngids;
} st_readers_t;

/* st_client_put granting `readers` read of the key. readers NULL: the
 * key keeps the grant it has (none for a new key); an st_readers_t with
 * no uid and no gid revokes it; otherwise it replaces it. Errors as
 * st_client_put, and ST_ERR_INVALID_ARGUMENT (a NULL list with a count,
 * more than 16). Thread of the client. */
ST_API int st_client_put_ex(st_client_t *c, const char *key, const st_args_t *value, int policy,
                            int flags, const st_readers_t *readers, uint64_t *version);

/* st_client_get flags. */
#define ST_GET_READONLY 1    /* map the tensors read-only                  */

/* Maps version `version` of `key` (0: the latest) into *out, owned by the
 * caller (st_result_free): the value put, its tensors mapped like a call's
 * result. *got_version (may be NULL) says which version it is. The
 * mappings stay valid whatever happens to the key afterwards. Errors:
 * ST_ERR_NOT_FOUND (no such key or version), ST_ERR_AUTH. */
ST_API int st_client_get(st_client_t *c, const char *key, uint64_t version, int flags,
                         st_result_t **out, uint64_t *got_version);

/* Views (docs/views.md, section 1). `view` is a spec such as
 * "*.q_proj.weight:shard(0,1,4);*.o_proj.weight:shard(1,1,4)": per
 * tensor (selected by a glob over its name: map keys and indices joined
 * by '.', a module's tensors "<module>.<name>") narrow, slice, shard,
 * transpose and permute steps, each a strided window of the same memory
 * (no copy: the reply maps the same allocations), and `contiguous`, which
 * makes the server copy a window that is not contiguous once and keep the
 * copy for later requests of the same view. The server parses the spec;
 * a bad spec, a step past a bound or a selector that selects no tensor
 * fail with ST_ERR_INVALID_ARGUMENT and the server's message ("shard(0,5,
 * 4): rank 5 is not below world 4 (tensor 'w')"). NULL or "" is no view. */

/* st_client_get seen through `view`. Thread of the client. */
ST_API int st_client_get_view(st_client_t *c, const char *key, uint64_t version, int flags,
                              const char *view, st_result_t **out, uint64_t *got_version);

/* st_client_get_view, unless version `have` (not 0) is still the one the
 * request resolves to: then nothing is sent or mapped, *out is NULL and
 * *got_version is `have` (the caller goes on using what it got with that
 * version). For a caller that keeps a key's result, e.g. to load it again
 * and again (st_get_into does): asking costs one round trip, with no
 * descriptor. Thread of the client. */
ST_API int st_client_get_since(st_client_t *c, const char *key, uint64_t version, int flags,
                               const char *view, uint64_t have, st_result_t **out,
                               uint64_t *got_version);

/* st_client_call_flags seen through `view` (flags: ST_CALL_READONLY; a
 * reply with a view is never lent). Thread of the client. */
ST_API int st_client_call_view(st_client_t *c, const char *endpoint, const st_args_t *args,
                               int flags, const char *view, st_result_t **out);

/* The keys of this uid whose name starts with `prefix` (NULL: all), by
 * name: an ARRAY of {key, version, versions, bytes, policy, device,
 * readonly, uid, updated_at}. */
ST_API int st_client_keys(st_client_t *c, const char *prefix, st_result_t **out);

/* Drops every version of `key`. Readers' mappings stay valid; the server's
 * memory and budget charge go. ST_ERR_NOT_FOUND, ST_ERR_AUTH. */
ST_API int st_client_delete(st_client_t *c, const char *key);

/* ------------------------------------------------- keys between servers
 *
 * A key published on a peer (another host's server, docs/multihost.md) is
 * copied into this server by `pull`, or pushed from this server to peers
 * by `replicate` (docs/protocol.md, "pull" and "replicate"). Both are tasks: the functions below return the task's id
 * at once, and the task functions above follow it (st_client_task_wait:
 * `progress` is the fraction of bytes moved and `note` "N of M bytes";
 * st_client_task_cancel; st_client_task_result, whose value is a plain
 * MAP handed over once). Errors the server sees at once come back here:
 * ST_ERR_NOT_FOUND ('z' is not a peer of this server), ST_ERR_CAPABILITY
 * (no peers configured, the peer not up, no usable engine); the rest end
 * the task failed: ST_ERR_AUTH (the key is not exported by the peer),
 * ST_ERR_NOT_FOUND, ST_ERR_OUT_OF_MEMORY (this server's memory_budget),
 * ST_ERR_IO (the link or a transfer helper died), ST_ERR_CANCELLED. */

/* Options of st_client_pull; NULL, or a zeroed struct, is all defaults.
 * The strings are borrowed for the call. */
typedef struct st_pull_opts {
  uint64_t version;              /* the peer's version; 0: its latest         */
  const char *as;                /* the name here; NULL: the key's own name   */
  const char *device;            /* "cpu", "cuda" (this connection's device)
                                    or "cuda:N"; NULL: the memory kind of the
                                    peer's key (CUDA: device 0)               */
  int policy;                    /* ST_KEY_PINNED (0) or ST_KEY_EVICTABLE     */
  const st_readers_t *readers;   /* read grants of the copy; NULL: none       */
  int live;                      /* nonzero: the peer's key is a live key, and
                                    the copy follows it (below); version must
                                    be 0 and policy ST_KEY_PINNED            */
} st_pull_opts_t;

/* Starts a pull of `key` from peer `from` (an id of config.lua's
 * peer.peers) into this server: *task_id names the task. The task's
 * result: {key, version (here), origin: {peer, key, version}, bytes,
 * seconds}. The copy belongs to this client's uid; nothing of it is
 * visible before every byte arrived. Thread of the client. */
ST_API int st_client_pull(st_client_t *c, const char *key, const char *from,
                          const st_pull_opts_t *opts, uint64_t *task_id);

/* A live pull (opts->live; docs/multihost.md, "Live replication") copies
 * the peer's live key as one whole version into a live key here (its
 * result says {live: true} and the peer's version number), then keeps it
 * following the peer's key: each later version the peer's publisher
 * completes is brought in place and published here under the same
 * number, so readers here use st_key_open, st_key_read_begin/end and
 * st_key_wait_version as on any live key, and never read a version that
 * is not whole. Nobody here may put into it while it follows.
 * st_client_unsubscribe ends that (the key stays, with its last version):
 * *version (may be NULL) receives it. ST_ERR_NOT_FOUND when `key` is no
 * replica that follows a peer's key, ST_ERR_AUTH for another uid's.
 * Thread of the client. */
ST_API int st_client_unsubscribe(st_client_t *c, const char *key, uint64_t *version);

/* Who follows this server's key `key`, and what `key` here follows, as a
 * MAP: {key, subscribers: [{peer, version (the last announced), since}],
 * source: {peer, key, version, updates, torn, lost, why} or nil}. `lost`:
 * the peer's key or the link to it is gone (`why`), and the key keeps its
 * last version. ST_ERR_NOT_FOUND when there is no such key (or it is not
 * visible to this uid). Thread of the client. */
ST_API int st_client_replicas(st_client_t *c, const char *key, st_result_t **out);

/* Options of st_client_replicate; NULL, or a zeroed struct, is all
 * defaults. Borrowed for the call. */
typedef struct st_replicate_opts {
  uint64_t version;              /* this server's version; 0: the latest      */
  const char *as;                /* the name on the peers; NULL: the same     */
} st_replicate_opts_t;

/* Starts pushing `key` of this server to each of the `nto` peers named by
 * `to` (ids, none NULL or empty; the caller keeps the list): *task_id
 * names the task. Each peer pulls the version under the uid its config
 * names for this server (peer.peers[id].as_uid there; none: AUTH), so
 * the key must be exported and the caller able to get it. The task
 * completes with {key, version, peers: {<id>: {ok, version}}} when every
 * peer holds the version; else it fails naming each peer's outcome
 * ("replicate: 1 of 2 peers failed: b: ok; c: ..."), with the first
 * failure's error. Thread of the client. */
ST_API int st_client_replicate(st_client_t *c, const char *key, const char *const *to,
                               size_t nto, const st_replicate_opts_t *opts,
                               uint64_t *task_id);

/* ------------------------------------------------------------ live keys
 *
 * A key put with ST_PUT_LIVE (docs/views.md, section 3) is updated in
 * place: its publisher writes new values into the same memory, so readers
 * keep their mappings and pointers and see its version move. Each live
 * key has a control page (a seqlock: a sequence word, odd while an update
 * runs, the version, a futex word); per update and per read nothing goes
 * to the server.
 *
 *   publisher: st_client_put(..., ST_PUT_LIVE) once, st_key_open, then per
 *              update st_key_update (or st_key_begin_update, writes of its
 *              own, st_key_end_update)
 *   reader:    st_key_open once; st_key_wait_version; reads between
 *              st_key_read_begin and st_key_read_end
 *
 * Only the connection that put the key publishes it: every other
 * connection maps it read-only (memory and page). A put with ST_PUT_LIVE
 * into an existing live key (same uid) makes the putting connection the
 * publisher and copies its value into the key's memory by name as one
 * update (names, shapes and dtypes must match); the memory stays. A
 * publisher that leaves in the middle of an update (its connection
 * closes, SIGKILL included) leaves the key TORN: reads and gets fail with
 * ST_ERR_STALE_HANDLE until such a put completes an update.
 *
 * A live key is pinned (no ST_KEY_EVICTABLE) and has one version in the
 * table, its current one; a put without ST_PUT_LIVE cannot change a live
 * key, nor one with it a key that is not live (delete it first). */

typedef struct st_key st_key_t;

/* Opens live key `key` (st_client_get of it, plus its page): flags 0 or
 * ST_GET_READONLY. The handle is the publisher's when c is the
 * connection that publishes the key (and flags do not ask read-only).
 * *out is owned by the caller (st_key_close); c must outlive it. Errors:
 * those of st_client_get, ST_ERR_INVALID_ARGUMENT (not a live key),
 * ST_ERR_STALE_HANDLE (torn). Thread of the client. */
ST_API int st_key_open(st_client_t *c, const char *key, int flags, st_key_t **out);

/* st_key_open seen through `view` (a view spec of windows only:
 * st_client_get_view; NULL or "" is no view): the handle's tensors are
 * windows of the key's memory (a tensor-parallel rank's shard), with the
 * key's page, so they follow its updates and versions as the whole key's
 * do. A view ending in `contiguous` is INVALID_ARGUMENT (a copy would not
 * follow updates). Thread of the client. */
ST_API int st_key_open_view(st_client_t *c, const char *key, int flags, const char *view,
                            st_key_t **out);

/* Closes k: its mappings go with the last reference to its result. NULL:
 * no-op. Not concurrently with other calls on k. */
ST_API void st_key_close(st_key_t *k);

/* The key's value and tensors (borrowed from k: take a reference with
 * st_result_ref to keep it longer). The tensors' addresses never change
 * for the life of the key; their contents change at each update. */
ST_API st_result_t *st_key_result(const st_key_t *k);

/* 1 when k may update the key (see st_key_open), else 0. */
ST_API int st_key_is_publisher(const st_key_t *k);

/* The last complete version (1 after the first put). Any thread. */
ST_API uint64_t st_key_version(const st_key_t *k);

/* Waits until the key's version is at least `version`, at most
 * timeout_ms (< 0: no limit), with a futex wait on the page (no server
 * round trip). *got (may be NULL) gets the version then. ST_OK;
 * ST_ERR_TIMEOUT ("no version N within M ms"); ST_ERR_STALE_HANDLE (the
 * key is torn); ST_ERR_NOT_FOUND (the key was deleted). Any thread. */
ST_API int st_key_wait_version(st_key_t *k, uint64_t version, int64_t timeout_ms, uint64_t *got);

/* Begins a consistent read: waits (at most timeout_ms; < 0: no limit)
 * while an update runs and gives the even sequence word in *seq. Read the
 * tensors, then call st_key_read_end with it. ST_OK, ST_ERR_TIMEOUT,
 * ST_ERR_STALE_HANDLE (torn), ST_ERR_NOT_FOUND (deleted). Any thread. */
ST_API int st_key_read_begin(st_key_t *k, int64_t timeout_ms, uint64_t *seq);

/* Ends a consistent read begun with *seq: *consistent is 1 when no update
 * began since (every byte read belongs to one version), else 0 (read
 * again). GPU fence: a CUDA key's reads must be complete before the
 * sequence is read again, so this first synchronizes CUstream `stream`
 * (NULL: the device's whole primary context); work of other streams is
 * the caller's to wait for. A CPU key synchronizes nothing. ST_OK,
 * ST_ERR_STALE_HANDLE (torn meanwhile; *consistent 0), or the driver's
 * error. Any thread. */
ST_API int st_key_read_end(st_key_t *k, uint64_t seq, void *stream, int *consistent);

/* The publisher begins an update (the sequence goes odd: readers that
 * check see a torn read); write the tensors of st_key_result, then
 * st_key_end_update. ST_ERR_INVALID_ARGUMENT (not the publisher's handle,
 * an update already begun), ST_ERR_STALE_HANDLE (another connection took
 * the key over). Thread that then ends it. */
ST_API int st_key_begin_update(st_key_t *k);

/* Ends the update: for a CUDA key synchronizes CUstream `stream` (NULL:
 * the device's whole primary context) so that the writes are complete,
 * then makes the sequence even with the next version and wakes every
 * waiter. ST_OK, ST_ERR_INVALID_ARGUMENT (no update begun), or the
 * driver's error (the update stays open: end it again or leave it torn). */
ST_API int st_key_end_update(st_key_t *k, void *stream);

/* One whole update: copies each of the n tensors (contiguous, CPU or CUDA
 * memory) into the key's tensor of the same name (st_tensor_t.name),
 * whose shape and dtype must be the same, between begin and end (CPU
 * memcpy; CUDA copies, then the context is synchronized). Every name,
 * shape and dtype is checked before anything is written: a mismatch is
 * ST_ERR_INVALID_ARGUMENT naming it, and the key is not touched.
 * Tensors of the key not given keep their values. */
ST_API int st_key_update(st_key_t *k, const st_tensor_t *const *tensors, size_t n);

/* The message of this thread's last failure of an st_key_* function
 * ("" if none; k is not used and may be NULL, as after a failed
 * st_key_open). */
ST_API const char *st_key_error(const st_key_t *k);
/* ------------------------------------ loading into caller-owned tensors
 *
 * Copies each named tensor of a source (a result, or a published key)
 * into the caller's tensor of the same name (docs/views.md, section 2):
 * parameters an engine allocated, any host or CUDA memory. Destinations
 * are st_tensor_t structs the caller fills; of each, these fields are
 * read: name, data, dtype, ndim, shape, strides (NULL: contiguous; else
 * they must be contiguous), device, device_index (a CUDA ordinal of this
 * process; ignored for the CPU). numel, nbytes and device_uuid are not.
 *
 * Every destination is checked before anything is copied, and any
 * difference refuses the whole call with ST_ERR_INVALID_ARGUMENT and
 * nothing copied; the message lists what differs (the first 8, then a
 * count): a destination the source lacks ("missing 'x'"), a source tensor
 * no destination names ("extra 'y'"; a source's values that are not
 * tensors do not count), "'w': shape [4, 4] here, [4, 8] in the source",
 * "'w': dtype float32 here, bfloat16 in the source", a source that is not
 * contiguous, a name given twice, CUDA tensors of one pair on two
 * devices, or copies on more than one device in one call. Dtypes must be
 * equal: casts are Python's (get_into(dtype_cast=True)).
 *
 * Copies: host to host is memcpy; copies with a CUDA side are queued on
 * `stream`, a CUstream of the device the copies use (the destinations',
 * else the source's), or NULL for the legacy default stream of that
 * device's primary context: two or more between memory of that device in
 * one launch of a batched copy kernel (each separate copy costs the GPU
 * a few microseconds of its own), the others with cuMemcpyAsync. The
 * copies of one call run concurrently: destinations must not overlap. */

/* Copies the tensors of `src` (any result: a call's, an object's, a key's
 * from st_client_get) into the n destinations `dst` (borrowed), checked
 * as above; err (may be NULL) gets the reason of a failure. With a
 * non-NULL stream the CUDA copies are only queued: synchronize the
 * stream before reading the destinations elsewhere or freeing src. With
 * a NULL stream, or host copies only, they are complete on return.
 * ST_OK; ST_ERR_INVALID_ARGUMENT (the checks); ST_ERR_CAPABILITY or a
 * driver error for CUDA. Any thread while src lives. */
ST_API int st_result_copy_into(const st_result_t *src, const st_tensor_t *dst, size_t n,
                               void *stream, char *err, size_t errlen);

/* st_copy_ranges flags. */
#define ST_COPY_SYNC 1   /* wait for the stream before returning            */
#define ST_COPY_DEVICE 2 /* every range lies in memory of device `ordinal`  */
                         /* on both sides: the per-range check is skipped   */

/* Copies n byte ranges, bytes[i] from address src[i] to address dst[i]
 * (destinations must not overlap): on CUDA device `ordinal`, queued on
 * `stream` (NULL: the legacy default stream of its primary context) as
 * above, ranges that follow each other in both dst and src merged into
 * one copy, then waits for the stream with ST_COPY_SYNC; with ordinal -1
 * in host memory (memcpy). The copies of st_result_copy_into and
 * st_get_into, for bindings that check their tensors themselves (Python's
 * get_into and live updates): the caller vouches for every range. Without
 * ST_COPY_DEVICE each range is asked of the driver (cuPointerGetAttributes)
 * before the kernel may take it; with it the caller vouches for that too
 * (a host address then faults in the kernel). ST_OK;
 * ST_ERR_INVALID_ARGUMENT (NULL arrays with n > 0, an unknown flag,
 * ST_COPY_DEVICE with ordinal -1); ST_ERR_CAPABILITY or a driver error,
 * with the reason in err (may be NULL). Any thread. */
ST_API int st_copy_ranges(int ordinal, const uint64_t *dst, const uint64_t *src,
                          const uint64_t *bytes, size_t n, void *stream, int flags, char *err,
                          size_t errlen);

/* Device copies of this process so far: ranges the batched copy kernel
 * copied, and ranges copied by cuMemcpyAsync (after merging). Shows which
 * way a caller's copies go; for tests and benchmarks. Any thread. */
ST_API void st_copy_stats(uint64_t *kernel_ranges, uint64_t *memcpy_ranges);

/* Maps version `version` of `key` (0: the latest) read-only (as
 * st_client_get with ST_GET_READONLY: nothing done to the destinations
 * can change the published state) and copies it into `dst` as
 * st_result_copy_into does, then waits for `stream` (NULL: the legacy
 * default stream): the copies are complete on return. *got_version (may
 * be NULL) gets the version copied. `view` (may be NULL) is a view spec
 * (st_client_get_view; docs/views.md, section 1): a tensor-parallel rank
 * loads its shard. The client keeps the key's source mapped (the last
 * st_get_into of each of up to 16 (key, view) pairs, the least recently used
 * let go; st_client_close lets go of all), so that the next st_get_into
 * of that key maps nothing new, and while the key's version has not moved
 * asks for it with one round trip that carries no descriptor
 * (st_client_get_since): that keeps one version per key alive in this
 * process until a newer one replaces it. Errors: those of
 * st_client_get (NOT_FOUND, AUTH, ...) and of st_result_copy_into, on the
 * client (st_client_error). Thread of the client. */
ST_API int st_get_into(st_client_t *c, const char *key, uint64_t version, const char *view,
                       const st_tensor_t *dst, size_t n, void *stream, uint64_t *got_version);

/* Reloads the endpoint files, as SIGHUP does. *out is a MAP {ok,
 * generation, error, changed, added, removed}; a load error is not a
 * failure of the call: ok is false and `error` names file:line, and the
 * old generation keeps serving. */
ST_API int st_client_reload(st_client_t *c, st_result_t **out);

/* Open-cache statistics of this process: allocations mapped now, and
 * mappings reused instead of created since start. For tests and stcli. */
ST_API void st_open_cache_stats(size_t *mapped, uint64_t *reused);


/* -------------------------------------------------------------- bindings
 *
 * For language bindings (the Python package, the Lua client): each
 * crossing into C through ctypes or an FFI costs more than the C it runs,
 * so a reply is read in one call rather than one accessor per field. */

/* What a binding needs of a result. Borrowed from the result. */
typedef struct st_result_summary {
  const st_value_t *value;   /* st_result_value                            */
  int kind;                  /* value->kind (st_value_kind_t)              */
  size_t ntensors;           /* st_result_tensor_count                     */
  int has_object;            /* 1: the reply names an object, in `object`  */
  st_object_info_t object;   /* st_result_object when has_object           */
  uint64_t identity;         /* a hash of every tensor's address, dtype,
                                shape, strides and device, in order: two
                                results of one object whose identities are
                                equal describe the same tensors at the same
                                addresses of this process                  */
  int same;                  /* 1: the reply said `same` (docs/client.md,
                                "Kept results"): the result is the one this
                                connection already holds of that object    */
} st_result_summary_t;

/* Fills *out for r. ST_OK; ST_ERR_INVALID_ARGUMENT for NULL. Any thread
 * while r lives. */
ST_API int st_result_summary(const st_result_t *r, st_result_summary_t *out);

/* st_client_call, then (on ST_OK) st_result_summary of *out into
 * *summary (may be NULL), whose `same` says whether the reply was `same`.
 * flags: st_call_flags_t (0, ST_CALL_LEND_SAME, ST_CALL_READONLY). *out is owned by the caller as with
 * st_client_call, except a `same` reply with ST_CALL_LEND_SAME (lent, see
 * above). Thread of the client. */
ST_API int st_client_call_summary(st_client_t *c, const char *endpoint, const st_args_t *args,
                                  int flags, st_result_t **out, st_result_summary_t *summary);

/* DLPack exports (include/st/dlpack.h, st_tensor_dlpack) of tensors 0 ..
 * n-1 of r, in st_result_tensor order, into out[]: each a
 * DLManagedTensorVersioned * (versioned) or a DLManagedTensor *, holding
 * one reference on r, released by its deleter; an entry is NULL where
 * that tensor cannot be exported (out of memory, a dtype DLPack lacks).
 * Returns how many entries were written: min(n, tensor count); 0 for a
 * NULL out. Any thread while r lives. */
ST_API size_t st_result_dlpack_all(st_result_t *r, int versioned, void **out, size_t n);

/* 1 when tensor i of r is t: the same data address (not NULL), dtype,
 * shape, strides, device and device index; else 0 (also for a NULL r or
 * t, or i out of range). A binding asks it of a call's result with each
 * tensor it passed (st_args_tensor): a result that is the caller's own
 * argument (docs/protocol.md, "Tensor arguments", {arg: i}) is then the
 * binding's own tensor object, with no conversion. t must be a valid
 * tensor (shape and strides for its ndim). Any thread while r lives. */
ST_API int st_result_tensor_is(const st_result_t *r, size_t i, const st_tensor_t *t);


/* Kept arenas. When the last result using an object's arena (one the
 * server may send again: its reply lists it in `kept`) is freed, its
 * mapping is kept (still mapped, used by no result) rather than
 * unmapped at once, so that the same allocation received again (a cached
 * object called again after its results were dropped) costs a lookup
 * instead of an mmap or a CUDA import. At most `max_arenas` mappings and
 * `max_bytes` bytes are kept per process, the oldest unmapped first; a
 * larger mapping is unmapped at once. Defaults: 16 arenas, 256 MiB, or
 * $ST_CLIENT_KEEP_ARENAS and $ST_CLIENT_KEEP_BYTES (decimal) read at the
 * library's first mapping. While kept, a mapping keeps its memory (host
 * pages of a memfd, device memory of a CUDA allocation) alive after the
 * server freed it. A kept mapping is served again only for the same
 * allocation (server_id, arena id, and the file's device and inode or the
 * GPU's UUID), never for another. st_open_cache_keep(0, 0) unmaps every
 * kept mapping and keeps none after. Any thread. */
ST_API void st_open_cache_keep(size_t max_arenas, uint64_t max_bytes);

/* Mappings kept now and their bytes (not counted by st_open_cache_stats'
 * `mapped`, which counts mappings results use). Any thread. */
ST_API void st_open_cache_kept(size_t *arenas, uint64_t *bytes);


/* r's value in CPython's marshal format, for the Python package
 * (marshal.loads reads it): nil None, booleans, integers, floats, strings
 * (str), binary (bytes), arrays (list) and maps (dict) as themselves; a
 * tensor as the tuple (i,) and a module as ([i, ...], [name, ...],
 * metadata), i the tensor's index in st_result_tensor order and the names
 * st_tensor_t.name (full paths). Returns the bytes (*len of them),
 * borrowed from r (allocated in it: call it on the thread that owns r,
 * before r is shared), or NULL with *len 0 when r has no value, out of
 * memory, or when the value holds what the format cannot carry the same
 * way (a string that is not valid UTF-8, a tensor inside a map key). */
ST_API const void *st_result_marshal(st_result_t *r, size_t *len);

/* st_client_rpc for a plain value (info, metrics, endpoints, task status,
 * ...), given in the format of st_result_marshal straight from the reply,
 * without a result: on ST_OK *data points to *len bytes owned by c, valid
 * until the next call on c. A reply the format cannot carry that way (a
 * tensor, a string that is not UTF-8, arenas) is decoded as st_client_rpc
 * does instead: *fallback gets that result (owned by the caller) and
 * *data stays NULL. On failure all three are NULL/0, as with
 * st_client_rpc. Thread of the client. */
ST_API int st_client_rpc_marshal(st_client_t *c, const char *method, const st_args_t *params,
                                 const void **data, size_t *len, st_result_t **fallback);

/* ------------------------------------------------------------ hand-offs
 *
 * A hand-off passes per-request memory from one producer process to one
 * or several consumer processes through a named pool the server owns
 * (docs/pool.md, section 5): one allocation of `chunks` chunks (CPU
 * memory, or one CUDA VMM allocation) and a small control page, both
 * mapped once. Per request nothing goes to the server:
 *
 *   producer: st_handoff_acquire -> write the chunk -> st_handoff_publish
 *             -> send (chunk, seq) to the consumers over its own channel
 *             (a pipe, a queue, a socket of its own)
 *   consumer: st_handoff_read(chunk, seq) -> use the chunk ->
 *             st_handoff_ack(chunk, seq)
 *
 * A chunk is acquired again only once every consumer slot acknowledged
 * its last publish. Every consumer slot (`consumers` of them) counts from
 * creation, opened or not, until a consumer that opened it leaves
 * (st_handoff_close or its connection closing): the server then makes
 * every acknowledgement it still owed. A producer that leaves makes
 * waiting reads fail with ST_ERR_STALE_HANDLE; what was published stays
 * readable. The server lets go of the memory when the last connection
 * using the hand-off leaves, or at st_handoff_delete; mappings stay valid
 * until each handle is closed.
 *
 * CUDA hand-offs: `data` is a device address. The producer's writes must
 * be complete (its stream synchronized, or an event it recorded after
 * them synchronized) before st_handoff_publish; a consumer acknowledges
 * only after its own GPU reads of the chunk completed (the same), since
 * an acknowledged chunk may be overwritten at once.
 *
 * Sequence numbers are 32-bit (1 .. 2^32 - 1, wrapping): a stale or
 * repeated (chunk, seq) is refused and changes nothing. Handle functions
 * other than create/open/close/delete report failures through
 * st_handoff_error (this thread's last message), not the client. */

typedef struct st_handoff st_handoff_t;

/* Creates hand-off `name` (1 to 64 of A-Z a-z 0-9 . _ -) on `device`
 * ("cpu" or NULL, "cuda" (the socket's device), "cuda:N") with `chunks`
 * chunks of `chunk_bytes` for `consumers` consumers (1 to 31); this
 * connection is its producer. Errors (the client's): INVALID_ARGUMENT
 * (name, sizes, a name in use), LIMIT (limits.max_handoff_chunks,
 * limits.max_handoffs_per_connection, max_object_bytes), OUT_OF_MEMORY
 * (memory_budget), CAPABILITY (no such CUDA device). *out is owned: close
 * it with st_handoff_close before the client. Thread of the client. */
ST_API int st_handoff_create(st_client_t *c, const char *name, const char *device,
                             uint64_t chunk_bytes, int chunks, int consumers,
                             st_handoff_t **out);

/* st_handoff_create granting `readers` (NULL: none; "published keys"
 * above) the right to open it as consumers. Thread of the client. */
ST_API int st_handoff_create_ex(st_client_t *c, const char *name, const char *device,
                                uint64_t chunk_bytes, int chunks, int consumers,
                                const st_readers_t *readers, st_handoff_t **out);

/* Opens hand-off `name` as a consumer: this connection takes the lowest
 * free consumer slot. Errors: NOT_FOUND (also another uid's that granted
 * this one no read),
 * LIMIT (every slot is open; limits.max_handoffs_per_connection),
 * INVALID_ARGUMENT (this connection already uses it). */
ST_API int st_handoff_open(st_client_t *c, const char *name, st_handoff_t **out);

/* st_handoff_open of `name@peer` (a hand-off of a peer server,
 * docs/multihost.md "Hand-offs across servers") choosing what the first
 * open makes of the mirror: `consumers` its consumer slots (0: 1) and
 * `device` its memory ("cpu", "cuda", "cuda:N"; NULL: the kind of the
 * peer's hand-off). A local name with either set is INVALID_ARGUMENT;
 * later opens of a mirror ignore both. Thread of the client. */
ST_API int st_handoff_open_ex(st_client_t *c, const char *name, int consumers, const char *device,
                              st_handoff_t **out);

/* Its shape (out pointers may be NULL): chunks, usable bytes per chunk,
 * consumer slots, this handle's slot (-1: the producer) and the CUDA
 * ordinal of its memory in this process (-1: CPU memory). Any thread. */
ST_API int st_handoff_shape(const st_handoff_t *h, int *chunks, uint64_t *chunk_bytes,
                            int *consumers, int *slot, int *device_index);

/* Producer: takes a free chunk, waiting up to timeout_ms (< 0: no limit)
 * for one; *chunk is its index, *data its memory (chunk_bytes). Errors:
 * TIMEOUT (every chunk still waits for acknowledgements), STALE_HANDLE
 * (deleted), INVALID_ARGUMENT (not the producer). Any thread. */
ST_API int st_handoff_acquire(st_handoff_t *h, int timeout_ms, int *chunk, void **data);

/* Producer: publishes acquired chunk `chunk` holding `bytes` (<=
 * chunk_bytes) to every consumer slot; *seq (may be NULL) is the
 * sequence number to send with the chunk index. CUDA: the writes must be
 * complete (above). INVALID_ARGUMENT: not acquired, too many bytes. */
ST_API int st_handoff_publish(st_handoff_t *h, int chunk, uint64_t bytes, uint64_t *seq);

/* Producer: gives acquired chunk `chunk` back unpublished. */
ST_API int st_handoff_cancel(st_handoff_t *h, int chunk);

/* Consumer: the memory of chunk `chunk` as published with `seq`, waiting
 * up to timeout_ms (< 0: no limit) when that publish is still to come.
 * *data (a device address for CUDA) and *bytes (what the producer
 * published) may be NULL. Errors: STALE_HANDLE (the chunk was recycled
 * since: a stale seq; or the producer left or the hand-off was deleted
 * while waiting), INVALID_ARGUMENT (already acknowledged by this
 * consumer), TIMEOUT. Any thread. */
ST_API int st_handoff_read(st_handoff_t *h, int chunk, uint64_t seq, int timeout_ms, void **data,
                           uint64_t *bytes);

/* Consumer: this consumer is done with chunk `chunk` of publish `seq`;
 * the last acknowledgement frees the chunk and wakes a waiting producer.
 * A stale seq (STALE_HANDLE) or a second acknowledgement
 * (INVALID_ARGUMENT) changes nothing. CUDA: after the reads completed. */
ST_API int st_handoff_ack(st_handoff_t *h, int chunk, uint64_t seq);

/* The state of chunk `chunk`: *seq its last publish (0: never), *pending
 * the consumer slots (bit i: slot i) that have not acknowledged it, with
 * bit 31 set while the producer holds it. For tests and monitoring. */
ST_API int st_handoff_pending(const st_handoff_t *h, int chunk, uint64_t *seq,
                              uint64_t *pending);

/* This thread's last hand-off failure message ("" when none). */
ST_API const char *st_handoff_error(const st_handoff_t *h);

/* Leaves the hand-off (handoff_close: a consumer's outstanding
 * acknowledgements are made, a producer's consumers see it gone), unmaps
 * it and frees h. Call it before st_client_close of its client. ST_OK or
 * the exchange's failure (h is freed either way). NULL is a no-op. */
ST_API int st_handoff_close(st_handoff_t *h);

/* Deletes hand-off `name` (its creator's uid only): the name goes and the
 * server lets go of its memory at once; open handles stay mapped until
 * closed, and their waits fail with STALE_HANDLE. */
ST_API int st_handoff_delete(st_client_t *c, const char *name);

/* -------------------------------------------------- buffers and streams
 *
 * A buffer is a named, shared frame of one shape and dtype, in `slots`
 * slots (docs/streams.md): one allocation (CPU memory or one CUDA VMM
 * allocation) and a small control page, mapped once by every process
 * that opens it. Per frame nothing goes to the server:
 *
 *   writer:  st_buffer_write (a copy into the next slot), or
 *            st_buffer_write_begin -> fill the slot -> st_buffer_write_end
 *   readers: st_buffer_read (a consistent copy of the newest complete
 *            write), st_buffer_read_new (wait for a write newer than the
 *            last this handle read, then read it), or
 *            st_buffer_read_begin -> copy the slot -> st_buffer_read_check
 *
 * Write number w goes to slot (w - 1) % slots; its slot's sequence word
 * is odd while it is written, so a reader that raced with a writer (a
 * torn copy, or a slot the ring lapped) notices and reads the newest
 * write again. Writes never overlap: a write takes the writer lock for
 * its duration unless this connection holds it (st_buffer_acquire). The
 * lock belongs to a connection: the server frees it when that connection
 * closes or dies (SIGKILL included), so a dead writer never leaves it
 * taken. Waits are futex waits on the page, with a timeout.
 *
 * A read-only handle (st_buffer_open with readonly) maps the frames and
 * the page without write access: writing through st_buffer_slot's
 * pointer faults in the writer's process (CPU: the descriptor cannot be
 * mapped writable; CUDA: the mapping's access is read-only), and
 * writes and the lock are refused with INVALID_ARGUMENT.
 *
 * CUDA buffers: slot addresses are device addresses. st_buffer_write and
 * st_buffer_read copy from and to host memory and wait for the copy; for
 * device-side copies use the begin/end pairs, and make the copy complete
 * (synchronize its stream) before st_buffer_write_end or
 * st_buffer_read_check.
 *
 * A buffer lives until st_buffer_unlink (the creator's uid): the name
 * goes at once, the memory when no handle is left; open handles keep
 * working. Handle functions other than create/open/close/unlink report
 * failures through st_buffer_error (this thread's last message), not the
 * client. Timeouts are in ms; -1 waits without limit. */

typedef struct st_buffer st_buffer_t;

/* What a buffer is, as its handle sees it. */
typedef struct st_buffer_info {
  const char *name;         /* borrowed from the handle              */
  st_dtype_t dtype;
  int ndim;
  const int64_t *shape;     /* ndim sizes, borrowed from the handle  */
  int slots;
  uint64_t frame_bytes;     /* bytes of one frame                     */
  int device_index;         /* -1: the CPU; else the CUDA ordinal here */
  int readonly;
  uint64_t handle;          /* the server's id of this handle         */
  uint64_t connection;      /* the id the writer lock names this connection by */
} st_buffer_info_t;

/* Creates buffer `name` (1 to 64 of A-Z a-z 0-9 . _ -) of `slots` frames
 * (1 to 1024) of `shape` (ndim 0 to 16 dimensions, each >= 1) and
 * `dtype` on `device` ("cpu" or NULL, "cuda", "cuda:N"), zero-filled, and
 * opens it read-write. Errors (the client's): INVALID_ARGUMENT (name,
 * shape, dtype, slots; the name exists), LIMIT (limits.max_buffers,
 * limits.max_buffer_bytes, limits.max_buffer_handles_per_connection),
 * OUT_OF_MEMORY (memory_budget), CAPABILITY (no such CUDA device). *out is
 * owned: close it with st_buffer_close before the client. Thread of the
 * client. */
ST_API int st_buffer_create(st_client_t *c, const char *name, const char *device,
                            st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
                            st_buffer_t **out);

/* st_buffer_create granting `readers` (NULL: none; "published keys"
 * above) the right to open it read-only. Thread of the client. */
ST_API int st_buffer_create_ex(st_client_t *c, const char *name, const char *device,
                               st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
                               const st_readers_t *readers, st_buffer_t **out);

/* Opens buffer `name` (the creator's uid, or a uid it granted read:
 * read-only then, AUTH otherwise), read-only when `readonly`. NOT_FOUND
 * when no buffer has that name or it belongs to another uid that granted
 * this one nothing. Thread of the client. */
ST_API int st_buffer_open(st_client_t *c, const char *name, int readonly, st_buffer_t **out);

/* Fills *out. Any thread. */
ST_API int st_buffer_info(const st_buffer_t *b, st_buffer_info_t *out);

/* Copies `bytes` (the frame's size) from host memory `src` into the next
 * slot and completes the write; *seq (may be NULL) gets its number.
 * Waits at most timeout_ms for the writer lock when another connection
 * holds it (TIMEOUT). INVALID_ARGUMENT: a read-only handle, another size,
 * a write already begun on this handle. Any thread. */
ST_API int st_buffer_write(st_buffer_t *b, const void *src, uint64_t bytes, int timeout_ms,
                           uint64_t *seq);

/* Begins a write: takes the writer lock (as st_buffer_write), marks the
 * next slot as being written and gives its address (*data: host memory,
 * or a device address of a CUDA buffer). Fill frame_bytes there, then
 * st_buffer_write_end (or st_buffer_write_abort). Any thread. */
ST_API int st_buffer_write_begin(st_buffer_t *b, int timeout_ms, void **data);

/* Completes the write begun on b: the slot's sequence, write_time,
 * write_sequence move and readers waiting in read_new wake. *seq (may be
 * NULL) gets the write's number. A lock taken by begin is freed. */
ST_API int st_buffer_write_end(st_buffer_t *b, uint64_t *seq);

/* Gives up the write begun on b: nothing is published, readers never see
 * the slot (with slots = 1, it held the newest write: reads wait for the
 * next write until their timeout). */
ST_API int st_buffer_write_abort(st_buffer_t *b);

/* Copies the newest complete write (write 0: the zero-filled frame, when
 * nothing was written yet) to host memory `dst` (`bytes` >= the frame's
 * size), consistent: a copy that raced with a writer is made again, for
 * at most timeout_ms (TIMEOUT: the writer kept rewriting that slot; use
 * more slots). *seq and *time_ns (may be NULL) get its write_sequence and
 * write_time. The handle remembers it as read (st_buffer_read_new). Any
 * thread. */
ST_API int st_buffer_read(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
                          uint64_t *seq, int64_t *time_ns);

/* Waits at most timeout_ms for a write newer than the last this handle
 * read (TIMEOUT "no write after N within M ms"), then reads as
 * st_buffer_read. Any thread. */
ST_API int st_buffer_read_new(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
                              uint64_t *seq, int64_t *time_ns);

/* Only the wait of st_buffer_read_new: *seq gets the newer
 * write_sequence. */
ST_API int st_buffer_wait_new(st_buffer_t *b, int timeout_ms, uint64_t *seq);

/* How long b's waits (st_buffer_read_new, st_buffer_wait_new) poll the
 * control page before they sleep on its futex: a write that comes
 * meanwhile is seen within a fraction of a microsecond instead of a
 * futex wake-up (docs/streams.md, "Waits"); the poll costs its CPU time.
 * spin_us 0 to 1000000; -1: the default ($ST_CLIENT_SPIN_US, else 50 when
 * the process may run on four CPUs or more, else 0). INVALID_ARGUMENT
 * otherwise. Any thread. */
ST_API int st_buffer_set_spin(st_buffer_t *b, int spin_us);

/* Where the newest complete write lies: *data (its slot; host or device
 * address), *seq its number. Copy it, then st_buffer_read_check(seq):
 * ST_OK when the copy is consistent, STALE_HANDLE when a writer touched
 * the slot meanwhile (copy again from a new begin). TIMEOUT as
 * st_buffer_read. Any thread. */
ST_API int st_buffer_read_begin(st_buffer_t *b, int timeout_ms, const void **data,
                                uint64_t *seq);
ST_API int st_buffer_read_check(st_buffer_t *b, uint64_t seq, int64_t *time_ns);

/* The address of slot `slot` (0 .. slots - 1), for views that accept
 * torn reads (pyshmem's read(safe=False)); NULL for another index. */
ST_API void *st_buffer_slot(const st_buffer_t *b, int slot);

/* The number of the newest complete write (0: none) and its
 * CLOCK_REALTIME in ns (0: none). Any thread. */
ST_API uint64_t st_buffer_write_sequence(const st_buffer_t *b);
ST_API int64_t st_buffer_write_time(const st_buffer_t *b);

/* Takes the writer lock for this connection, waiting at most timeout_ms
 * (TIMEOUT names the owner's connection and pid). Re-entrant per handle:
 * while this handle holds it, another acquire only counts (threads that
 * share the handle share its hold), and the lock is freed by the release
 * that balances the first acquire. INVALID_ARGUMENT: a read-only handle,
 * or this connection holds the lock otherwise (through another handle,
 * or for a write of this handle under way). */
ST_API int st_buffer_acquire(st_buffer_t *b, int timeout_ms);

/* Undoes one st_buffer_acquire of this handle; the last one frees the
 * lock. INVALID_ARGUMENT when this handle holds none. */
ST_API int st_buffer_release(st_buffer_t *b);

/* How many st_buffer_acquire calls of this handle are not yet released
 * (0: this handle does not hold the lock). Any thread. */
ST_API int st_buffer_held(const st_buffer_t *b);

/* Clears the buffer: every slot's frame becomes zeros, published as one
 * more write (write_sequence moves on, as for st_buffer_write: readers
 * waiting for a new write wake and read zeros; sequences never go back,
 * so a reader's "newer than the last I read" stays right). Takes the
 * writer lock for its duration unless this connection holds it, waiting
 * at most timeout_ms; *seq (may be NULL) gets the write's number.
 * INVALID_ARGUMENT on a read-only handle. Any thread. */
ST_API int st_buffer_clear(st_buffer_t *b, int timeout_ms, uint64_t *seq);

/* 1 when the writer lock is held, else 0; *owner (the connection id),
 * *pid (the owner's pid as it said) and *mine (this connection) may be
 * NULL. Any thread. */
ST_API int st_buffer_locked(const st_buffer_t *b, uint64_t *owner, int *pid, int *mine);

/* The last failure of a buffer function on this thread. */
ST_API const char *st_buffer_error(const st_buffer_t *b);

/* Closes the handle: a lock it holds is freed, the server forgets the
 * handle, the memory is unmapped and b freed. Call it before
 * st_client_close of its client. ST_OK or the exchange's failure (b is
 * freed either way). NULL is a no-op. */
ST_API int st_buffer_close(st_buffer_t *b);

/* Unlinks buffer `name` (its creator's uid only): the name goes at once
 * (a new buffer may take it); the memory stays until the last handle
 * closes. NOT_FOUND, AUTH. Thread of the client. */
ST_API int st_buffer_unlink(st_client_t *c, const char *name);

#ifdef __cplusplus
}
#endif
#endif
