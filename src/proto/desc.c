/* src/proto/desc.c: tensor, arena and module descriptors (docs/protocol.md,
 * "Values"). Parsing is strict: whatever a client will map must be fully
 * described, in range and self-consistent; any doubt is ST_ERR_PROTOCOL.
 * No state; any thread.
 */
#include "proto/proto.h"

#include "common/fail.h"
#include "proto/scan.h"
#include "common/geometry.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every failure here is PROTOCOL. */
#define fail(err, errlen, ...) st__fail(ST_ERR_PROTOCOL, err, errlen, __VA_ARGS__)

/* ------------------------------------------------------------ fixed packer */

/* A tensor payload always fits: 5 keys, a dtype name and 2 x 16 integers. */
#define TENSOR_PAYLOAD_MAX 512

typedef struct {
  char data[TENSOR_PAYLOAD_MAX];
  size_t size;
} fixed_buf_t;

static int fixed_write(void *data, const char *buf, size_t len) {
  fixed_buf_t *b = data;
  if (len > sizeof b->data - b->size) return -1;
  memcpy(b->data + b->size, buf, len);
  b->size += len;
  return 0;
}

static void pack_i64_array(msgpack_packer *pk, const int64_t *v, int n) {
  msgpack_pack_array(pk, (size_t)n);
  for (int i = 0; i < n; i++) msgpack_pack_int64(pk, v[i]);
}

/* See proto.h. `d` is borrowed. A descriptor with an ndim outside
 * [0, ST_MAX_NDIM] or an invalid dtype is a caller bug: it is packed as nil
 * so that the receiver refuses it. */
void st__pack_tensor(msgpack_packer *pk, const st__tensor_desc_t *d) {
  const char *dtype = st_dtype_name(d->dtype);
  if (d->ndim < 0 || d->ndim > ST_MAX_NDIM || !dtype) {
    msgpack_pack_nil(pk);
    return;
  }
  fixed_buf_t buf;
  buf.size = 0;
  msgpack_packer p;
  msgpack_packer_init(&p, &buf, fixed_write);
  msgpack_pack_map(&p, 5);
  st__pack_kv_uint(&p, "arena", d->arena);
  st__pack_kv_uint(&p, "offset", d->offset);
  st__pack_kv_str(&p, "dtype", dtype);
  st__pack_cstr(&p, "shape");
  pack_i64_array(&p, d->shape, d->ndim);
  st__pack_cstr(&p, "strides");
  pack_i64_array(&p, d->strides, d->ndim);
  msgpack_pack_ext(pk, buf.size, ST_EXT_TENSOR);
  msgpack_pack_ext_body(pk, buf.data, buf.size);
}

/* ------------------------------------------------------------ field readers */

static int get_u64(const msgpack_object *map, const char *key, uint64_t max, uint64_t *out,
                   char *err, size_t errlen) {
  const msgpack_object *v = st__map_get(map, key);
  if (!v) return fail(err, errlen, "missing '%s'", key);
  if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > max)
    return fail(err, errlen, "'%s' is not an unsigned integer in range", key);
  *out = v->via.u64;
  return ST_OK;
}

/* Copies a string field into out[cap] (NUL-terminated); it must be
 * non-empty and shorter than cap. */
static int get_str(const msgpack_object *map, const char *key, char *out, size_t cap,
                   char *err, size_t errlen) {
  const msgpack_object *v = st__map_get(map, key);
  if (!v) return fail(err, errlen, "missing '%s'", key);
  if (v->type != MSGPACK_OBJECT_STR || v->via.str.size == 0 || v->via.str.size >= cap)
    return fail(err, errlen, "'%s' is not a string of 1 to %zu bytes", key, cap - 1);
  memcpy(out, v->via.str.ptr, v->via.str.size);
  out[v->via.str.size] = '\0';
  if (memchr(out, '\0', v->via.str.size)) return fail(err, errlen, "'%s' holds a NUL byte", key);
  return ST_OK;
}

