/* src/engine: the key table (keys.h). Loop thread only. */
#include "engine/keys.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/fail.h"
#include "mem/arena.h"
#include "mem/ledger.h"
#include "mem/uidq.h"
#include "proto/proto.h"
#include "st/errors.h"

/* The table endpoints read (st__keys_serve); NULL: none. */
static st__keys_t *served;

/* See keys.h. */
void st__keys_init(st__keys_t *t, size_t max_keys, uint64_t max_bytes, unsigned max_versions) {
  memset(t, 0, sizeof *t);
  pthread_mutex_init(&t->lock, NULL);
  st__smap_init(&t->by_name);
  t->max_keys = max_keys;
  t->max_bytes = max_bytes;
  t->max_versions = max_versions ? max_versions : 1;
}

/* Charges (charge) or discharges the bytes of every arena of r on its
 * device. ST_OK, or the ledger's refusal (nothing stays charged). */
static int charge(const st__build_result_t *r, int on, char *err, size_t errlen) {
  for (size_t i = 0; i < r->narenas; i++) {
    int dev = st__arena_device(r->arenas[i]);
    uint64_t b = st__arena_bytes(r->arenas[i]);
    if (!on) {
      st__ledger_discharge(dev, b, 0);
      continue;
    }
    int rc = st__ledger_charge(dev, b, 0, err, errlen);
    if (rc != ST_OK) {
      for (size_t k = 0; k < i; k++)
        st__ledger_discharge(st__arena_device(r->arenas[k]), st__arena_bytes(r->arenas[k]), 0);
      return rc;
    }
  }
  return ST_OK;
}

/* What version result r of `bytes` charges to its uid's quotas. */
static void version_use(const st__build_result_t *r, uint64_t bytes,
                        uint64_t use[ST__UIDQ_NKINDS]) {
  memset(use, 0, ST__UIDQ_NKINDS * sizeof *use);
  use[ST__UIDQ_VERSIONS] = 1;
  for (size_t i = 0; i < r->narenas; i++) use[ST__UIDQ_FDS] += st__named_arena_fds(r->arenas[i]);
  use[ST__UIDQ_PINNED_BYTES] = bytes;
}

/* Charges (on) or gives back the quota uses `use` of uid, unchecked:
 * st__keys_put checked them first (quota_room). */
static void quota_apply(uid_t uid, const uint64_t use[ST__UIDQ_NKINDS], int on) {
  for (int q = 0; q < ST__UIDQ_NKINDS; q++) {
    if (!use[q]) continue;
    if (on) st__uidq_add(uid, (st__uidq_kind_t)q, use[q]);
    else st__uidq_uncharge(uid, (st__uidq_kind_t)q, use[q]);
  }
}

static void version_free(st__keys_t *t, st__key_t *k, st__key_version_t *v) {
  uint64_t use[ST__UIDQ_NKINDS];
  version_use(&v->result, v->bytes, use);
  quota_apply(k->uid, use, 0);
  if (v->charged) charge(&v->result, 0, NULL, 0);
  k->bytes -= v->bytes;
  t->bytes -= v->bytes;
  t->versions--;
  st__build_result_destroy(&v->result);
  free(v);
}

/* Drops version index i of k; the journal is told. */
static void drop_version(st__keys_t *t, st__key_t *k, size_t i) {
  if (t->journal) t->journal->version_dropped(t->journal_ud, k, k->versions[i]);
  version_free(t, k, k->versions[i]);
  memmove(&k->versions[i], &k->versions[i + 1], (k->nversions - i - 1) * sizeof *k->versions);
  k->nversions--;
}

/* Frees k and its versions (the journal is not told). */
static void key_free(st__keys_t *t, st__key_t *k) {
  while (k->nversions) version_free(t, k, k->versions[--k->nversions]);
  st__uidq_uncharge(k->uid, ST__UIDQ_KEYS, 1);
  free(k->versions);
  if (k->page_arena) {
    /* Readers' mappings keep the page: they see DELETED and wake. */
    st__key_page_flag(k->page, ST__KEY_DELETED);
    st__arena_unref(k->page_arena);
    t->live--;
    if (k->live_prev) k->live_prev->live_next = k->live_next;
    else t->live_keys = k->live_next;
    if (k->live_next) k->live_next->live_prev = k->live_prev;
  }
  free(k);
}

