/* src/server: the restore of published state at start (restore.h):
 * records replayed, then every version and buffer made again from them.
 * Loop thread, at start. Every byte read from the journal or received is
 * untrusted (docs/security.md, "The fd store and the journal"). */
#include "server/restore.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/buffer.h"
#include "engine/keys.h"
#include "mem/arena.h"
#include "proto/proto.h"
#include "server/holdings.h"
#include "server/rpc.h"
#include "server/server.h"
#include "st/errors.h"


/* An arena the journal names. */
typedef struct old_arena {
  uint64_t n;
  st__arena_desc_t desc;
  int gone;                   /* ARENA_GONE came                           */
  int tried;
  st__arena_t *arena;         /* imported (one reference), or NULL         */
  char why[300];              /* why the import failed                     */
} old_arena_t;

/* A VERSION record still standing. */
typedef struct old_version {
  char *payload;              /* owned copy of the record                  */
  size_t len;
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version;
  int dropped;
} old_version_t;

/* A BUFFER record still standing. */
typedef struct old_buffer {
  char *payload;              /* owned copy of the record; NULL: unlinked  */
  size_t len;
  char name[ST__NAME_MAX + 1];
} old_buffer_t;

typedef struct replay {
  st__smap_t arenas;          /* decimal n -> old_arena_t                  */
  old_buffer_t *buffers;      /* in record order                           */
  size_t nbuffers, bcap;
  st__smap_t buffer_names;    /* name -> index + 1 of its standing record  */
  old_version_t *versions;
  size_t nversions, cap;
  st__smap_t latest;          /* "key" -> index + 1 of its last version    */
} replay_t;

/* A string field (NUL-free, at most cap-1 bytes) of map m. */
static int field_str(const msgpack_object *m, const char *k, char *out, size_t cap) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_STR || o->via.str.size >= cap ||
      memchr(o->via.str.ptr, 0, o->via.str.size))
    return 0;
  memcpy(out, o->via.str.ptr, o->via.str.size);
  out[o->via.str.size] = '\0';
  return 1;
}

static int field_uint(const msgpack_object *m, const char *k, uint64_t max, uint64_t *out) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > max) return 0;
  *out = o->via.u64;
  return 1;
}

static int field_bool(const msgpack_object *m, const char *k, int *out) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_BOOLEAN) return 0;
  *out = o->via.boolean;
  return 1;
}

static old_arena_t *old_arena(replay_t *p, uint64_t n) {
  char k[24];
  int len = snprintf(k, sizeof k, "%" PRIu64, n);
  return st__smap_get(&p->arenas, k, (size_t)len);
}

/* Keeps an ARENA record. */
static int replay_arena(replay_t *p, const msgpack_object *m, char *err, size_t errlen) {
  old_arena_t a;
  memset(&a, 0, sizeof a);
  int cuda = 0;
  if (!field_uint(m, "n", ST__RESTART_MAX_ARENA, &a.n) || a.n == 0 ||
      !field_str(m, "backend", a.desc.backend, sizeof a.desc.backend) ||
      !field_uint(m, "bytes", UINT64_MAX, &a.desc.bytes) || !field_bool(m, "cuda", &cuda) ||
      !field_str(m, "uuid", a.desc.uuid, sizeof a.desc.uuid))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "an arena record lacks a valid field");
  a.desc.cuda = cuda;
  if (old_arena(p, a.n))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arena %" PRIu64 " recorded twice",
                    a.n);
  old_arena_t *e = malloc(sizeof *e);
  char k[24];
  int len = snprintf(k, sizeof k, "%" PRIu64, a.n);
  if (!e || (*e = a, st__smap_put(&p->arenas, k, (size_t)len, e)) != ST_OK) {
    free(e);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  return ST_OK;
}