/* Reads an array of at most ST_MAX_NDIM integers in [0, INT64_MAX]. */
static int get_dims(const msgpack_object *map, const char *key, int64_t *out, int *n,
                    char *err, size_t errlen) {
  const msgpack_object *v = st__map_get(map, key);
  if (!v) return fail(err, errlen, "missing '%s'", key);
  if (v->type != MSGPACK_OBJECT_ARRAY) return fail(err, errlen, "'%s' is not an array", key);
  if (v->via.array.size > ST_MAX_NDIM)
    return fail(err, errlen, "'%s' has more than %d dimensions", key, ST_MAX_NDIM);
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    const msgpack_object *x = &v->via.array.ptr[i];
    if (x->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
      return fail(err, errlen, "'%s'[%u] is negative", key, i);
    if (x->type != MSGPACK_OBJECT_POSITIVE_INTEGER || x->via.u64 > (uint64_t)INT64_MAX)
      return fail(err, errlen, "'%s'[%u] is not an integer in range", key, i);
    out[i] = (int64_t)x->via.u64;
  }
  *n = (int)v->via.array.size;
  return ST_OK;
}

/* Decodes the payload of ext `o` of type `type` into *pl (caller destroys
 * it on ST_OK; released here otherwise). The payload must be exactly one
 * map. */
static int unpack_payload(const msgpack_object *o, int8_t type, const char *what,
                          msgpack_unpacked *pl, char *err, size_t errlen) {
  msgpack_unpacked_init(pl);
  if (!o || o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != type)
    return fail(err, errlen, "not a %s (expected ext type %d)", what, (int)type);
  const char *data = o->via.ext.ptr;
  size_t size = o->via.ext.size, off = 0;
  if (st__scan_bounded(data, size) != ST_OK)
    return fail(err, errlen, "%s payload is not msgpack", what);
  msgpack_unpack_return ret = msgpack_unpack_next(pl, data, size, &off);
  if (ret != MSGPACK_UNPACK_SUCCESS || off != size) {
    msgpack_unpacked_destroy(pl);
    msgpack_unpacked_init(pl);
    return fail(err, errlen, "%s payload is not one msgpack value", what);
  }
  if (pl->data.type != MSGPACK_OBJECT_MAP) {
    msgpack_unpacked_destroy(pl);
    msgpack_unpacked_init(pl);
    return fail(err, errlen, "%s payload is not a map", what);
  }
  return ST_OK;
}

/* ------------------------------------------------------------------ tensors */

static int tensor_fields(const msgpack_object *m, st__tensor_desc_t *d, char *err,
                         size_t errlen) {
  uint64_t u = 0;
  char dtype[32];
  int rc, nstrides = 0;
  if ((rc = get_u64(m, "arena", UINT32_MAX, &u, err, errlen)) != ST_OK) return rc;
  d->arena = (uint32_t)u;
  if ((rc = get_u64(m, "offset", UINT64_MAX, &d->offset, err, errlen)) != ST_OK) return rc;
  if ((rc = get_str(m, "dtype", dtype, sizeof dtype, err, errlen)) != ST_OK) return rc;
  d->dtype = st_dtype_from_name(dtype);
  /* The wire carries canonical names only; aliases are for people. */
  if (d->dtype == ST_DTYPE_INVALID || strcmp(st_dtype_name(d->dtype), dtype) != 0)
    return fail(err, errlen, "unknown dtype '%s'", dtype);
  if ((rc = get_dims(m, "shape", d->shape, &d->ndim, err, errlen)) != ST_OK) return rc;
  if ((rc = get_dims(m, "strides", d->strides, &nstrides, err, errlen)) != ST_OK) return rc;
  if (nstrides != d->ndim)
    return fail(err, errlen, "shape has %d dimensions but strides %d", d->ndim, nstrides);
  return ST_OK;
}

/* See proto.h. *d is filled on ST_OK only (it may be partly written on
 * failure). `o` is borrowed. */
int st__parse_tensor(const msgpack_object *o, st__tensor_desc_t *d, char *err, size_t errlen) {
  msgpack_unpacked pl;
  int rc = unpack_payload(o, ST_EXT_TENSOR, "tensor", &pl, err, errlen);
  if (rc != ST_OK) return rc;
  memset(d, 0, sizeof *d);
  rc = tensor_fields(&pl.data, d, err, errlen);
  msgpack_unpacked_destroy(&pl);
  return rc;
}

