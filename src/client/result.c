/* src/client: decoding a reply into an st_result_t.
 *
 * A result owns everything its value tree points to: nodes, strings,
 * tensors and their shapes live in a chain of blocks freed at once, and the
 * result holds one open-cache reference per arena it maps. Arenas are mapped
 * before the value is decoded, so that every tensor is checked against the
 * size of its arena before it is exposed.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "client/result.h"

#define BLOCK_MIN 4096

/* Bump allocation from the result's blocks; NULL when out of memory. */
void *st__client_result_alloc(st_result_t *r, size_t size) {
  size = (size + 15) & ~(size_t)15;
  if (size == 0) size = 16;
  st__block_t *b = r->blocks;
  if (!b || b->cap - b->used < size) {
    size_t cap = size > BLOCK_MIN ? size : BLOCK_MIN;
    b = malloc(offsetof(st__block_t, data) + cap);
    if (!b) return NULL;
    b->cap = cap;
    b->used = 0;
    b->next = r->blocks;
    r->blocks = b;
  }
  void *p = b->data + b->used;
  b->used += size;
  return p;
}

/* One step of the path to the value being decoded: a map key or a
 * module's tensor name (p, n), or an array index or integer key (num,
 * p NULL). */
typedef struct path_seg {
  const char *p;
  size_t n;
  long long num;
} path_seg_t;

/* Steps kept: decode_value refuses a depth past ST_MAX_DEPTH, and a
 * module or an object map adds a few. */
#define PATH_SEGS (ST_MAX_DEPTH + 8)

typedef struct decoder {
  st_client_t *c;
  st_result_t *r;
  const st__arena_desc_t *arenas;
  size_t narenas;
  /* The path to the value being decoded, as steps: made into its dotted
   * text (path) only when a tensor is named after it or an error quotes
   * it, not at every step of a large map. */
  path_seg_t seg[PATH_SEGS];
  size_t nseg;
  st__text_t path;
  int readonly;              /* map every arena read-only              */
} decoder_t;

static int oom(decoder_t *d) {
  return st__client_fail(d->c, ST_ERR_OUT_OF_MEMORY, "out of memory decoding a reply");
}

/* st__client_result_alloc's common case inline: room in the block. */
static inline void *alloc_in(st_result_t *r, size_t size) {
  size_t need = (size + 15) & ~(size_t)15;
  st__block_t *b = r->blocks;
  if (need && b && b->cap - b->used >= need) {
    void *p = b->data + b->used;
    b->used += need;
    return p;
  }
  return st__client_result_alloc(r, size);
}