/* Removes k from the table and frees it; the journal is told when
 * `told` (not for a key a failed put made and never showed). */
static void key_remove(st__keys_t *t, st__key_t *k, int told) {
  if (told && t->journal) t->journal->key_removed(t->journal_ud, k);
  st__smap_del(&t->by_name, k->name, strlen(k->name));
  t->count--;
  key_free(t, k);
}

static void free_each(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  key_free(ud, value);
}

/* See keys.h. */
void st__keys_free(st__keys_t *t) {
  if (served == t) served = NULL;
  pthread_mutex_lock(&t->lock);
  st__smap_each(&t->by_name, free_each, t);
  st__smap_clear(&t->by_name);
  t->count = 0;
  pthread_mutex_unlock(&t->lock);
  pthread_mutex_destroy(&t->lock);
}

/* See keys.h. */
void st__keys_serve(st__keys_t *t) {
  served = t;
}

/* See keys.h. */
int st__keys_name_ok(const char *name, size_t len, char *err, size_t errlen) {
  if (len == 0 || len > ST__KEY_NAME_MAX)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "a key name is 1 to %d characters (this one has %zu)", ST__KEY_NAME_MAX, len);
  for (size_t i = 0; i < len; i++) {
    char ch = name[i], shown[300];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
             ch == '.' || ch == '_' || ch == '-' || ch == '/' || ch == ':';
    if (!ok)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "key name '%s': character %zu is not one of A-Z a-z 0-9 . _ - / :",
                      st__wire_shown(name, len, shown, sizeof shown), i + 1);
  }
  return ST_OK;
}

/* NOT_FOUND for key (name, len). */
static int no_key(const char *name, size_t len, char *err, size_t errlen) {
  return st__fail(ST_ERR_NOT_FOUND, err, errlen,
                  "no key '%.*s' (never put, deleted, or evicted under the memory budget)",
                  (int)len, name);
}

/* The key of (name, len) that who wants to `use` (named.h), or an error:
 * NOT_FOUND (absent, or not visible to who: the same words), AUTH. */
static int lookup(st__keys_t *t, const char *name, size_t len, const st__who_t *who,
                  st__use_t use, int force, st__key_t **out, char *err, size_t errlen) {
  int rc = st__keys_name_ok(name, len, err, errlen);
  if (rc != ST_OK) return rc;
  st__key_t *k = st__smap_get(&t->by_name, name, len);
  rc = k ? st__access(k->uid, &k->readers, who, use, force, "key", k->name, err, errlen)
         : ST_ERR_NOT_FOUND;
  if (rc == ST_ERR_NOT_FOUND) return no_key(name, len, err, errlen);
  if (rc != ST_OK) return rc;
  *out = k;
  return ST_OK;
}

/* See keys.h. */
int st__keys_visible(const st__key_t *k, const st__who_t *who) {
  return st__access(k->uid, &k->readers, who, ST__USE_READ, 0, "key", k->name, NULL, 0) == ST_OK;
}

/* ST_OK when uid's quotas take `add` while `leave` goes, else LIMIT
 * naming the first quota it would pass (key name first in err). */
static int quota_room(const st__key_put_t *p, const uint64_t add[ST__UIDQ_NKINDS],
                      const uint64_t leave[ST__UIDQ_NKINDS], char *err, size_t errlen) {
  for (int q = 0; q < ST__UIDQ_NKINDS; q++) {
    if (add[q] <= leave[q]) continue;
    char why[300];
    if (st__uidq_room(p->uid, (st__uidq_kind_t)q, add[q] - leave[q], why, sizeof why) != ST_OK)
      return st__fail(ST_ERR_LIMIT, err, errlen, "key '%.*s': %s", (int)p->len, p->name, why);
  }
  return ST_OK;
}