/* See proto.h: the geometry's own count (src/common/geometry.h); -1 when
 * the product overflows int64 or the descriptor is malformed. */
int64_t st__tensor_numel(const st__tensor_desc_t *d) {
  return st__geom_numel_of(d->ndim, d->shape);
}

/* See proto.h: the geometry's extent (src/common/geometry.h), whose every
 * refusal is PROTOCOL here: the element count or its byte size overflows
 * int64, hi passes INT64_MAX, or the descriptor is malformed (bad dtype or
 * ndim, negative sizes): a tensor that passes can be indexed with signed
 * 64-bit byte offsets without further checks. */
int st__tensor_extent(const st__tensor_desc_t *d, uint64_t *lo, uint64_t *hi) {
  int rc = st__geom_extent_of(d->dtype, d->offset, d->ndim, d->shape, d->strides, lo, hi);
  return rc == ST_OK ? ST_OK : ST_ERR_PROTOCOL;
}

/* ------------------------------------------------------------------- arenas */

/* See proto.h. `a` is borrowed; uuid is sent for CUDA arenas only; a
 * legacy arena has no fd and carries its IPC handle instead. */
void st__pack_arena(msgpack_packer *pk, const st__arena_desc_t *a) {
  st__pack_arena_open(pk, a, 0);
}

/* See proto.h. */
void st__pack_arena_open(msgpack_packer *pk, const st__arena_desc_t *a, size_t extra) {
  size_t n = (a->legacy ? 8 : a->cuda ? 6 : 5) + (a->arg_id != 0) - (!a->legacy && a->no_fd) +
             (a->readonly != 0);
  msgpack_pack_map(pk, n + extra);
  if (!a->legacy && !a->no_fd) {
    st__pack_kv_uint(pk, "fd", a->fd);
  }
  st__pack_kv_uint(pk, "bytes", a->bytes);
  st__pack_kv_str(pk, "device", a->cuda || a->legacy ? "cuda" : "cpu");
  if (a->cuda || a->legacy) {
    st__pack_kv_str(pk, "uuid", a->uuid);
  }
  st__pack_kv_str(pk, "backend", a->legacy ? "legacy" : a->backend);
  st__pack_kv_uint(pk, "id", a->id);
  if (a->arg_id) st__pack_kv_uint(pk, "arg_id", a->arg_id);
  if (a->readonly) st__pack_kv_bool(pk, "readonly", 1);
  if (a->legacy) {
    st__pack_cstr(pk, "ipc_handle");
    msgpack_pack_bin(pk, ST_IPC_HANDLE_LEN);
    msgpack_pack_bin_body(pk, a->ipc_handle, ST_IPC_HANDLE_LEN);
    st__pack_kv_uint(pk, "device_index", a->device_index < 0 ? 0u : (uint32_t)a->device_index);
    st__pack_kv_uint(pk, "storage_bytes", a->storage_bytes);
  }
}

/* The fields of a legacy arena (backend "legacy"): a CUDA device, no fd,
 * a 64-byte handle, a device index and storage_bytes <= bytes. */
static int legacy_fields(const msgpack_object *o, st__arena_desc_t *a, char *err,
                         size_t errlen) {
  uint64_t u = 0;
  int rc;
  if (!a->cuda) return fail(err, errlen, "a legacy arena must be on device 'cuda'");
  if (st__map_get(o, "fd"))
    return fail(err, errlen, "a legacy arena carries no descriptor, but 'fd' is present");
  const msgpack_object *h = st__map_get(o, "ipc_handle");
  if (!h) return fail(err, errlen, "missing 'ipc_handle'");
  if (h->type != MSGPACK_OBJECT_BIN || h->via.bin.size != ST_IPC_HANDLE_LEN)
    return fail(err, errlen, "'ipc_handle' is not bin of %d bytes", ST_IPC_HANDLE_LEN);
  memcpy(a->ipc_handle, h->via.bin.ptr, ST_IPC_HANDLE_LEN);
  if ((rc = get_u64(o, "device_index", INT32_MAX, &u, err, errlen)) != ST_OK) return rc;
  a->device_index = (int32_t)u;
  if ((rc = get_u64(o, "storage_bytes", a->bytes, &a->storage_bytes, err, errlen)) != ST_OK)
    return rc;
  a->legacy = 1;
  return ST_OK;
}