static char *copy_bytes(st_result_t *r, const char *p, size_t n) {
  char *s = alloc_in(r, n + 1);
  if (!s) return NULL;
  if (n) memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

static int push_tensor(decoder_t *d, const st_tensor_t *t) {
  st_result_t *r = d->r;
  if (r->ntensors == r->tensors_cap) {
    size_t cap = r->tensors_cap ? r->tensors_cap * 2 : 8;
    const st_tensor_t **p = realloc(r->tensors, cap * sizeof *p);
    if (!p) return oom(d);
    r->tensors = p;
    r->tensors_cap = cap;
  }
  r->tensors[r->ntensors++] = t;
  return ST_OK;
}

/* Path handling: one more step (the bytes stay the caller's until the
 * step is popped); returns the depth to restore. */
static size_t path_push(decoder_t *d, const char *seg, size_t n) {
  size_t old = d->nseg++;
  if (old < PATH_SEGS) d->seg[old] = (path_seg_t){.p = seg, .n = n};
  return old;
}

/* An array index or integer key as the next step. */
static size_t path_push_num(decoder_t *d, long long num) {
  size_t old = d->nseg++;
  if (old < PATH_SEGS) d->seg[old] = (path_seg_t){.p = NULL, .num = num};
  return old;
}

static void path_pop(decoder_t *d, size_t old) { d->nseg = old; }

/* The dotted path now ("" at the root), valid until the next call;
 * d->path.len is its length. */
static const char *path_now(decoder_t *d) {
  d->path.len = 0;
  if (d->path.ptr) d->path.ptr[0] = '\0';
  for (size_t i = 0; i < d->nseg; i++) {
    if (d->path.len) st__client_text_put(&d->path, ".", 1);
    if (i >= PATH_SEGS) {
      st__client_text_put(&d->path, "...", 3);
      break;
    }
    if (d->seg[i].p) st__client_text_put(&d->path, d->seg[i].p, d->seg[i].n);
    else st__client_text_printf(&d->path, "%lld", d->seg[i].num);
  }
  return d->path.ptr ? d->path.ptr : "";
}

/* Decodes a tensor ext value into a new st_tensor_t at the current path. */
static int decode_tensor(decoder_t *d, const msgpack_object *o, const st_tensor_t **out) {
  st__tensor_desc_t td;
  char why[200] = "";
  if (st__parse_tensor(o, &td, why, sizeof why) != ST_OK)
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "bad tensor '%s' in the reply: %s",
                           path_now(d), why);
  if (td.arena >= d->narenas)
    return st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "tensor '%s' names arena %u but the reply has %zu", path_now(d),
                           td.arena, d->narenas);
  const st__arena_desc_t *a = &d->arenas[td.arena];
  uint64_t lo, hi;
  if (st__tensor_extent(&td, &lo, &hi) != ST_OK || hi > a->bytes)
    return st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "tensor '%s' reaches beyond its arena (%llu bytes)", path_now(d),
                           (unsigned long long)a->bytes);
  st_result_t *r = d->r;
  st_tensor_t *t = st__client_result_alloc(r, sizeof *t);
  int64_t *dims = st__client_result_alloc(r, sizeof(int64_t) * 2 * (size_t)(td.ndim ? td.ndim : 1));
  const char *path = path_now(d);
  char *name = copy_bytes(r, path, d->path.len);
  if (!t || !dims || !name || d->path.oom) return oom(d);
  memcpy(dims, td.shape, sizeof(int64_t) * (size_t)td.ndim);
  memcpy(dims + td.ndim, td.strides, sizeof(int64_t) * (size_t)td.ndim);
  char *base = st__client_mapping_base(r->maps[td.arena]);
  t->name = name;
  t->data = base ? base + td.offset : NULL;
  t->dtype = td.dtype;
  t->ndim = td.ndim;
  t->shape = dims;
  t->strides = dims + td.ndim;
  /* Strides may be 0 (broadcast), so the extent check does not bound the
   * element count: check it for overflow on its own. */
  uint64_t numel = 1, esize = st_dtype_size(td.dtype);
  for (int i = 0; i < td.ndim; i++) {
    uint64_t s = (uint64_t)td.shape[i];
    if (s && numel > (uint64_t)INT64_MAX / s)
      return st__client_fail(d->c, ST_ERR_PROTOCOL, "tensor '%s' has too many elements",
                             path_now(d));
    numel *= s;
  }
  if (esize && numel > SIZE_MAX / esize)
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "tensor '%s' has too many elements", path_now(d));
  t->numel = (int64_t)numel;
  t->nbytes = (size_t)(numel * esize);
  t->device = a->cuda ? ST_DEVICE_CUDA : ST_DEVICE_CPU;
  t->device_index = st__client_mapping_ordinal(r->maps[td.arena]);
  t->device_uuid = a->cuda ? copy_bytes(r, a->uuid, strlen(a->uuid)) : "";
  if (!t->device_uuid) return oom(d);
  int rc = push_tensor(d, t);
  if (rc != ST_OK) return rc;
  *out = t;
  return ST_OK;
}

static int decode_value(decoder_t *d, const msgpack_object *o, st_value_t *v, int depth);

