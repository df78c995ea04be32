/* src/engine: live keys of the key table (keys.h; docs/views.md,
 * section 3): who publishes them, and what the server writes into their
 * control pages (shm/key_page.h). Loop thread, except the reads and
 * checks that say otherwise. */
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/keys.h"
#include "engine/smap.h"
#include "mem/arena.h"
#include "proto/proto.h"
#include "st/errors.h"
#include "st/wire.h"
#include "common/geometry.h"

/* See keys.h. Any thread: a read of the page. */
int st__keys_torn(const st__key_t *k) {
  return k->page && (atomic_load(&k->page->flags) & ST__KEY_TORN) != 0;
}

/* See keys.h. Any thread: a read of the page. */
uint64_t st__keys_version_of(const st__key_t *k, const st__key_version_t *v) {
  return k->page ? atomic_load(&k->page->version) : v->version;
}

/* Whether o is a tensor descriptor (parsed into *d when it is). -1: it
 * says it is one and does not parse (err says why). */
static int tensor_of(const msgpack_object *o, st__tensor_desc_t *d, char *err, size_t errlen) {
  if (o->type != MSGPACK_OBJECT_EXT || o->via.ext.type != ST_EXT_TENSOR) return 0;
  return st__parse_tensor(o, d, err, errlen) == ST_OK ? 1 : -1;
}

/* Counts the tensors among the entries of map m (a map). */
static size_t count_tensors(const msgpack_object *m) {
  size_t n = 0;
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    const msgpack_object *o = &m->via.map.ptr[i].val;
    n += o->type == MSGPACK_OBJECT_EXT && o->via.ext.type == ST_EXT_TENSOR;
  }
  return n;
}

/* Whether tensor `name` of a take-over's value (given) may be copied into
 * the key's (mine): same dtype and shape, both contiguous. */
static int same_kind(const char *key, const char *name, size_t len, const st__tensor_desc_t *mine,
                     const st__tensor_desc_t *given, char *err, size_t errlen) {
  int same = mine->dtype == given->dtype && mine->ndim == given->ndim;
  for (int i = 0; same && i < mine->ndim; i++) same = mine->shape[i] == given->shape[i];
  if (!same)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "live key '%s': tensor '%.*s' is %s of %d dims (first %lld); the put gives "
                    "%s of %d dims (first %lld)",
                    key, (int)len, name, st_dtype_name(mine->dtype), mine->ndim,
                    (long long)(mine->ndim ? mine->shape[0] : 0), st_dtype_name(given->dtype),
                    given->ndim, (long long)(given->ndim ? given->shape[0] : 0));
  if (!st__geom_contiguous_of(mine->ndim, mine->shape, mine->strides) ||
      !st__geom_contiguous_of(given->ndim, given->shape, given->strides))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "live key '%s': tensor '%.*s': a put into a live key copies contiguous "
                    "tensors only", key, (int)len, name);
  return ST_OK;
}

/* The entry `name` of map m: entry i when it has that name (a put gives
 * its tensors in the key's order), else from *index (the map's entries by
 * name, built at the first miss; *built says it was). Expected O(1), so a take-over's check
 * is linear in its tensors. NULL: no such entry, or out of memory
 * (*oom set). */
static const msgpack_object *entry_named(const msgpack_object *m, uint32_t i, const char *name,
                                         size_t len, st__smap_t *index, int *built,
                                         int *oom) {
  const msgpack_object_kv *kv = m->via.map.ptr;
  if (i < m->via.map.size && kv[i].key.type == MSGPACK_OBJECT_STR &&
      kv[i].key.via.str.size == len && memcmp(kv[i].key.via.str.ptr, name, len) == 0)
    return &kv[i].val;
  if (!*built && (*built = 1))
    for (uint32_t j = 0; j < m->via.map.size; j++)
      if (kv[j].key.type == MSGPACK_OBJECT_STR &&
          !st__smap_get(index, kv[j].key.via.str.ptr, kv[j].key.via.str.size) &&
          st__smap_put(index, kv[j].key.via.str.ptr, kv[j].key.via.str.size,
                       (void *)&kv[j].val) != ST_OK) {
        *oom = 1;
        return NULL;
      }
  return st__smap_get(index, name, len);
}

/* Whether `value` (a take-over's) matches the value of live key `key`
 * (its packed bytes: data, size): a map whose tensors have the names of
 * the key's tensors, each with its dtype and shape, contiguous. ST_OK or
 * INVALID_ARGUMENT naming the first difference. Linear in the tensors
 * (entry_named). Any thread. */