/* The first CUDA ordinal among r's arenas, else -1. */
static int first_device(const st__build_result_t *r) {
  for (size_t i = 0; i < r->narenas; i++) {
    int d = st__arena_device(r->arenas[i]);
    if (d >= 0) return d;
  }
  return -1;
}

/* Whether a put of `bytes` into key k (NULL: a new key) fits the table's
 * limits, counting the version the put retires. */
static int fits(st__keys_t *t, const st__key_put_t *p, const st__key_t *k, uint64_t bytes,
                char *err, size_t errlen) {
  if (!k && t->count >= t->max_keys)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "key '%.*s': the server keeps at most %zu keys (keys.max_keys)", (int)p->len,
                    p->name, t->max_keys);
  uint64_t leaving = 0;
  if (k && k->nversions >= t->max_versions) leaving = k->versions[0]->bytes;
  if (t->max_bytes && t->bytes - leaving + bytes > t->max_bytes)
    return st__fail(ST_ERR_LIMIT, err, errlen,
                    "key '%.*s': %llu more bytes do not fit: keys hold %llu of at most %llu "
                    "(keys.max_bytes)",
                    (int)p->len, p->name, (unsigned long long)bytes,
                    (unsigned long long)(t->bytes - leaving), (unsigned long long)t->max_bytes);
  return ST_OK;
}

/* A new empty key for p, live with page arena `page` (taken on success)
 * when not NULL; NULL when out of memory. */
static st__key_t *key_new(st__keys_t *t, const st__key_put_t *p, st__arena_t *page) {
  st__key_t *k = calloc(1, sizeof *k);
  if (!k) return NULL;
  memcpy(k->name, p->name, p->len);
  k->uid = p->uid;
  if (p->readers) k->readers = *p->readers;
  if (st__smap_put(&t->by_name, k->name, p->len, k) != ST_OK) {
    free(k);
    return NULL;
  }
  t->count++;
  st__uidq_add(k->uid, ST__UIDQ_KEYS, 1);
  if (page) {
    k->live = 1;
    k->page_arena = page;
    k->page = st__arena_base(page);
    if (!p->page) st__key_page_init(k->page, p->conn);
    else st__key_page_fence_clear(k->page);   /* a restore: no lend of the old server holds it */
    t->live++;
    k->live_next = t->live_keys;
    if (t->live_keys) t->live_keys->live_prev = k;
    t->live_keys = k;
  }
  return k;
}

/* Whether a put of p may go into k (NULL: a new key), as far as being
 * live goes; makes the page of a new live key in *page. */
static int live_ok(const st__key_put_t *p, const st__key_t *k, st__arena_t **page, char *err,
                   size_t errlen) {
  *page = NULL;
  if (p->live && p->policy == ST__KEY_EVICTABLE)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "key '%.*s': a live key is pinned (its readers keep pointers into it); "
                    "put it without policy 'evictable'",
                    (int)p->len, p->name);
  if (k && k->live != p->live)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "key '%s' is %slive; a put %s live cannot change that (delete it first)",
                    k->name, k->live ? "" : "not ", p->live ? "as" : "not");
  if (!p->live || k) return ST_OK;
  if (p->page) {   /* a restore: the page as it was */
    st__arena_ref(p->page);
    *page = p->page;
    return ST_OK;
  }
  char why[300];
  int rc = st__arena_new_cpu(ST__KEY_PAGE_BYTES, page, why, sizeof why);
  if (rc != ST_OK)
    return st__fail(rc, err, errlen, "key '%.*s': its control page: %s", (int)p->len, p->name,
                    why);
  return ST_OK;
}