/* Decodes a module ext value: its tensors named "<path>.<name>". */
static int decode_module(decoder_t *d, const msgpack_object *o, st_value_t *v, int depth) {
  msgpack_unpacked payload;
  msgpack_unpacked_init(&payload);
  const msgpack_object *tensors = NULL, *meta = NULL;
  char why[200] = "";
  int rc = st__parse_module(o, &payload, &tensors, &meta, why, sizeof why);
  if (rc == ST_ERR_OUT_OF_MEMORY) {
    msgpack_unpacked_destroy(&payload);
    return oom(d);
  }
  if (rc != ST_OK || !tensors || tensors->type != MSGPACK_OBJECT_ARRAY) {
    msgpack_unpacked_destroy(&payload);
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "bad module '%s' in the reply: %s",
                           path_now(d), why[0] ? why : "no tensors array");
  }
  size_t n = tensors->via.array.size;
  const st_tensor_t **list = st__client_result_alloc(d->r, sizeof *list * (n ? n : 1));
  st_value_t *mv = st__client_result_alloc(d->r, sizeof *mv);
  if (!list || !mv) {
    msgpack_unpacked_destroy(&payload);
    return oom(d);
  }
  for (size_t i = 0; i < n && rc == ST_OK; i++) {
    const msgpack_object *pair = &tensors->via.array.ptr[i];
    if (pair->type != MSGPACK_OBJECT_ARRAY || pair->via.array.size != 2 ||
        pair->via.array.ptr[0].type != MSGPACK_OBJECT_STR) {
      rc = st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "module '%s': entry %zu is not a [name, tensor] pair", path_now(d), i);
      break;
    }
    const msgpack_object *nm = &pair->via.array.ptr[0];
    size_t old = path_push(d, nm->via.str.ptr, nm->via.str.size);
    rc = decode_tensor(d, &pair->via.array.ptr[1], &list[i]);
    path_pop(d, old);
  }
  if (rc == ST_OK) {
    if (meta && meta->type != MSGPACK_OBJECT_NIL) {
      size_t old = path_push(d, "metadata", 8);
      rc = decode_value(d, meta, mv, depth + 1);
      path_pop(d, old);
    } else {
      memset(mv, 0, sizeof *mv);
      mv->kind = ST_VALUE_MAP;
    }
  }
  msgpack_unpacked_destroy(&payload);
  if (rc != ST_OK) return rc;
  v->kind = ST_VALUE_MODULE;
  v->as.module.tensors = list;
  v->as.module.len = n;
  v->as.module.metadata = mv;
  return ST_OK;
}

/* A leaf (nil, bool, number, string, bin) into *v: 1, 0 when o is no
 * leaf, -1 out of memory. A leaf names no tensor and quotes no path, so
 * the walk below takes it without a step of its own. */
static inline int decode_leaf(st_result_t *r, const msgpack_object *o, st_value_t *v) {
  memset(v, 0, sizeof *v);
  switch (o->type) {
  case MSGPACK_OBJECT_NIL:
    v->kind = ST_VALUE_NIL;
    return 1;
  case MSGPACK_OBJECT_BOOLEAN:
    v->kind = ST_VALUE_BOOL;
    v->as.boolean = o->via.boolean ? 1 : 0;
    return 1;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    if (o->via.u64 > INT64_MAX) {
      v->kind = ST_VALUE_FLOAT;
      v->as.number = (double)o->via.u64;
    } else {
      v->kind = ST_VALUE_INT;
      v->as.integer = (int64_t)o->via.u64;
    }
    return 1;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    v->kind = ST_VALUE_INT;
    v->as.integer = o->via.i64;
    return 1;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    v->kind = ST_VALUE_FLOAT;
    v->as.number = o->via.f64;
    return 1;
  case MSGPACK_OBJECT_STR:
  case MSGPACK_OBJECT_BIN: {
    const char *p = o->type == MSGPACK_OBJECT_STR ? o->via.str.ptr : o->via.bin.ptr;
    size_t n = o->type == MSGPACK_OBJECT_STR ? o->via.str.size : o->via.bin.size;
    v->kind = o->type == MSGPACK_OBJECT_STR ? ST_VALUE_STRING : ST_VALUE_BINARY;
    v->as.str.ptr = copy_bytes(r, p, n);
    v->as.str.len = n;
    return v->as.str.ptr ? 1 : -1;
  }
  default:
    return 0;
  }
}