/* The backends each device has (docs/protocol.md, "Arena"): anything else
 * is refused here, so that no receiver meets a backend it has no checks
 * for. */
static int backend_fits(const st__arena_desc_t *a) {
  if (!a->cuda) return strcmp(a->backend, "memfd") == 0;
  return strcmp(a->backend, "vmm") == 0 || strcmp(a->backend, "legacy") == 0;
}

/* See proto.h. ST_OK or ST_ERR_PROTOCOL with a reason; `o` is borrowed.
 * A CUDA arena must name its device's uuid; a CPU arena's uuid is "". The
 * backend must be one of the device's: "memfd" for cpu, "vmm" or "legacy"
 * for cuda. */
/* st__parse_arena, and with `region` a pooled region's slab entry. */
static int parse_arena(const msgpack_object *o, st__arena_desc_t *a, int region, char *err,
                       size_t errlen) {
  uint64_t u = 0;
  int rc;
  char device[8];
  memset(a, 0, sizeof *a);
  if (!o || o->type != MSGPACK_OBJECT_MAP) return fail(err, errlen, "arena is not a map");
  if ((rc = get_u64(o, "bytes", UINT64_MAX, &a->bytes, err, errlen)) != ST_OK) return rc;
  if ((rc = get_str(o, "device", device, sizeof device, err, errlen)) != ST_OK) return rc;
  if (strcmp(device, "cpu") == 0) a->cuda = 0;
  else if (strcmp(device, "cuda") == 0) a->cuda = 1;
  else return fail(err, errlen, "unknown device '%s'", device);
  if (a->cuda && (rc = get_str(o, "uuid", a->uuid, sizeof a->uuid, err, errlen)) != ST_OK)
    return rc;
  if ((rc = get_str(o, "backend", a->backend, sizeof a->backend, err, errlen)) != ST_OK)
    return rc;
  if (!backend_fits(a))
    return fail(err, errlen, "backend '%s' is not one of device '%s' (%s)", a->backend, device,
                a->cuda ? "vmm or legacy" : "memfd");
  if ((rc = get_u64(o, "id", UINT64_MAX, &a->id, err, errlen)) != ST_OK) return rc;
  if (st__map_get(o, "arg_id")) {
    if ((rc = get_u64(o, "arg_id", UINT64_MAX, &a->arg_id, err, errlen)) != ST_OK) return rc;
    if (a->arg_id == 0) return fail(err, errlen, "'arg_id' must be at least 1");
  }
  const msgpack_object *ro = st__map_get(o, "readonly");
  if (ro && ro->type != MSGPACK_OBJECT_BOOLEAN) return fail(err, errlen, "'readonly' is not a boolean");
  a->readonly = ro && ro->via.boolean;
  if (strcmp(a->backend, "legacy") == 0)
    return region ? fail(err, errlen, "a pool slab is never a legacy arena")
                  : legacy_fields(o, a, err, errlen);
  if ((a->arg_id || region) && !st__map_get(o, "fd")) {
    a->no_fd = 1;
    return ST_OK;
  }
  if ((rc = get_u64(o, "fd", UINT32_MAX, &u, err, errlen)) != ST_OK) return rc;
  a->fd = (uint32_t)u;
  return ST_OK;
}

/* See proto.h. */
int st__parse_arena(const msgpack_object *o, st__arena_desc_t *a, char *err, size_t errlen) {
  return parse_arena(o, a, 0, err, errlen);
}

/* See proto.h. */
int st__parse_pool_slab(const msgpack_object *o, st__arena_desc_t *a, char *err, size_t errlen) {
  return parse_arena(o, a, 1, err, errlen);
}

/* ------------------------------------------------------------------ modules */