/* Keeps a VERSION record (a copy), checking its key and number. */
static int replay_version(replay_t *p, const msgpack_object *m, const char *payload, size_t len,
                          char *err, size_t errlen) {
  old_version_t v;
  memset(&v, 0, sizeof v);
  if (!field_str(m, "key", v.key, sizeof v.key) ||
      st__keys_name_ok(v.key, strlen(v.key), NULL, 0) != ST_OK ||
      !field_uint(m, "version", UINT64_MAX, &v.version) || v.version == 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a version record has no valid key "
                    "and version");
  uintptr_t last = (uintptr_t)st__smap_get(&p->latest, v.key, strlen(v.key));
  if (last && !p->versions[last - 1].dropped && p->versions[last - 1].version >= v.version)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "key '%s': version %" PRIu64 " recorded after version %" PRIu64, v.key,
                    v.version, p->versions[last - 1].version);
  if (p->nversions == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    old_version_t *grown = realloc(p->versions, cap * sizeof *grown);
    if (!grown) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    p->versions = grown;
    p->cap = cap;
  }
  v.payload = malloc(len ? len : 1);
  if (!v.payload) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  memcpy(v.payload, payload, len);
  v.len = len;
  p->versions[p->nversions++] = v;
  if (st__smap_put(&p->latest, v.key, strlen(v.key), (void *)(uintptr_t)p->nversions) != ST_OK)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  return ST_OK;
}

/* DROP (version) or DELETE (every version) of key. */
static int replay_gone(replay_t *p, const msgpack_object *m, int drop, char *err,
                       size_t errlen) {
  char key[ST__KEY_NAME_MAX + 1];
  uint64_t version = 0;
  if (!field_str(m, "key", key, sizeof key) ||
      (drop && !field_uint(m, "version", UINT64_MAX, &version)))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a %s record lacks a valid field",
                    drop ? "drop" : "delete");
  for (size_t i = p->nversions; i-- > 0;) {
    old_version_t *v = &p->versions[i];
    if (v->dropped || strcmp(v->key, key) != 0) continue;
    if (!drop || v->version == version) {
      v->dropped = 1;
      free(v->payload);
      v->payload = NULL;
      if (drop) break;
    }
  }
  return ST_OK;
}

/* Keeps a BUFFER record (a copy), or drops one for BUFFER_GONE. */
static int replay_buffer(replay_t *p, const msgpack_object *m, const char *payload, size_t len,
                         int gone, char *err, size_t errlen) {
  char name[ST__NAME_MAX + 1];
  if (!field_str(m, "name", name, sizeof name) ||
      st__named_check("buffer", name, strlen(name), NULL, 0) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a buffer record has no valid name");
  uintptr_t at = (uintptr_t)st__smap_get(&p->buffer_names, name, strlen(name));
  if (gone) {
    if (!at)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "buffer '%s' unlinked, never made",
                      name);
    free(p->buffers[at - 1].payload);
    p->buffers[at - 1].payload = NULL;
    st__smap_del(&p->buffer_names, name, strlen(name));
    return ST_OK;
  }
  if (at)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "buffer '%s' made twice", name);
  if (p->nbuffers == p->bcap) {
    size_t cap = p->bcap ? p->bcap * 2 : 16;
    old_buffer_t *grown = realloc(p->buffers, cap * sizeof *grown);
    if (!grown) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    p->buffers = grown;
    p->bcap = cap;
  }
  old_buffer_t *b = &p->buffers[p->nbuffers];
  memset(b, 0, sizeof *b);
  memcpy(b->name, name, strlen(name) + 1);
  if (!(b->payload = malloc(len ? len : 1)))
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  memcpy(b->payload, payload, len);
  b->len = len;
  p->nbuffers++;
  if (st__smap_put(&p->buffer_names, name, strlen(name), (void *)(uintptr_t)p->nbuffers) != ST_OK)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  return ST_OK;
}