static int decode_value(decoder_t *d, const msgpack_object *o, st_value_t *v, int depth) {
  if (depth > ST_MAX_DEPTH)
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "reply value nested deeper than %d at '%s'",
                           ST_MAX_DEPTH, path_now(d));
  int got = decode_leaf(d->r, o, v);
  if (got) return got > 0 ? ST_OK : oom(d);
  st_result_t *r = d->r;
  switch (o->type) {
  case MSGPACK_OBJECT_ARRAY: {
    size_t n = o->via.array.size;
    st_value_t *items = alloc_in(r, sizeof *items * (n ? n : 1));
    if (!items) return oom(d);
    int leaves = depth < ST_MAX_DEPTH;   /* a leaf one deeper is in bounds */
    for (size_t i = 0; i < n; i++) {
      int leaf = leaves ? decode_leaf(r, &o->via.array.ptr[i], &items[i]) : 0;
      if (leaf < 0) return oom(d);
      if (leaf) continue;
      size_t old = path_push_num(d, (long long)i);
      int rc = decode_value(d, &o->via.array.ptr[i], &items[i], depth + 1);
      path_pop(d, old);
      if (rc != ST_OK) return rc;
    }
    v->kind = ST_VALUE_ARRAY;
    v->as.array.items = items;
    v->as.array.len = n;
    return ST_OK;
  }
  case MSGPACK_OBJECT_MAP: {
    size_t n = o->via.map.size;
    st_value_t *keys = alloc_in(r, sizeof *keys * (n ? n : 1));
    st_value_t *vals = alloc_in(r, sizeof *vals * (n ? n : 1));
    if (!keys || !vals) return oom(d);
    int leaves = depth < ST_MAX_DEPTH;   /* a leaf one deeper is in bounds */
    for (size_t i = 0; i < n; i++) {
      const msgpack_object_kv *kv = &o->via.map.ptr[i];
      int leaf = leaves ? decode_leaf(r, &kv->key, &keys[i]) : 0;
      int rc = leaf < 0 ? oom(d) : leaf ? ST_OK : decode_value(d, &kv->key, &keys[i], depth + 1);
      if (rc != ST_OK) return rc;
      leaf = leaves ? decode_leaf(r, &kv->val, &vals[i]) : 0;
      if (leaf < 0) return oom(d);
      if (leaf) continue;
      size_t old = kv->key.type == MSGPACK_OBJECT_STR
                       ? path_push(d, kv->key.via.str.ptr, kv->key.via.str.size)
                   : keys[i].kind == ST_VALUE_INT ? path_push_num(d, (long long)keys[i].as.integer)
                                                  : path_push(d, "?", 1);
      rc = decode_value(d, &kv->val, &vals[i], depth + 1);
      path_pop(d, old);
      if (rc != ST_OK) return rc;
    }
    v->kind = ST_VALUE_MAP;
    v->as.map.keys = keys;
    v->as.map.values = vals;
    v->as.map.len = n;
    return ST_OK;
  }
  case MSGPACK_OBJECT_EXT:
    if (o->via.ext.type == ST_EXT_TENSOR) {
      v->kind = ST_VALUE_TENSOR;
      return decode_tensor(d, o, &v->as.tensor);
    }
    if (o->via.ext.type == ST_EXT_MODULE) return decode_module(d, o, v, depth);
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "unknown ext type %d at '%s'",
                           (int)o->via.ext.type, path_now(d));
  default:
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "unexpected msgpack type %d at '%s'",
                           (int)o->type, path_now(d));
  }
}

static int64_t value_int(const st_value_t *v, int64_t dflt) {
  if (v && v->kind == ST_VALUE_INT) return v->as.integer;
  uint64_t u;
  return st__client_value_u64(v, &u) ? (int64_t)u : dflt;
}

static const char *value_str(const st_value_t *v) {
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : "";
}

static int value_bool(const st_value_t *v) {
  return v && v->kind == ST_VALUE_BOOL && v->as.boolean;
}

/* Decodes result["object"] (docs/protocol.md, "Objects, leases and
 * caching") into r->object. Absent: ST_OK, no object. */
static int decode_object(decoder_t *d, const msgpack_object *o) {
  st_value_t *v = st__client_result_alloc(d->r, sizeof *v);
  if (!v) return oom(d);
  size_t old = path_push(d, "object", 6);
  int rc = decode_value(d, o, v, 1);
  path_pop(d, old);
  if (rc != ST_OK) return rc;
  st_object_info_t *info = &d->r->object;
  if (v->kind != ST_VALUE_MAP || !st__client_value_u64(st_value_get(v, "id"), &info->id))
    return st__client_fail(d->c, ST_ERR_PROTOCOL, "the reply's 'object' has no id");
  info->server_id = value_str(st_value_get(v, "server_id"));
  if (!*info->server_id) info->server_id = d->r->server_id;
  info->cache_key = value_str(st_value_get(v, "cache_key"));
  info->device = value_str(st_value_get(v, "device"));
  info->cached = value_bool(st_value_get(v, "cached"));
  info->managed = value_bool(st_value_get(v, "managed"));
  info->lease = value_bool(st_value_get(v, "lease"));
  info->refcount = value_int(st_value_get(v, "refcount"), 0);
  info->bytes = (uint64_t)value_int(st_value_get(v, "bytes"), 0);
  d->r->has_object = 1;
  return ST_OK;
}