static int same_tensors(const char *key, const char *data, size_t size,
                        const msgpack_object *value, char *err, size_t errlen) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  st__smap_t index;
  st__smap_init(&index);
  size_t off = 0;
  int rc = ST_OK, oom = 0, built = 0;
  if (msgpack_unpack_next(&u, data, size, &off) != MSGPACK_UNPACK_SUCCESS ||
      u.data.type != MSGPACK_OBJECT_MAP || !value || value->type != MSGPACK_OBJECT_MAP)
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                  "live key '%s': a put into it gives a map of its tensors by name", key);
  for (uint32_t i = 0; rc == ST_OK && i < value->via.map.size; i++) {
    const msgpack_object_kv *kv = &value->via.map.ptr[i];
    st__tensor_desc_t given, mine;
    int is = tensor_of(&kv->val, &given, err, errlen);
    if (is <= 0 || kv->key.type != MSGPACK_OBJECT_STR) {
      if (is < 0) rc = ST_ERR_INVALID_ARGUMENT;
      continue;
    }
    const char *name = kv->key.via.str.ptr;
    size_t len = kv->key.via.str.size;
    const msgpack_object *o = entry_named(&u.data, i, name, len, &index, &built, &oom);
    if (oom)
      rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    else if (!o || tensor_of(o, &mine, err, errlen) != 1)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "live key '%s' has no tensor named '%.*s'",
                    key, (int)len, name);
    else
      rc = same_kind(key, name, len, &mine, &given, err, errlen);
  }
  if (rc == ST_OK && count_tensors(value) != count_tensors(&u.data))
    rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                  "live key '%s' has %zu tensors; the put gives %zu (a put into a live key "
                  "gives every tensor of it)",
                  key, count_tensors(&u.data), count_tensors(value));
  st__smap_clear(&index);
  msgpack_unpacked_destroy(&u);
  return rc;
}

/* The value bytes of live key k's one version. */
static const msgpack_sbuffer *value_of(const st__key_t *k) {
  return &k->versions[k->nversions - 1]->result.value;
}

/* See keys.h. Loop thread. */
int st__keys_live_page_is(st__keys_t *t, const char *name, const st__arena_t *page) {
  const st__key_t *k = st__smap_get(&t->by_name, name, strlen(name));
  return k && k->live && k->page_arena == page;
}

/* See keys.h. Any thread. */
int st__keys_take_check(st__keys_t *t, const char *name, size_t len, const st__arena_t *page,
                        const msgpack_object *value, char *err, size_t errlen) {
  /* A copy of the key's value under the lock (a memcpy), the check
   * without it: the loop's changes never wait for the check. */
  char key[ST__KEY_NAME_MAX + 1];
  char *data = NULL;
  size_t size = 0;
  int found = 0;
  pthread_mutex_lock(&t->lock);
  const st__key_t *k = st__smap_get(&t->by_name, name, len);
  if (k && k->live && k->page_arena == page) {
    const msgpack_sbuffer *v = value_of(k);
    found = 1;
    size = v->size;
    memcpy(key, k->name, sizeof key);
    if ((data = malloc(size ? size : 1)) != NULL) memcpy(data, v->data, size);
  }
  pthread_mutex_unlock(&t->lock);
  if (!found)
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "live key '%.*s' changed while its put was "
                    "checked", (int)len, name);
  if (!data) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  int rc = same_tensors(key, data, size, value, err, errlen);
  free(data);
  return rc;
}

/* See keys.h. Loop thread. */
int st__keys_take(st__keys_t *t, const st__key_put_t *p, const msgpack_object *value,
                  st__key_t **key, char *err, size_t errlen) {
  *key = NULL;
  st__key_t *k = st__smap_get(&t->by_name, p->name, p->len);
  if (!k || !k->live)
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "no live key '%.*s'", (int)p->len, p->name);
  if (k->uid != p->uid)
    return st__fail(ST_ERR_AUTH, err, errlen, "key '%s' belongs to uid %u; uid %u may not put it",
                    k->name, (unsigned)k->uid, (unsigned)p->uid);
  if (value) {
    const msgpack_sbuffer *v = value_of(k);
    int rc = same_tensors(k->name, v->data, v->size, value, err, errlen);
    if (rc != ST_OK) return rc;
  }
  if (k->owner_conn != p->conn)
    ST_LOG_I("keys", "live key '%s': connection %llu takes over from %llu", k->name,
             (unsigned long long)p->conn, (unsigned long long)k->owner_conn);
  k->owner_conn = p->conn;
  atomic_store(&k->page->owner, p->conn);
  *key = k;
  return ST_OK;
}

/* See keys.h. Any thread. */
int st__keys_page_valid(const st__arena_t *page) {
  const st__key_page_t *kp = st__arena_base(page);
  return st__arena_device(page) == -1 && st__arena_bytes(page) >= ST__KEY_PAGE_BYTES && kp &&
         kp->magic == ST__KEY_PAGE_MAGIC && kp->layout == ST__KEY_PAGE_LAYOUT;
}

/* See keys.h. Loop thread. */
void st__keys_live_orphaned(st__key_t *k) {
  uint64_t conn = atomic_load(&k->page->owner);
  k->owner_conn = 0;
  atomic_store(&k->page->owner, 0);
  if (!st__key_page_updating(k->page)) return;
  ST_LOG_W("keys", "live key '%s' is torn: its publisher (connection %llu) left in the middle "
           "of an update", k->name, (unsigned long long)conn);
  st__key_page_flag(k->page, ST__KEY_TORN);
}

/* See keys.h. Walks the live keys only. Loop thread. */
uint64_t st__keys_conn_live(st__keys_t *t, uint64_t conn) {
  uint64_t n = 0;
  for (const st__key_t *k = t->live_keys; k; k = k->live_next) n += k->owner_conn == conn;
  return n;
}

/* See keys.h. Loop thread. */
void st__keys_conn_closed(st__keys_t *t, uint64_t conn) {
  for (st__key_t *k = t->live_keys; k; k = k->live_next)
    if (k->owner_conn == conn) st__keys_live_orphaned(k);
}