/* See keys.h. Loop thread. */
int st__keys_put(st__keys_t *t, const st__key_put_t *p, st__build_result_t *result,
                 uint64_t *version, char *err, size_t errlen) {
  int rc = st__keys_name_ok(p->name, p->len, err, errlen);
  if (rc != ST_OK) return rc;
  st__key_t *k = st__smap_get(&t->by_name, p->name, p->len);
  if (k && k->uid != p->uid)
    return st__fail(ST_ERR_AUTH, err, errlen, "key '%s' belongs to uid %u; uid %u may not put it",
                    k->name, (unsigned)k->uid, (unsigned)p->uid);
  uint64_t bytes = 0;
  for (size_t i = 0; i < result->narenas; i++) bytes += st__arena_bytes(result->arenas[i]);
  rc = fits(t, p, k, bytes, err, errlen);
  uint64_t add[ST__UIDQ_NKINDS], leave[ST__UIDQ_NKINDS] = {0};
  version_use(result, bytes, add);
  add[ST__UIDQ_KEYS] = !k;
  if (k && k->nversions >= t->max_versions)
    version_use(&k->versions[0]->result, k->versions[0]->bytes, leave);
  if (rc == ST_OK) rc = quota_room(p, add, leave, err, errlen);
  st__arena_t *page = NULL;
  if (rc == ST_OK) rc = live_ok(p, k, &page, err, errlen);
  if (rc != ST_OK) return rc;
  st__key_version_t *v = calloc(1, sizeof *v);
  if (!v) {
    st__arena_unref(page);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  /* The charge may evict evictable versions, this key's too: look the
   * key up again afterwards. */
  char why[400];
  rc = p->precharged ? ST_OK : charge(result, 1, why, sizeof why);
  if (rc != ST_OK) {
    free(v);
    st__arena_unref(page);
    return st__fail(rc, err, errlen, "key '%.*s': %s", (int)p->len, p->name, why);
  }
  pthread_mutex_lock(&t->lock);
  k = st__smap_get(&t->by_name, p->name, p->len);
  st__key_version_t **grown = NULL;
  if (!k && (k = key_new(t, p, page)) != NULL) page = NULL;
  if (k) grown = realloc(k->versions, (k->nversions + 1) * sizeof *k->versions);
  rc = grown ? ST_OK : st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  if (grown) k->versions = grown;
  uint64_t number = k ? k->last_version + 1 : 0;
  if (rc == ST_OK && p->version) {
    number = p->version;
    if (number <= k->last_version)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "key '%s': version %llu is not above its last one, %llu", k->name,
                    (unsigned long long)number, (unsigned long long)k->last_version);
  }
  double created = p->created_at > 0 ? p->created_at : st__now_unix();
  if (rc == ST_OK && t->journal && !p->version) {
    const st__key_change_t c = {.name = k->name, .uid = k->uid,
                                .readers = p->readers ? p->readers : &k->readers,
                                .policy = p->policy, .readonly = p->readonly, .live = p->live,
                                .version = number, .created_at = created, .result = result,
                                .page = k->page_arena, .origin = p->origin};
    rc = t->journal->version_added(t->journal_ud, &c, err, errlen);
  }
  if (rc != ST_OK) {
    if (!p->precharged) charge(result, 0, NULL, 0);
    free(v);
    st__arena_unref(page);
    if (k && k->nversions == 0) key_remove(t, k, 0);
    pthread_mutex_unlock(&t->lock);
    return rc;
  }
  v->result = *result;
  st__build_result_init(result);
  v->bytes = bytes;
  v->device = first_device(&v->result);
  v->created_at = created;
  v->last_used = st__now_mono();
  v->version = k->last_version = number;
  v->charged = !p->precharged;
  if (p->origin) v->has_origin = 1, v->origin = *p->origin;
  k->versions[k->nversions++] = v;
  t->versions++;
  add[ST__UIDQ_KEYS] = 0;       /* key_new charged it */
  quota_apply(k->uid, add, 1);
  if (p->readers) k->readers = *p->readers;
  k->bytes += bytes;
  k->policy = p->policy;
  k->readonly = p->readonly;
  k->owner_conn = p->conn;
  t->bytes += bytes;
  t->puts++;
  while (k->nversions > t->max_versions) drop_version(t, k, 0);
  pthread_mutex_unlock(&t->lock);
  *version = v->version;
  return ST_OK;
}