/* Whether the reply's `kept` (may be NULL) lists arena index i. */
static int listed_kept(const msgpack_object *kept, size_t i) {
  if (!kept || kept->type != MSGPACK_OBJECT_ARRAY) return 0;
  for (uint32_t k = 0; k < kept->via.array.size; k++)
    if (kept->via.array.ptr[k].type == MSGPACK_OBJECT_POSITIVE_INTEGER &&
        kept->via.array.ptr[k].via.u64 == i)
      return 1;
  return 0;
}

/* Parses and maps the reply's arenas; consumes every fd. An arena named
 * by id alone is this connection's kept mapping; one that `kept` lists is
 * pinned for later replies (kept_arenas.c); a region is a view of one of
 * the connection's pool slabs (pool.c). A reply decoded read-only maps
 * each arena read-only itself, so neither of those may come in it (the
 * server never sends them there: docs/keys.md, section 5), and it keeps
 * nothing. */
static int map_arenas(decoder_t *d, const msgpack_object *list, const msgpack_object *kept,
                      int *fds, size_t nfds, st__arena_desc_t *descs) {
  st_result_t *r = d->r;
  size_t n = list ? list->via.array.size : 0;
  int rc = ST_OK;
  for (size_t i = 0; i < n && rc == ST_OK; i++) {
    char why[200] = "";
    if (d->readonly && (st__client_pool_is_region(&list->via.array.ptr[i]) ||
                        st__client_kept_arenas_is_ref(d->c, &list->via.array.ptr[i]) ||
                        st__client_arg_result_is(&list->via.array.ptr[i]))) {
      rc = st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "arena %zu of a reply asked read-only is a pool region or names an "
                           "arena by id: memory this connection maps writable", i);
    } else if (st__client_arg_result_is(&list->via.array.ptr[i])) {
      rc = st__client_arg_result_arena(d->c, &list->via.array.ptr[i], &descs[i], &r->maps[i]);
      if (rc == ST_OK) r->nmaps = i + 1;
    } else if (st__client_pool_is_region(&list->via.array.ptr[i])) {
      rc = st__client_pool_region(d->c, &list->via.array.ptr[i], fds, nfds, &descs[i], &r->maps[i]);
      if (rc == ST_OK) r->nmaps = i + 1;
    } else if (st__client_kept_arenas_is_ref(d->c, &list->via.array.ptr[i])) {
      rc = st__client_kept_arenas_find(d->c, &list->via.array.ptr[i], &descs[i], &r->maps[i]);
      if (rc == ST_OK) r->nmaps = i + 1;
    } else if (st__parse_arena(&list->via.array.ptr[i], &descs[i], why, sizeof why) != ST_OK) {
      rc = st__client_fail(d->c, ST_ERR_PROTOCOL, "bad arena %zu in the reply: %s", i, why);
    } else if (descs[i].no_fd) {
      rc = st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "arena %zu in the reply has no descriptor (arg_id is for requests)", i);
    } else if (!descs[i].legacy && (descs[i].fd >= nfds || fds[descs[i].fd] < 0)) {
      rc = st__client_fail(d->c, ST_ERR_PROTOCOL,
                           "arena %zu names descriptor %u, which is missing or taken", i,
                           descs[i].fd);
    } else {
      if (d->readonly) descs[i].readonly = 1;   /* whatever the reply says */
      int fd = -1;   /* a legacy arena has none: map.c refuses it */
      if (!descs[i].legacy) {
        fd = fds[descs[i].fd];
        fds[descs[i].fd] = -1;
      }
      rc = st__client_map_arena(d->c->server_id, &descs[i], fd, &r->maps[i], why, sizeof why);
      if (rc != ST_OK) {
        st__client_fail(d->c, rc, "%s", why);
      } else {
        r->nmaps = i + 1;
        if (!descs[i].legacy && !d->readonly && listed_kept(kept, i)) {
          st__client_mapping_mark_reusable(r->maps[i]);
          st__client_kept_arenas_keep(d->c, &descs[i], r->maps[i]);
        }
      }
    }
  }
  for (size_t i = 0; i < nfds; i++)
    if (fds[i] >= 0) {
      close(fds[i]);
      fds[i] = -1;
    }
  return rc;
}

/* The reply's names by id (arenas, its object) are resolved: the request
 * is over (kept.c). */