/* st__journal_read's callback: one verified record into the replay. */
static int replay_record(void *ud, uint32_t type, const char *payload, size_t len, char *err,
                         size_t errlen) {
  replay_t *p = ud;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int rc = ST_OK;
  if (msgpack_unpack_next(&u, payload, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
      u.data.type != MSGPACK_OBJECT_MAP) {
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a record of type %u is no map", type);
  } else if (type == ST__REC_ARENA) {
    rc = replay_arena(p, &u.data, err, errlen);
  } else if (type == ST__REC_ARENA_GONE) {
    uint64_t n;
    old_arena_t *a = field_uint(&u.data, "n", ST__RESTART_MAX_ARENA, &n) ? old_arena(p, n) : NULL;
    if (a) a->gone = 1;
    else rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the end of an unknown arena");
  } else if (type == ST__REC_VERSION) {
    rc = replay_version(p, &u.data, payload, len, err, errlen);
  } else if (type == ST__REC_DROP || type == ST__REC_DELETE) {
    rc = replay_gone(p, &u.data, type == ST__REC_DROP, err, errlen);
  } else if (type == ST__REC_BUFFER || type == ST__REC_BUFFER_GONE) {
    rc = replay_buffer(p, &u.data, payload, len, type == ST__REC_BUFFER_GONE, err, errlen);
  } else {
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a record of unknown type %u", type);
  }
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* Arena n imported from the store (once): the reference the replay
 * holds, or NULL with the reason in err. */
static st__arena_t *import_arena(struct st__restart *r, replay_t *p, uint64_t n, char *err,
                                 size_t errlen) {
  old_arena_t *a = old_arena(p, n);
  if (!a || a->gone) {
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "it names arena %" PRIu64 ", which the "
             "journal %s", n, a ? "says was let go of" : "never recorded");
    return NULL;
  }
  if (!a->tried) {
    a->tried = 1;
    char name[64];
    st__restart_fdname(name, sizeof name, n);
    int fd = st__fdstore_claim(&r->store, name);
    if (fd < 0) {
      snprintf(a->why, sizeof a->why, "its descriptor '%s' is not in the store", name);
    } else {
      st__arena_desc_t d = a->desc;
      if (st__arena_import(&d, fd, &a->arena, a->why, sizeof a->why) != ST_OK) {
        a->arena = NULL;
        st__fdstore_remove(&r->store, name);
      }
    }
  }
  if (!a->arena)
    st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arena %" PRIu64 ": %s", n, a->why);
  return a->arena;
}

/* Checks every tensor of value o against the arenas of res: a valid
 * descriptor whose arena index is res's and whose bytes lie inside it. */
static int check_tensors(const msgpack_object *o, const st__build_result_t *res, int depth,
                         char *err, size_t errlen) {
  if (depth > ST_MAX_DEPTH + 2)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "the value nests too deep");
  if (o->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      int rc = check_tensors(&o->via.array.ptr[i], res, depth + 1, err, errlen);
      if (rc != ST_OK) return rc;
    }
  } else if (o->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      int rc = check_tensors(&o->via.map.ptr[i].val, res, depth + 1, err, errlen);
      if (rc != ST_OK) return rc;
    }
  } else if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_TENSOR) {
    st__tensor_desc_t d;
    uint64_t lo, hi;
    int rc = st__parse_tensor(o, &d, err, errlen);
    if (rc != ST_OK) return rc;
    if (d.arena >= res->narenas || st__tensor_extent(&d, &lo, &hi) != ST_OK ||
        hi > st__arena_bytes(res->arenas[d.arena]))
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "a tensor lies outside the arenas it was recorded with");
  } else if (o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_MODULE) {
    msgpack_unpacked payload;
    const msgpack_object *tensors, *metadata;
    msgpack_unpacked_init(&payload);
    int rc = st__parse_module(o, &payload, &tensors, &metadata, err, errlen);
    if (rc == ST_OK) rc = check_tensors(tensors, res, depth + 1, err, errlen);
    msgpack_unpacked_destroy(&payload);
    return rc == ST_OK ? ST_OK : ST_ERR_INVALID_ARGUMENT;
  }
  return ST_OK;
}