/* See keys.h. */
st__key_change_t st__keys_change_of(const st__key_t *k, const st__key_version_t *v) {
  return (st__key_change_t){.name = k->name, .uid = k->uid, .readers = &k->readers,
                            .policy = k->policy, .readonly = k->readonly, .live = k->live,
                            .version = v->version, .created_at = v->created_at,
                            .result = &v->result, .page = k->page_arena,
                            .origin = v->has_origin ? &v->origin : NULL};
}

/* Version `version` of k (0: the latest) in *out. A live key has one
 * version, its current one (its page's: st__keys_version_of): 0 or that
 * number finds it, any other is NOT_FOUND. Caller holds the table's lock,
 * or is the loop thread. */
static int find_version(const st__key_t *k, uint64_t version, st__key_version_t **out, char *err,
                        size_t errlen) {
  *out = NULL;
  st__key_version_t *last = k->versions[k->nversions - 1];
  if (k->live) {
    uint64_t now = st__keys_version_of(k, last);
    if (version == 0 || version == now) {
      *out = last;
      return ST_OK;
    }
    return st__fail(ST_ERR_NOT_FOUND, err, errlen,
                    "live key '%s' has only its current version %llu (asked: %llu; it is "
                    "updated in place and keeps no other: leave the version out for the latest)",
                    k->name, (unsigned long long)now, (unsigned long long)version);
  }
  for (size_t i = 0; i < k->nversions; i++)
    if (version == 0 ? i == k->nversions - 1 : k->versions[i]->version == version) {
      *out = k->versions[i];
      return ST_OK;
    }
  return st__fail(ST_ERR_NOT_FOUND, err, errlen,
                  "key '%s' has no version %llu (kept: %llu..%llu; older ones go after "
                  "keys.max_versions newer puts, or under the memory budget)",
                  k->name, (unsigned long long)version,
                  (unsigned long long)k->versions[0]->version,
                  (unsigned long long)k->last_version);
}

/* See keys.h. Loop thread. */
int st__keys_get(st__keys_t *t, const char *name, size_t len, const st__who_t *who,
                 uint64_t version, st__key_t **key, st__key_version_t **out, char *err,
                 size_t errlen) {
  st__key_t *k = NULL;
  int rc = lookup(t, name, len, who, ST__USE_READ, 0, &k, err, errlen);
  if (rc != ST_OK) return rc;
  st__key_version_t *v = NULL;
  rc = find_version(k, version, &v, err, errlen);
  if (rc != ST_OK) return rc;
  pthread_mutex_lock(&t->lock);
  v->last_used = st__now_mono();
  pthread_mutex_unlock(&t->lock);
  *key = k;
  *out = v;
  return ST_OK;
}

/* See keys.h. Loop thread. */
int st__keys_delete(st__keys_t *t, const char *name, size_t len, const st__who_t *who,
                    int force, char *err, size_t errlen) {
  st__key_t *k = NULL;
  int rc = lookup(t, name, len, who, ST__USE_REMOVE, force, &k, err, errlen);
  if (rc != ST_OK) return rc;
  pthread_mutex_lock(&t->lock);
  key_remove(t, k, 1);
  pthread_mutex_unlock(&t->lock);
  return ST_OK;
}

typedef struct collect {
  const char *prefix;
  size_t plen;
  st__key_t **list;
  size_t n;
} collect_t;

static void collect_one(const char *key, size_t len, void *value, void *ud) {
  collect_t *c = ud;
  if (c->list && len >= c->plen && memcmp(key, c->prefix, c->plen) == 0) c->list[c->n++] = value;
}

static int by_name(const void *a, const void *b) {
  return strcmp((*(st__key_t *const *)a)->name, (*(st__key_t *const *)b)->name);
}