static void resolved(st_client_t *c) {
  st__client_kept_arenas_resolved(c);
  st__client_kept_objects_resolved(c);
}

/* A reply {object, same: true}: the result this connection keeps of that
 * object, once more (kept_objects.c). */
static int decode_same(st_client_t *c, const msgpack_object *result, int *fds, size_t nfds,
                       st_result_t **out) {
  for (size_t i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
  int rc = st__client_kept_objects_same(c, result, out);
  resolved(c);
  return rc;
}

/* The pairs of a reply map that decode reads, found in one pass (a
 * plain value such as info's is a map of a few dozen pairs, looked into
 * for these names on every call); the first of equal keys, as
 * st__map_get. */
typedef struct reply_fields {
  const msgpack_object *same, *kept, *value, *arenas, *object, *pool_page, *object_kept;
} reply_fields_t;

static void reply_fields(const msgpack_object *m, reply_fields_t *f) {
  memset(f, 0, sizeof *f);
  if (!m || m->type != MSGPACK_OBJECT_MAP) return;
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object_kv *kv = &m->via.map.ptr[i];
    if (kv->key.type != MSGPACK_OBJECT_STR) continue;
    const char *k = kv->key.via.str.ptr;
    const msgpack_object **at = NULL;
    switch (kv->key.via.str.size) {
    case 4:
      at = !memcmp(k, "same", 4) ? &f->same : !memcmp(k, "kept", 4) ? &f->kept : NULL;
      break;
    case 5:
      at = !memcmp(k, "value", 5) ? &f->value : NULL;
      break;
    case 6:
      at = !memcmp(k, "arenas", 6) ? &f->arenas : !memcmp(k, "object", 6) ? &f->object : NULL;
      break;
    case 9:
      at = !memcmp(k, "pool_page", 9) ? &f->pool_page : NULL;
      break;
    case 11:
      at = !memcmp(k, "object_kept", 11) ? &f->object_kept : NULL;
      break;
    default:
      break;
    }
    if (at && !*at) *at = &kv->val;
  }
}

/* st__client_result_decode, every arena mapped read-only when
 * `readonly`. */
static int decode(st_client_t *c, const msgpack_object *result, int unwrap, int readonly,
                  int *fds, size_t nfds, st_result_t **out) {
  *out = NULL;
  reply_fields_t f;
  reply_fields(result, &f);
  if (unwrap && c->object_refs && f.same) {
    if (readonly) {
      for (size_t i = 0; i < nfds; i++)
        if (fds[i] >= 0) close(fds[i]);
      return st__client_fail(c, ST_ERR_PROTOCOL, "a `same` object reply to a request asked "
                             "read-only");
    }
    return decode_same(c, result, fds, nfds, out);
  }
  decoder_t d;
  memset(&d, 0, sizeof d);
  d.c = c;
  d.readonly = readonly;
  st_result_t *r = calloc(1, sizeof *r);
  const msgpack_object *list = f.arenas;
  if (list && list->type != MSGPACK_OBJECT_ARRAY) list = NULL;
  size_t n = list ? list->via.array.size : 0;
  st__arena_desc_t *descs = n ? calloc(n, sizeof *descs) : NULL;
  if (r && n) r->maps = calloc(n, sizeof *r->maps);
  int rc;
  if (!r || (n && (!descs || !r->maps))) {
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    rc = st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory decoding a reply");
    goto done;
  }
  d.r = r;
  /* The pool page first: the regions of this reply free into it. */
  rc = st__client_pool_take_page(c, f.pool_page, fds, nfds);
  if (rc == ST_OK) rc = map_arenas(&d, list, f.kept, fds, nfds, descs);
  else
    for (size_t i = 0; i < nfds; i++)
      if (fds[i] >= 0) close(fds[i]);
  resolved(c);   /* every {ref} holds its mapping now */
  if (rc != ST_OK) goto done;
  d.arenas = descs;
  d.narenas = n;

  const msgpack_object *value = result;
  if (unwrap) {
    value = f.value;
    if (result->type != MSGPACK_OBJECT_MAP || !value) {
      rc = st__client_fail(c, ST_ERR_PROTOCOL, "the reply has no 'value'");
      goto done;
    }
  }
  r->value = st__client_result_alloc(r, sizeof *r->value);
  if (!r->value) {
    rc = oom(&d);
    goto done;
  }
  rc = decode_value(&d, value, r->value, 0);
  const msgpack_object *object = unwrap ? f.object : NULL;
  if (rc == ST_OK && object && object->type != MSGPACK_OBJECT_NIL) {
    r->server_id = copy_bytes(r, c->server_id, strlen(c->server_id));
    rc = r->server_id ? decode_object(&d, object) : oom(&d);
    const msgpack_object *kept = f.object_kept;
    if (rc == ST_OK && kept && kept->type == MSGPACK_OBJECT_BOOLEAN && kept->via.boolean)
      st__client_kept_objects_keep(c, r);
  }

done:
  free(descs);
  free(d.path.ptr);
  if (rc != ST_OK) {
    st_result_free(r);
    return rc;
  }
  *out = r;
  return ST_OK;
}