static int cmp_names(const void *pa, const void *pb) {
  const msgpack_object *a = *(const msgpack_object *const *)pa;
  const msgpack_object *b = *(const msgpack_object *const *)pb;
  size_t n = a->via.str.size < b->via.str.size ? a->via.str.size : b->via.str.size;
  int c = n ? memcmp(a->via.str.ptr, b->via.str.ptr, n) : 0;
  if (c) return c;
  return (a->via.str.size > b->via.str.size) - (a->via.str.size < b->via.str.size);
}

/* Nonzero if two of the names in pairs[0..n) are equal; -1 out of memory. */
static int names_repeat(const msgpack_object *pairs, uint32_t n) {
  if (n < 2) return 0;
  const msgpack_object **v = malloc(n * sizeof *v);
  if (!v) return -1;
  for (uint32_t i = 0; i < n; i++) v[i] = &pairs[i].via.array.ptr[0];
  qsort(v, n, sizeof *v, cmp_names);
  int dup = 0;
  for (uint32_t i = 1; i < n && !dup; i++) dup = cmp_names(&v[i - 1], &v[i]) == 0;
  free(v);
  return dup;
}

static int module_fields(const msgpack_object *m, const msgpack_object **tensors,
                         const msgpack_object **metadata, char *err, size_t errlen) {
  const msgpack_object *t = st__map_get(m, "tensors");
  const msgpack_object *md = st__map_get(m, "metadata");
  if (!t) return fail(err, errlen, "missing 'tensors'");
  if (!md) return fail(err, errlen, "missing 'metadata'");
  if (t->type != MSGPACK_OBJECT_ARRAY) return fail(err, errlen, "'tensors' is not an array");
  if (md->type != MSGPACK_OBJECT_MAP) return fail(err, errlen, "'metadata' is not a map");
  char why[128];
  if (st__check_value(md, 0, why, sizeof why) != ST_OK)
    return fail(err, errlen, "bad 'metadata': %s", why);

  uint32_t arena = 0;
  for (uint32_t i = 0; i < t->via.array.size; i++) {
    const msgpack_object *pair = &t->via.array.ptr[i];
    if (pair->type != MSGPACK_OBJECT_ARRAY || pair->via.array.size != 2 ||
        pair->via.array.ptr[0].type != MSGPACK_OBJECT_STR)
      return fail(err, errlen, "'tensors'[%u] is not a [name, tensor] pair", i);
    st__tensor_desc_t d;
    if (st__parse_tensor(&pair->via.array.ptr[1], &d, why, sizeof why) != ST_OK)
      return fail(err, errlen, "'tensors'[%u]: %s", i, why);
    if (i == 0) arena = d.arena;
    else if (d.arena != arena)
      return fail(err, errlen, "'tensors'[%u] is in another arena than the module's", i);
  }
  int dup = names_repeat(t->via.array.ptr, t->via.array.size);
  if (dup < 0) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    return ST_ERR_OUT_OF_MEMORY;
  }
  if (dup) return fail(err, errlen, "module tensor names repeat");
  *tensors = t;
  *metadata = md;
  return ST_OK;
}

/* See proto.h. On ST_OK *payload holds the decoded payload (caller frees it
 * with msgpack_unpacked_destroy) and *tensors / *metadata point into it;
 * its strings point into o's bytes, so the message holding `o` must outlive
 * it. Every pair is checked ([str, valid tensor], unique names, one arena)
 * and metadata must be a map of plain values with string keys. On failure
 * *payload holds nothing. ST_ERR_PROTOCOL or ST_ERR_OUT_OF_MEMORY. */
int st__parse_module(const msgpack_object *o, msgpack_unpacked *payload,
                     const msgpack_object **tensors, const msgpack_object **metadata,
                     char *err, size_t errlen) {
  *tensors = NULL;
  *metadata = NULL;
  int rc = unpack_payload(o, ST_EXT_MODULE, "module", payload, err, errlen);
  if (rc != ST_OK) return rc;
  rc = module_fields(&payload->data, tensors, metadata, err, errlen);
  if (rc != ST_OK) {
    msgpack_unpacked_destroy(payload);
    msgpack_unpacked_init(payload);
    *tensors = NULL;
    *metadata = NULL;
  }
  return rc;
}