/* See keys.h. Loop thread. */
st__key_t **st__keys_list(st__keys_t *t, const char *prefix, size_t plen, size_t *n) {
  collect_t c = {.prefix = prefix ? prefix : "", .plen = prefix ? plen : 0};
  *n = 0;
  if (t->count == 0) return NULL;
  c.list = malloc(t->count * sizeof *c.list);
  st__smap_each(&t->by_name, collect_one, &c);
  if (c.n == 0) {
    free(c.list);
    return NULL;
  }
  qsort(c.list, c.n, sizeof *c.list, by_name);
  *n = c.n;
  return c.list;
}

/* Whether version v holds bytes on `device` (fds: any memfd arena). */
static int holds(const st__key_version_t *v, int device, unsigned fds) {
  for (size_t i = 0; i < v->result.narenas; i++) {
    const st__arena_t *a = v->result.arenas[i];
    if (fds ? st__arena_device(a) < 0 : st__arena_device(a) == device) return 1;
  }
  return 0;
}

typedef struct oldest {
  int device;
  unsigned fds;
  st__key_t *key;
  size_t index;
  double used;
} oldest_t;

static void find_oldest(const char *name, size_t len, void *value, void *ud) {
  (void)name;
  (void)len;
  oldest_t *o = ud;
  st__key_t *k = value;
  if (k->policy != ST__KEY_EVICTABLE) return;
  for (size_t i = 0; i < k->nversions; i++)
    if (holds(k->versions[i], o->device, o->fds) && (!o->key || k->versions[i]->last_used < o->used)) {
      o->key = k;
      o->index = i;
      o->used = k->versions[i]->last_used;
    }
}

/* See keys.h. Loop thread. */
size_t st__keys_reclaim(st__keys_t *t, int device, uint64_t bytes, unsigned fds) {
  size_t n = 0;
  while (!st__ledger_fits(device, bytes, fds)) {
    oldest_t o = {.device = device, .fds = fds};
    st__smap_each(&t->by_name, find_oldest, &o);
    if (!o.key) break;
    pthread_mutex_lock(&t->lock);
    drop_version(t, o.key, o.index);
    if (o.key->nversions == 0) key_remove(t, o.key, 1);
    pthread_mutex_unlock(&t->lock);
    n++;
    t->evictions++;
  }
  return n;
}

/* See keys.h. Any thread. */
int st__keys_read(const char *name, size_t len, uint64_t version, st__build_result_t *out,
                  uint64_t *got, char *err, size_t errlen) {
  st__build_result_init(out);
  st__keys_t *t = served;
  if (!t) return st__fail(ST_ERR_NOT_FOUND, err, errlen, "no key table in this process");
  int rc = st__keys_name_ok(name, len, err, errlen);
  if (rc != ST_OK) return rc;
  pthread_mutex_lock(&t->lock);
  st__key_t *k = st__smap_get(&t->by_name, name, len);
  st__key_version_t *v = NULL;
  rc = k ? find_version(k, version, &v, err, errlen) : no_key(name, len, err, errlen);
  if (rc != ST_OK) {
    pthread_mutex_unlock(&t->lock);
    return rc;
  }
  if (k->live && st__keys_torn(k)) {
    pthread_mutex_unlock(&t->lock);
    return st__fail(ST_ERR_STALE_HANDLE, err, errlen,
                    "live key '%s' is torn: its publisher left in the middle of an update "
                    "(readable again after the next complete update: a put by its uid)",
                    k->name);
  }
  v->last_used = st__now_mono();
  const st__build_result_t *r = &v->result;
  out->arenas = r->narenas ? malloc(r->narenas * sizeof *out->arenas) : NULL;
  if ((r->narenas && !out->arenas) || msgpack_sbuffer_write(&out->value, r->value.data,
                                                            r->value.size) != 0) {
    pthread_mutex_unlock(&t->lock);
    st__build_result_destroy(out);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  for (size_t i = 0; i < r->narenas; i++) {
    st__arena_ref(r->arenas[i]);
    out->arenas[i] = r->arenas[i];
  }
  out->narenas = r->narenas;
  out->bytes = r->bytes;
  if (got) *got = st__keys_version_of(k, v);
  pthread_mutex_unlock(&t->lock);
  return ST_OK;
}
