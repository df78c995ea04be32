-- st.ffi: libstclient for the Lua client: its declarations (a mirror of
-- include/st/client.h and include/st/errors.h, plus the dtype.h functions
-- the client uses) and the loaded library.
--
--   local C = require("st.ffi")
--   C.lib.st_client_ping(...)          -- the library namespace
--   C.err_name(rc)                     -- "INVALID_ARGUMENT"
--
-- The declarations below must match the headers exactly: the test
-- tests/python/test_mirrors.py compares them (functions, structs and the
-- constants of client.h) and fails on any difference. Error codes are not
-- mirrored: names come from the library (st_err_name).
--
-- The library is found, first match wins, through: $ST_CLIENT_LIB (a
-- path); st/libpath.lua, written by `cmake --install` (the installed
-- library, relative to these modules); the system loader (ldconfig's cache,
-- LD_LIBRARY_PATH). None of them: one error that says what was tried.
local ffi = require("ffi")

ffi.cdef [[
/* include/st/dtype.h (the functions the client uses) */
typedef int st_dtype_t;
const char *st_dtype_name(st_dtype_t dtype);
st_dtype_t st_dtype_from_name(const char *name);
size_t st_dtype_size(st_dtype_t dtype);
void st_dtype_store(st_dtype_t dtype, void *base, size_t i, double v);

/* include/st/errors.h */
const char *st_err_name(int err);
const char *st_strerror(int err);
int st_err_from_name(const char *name);

/* include/st/client.h */
typedef struct st_client st_client_t;
typedef struct st_args st_args_t;
typedef struct st_result st_result_t;
typedef struct st_handoff st_handoff_t;
typedef struct st_buffer st_buffer_t;
typedef struct st_key st_key_t;

typedef enum {
  ST_DEVICE_CPU = 0,
  ST_DEVICE_CUDA = 1
} st_device_kind_t;

typedef struct st_tensor {
  const char *name;
  void *data;
  st_dtype_t dtype;
  int ndim;
  const int64_t *shape;
  const int64_t *strides;
  int64_t numel;
  size_t nbytes;
  st_device_kind_t device;
  int device_index;
  const char *device_uuid;
} st_tensor_t;

typedef enum {
  ST_VALUE_NIL,
  ST_VALUE_BOOL,
  ST_VALUE_INT,
  ST_VALUE_FLOAT,
  ST_VALUE_STRING,
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
    struct { const char *ptr; size_t len; } str;
    struct { const st_value_t *items; size_t len; } array;
    struct { const st_value_t *keys; const st_value_t *values; size_t len; } map;
    const st_tensor_t *tensor;
    struct {
      const st_tensor_t *const *tensors;
      size_t len;
      const st_value_t *metadata;
    } module;
  } as;
};

const st_value_t *st_value_get(const st_value_t *map, const char *key);
char *st_value_json(const st_value_t *v, int pretty);
double st_tensor_get(const st_tensor_t *t, int64_t linear);
int st_tensor_copy_to_host(const st_tensor_t *t, void *dst, size_t len);
int st_tensor_is_contiguous(const st_tensor_t *t);

const st_value_t *st_result_value(const st_result_t *r);
size_t st_result_tensor_count(const st_result_t *r);
const st_tensor_t *st_result_tensor(const st_result_t *r, size_t i);
const st_tensor_t *st_result_find(const st_result_t *r, const char *name);

typedef struct st_object_info {
  uint64_t id;
  const char *server_id;
  const char *cache_key;
  const char *device;
  int cached;
  int managed;
  int lease;
  int64_t refcount;
  uint64_t bytes;
} st_object_info_t;

int st_result_object(const st_result_t *r, st_object_info_t *out);
void st_result_ref(st_result_t *r);
void st_result_free(st_result_t *r);

st_args_t *st_args_new(void);
void st_args_free(st_args_t *a);
int st_args_nil(st_args_t *a, const char *key);
int st_args_bool(st_args_t *a, const char *key, int v);
int st_args_int(st_args_t *a, const char *key, int64_t v);
int st_args_float(st_args_t *a, const char *key, double v);
int st_args_string(st_args_t *a, const char *key, const char *v);
int st_args_str(st_args_t *a, const char *key, const char *s, size_t len);
int st_args_bytes(st_args_t *a, const char *key, const void *p, size_t len);
int st_args_begin_list(st_args_t *a, const char *key);
int st_args_begin_map(st_args_t *a, const char *key);
int st_args_end(st_args_t *a);
int st_args_key(st_args_t *a, const char *key, size_t len);
int st_args_keys(st_args_t *a, const char *data, const size_t *lens, size_t n);
int st_args_ints(st_args_t *a, const int64_t *v, size_t n);
int st_args_floats(st_args_t *a, const double *v, size_t n);
int st_args_strs(st_args_t *a, const char *data, const size_t *lens, size_t n);
const char *st_args_error(const st_args_t *a);
int st_args_parse_kv(st_args_t *a, const char *word, char *err, size_t errlen);
int st_args_parse_json(st_args_t *a, const char *json, char *err, size_t errlen);

int st_tensor_alloc(const char *device, st_dtype_t dtype, int ndim, const int64_t *shape,
                    st_result_t **out, char *err, size_t errlen);
int st_args_tensor(st_args_t *a, const char *key, const st_tensor_t *t, char *err,
                   size_t errlen);
int st_tensor_is_shareable(const st_tensor_t *t);

int st_socket_path(const char *base, int device, char *out, size_t len);

typedef struct st_client_options {
  int64_t server_uid;
  int timeout_ms;
} st_client_options_t;

void st_client_options_init(st_client_options_t *o);
int st_client_connect_opts(const char *path, const st_client_options_t *opts,
                           st_client_t **out, char *err, size_t errlen);
int st_client_connect_device_opts(const char *base, int device,
                                  const st_client_options_t *opts, st_client_t **out,
                                  char *err, size_t errlen);
int st_client_connect(const char *path, st_client_t **out, char *err, size_t errlen);
int st_client_connect_device(const char *base, int device, st_client_t **out,
                             char *err, size_t errlen);
void st_client_close(st_client_t *c);
const char *st_client_error(const st_client_t *c);
const char *st_client_error_name(const st_client_t *c);
void st_client_set_timeout(st_client_t *c, int timeout_ms);
const char *st_client_server_id(const st_client_t *c);
const char *st_client_server_version(const st_client_t *c);
int st_client_server_pid(const st_client_t *c);
int st_client_ping(st_client_t *c, double *rtt_us);
int st_client_call(st_client_t *c, const char *endpoint, const st_args_t *args,
                   st_result_t **out);
int st_client_rpc(st_client_t *c, const char *method, const st_args_t *params,
                  st_result_t **out);
int st_client_info(st_client_t *c, st_result_t **out);
int st_client_endpoints(st_client_t *c, st_result_t **out);
int st_client_peers(st_client_t *c, st_result_t **out);
int st_client_submit(st_client_t *c, const char *endpoint, const st_args_t *args,
                     uint64_t *task_id);
int st_client_task_status(st_client_t *c, uint64_t id, st_result_t **info);
int st_client_task_wait(st_client_t *c, uint64_t id, double timeout_s, st_result_t **info);
int st_client_task_result(st_client_t *c, uint64_t id, st_result_t **out);
int st_client_task_cancel(st_client_t *c, uint64_t id, st_result_t **info);
int st_client_tasks(st_client_t *c, const char *status, uint64_t before, int limit,
                    st_result_t **out);
int st_client_release(st_client_t *c, uint64_t object_id, int *released, int *destroyed,
                      int64_t *refcount);
int st_client_object_info(st_client_t *c, uint64_t object_id, st_result_t **out);
int st_client_ensure_live(st_client_t *c, uint64_t object_id, const char *server_id);
int st_client_objects(st_client_t *c, st_result_t **out);
int st_client_invalidate_call(st_client_t *c, const char *endpoint, const st_args_t *args,
                              int *dropped);
int st_client_invalidate_endpoint(st_client_t *c, const char *endpoint, int64_t *count);
int st_client_reload(st_client_t *c, st_result_t **out);
int st_args_tensor_copy(st_args_t *a, const char *key, const st_tensor_t *t, int *copied,
                        char *err, size_t errlen);
int st_client_put(st_client_t *c, const char *key, const st_args_t *value, int policy,
                  int flags, uint64_t *version);
typedef struct st_readers {
  const uint32_t *uids;
  size_t nuids;
  const uint32_t *gids;
  size_t ngids;
} st_readers_t;
int st_client_put_ex(st_client_t *c, const char *key, const st_args_t *value, int policy,
                     int flags, const st_readers_t *readers, uint64_t *version);
typedef struct st_pull_opts {
  uint64_t version;
  const char *as;
  const char *device;
  int policy;
  const st_readers_t *readers;
  int live;
} st_pull_opts_t;
int st_client_pull(st_client_t *c, const char *key, const char *from,
                   const st_pull_opts_t *opts, uint64_t *task_id);
int st_client_unsubscribe(st_client_t *c, const char *key, uint64_t *version);
int st_client_replicas(st_client_t *c, const char *key, st_result_t **out);
typedef struct st_replicate_opts {
  uint64_t version;
  const char *as;
} st_replicate_opts_t;
int st_client_replicate(st_client_t *c, const char *key, const char *const *to, size_t nto,
                        const st_replicate_opts_t *opts, uint64_t *task_id);
int st_client_get(st_client_t *c, const char *key, uint64_t version, int flags,
                  st_result_t **out, uint64_t *got_version);
int st_client_keys(st_client_t *c, const char *prefix, st_result_t **out);
int st_client_delete(st_client_t *c, const char *key);
int st_key_open(st_client_t *c, const char *key, int flags, st_key_t **out);
int st_key_open_view(st_client_t *c, const char *key, int flags, const char *view,
                     st_key_t **out);
void st_key_close(st_key_t *k);
st_result_t *st_key_result(const st_key_t *k);
int st_key_is_publisher(const st_key_t *k);
uint64_t st_key_version(const st_key_t *k);
int st_key_wait_version(st_key_t *k, uint64_t version, int64_t timeout_ms, uint64_t *got);
int st_key_read_begin(st_key_t *k, int64_t timeout_ms, uint64_t *seq);
int st_key_read_end(st_key_t *k, uint64_t seq, void *stream, int *consistent);
int st_key_begin_update(st_key_t *k);
int st_key_end_update(st_key_t *k, void *stream);
int st_key_update(st_key_t *k, const st_tensor_t *const *tensors, size_t n);
const char *st_key_error(const st_key_t *k);
int st_result_copy_into(const st_result_t *src, const st_tensor_t *dst, size_t n,
                        void *stream, char *err, size_t errlen);
int st_copy_ranges(int ordinal, const uint64_t *dst, const uint64_t *src,
                   const uint64_t *bytes, size_t n, void *stream, int flags, char *err,
                   size_t errlen);
void st_copy_stats(uint64_t *kernel_ranges, uint64_t *memcpy_ranges);
int st_get_into(st_client_t *c, const char *key, uint64_t version, const char *view,
                const st_tensor_t *dst, size_t n, void *stream, uint64_t *got_version);
int st_client_call_flags(st_client_t *c, const char *endpoint, const st_args_t *args,
                         int flags, st_result_t **out);
int st_client_get_view(st_client_t *c, const char *key, uint64_t version, int flags,
                       const char *view, st_result_t **out, uint64_t *got_version);
int st_client_get_since(st_client_t *c, const char *key, uint64_t version, int flags,
                        const char *view, uint64_t have, st_result_t **out,
                        uint64_t *got_version);
int st_client_call_view(st_client_t *c, const char *endpoint, const st_args_t *args, int flags,
                        const char *view, st_result_t **out);
void st_open_cache_stats(size_t *mapped, uint64_t *reused);

typedef struct st_result_summary {
  const st_value_t *value;
  int kind;
  size_t ntensors;
  int has_object;
  st_object_info_t object;
  uint64_t identity;
  int same;
} st_result_summary_t;
int st_result_summary(const st_result_t *r, st_result_summary_t *out);
typedef enum {
  ST_CALL_LEND_SAME = 1,
  ST_CALL_READONLY = 2
} st_call_flags_t;
int st_client_call_summary(st_client_t *c, const char *endpoint, const st_args_t *args,
                           int flags, st_result_t **out, st_result_summary_t *summary);
size_t st_result_dlpack_all(st_result_t *r, int versioned, void **out, size_t n);
int st_result_tensor_is(const st_result_t *r, size_t i, const st_tensor_t *t);
void st_open_cache_keep(size_t max_arenas, uint64_t max_bytes);
void st_open_cache_kept(size_t *arenas, uint64_t *bytes);
const void *st_result_marshal(st_result_t *r, size_t *len);
int st_client_rpc_marshal(st_client_t *c, const char *method, const st_args_t *params,
                          const void **data, size_t *len, st_result_t **fallback);
int st_handoff_create(st_client_t *c, const char *name, const char *device,
                      uint64_t chunk_bytes, int chunks, int consumers, st_handoff_t **out);
int st_handoff_create_ex(st_client_t *c, const char *name, const char *device,
                         uint64_t chunk_bytes, int chunks, int consumers,
                         const st_readers_t *readers, st_handoff_t **out);
int st_handoff_open(st_client_t *c, const char *name, st_handoff_t **out);
int st_handoff_open_ex(st_client_t *c, const char *name, int consumers, const char *device,
                       st_handoff_t **out);
int st_handoff_shape(const st_handoff_t *h, int *chunks, uint64_t *chunk_bytes,
                     int *consumers, int *slot, int *device_index);
int st_handoff_acquire(st_handoff_t *h, int timeout_ms, int *chunk, void **data);
int st_handoff_publish(st_handoff_t *h, int chunk, uint64_t bytes, uint64_t *seq);
int st_handoff_cancel(st_handoff_t *h, int chunk);
int st_handoff_read(st_handoff_t *h, int chunk, uint64_t seq, int timeout_ms, void **data,
                    uint64_t *bytes);
int st_handoff_ack(st_handoff_t *h, int chunk, uint64_t seq);
int st_handoff_pending(const st_handoff_t *h, int chunk, uint64_t *seq,
                       uint64_t *pending);
const char *st_handoff_error(const st_handoff_t *h);
int st_handoff_close(st_handoff_t *h);
int st_handoff_delete(st_client_t *c, const char *name);
typedef struct st_buffer_info {
  const char *name;
  st_dtype_t dtype;
  int ndim;
  const int64_t *shape;
  int slots;
  uint64_t frame_bytes;
  int device_index;
  int readonly;
  uint64_t handle;
  uint64_t connection;
} st_buffer_info_t;
int st_buffer_create(st_client_t *c, const char *name, const char *device,
  st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
  st_buffer_t **out);
int st_buffer_create_ex(st_client_t *c, const char *name, const char *device,
  st_dtype_t dtype, int ndim, const int64_t *shape, int slots,
  const st_readers_t *readers, st_buffer_t **out);
int st_buffer_open(st_client_t *c, const char *name, int readonly, st_buffer_t **out);
int st_buffer_info(const st_buffer_t *b, st_buffer_info_t *out);
int st_buffer_write(st_buffer_t *b, const void *src, uint64_t bytes, int timeout_ms,
  uint64_t *seq);
int st_buffer_write_begin(st_buffer_t *b, int timeout_ms, void **data);
int st_buffer_write_end(st_buffer_t *b, uint64_t *seq);
int st_buffer_write_abort(st_buffer_t *b);
int st_buffer_read(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
  uint64_t *seq, int64_t *time_ns);
int st_buffer_read_new(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
  uint64_t *seq, int64_t *time_ns);
int st_buffer_wait_new(st_buffer_t *b, int timeout_ms, uint64_t *seq);
int st_buffer_set_spin(st_buffer_t *b, int spin_us);
int st_buffer_read_begin(st_buffer_t *b, int timeout_ms, const void **data,
  uint64_t *seq);
int st_buffer_read_check(st_buffer_t *b, uint64_t seq, int64_t *time_ns);
void *st_buffer_slot(const st_buffer_t *b, int slot);
uint64_t st_buffer_write_sequence(const st_buffer_t *b);
int64_t st_buffer_write_time(const st_buffer_t *b);
int st_buffer_acquire(st_buffer_t *b, int timeout_ms);
int st_buffer_release(st_buffer_t *b);
int st_buffer_held(const st_buffer_t *b);
int st_buffer_clear(st_buffer_t *b, int timeout_ms, uint64_t *seq);
int st_buffer_locked(const st_buffer_t *b, uint64_t *owner, int *pid, int *mine);
const char *st_buffer_error(const st_buffer_t *b);
int st_buffer_close(st_buffer_t *b);
int st_buffer_unlink(st_client_t *c, const char *name);
]]