/* A grant list field (at most ST__GRANT_MAX ids). */
static int field_ids(const msgpack_object *m, const char *k, uint32_t *n, uint32_t *ids) {
  const msgpack_object *o = st__map_get(m, k);
  if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > ST__GRANT_MAX) return 0;
  for (uint32_t i = 0; i < o->via.array.size; i++) {
    const msgpack_object *e = &o->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > UINT32_MAX) return 0;
    ids[i] = (uint32_t)e->via.u64;
  }
  *n = o->via.array.size;
  return 1;
}

/* Makes version record v again in the table: every field checked, the
 * arenas imported, the value's tensors checked against them. */
static int restore_version(struct st__restart *r, replay_t *p, const old_version_t *v, char *err,
                           size_t errlen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, v->payload, v->len, &off);   /* verified by the replay */
  const msgpack_object *m = &u.data;
  st__grant_t readers;
  memset(&readers, 0, sizeof readers);
  uint32_t uids[ST__GRANT_MAX], gids[ST__GRANT_MAX];
  uint64_t uid, policy, page_n;
  int readonly, live, rc = ST_OK;
  const msgpack_object *created = st__map_get(m, "created"), *value = st__map_get(m, "value"),
                       *arenas = st__map_get(m, "arenas"), *origin = st__map_get(m, "origin");
  if (!field_uint(m, "uid", UINT32_MAX - 1, &uid) || !field_uint(m, "policy", 1, &policy) ||
      !field_bool(m, "readonly", &readonly) || !field_bool(m, "live", &live) ||
      !field_uint(m, "page", ST__RESTART_MAX_ARENA, &page_n) ||
      !field_ids(m, "uids", &readers.nuids, uids) || !field_ids(m, "gids", &readers.ngids, gids) ||
      !created || (created->type != MSGPACK_OBJECT_FLOAT64 && created->type != MSGPACK_OBJECT_FLOAT32) ||
      !value || value->type != MSGPACK_OBJECT_BIN || !arenas ||
      arenas->type != MSGPACK_OBJECT_ARRAY || arenas->via.array.size > ST_MAX_FDS_PER_MESSAGE * 64 ||
      !origin || (origin->type != MSGPACK_OBJECT_NIL && origin->type != MSGPACK_OBJECT_ARRAY) ||
      (live && (policy != ST__KEY_PINNED || page_n == 0)) || (!live && page_n)) {
    msgpack_unpacked_destroy(&u);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a field is missing or out of range");
  }
  for (uint32_t i = 0; i < readers.nuids; i++) readers.uids[i] = (uid_t)uids[i];
  for (uint32_t i = 0; i < readers.ngids; i++) readers.gids[i] = (gid_t)gids[i];
  st__key_origin_t org;
  memset(&org, 0, sizeof org);
  if (origin->type == MSGPACK_OBJECT_ARRAY) {
    const msgpack_object *e = origin->via.array.ptr;
    if (origin->via.array.size != 3 || e[0].type != MSGPACK_OBJECT_STR ||
        e[0].via.str.size >= sizeof org.peer || e[1].type != MSGPACK_OBJECT_STR ||
        e[1].via.str.size >= sizeof org.key || e[2].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its origin is malformed");
    else {
      memcpy(org.peer, e[0].via.str.ptr, e[0].via.str.size);
      memcpy(org.key, e[1].via.str.ptr, e[1].via.str.size);
      org.version = e[2].via.u64;
    }
  }
  st__build_result_t res;
  st__build_result_init(&res);
  uint32_t na = rc == ST_OK ? arenas->via.array.size : 0;
  if (na && !(res.arenas = calloc(na, sizeof *res.arenas)))
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  for (uint32_t i = 0; rc == ST_OK && i < na; i++) {
    const msgpack_object *e = &arenas->via.array.ptr[i];
    st__arena_t *a = e->type == MSGPACK_OBJECT_POSITIVE_INTEGER
                         ? import_arena(r, p, e->via.u64, err, errlen)
                         : NULL;
    if (!a) {
      if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "an arena number is no integer");
      rc = ST_ERR_INVALID_ARGUMENT;
      break;
    }
    for (size_t k = 0; k < res.narenas; k++)
      if (res.arenas[k] == a) rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                                            "it names arena %" PRIu64 " twice", e->via.u64);
    if (rc != ST_OK) break;
    st__arena_ref(a);
    res.arenas[res.narenas++] = a;
    res.bytes += st__arena_bytes(a);
  }
  st__arena_t *page = NULL;
  if (rc == ST_OK && live && (page = import_arena(r, p, page_n, err, errlen)) == NULL)
    rc = ST_ERR_INVALID_ARGUMENT;
  if (rc == ST_OK && page && !st__keys_page_valid(page))
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its control page is no key page");
  if (rc == ST_OK) {
    msgpack_unpacked val;
    msgpack_unpacked_init(&val);
    size_t voff = 0;
    if (msgpack_unpack_next(&val, value->via.bin.ptr, value->via.bin.size, &voff) !=
            MSGPACK_UNPACK_SUCCESS || voff != value->via.bin.size)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its value is no msgpack value");
    else if ((rc = st__check_value(&val.data, 1, err, errlen)) == ST_OK)
      rc = check_tensors(&val.data, &res, 0, err, errlen);
    if (rc != ST_OK) rc = ST_ERR_INVALID_ARGUMENT;
    msgpack_unpacked_destroy(&val);
  }
  if (rc == ST_OK && msgpack_sbuffer_write(&res.value, value->via.bin.ptr, value->via.bin.size))
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  if (rc == ST_OK) {
    const st__key_put_t kp = {.name = v->key, .len = strlen(v->key), .uid = (uid_t)uid,
                              .conn = 0, .policy = (st__key_policy_t)policy,
                              .readonly = readonly, .live = live, .readers = &readers,
                              .origin = origin->type == MSGPACK_OBJECT_ARRAY ? &org : NULL,
                              .version = v->version, .created_at = created->via.f64,
                              .page = page};
    uint64_t got;
    rc = st__keys_put(&r->srv->keys, &kp, &res, &got, err, errlen);
    if (rc == ST_OK && live) {
      st__key_t *k = st__smap_get(&r->srv->keys.by_name, v->key, strlen(v->key));
      st__keys_live_orphaned(k);
      r->torn += st__keys_torn(k);
    }
  }
  st__build_result_destroy(&res);
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* Makes buffer record b again: every field checked, its arenas
 * imported, then st__buffer_restore's checks of them. */