/* See client_internal.h. Thread of the client. */
int st__client_result_decode(st_client_t *c, const msgpack_object *result, int unwrap,
                             int *fds, size_t nfds, st_result_t **out) {
  return decode(c, result, unwrap, 0, fds, nfds, out);
}

/* See client_internal.h. Thread of the client. */
int st__client_result_decode_readonly(st_client_t *c, const msgpack_object *result, int unwrap,
                                      int *fds, size_t nfds, st_result_t **out) {
  return decode(c, result, unwrap, 1, fds, nfds, out);
}

/* See client_internal.h. Any thread holding a reference. */
int st__client_result_writable(const st_result_t *r, const st_tensor_t *t) {
  for (size_t i = 0; i < r->nmaps; i++) {
    const st__mapping_t *m = r->maps[i];
    const char *base = st__client_mapping_base(m);
    uint64_t bytes = st__client_mapping_bytes(m);
    if (!base || (t && (!t->data || (const char *)t->data < base ||
                        (uint64_t)((const char *)t->data - base) >= bytes)))
      continue;   /* empty, or not t's */
    if (!st__client_mapping_writable(m)) return 0;
  }
  return 1;
}

/* See client_internal.h. Any thread holding a reference. */
void st__client_result_describe(st_result_t *r, int kind, const char *fmt, ...) {
  /* Formatted only for a result with read-only memory: most have none,
   * and calls take this path each time. */
  char what[176];
  int formatted = 0;
  for (size_t i = 0; r && i < r->nmaps; i++) {
    if (!st__client_mapping_describable(r->maps[i])) continue;
    if (!formatted) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(what, sizeof what, fmt, ap);
      va_end(ap);
      formatted = 1;
    }
    st__client_mapping_describe(r->maps[i], kind, what);
  }
}

/* Takes one more reference on r; see client.h. Any thread. */
ST_API void st_result_ref(st_result_t *r) {
  if (!r) return;
  if (r->kept) st__client_kept_objects_ref(r);
  else __atomic_add_fetch(&r->extra_refs, 1, __ATOMIC_RELAXED);
}

/* See result.h. Any thread holding a reference. */
void st__client_result_after_device(st_result_t *r) {
  if (r) __atomic_store_n(&r->after_device, 1, __ATOMIC_RELEASE);
}

/* Drops one reference; the last one frees the result and drops its
 * open-cache references; see client.h. Any thread. */
ST_API void st_result_free(st_result_t *r) {
  if (!r) return;
  if (r->kept) {
    /* Counted under the lock: the connection may hold it on. */
    if (st__client_kept_objects_unref(r)) st__client_result_destroy(r);
    return;
  }
  /* extra_refs counts references beyond the first: a positive count is
   * decremented and the result lives on. Acquire/release orders every
   * earlier use of r before the free. */
  int refs = __atomic_load_n(&r->extra_refs, __ATOMIC_ACQUIRE);
  while (refs > 0) {
    if (__atomic_compare_exchange_n(&r->extra_refs, &refs, refs - 1, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return;
  }
  st__client_result_destroy(r);
}

/* See result.h. Any thread. */
void st__client_result_destroy(st_result_t *r) {
  int after_device = __atomic_load_n(&r->after_device, __ATOMIC_ACQUIRE);
  for (size_t i = 0; i < r->nmaps; i++) {
    if (after_device) st__client_mapping_release_after_device(r->maps[i]);
    else st__client_mapping_release(r->maps[i]);
  }
  free(r->maps);
  free(r->tensors);
  st__block_t *b = r->blocks;
  while (b) {
    st__block_t *next = b->next;
    free(b);
    b = next;
  }
  free(r);
}