-- Loads one of the project's libraries (soname "libstclient.so.0"): from
-- $<env> when set, else the install prefix's library directory
-- (st/libpath.lua), else through the system loader. Raises one error
-- naming every place tried and `what` to do.
local function load_library(soname, env, what)
  local tried = {}
  local function try(path, where)
    local ok, l = pcall(ffi.load, path)
    if ok then return l end
    tried[#tried + 1] = string.format("%s (%s): %s", path, where, tostring(l))
  end
  local path = os.getenv(env)
  local l
  if path and path ~= "" then
    l = try(path, "$" .. env)
  else
    local ok, rel = pcall(require, "st.libpath")
    if ok and type(rel) == "string" then
      local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
      l = try(here .. rel .. "/" .. soname, "the install prefix")
    end
    l = l or try(soname, "the system loader")
  end
  if l then return l end
  error(string.format("sharedtensor: cannot load %s. Tried: %s. Install sharedtensor (`cmake --install`, " ..
                      "or the Debian package), or set %s to the library's path",
                      soname, table.concat(tried, "; "), env), 0)
end

local lib = load_library("libstclient.so.0", "ST_CLIENT_LIB")

local M = { lib = lib, load_library = load_library }

-- The stable name of an error code ("INVALID_ARGUMENT"; docs/errors.md).
function M.err_name(rc)
  return ffi.string(lib.st_err_name(rc))
end

-- Frees obj._h (an owned handle that ffi.gc would free) with `free` now,
-- once: closing a client, freeing a result.
function M.drop(obj, free)
  if obj._h then
    free(ffi.gc(obj._h, nil))
    obj._h = nil
  end
end

return M