static int restore_buffer(struct st__restart *r, replay_t *p, const old_buffer_t *b, char *err,
                          size_t errlen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  msgpack_unpack_next(&u, b->payload, b->len, &off);   /* verified by the replay */
  const msgpack_object *m = &u.data, *shape = st__map_get(m, "shape");
  st__buffer_spec_t spec;
  memset(&spec, 0, sizeof spec);
  st__grant_t readers;
  memset(&readers, 0, sizeof readers);
  uint32_t uids[ST__GRANT_MAX], gids[ST__GRANT_MAX];
  uint64_t uid = 0, data_n = 0, page_n = 0;
  int cuda = 0, rc = ST_OK;
  char dtype[32];
  if (!field_uint(m, "uid", UINT32_MAX - 1, &uid) || !field_bool(m, "cuda", &cuda) ||
      !field_str(m, "dtype", dtype, sizeof dtype) ||
      (spec.dtype = st_dtype_from_name(dtype)) == ST_DTYPE_INVALID ||
      !field_uint(m, "slots", ST__BUFFER_MAX_SLOTS, &spec.slots) ||
      !field_uint(m, "data", ST__RESTART_MAX_ARENA, &data_n) ||
      !field_uint(m, "page", ST__RESTART_MAX_ARENA, &page_n) ||
      !field_ids(m, "uids", &readers.nuids, uids) || !field_ids(m, "gids", &readers.ngids, gids) ||
      !shape || shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size > ST_MAX_NDIM)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a field is missing or out of range");
  for (uint32_t i = 0; rc == ST_OK && i < shape->via.array.size; i++) {
    const msgpack_object *e = &shape->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT64_MAX)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its shape is malformed");
    else spec.shape[spec.ndim++] = (int64_t)e->via.u64;
  }
  for (uint32_t i = 0; rc == ST_OK && i < readers.nuids; i++) readers.uids[i] = (uid_t)uids[i];
  for (uint32_t i = 0; rc == ST_OK && i < readers.ngids; i++) readers.gids[i] = (gid_t)gids[i];
  st__arena_t *data = rc == ST_OK ? import_arena(r, p, data_n, err, errlen) : NULL;
  st__arena_t *page = data ? import_arena(r, p, page_n, err, errlen) : NULL;
  if (rc == ST_OK && (!data || !page)) rc = ST_ERR_INVALID_ARGUMENT;
  if (rc == ST_OK && data == page)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its data and page are one arena");
  if (rc == ST_OK && (st__arena_device(data) >= 0) != cuda)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "its data arena is on another backend");
  if (rc == ST_OK) {
    spec.device = st__arena_device(data);
    spec.name = b->name;
    spec.name_len = strlen(b->name);
    spec.readers = &readers;
    st__buffer_limits_t l = st__rpc_buffer_limits(r->srv->cfg);
    st__buffer_t *made;
    rc = st__buffer_restore(ST__HOLDING_STATE(r->srv, buffers), &spec, &l, (uid_t)uid, data,
                            page, &made, err, errlen);
  }
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* The arena -> number map of what the replay imported. */
static void index_imported(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  old_arena_t *a = value;
  if (a->arena) st__smap_put(ud, &a->arena, sizeof a->arena, (void *)(uintptr_t)a->n);
}

/* Counts arena a (of a restored key) into the kept arenas. */
static void count_kept(struct st__restart *r, st__smap_t *imported, const st__arena_t *a) {
  uintptr_t n = (uintptr_t)st__smap_get(imported, &a, sizeof a);
  if (!n) return;
  st__stored_arena_t *e = st__store_arenas_by_number(&r->arenas, n);
  if (!e && !(e = st__store_arenas_add(&r->arenas, a, n))) return;
  st__store_arenas_hold(&r->arenas, e, a);
}

/* Lets go of the replay's arena references; an arena no restored key
 * holds leaves the store. */
static void release_imported(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  struct st__restart *r = ud;
  old_arena_t *a = value;
  if (a->arena && !st__store_arenas_number_of(&r->arenas, a->arena)) {
    char name[64];
    st__restart_fdname(name, sizeof name, a->n);
    st__fdstore_remove(&r->store, name);
  }
  st__arena_unref(a->arena);
  free(a);
}

/* The journal among the received ones to restore from (the highest
 * generation and epoch that verifies), claimed; -1 when none. The others
 * are closed and removed from the store. */
static int pick_journal(struct st__restart *r, st__journal_scan_t *best) {
  int fds[2], chosen = -1;
  st__journal_scan_t scans[2];
  for (int i = 0; i < 2; i++) {
    char name[32], err[300];
    snprintf(name, sizeof name, "st-journal-%d", i);
    fds[i] = st__fdstore_claim(&r->store, name);
    if (fds[i] < 0) continue;
    if (st__journal_header(fds[i], &scans[i], err, sizeof err) != ST_OK) {
      ST_LOG_E("restart", "journal '%s' refused: %s", name, err);
      close(fds[i]);
      fds[i] = -1;
      st__fdstore_remove(&r->store, name);
      continue;
    }
    if (chosen < 0 || scans[i].generation > scans[chosen].generation ||
        (scans[i].generation == scans[chosen].generation && scans[i].epoch > scans[chosen].epoch))
      chosen = i;
  }
  for (int i = 0; i < 2; i++)
    if (fds[i] >= 0 && i != chosen) {
      char name[32];
      snprintf(name, sizeof name, "st-journal-%d", i);
      close(fds[i]);
      st__fdstore_remove(&r->store, name);
    }
  if (chosen < 0) return -1;
  *best = scans[chosen];
  r->slot = chosen;
  r->slot_stored = 1;
  return fds[chosen];
}

/* See restore.h. Loop thread, at start. */
void st__restore_run(struct st__restart *r) {
  st__journal_scan_t scan;
  int fd = pick_journal(r, &scan);
  if (fd < 0) return;
  replay_t p;
  memset(&p, 0, sizeof p);
  st__smap_init(&p.arenas);
  st__smap_init(&p.latest);
  st__smap_init(&p.buffer_names);
  char err[512];
  int rc = st__journal_read(fd, replay_record, &p, &scan, err, sizeof err);
  close(fd);
  r->from_generation = scan.generation;
  if (rc != ST_OK) {
    ST_LOG_E("restart", "journal generation %" PRIu64 " refused: %s; nothing restored",
             scan.generation, err);
  } else {
    if (scan.torn_tail)
      ST_LOG_W("restart", "the journal's last record was cut by the crash (a change never "
               "acknowledged): ignored");
    for (size_t i = 0; i < p.nversions; i++) {
      const old_version_t *v = &p.versions[i];
      if (v->dropped) continue;
      if (restore_version(r, &p, v, err, sizeof err) != ST_OK) {
        ST_LOG_E("restart", "key '%s' version %" PRIu64 " not restored: %s", v->key, v->version,
                 err);
        r->refused++;
        continue;
      }
      r->versions++;
    }
    for (size_t i = 0; i < p.nbuffers; i++) {
      const old_buffer_t *b = &p.buffers[i];
      if (!b->payload) continue;
      if (restore_buffer(r, &p, b, err, sizeof err) != ST_OK) {
        ST_LOG_E("restart", "buffer '%s' not restored: %s", b->name, err);
        r->refused++;
        continue;
      }
      r->buffers++;
    }
  }
  /* What the table holds now (a budget may have evicted some) decides
   * which arenas stay in the store. */
  st__smap_t imported;
  st__smap_init(&imported);
  st__smap_each(&p.arenas, index_imported, &imported);
  size_t nkeys = 0;
  st__key_t **keys = st__keys_list(&r->srv->keys, NULL, 0, &nkeys);
  for (size_t i = 0; i < nkeys; i++) {
    const st__key_t *k = keys[i];
    for (size_t j = 0; j < k->nversions; j++) {
      for (size_t a = 0; a < k->versions[j]->result.narenas; a++)
        count_kept(r, &imported, k->versions[j]->result.arenas[a]);
      if (k->page_arena) count_kept(r, &imported, k->page_arena);
    }
    r->bytes += k->bytes;
  }
  r->keys = nkeys;
  free(keys);
  st__buffers_t *bt = ST__HOLDING_STATE(r->srv, buffers);
  for (st__named_t *e = bt ? bt->named.head : NULL; e; e = e->next) {
    count_kept(r, &imported, e->data);
    count_kept(r, &imported, e->page_arena);
  }
  st__smap_clear(&imported);
  st__smap_each(&p.arenas, release_imported, r);
  st__smap_clear(&p.arenas);
  for (size_t i = 0; i < p.nversions; i++) free(p.versions[i].payload);
  free(p.versions);
  st__smap_clear(&p.latest);
  for (size_t i = 0; i < p.nbuffers; i++) free(p.buffers[i].payload);
  free(p.buffers);
  st__smap_clear(&p.buffer_names);
  ST_LOG_I("restart", "restored from generation %" PRIu64 ": %" PRIu64 " keys, %" PRIu64
           " versions, %" PRIu64 " bytes (no copy), %" PRIu64 " buffers; %" PRIu64
           " refused, %" PRIu64 " live keys torn", r->from_generation, r->keys, r->versions,
           r->bytes, r->buffers, r->refused, r->torn);
}

