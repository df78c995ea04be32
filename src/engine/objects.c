/* src/engine: objects, cache, leases, budget (objects.h). Loop thread. */
#include "engine/objects.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/fail.h"
#include "engine/job.h"
#include "mem/ledger.h"
#include "st/errors.h"

/* Empty registry; ids start at 1. */
void st__objects_init(st__objects_t *r) {
  memset(r, 0, sizeof *r);
  st__smap_init(&r->by_id);
  st__smap_init(&r->cache);
  r->next_id = 1;
}

static st__budget_t *budget_of(st__objects_t *r, const char *device, int create) {
  for (int i = 0; i < r->nbudgets; i++)
    if (strcmp(r->budgets[i].device, device) == 0) return &r->budgets[i];
  if (!create || r->nbudgets == ST_OBJ_MAX_BUDGETS) return NULL;
  st__budget_t *b = &r->budgets[r->nbudgets++];
  memset(b, 0, sizeof *b);
  snprintf(b->device, sizeof b->device, "%s", device);
  char *end = NULL;
  b->ordinal = strcmp(device, "cpu") == 0 ? -1 : -2;
  if (strncmp(device, "cuda:", 5) == 0) {
    long n = strtol(device + 5, &end, 10);
    if (end != device + 5 && !*end && n >= 0 && n < 4096) b->ordinal = (int)n;
  }
  return b;
}

/* Budget of a device (0 = none), in the ledger. ST_OK or ST_ERR_LIMIT. */
int st__objects_set_budget(st__objects_t *r, const char *device, uint64_t bytes) {
  st__budget_t *b = budget_of(r, device, 1);
  if (!b || b->ordinal < -1) return ST_ERR_LIMIT;
  st__ledger_set_budget(b->ordinal, bytes);
  return ST_OK;
}

/* Monotonic nanoseconds: the LRU order's clock. */
static uint64_t mono_ns(void) {
  return (uint64_t)(st__now_mono() * 1e9);
}

static int evictable(const st__object_t *o) {
  return o->cached && o->refcount == 0 && o->holds == 0;
}

/* Where o's charges count now (objects.h: ST__OBJ_CACHED ...). */
static int part_of(const st__object_t *o) {
  return evictable(o) ? ST__OBJ_CACHED : o->refcount ? ST__OBJ_LEASED : ST__OBJ_TASK;
}

/* Adds o's charges to (sign 1) or takes them from (-1) part `part` of
 * their budgets. */
static void count_in(st__objects_t *r, const st__object_t *o, int part, int sign) {
  for (int i = 0; i < o->ncharges; i++) {
    uint64_t *b = &r->budgets[o->charges[i].budget].part[part];
    if (sign > 0) *b += o->charges[i].bytes;
    else *b -= o->charges[i].bytes;
  }
}

/* o's cache entry, leases or holds changed: its charges move to the part
 * they count in now. Every such change calls it, so that info reads the
 * parts without walking the objects. */
static void recount(st__objects_t *r, st__object_t *o) {
  int now = part_of(o);
  if (!o->counted || now == o->counted) return;
  count_in(r, o, o->counted, -1);
  count_in(r, o, now, 1);
  o->counted = now;
}

static void lru_unlink(st__objects_t *r, st__object_t *o) {
  if (o->lru_prev) o->lru_prev->lru_next = o->lru_next;
  else if (r->lru_head == o) r->lru_head = o->lru_next;
  if (o->lru_next) o->lru_next->lru_prev = o->lru_prev;
  else if (r->lru_tail == o) r->lru_tail = o->lru_prev;
  o->lru_prev = o->lru_next = NULL;
}

static void lru_append(st__objects_t *r, st__object_t *o) {
  o->lru_prev = r->lru_tail;
  o->lru_next = NULL;
  if (r->lru_tail) r->lru_tail->lru_next = o;
  else r->lru_head = o;
  r->lru_tail = o;
}

/* Removes o from the cache index and the LRU list (not destroyed). */
static void drop_cache_entry(st__objects_t *r, st__object_t *o) {
  if (!o->cached) return;
  if (st__smap_get(&r->cache, o->slot, o->slot_len) == o)
    st__smap_del(&r->cache, o->slot, o->slot_len);
  lru_unlink(r, o);
  o->cached = 0;
  recount(r, o);
}

static void destroy(st__objects_t *r, st__object_t *o) {
  if (o->counted) count_in(r, o, o->counted, -1);
  o->counted = 0;
  r->bytes -= o->bytes;
  drop_cache_entry(r, o);
  st__smap_del(&r->by_id, ST__ID_KEY(&o->id));
  if (o->all_prev) o->all_prev->all_next = o->all_next;
  else r->all_head = o->all_next;
  if (o->all_next) o->all_next->all_prev = o->all_prev;
  else r->all_tail = o->all_prev;
  for (int i = 0; i < o->ncharges; i++) {
    st__budget_t *b = &r->budgets[o->charges[i].budget];
    b->bytes -= o->charges[i].bytes;
    b->objects--;
  }
  r->leases -= o->refcount;
  r->count--;
  r->destroyed++;
  st__build_result_destroy(&o->result);
  free(o->endpoint);
  free(o->cache_key);
  free(o->slot);
  free(o->leases);
  free(o);
}

/* Destroys every object. */
void st__objects_free(st__objects_t *r) {
  while (r->all_head) destroy(r, r->all_head);
  st__smap_clear(&r->by_id);
  st__smap_clear(&r->cache);
}

/* Destroys o if nothing holds it; 1 when it did. */
int st__objects_collect(st__objects_t *r, st__object_t *o) {
  if (o->cached || o->refcount || o->holds) return 0;
  destroy(r, o);
  return 1;
}

/* What an object of `res` is charged, per device: what the ledger holds
 * for its arenas (their allocated bytes; 0 for a tensor argument). A
 * result without arenas counts 0 bytes on the cpu. Fills charges (devices
 * listed as needed), *fds, *size (the object's `bytes`: a CPU arena's
 * usable size, a CUDA arena's allocated size) and `device` ("cpu" or the
 * first CUDA device). ST_OK or ST_ERR_OUT_OF_MEMORY (too many devices). */
static int charges_of(st__objects_t *r, const st__build_result_t *res, st__charge_t *charges,
                      int *ncharges, unsigned *fds, uint64_t *size,
                      char device[ST_OBJ_DEVICE_LEN], char *err, size_t errlen) {
  *ncharges = 0;
  *fds = 0;
  *size = 0;
  snprintf(device, ST_OBJ_DEVICE_LEN, "cpu");
  int have_cuda = 0;
  for (size_t i = 0; i <= res->narenas; i++) {
    char name[ST_OBJ_DEVICE_LEN];
    uint64_t bytes = 0;
    if (i == res->narenas) {
      if (*ncharges) break;
      snprintf(name, sizeof name, "cpu");
    } else {
      int dev = st__arena_device(res->arenas[i]);
      unsigned n = 0;
      st__arena_charge(res->arenas[i], NULL, &bytes, &n);
      *fds += n;
      if (dev < 0) {
        snprintf(name, sizeof name, "cpu");
        *size += st__arena_bytes(res->arenas[i]);
      } else {
        st__arena_desc_t d;
        memset(&d, 0, sizeof d);
        st__arena_describe(res->arenas[i], &d);
        *size += d.bytes;
        snprintf(name, sizeof name, "cuda:%d", dev);
        if (!have_cuda) snprintf(device, ST_OBJ_DEVICE_LEN, "%s", name);
        have_cuda = 1;
      }
    }
    st__budget_t *b = budget_of(r, name, 1);
    if (!b) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "too many devices");
    int bi = (int)(b - r->budgets), k = 0;
    while (k < *ncharges && charges[k].budget != bi) k++;
    if (k == *ncharges) {
      charges[k].budget = bi;
      charges[k].bytes = 0;
      (*ncharges)++;
    }
    charges[k].bytes += bytes;
  }
  return ST_OK;
}

/* Bytes o charges to budget bi. */
static uint64_t charge_on(const st__object_t *o, int bi) {
  for (int i = 0; i < o->ncharges; i++)
    if (o->charges[i].budget == bi) return o->charges[i].bytes;
  return 0;
}

/* "endpoint NUL where NUL key" (where "" when NULL). */
static char *make_slot(const char *endpoint, const char *where, const char *key, size_t key_len,
                       size_t *len) {
  if (!where) where = "";
  size_t el = strlen(endpoint), wl = strlen(where);
  char *s = malloc(el + 1 + wl + 1 + key_len + 1);
  if (!s) return NULL;
  memcpy(s, endpoint, el + 1);
  memcpy(s + el + 1, where, wl + 1);
  memcpy(s + el + 1 + wl + 1, key, key_len);
  s[el + wl + 2 + key_len] = '\0';
  *len = el + wl + 2 + key_len;
  return s;
}

/* See objects.h. Any thread. */
void st__objects_hit(st__object_t *o) {
  __atomic_store_n(&o->hit_ns, mono_ns(), __ATOMIC_RELAXED);
}

/* See objects.h. */
double st__objects_last_use(const st__object_t *o) {
  uint64_t hit = __atomic_load_n(&o->hit_ns, __ATOMIC_RELAXED);
  if (hit <= o->lru_ns) return o->last_accessed_at;
  double at = st__now_unix() - (double)(mono_ns() - hit) / 1e9;
  return at > o->last_accessed_at ? at : o->last_accessed_at;
}

/* Puts the cached objects used by st__objects_hit since their last place
 * in the LRU order where their use puts them: taken out, sorted by use,
 * merged back into the rest (which is in order). */
static int by_lru_ns(const void *a, const void *b) {
  uint64_t x = (*(st__object_t *const *)a)->lru_ns, y = (*(st__object_t *const *)b)->lru_ns;
  return x < y ? -1 : x > y;
}

static void order_hits(st__objects_t *r) {
  size_t n = 0;
  for (const st__object_t *o = r->lru_head; o; o = o->lru_next)
    n += __atomic_load_n(&o->hit_ns, __ATOMIC_RELAXED) > o->lru_ns;
  if (!n) return;
  st__object_t **moved = malloc(n * sizeof *moved);
  if (!moved) return;   /* the order stays a little off; nothing breaks */
  size_t k = 0;
  st__object_t *o = r->lru_head;
  while (o) {
    st__object_t *next = o->lru_next;
    uint64_t hit = __atomic_load_n(&o->hit_ns, __ATOMIC_RELAXED);
    if (hit > o->lru_ns && k < n) {
      o->last_accessed_at = st__objects_last_use(o);
      o->lru_ns = hit;
      lru_unlink(r, o);
      moved[k++] = o;
    }
    o = next;
  }
  qsort(moved, k, sizeof *moved, by_lru_ns);
  st__object_t *at = r->lru_head;
  for (size_t i = 0; i < k; i++) {
    while (at && at->lru_ns <= moved[i]->lru_ns) at = at->lru_next;
    st__object_t *m = moved[i];
    if (!at) {
      lru_append(r, m);
      continue;
    }
    m->lru_next = at;
    m->lru_prev = at->lru_prev;
    if (at->lru_prev) at->lru_prev->lru_next = m;
    else r->lru_head = m;
    at->lru_prev = m;
  }
  free(moved);
}

/* Evicts for the ledger; see objects.h. Loop thread. */
size_t st__objects_reclaim(st__objects_t *r, int device, uint64_t bytes, unsigned fds) {
  char name[ST_OBJ_DEVICE_LEN];
  if (device < 0) snprintf(name, sizeof name, "cpu");
  else snprintf(name, sizeof name, "cuda:%d", device);
  const st__budget_t *b = budget_of(r, name, 0);
  int bi = b ? (int)(b - r->budgets) : -1;
  order_hits(r);
  /* Nothing goes for nothing: when evicting every candidate would not
   * make room, none is evicted. */
  uint64_t freeable = 0, freeable_fds = 0;
  for (const st__object_t *o = r->lru_head; o; o = o->lru_next)
    if (evictable(o)) {
      freeable += bi >= 0 ? charge_on(o, bi) : 0;
      freeable_fds += o->fds;
    }
  st__ledger_stats_t l;
  st__ledger_stats(device, &l);
  if (l.budget && l.used + bytes > l.budget &&
      l.used - (freeable < l.used ? freeable : l.used) + bytes > l.budget)
    return 0;
  if (fds && l.fd_cap && l.fds + fds > l.fd_cap &&
      l.fds - (freeable_fds < l.fds ? freeable_fds : l.fds) + fds > l.fd_cap)
    return 0;
  size_t n = 0;
  st__object_t *o = r->lru_head;
  while (o && !st__ledger_fits(device, bytes, fds)) {
    st__object_t *next = o->lru_next;
    int helps = (bi >= 0 && charge_on(o, bi) > 0) || (fds && o->fds);
    if (evictable(o) && helps) {
      destroy(r, o);
      r->evictions++;
      n++;
    }
    o = next;
  }
  return n;
}

/* Registers a result as an object; see objects.h. */
int st__objects_add(st__objects_t *r, const st__object_spec_t *spec, st__build_result_t *result,
                    st__object_t **out, char *err, size_t errlen) {
  *out = NULL;
  char device[ST_OBJ_DEVICE_LEN];
  st__charge_t charges[ST_OBJ_MAX_BUDGETS];
  int ncharges = 0;
  unsigned fds = 0;
  uint64_t size = 0;
  int rc = charges_of(r, result, charges, &ncharges, &fds, &size, device, err, errlen);
  if (rc != ST_OK) return rc;
  st__object_t *o = calloc(1, sizeof *o);
  if (!o) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  o->endpoint = strdup(spec->endpoint);
  if (spec->cache_key) {
    o->cache_key = malloc(spec->cache_key_len + 1);
    if (o->cache_key) {
      memcpy(o->cache_key, spec->cache_key, spec->cache_key_len);
      o->cache_key[spec->cache_key_len] = '\0';
      o->cache_key_len = spec->cache_key_len;
    }
    o->slot = make_slot(spec->endpoint, spec->where, spec->cache_key, spec->cache_key_len,
                        &o->slot_len);
  }
  if (!o->endpoint || (spec->cache_key && (!o->cache_key || !o->slot))) {
    free(o->endpoint);
    free(o->cache_key);
    free(o->slot);
    free(o);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  o->id = r->next_id;
  if (st__smap_put(&r->by_id, ST__ID_KEY(&o->id), o) != ST_OK) {
    free(o->endpoint);
    free(o->cache_key);
    free(o->slot);
    free(o);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  r->next_id++;
  o->fingerprint = spec->fingerprint;
  o->managed = spec->managed;
  o->readonly = spec->readonly;
  o->bytes = size;
  for (int i = 0; i < ncharges; i++) {
    o->charges[i] = charges[i];
    r->budgets[charges[i].budget].bytes += charges[i].bytes;
    r->budgets[charges[i].budget].objects++;
  }
  o->ncharges = ncharges;
  o->fds = fds;
  memcpy(o->device, device, sizeof device);
  o->created_at = o->last_accessed_at = st__now_unix();
  o->lru_ns = mono_ns();
  o->result = *result;
  st__build_result_init(result);
  o->all_prev = r->all_tail;
  if (r->all_tail) r->all_tail->all_next = o;
  else r->all_head = o;
  r->all_tail = o;
  r->count++;
  r->created++;
  r->bytes += o->bytes;
  if (spec->cache && o->slot) {
    st__object_t *old = st__smap_get(&r->cache, o->slot, o->slot_len);
    if (st__smap_put(&r->cache, o->slot, o->slot_len, o) == ST_OK) {
      if (old) {
        lru_unlink(r, old);
        old->cached = 0;
        recount(r, old);
        st__objects_collect(r, old);
      }
      o->cached = 1;
      lru_append(r, o);
    }
  }
  o->counted = part_of(o);
  count_in(r, o, o->counted, 1);
  *out = o;
  return ST_OK;
}

/* Object by id or NULL. */
st__object_t *st__objects_find(st__objects_t *r, uint64_t id) {
  return st__smap_get(&r->by_id, ST__ID_KEY(&id));
}

/* Cached object of (endpoint, where, key) or NULL. */
st__object_t *st__objects_lookup_on(const st__objects_t *r, const char *endpoint,
                                    const char *where, const char *key, size_t key_len) {
  size_t len;
  char *slot = make_slot(endpoint, where, key, key_len, &len);
  if (!slot) return NULL;
  st__object_t *o = st__smap_get(&r->cache, slot, len);
  free(slot);
  return o;
}

/* Cached object of (endpoint, key) added without a device, or NULL. */
st__object_t *st__objects_lookup(st__objects_t *r, const char *endpoint, const char *key,
                                 size_t key_len) {
  return st__objects_lookup_on(r, endpoint, NULL, key, key_len);
}

/* Last use: now, and the fresh end of the LRU order. */
void st__objects_touch(st__objects_t *r, st__object_t *o) {
  o->last_accessed_at = st__now_unix();
  o->lru_ns = mono_ns();
  if (o->cached) {
    lru_unlink(r, o);
    lru_append(r, o);
  }
}

/* One more lease for conn_id. */
int st__objects_lease(st__objects_t *r, st__object_t *o, uint64_t conn_id) {
  for (size_t i = 0; i < o->nleases; i++) {
    if (o->leases[i].conn_id == conn_id) {
      o->leases[i].count++;
      o->refcount++;
      r->leases++;
      r->leases_granted++;
      recount(r, o);
      return ST_OK;
    }
  }
  if (o->nleases == o->cap_leases) {
    size_t cap = o->cap_leases ? o->cap_leases * 2 : 4;
    st__lease_t *l = realloc(o->leases, cap * sizeof *l);
    if (!l) return ST_ERR_OUT_OF_MEMORY;
    o->leases = l;
    o->cap_leases = cap;
  }
  o->leases[o->nleases].conn_id = conn_id;
  o->leases[o->nleases].count = 1;
  o->nleases++;
  o->refcount++;
  r->leases++;
  r->leases_granted++;
  recount(r, o);
  return ST_OK;
}

/* Drops `n` leases of entry i (all of them when n is 0). */
static uint32_t drop_leases(st__objects_t *r, st__object_t *o, size_t i, uint32_t n) {
  uint32_t k = n && n < o->leases[i].count ? n : o->leases[i].count;
  o->leases[i].count -= k;
  o->refcount -= k;
  r->leases -= k;
  if (o->leases[i].count == 0) o->leases[i] = o->leases[--o->nleases];
  recount(r, o);
  return k;
}

/* One lease of conn_id back; see objects.h. */
void st__objects_release(st__objects_t *r, uint64_t id, uint64_t conn_id, int *released,
                         int *destroyed, uint32_t *refcount) {
  *released = 0;
  *destroyed = 1;
  *refcount = 0;
  st__object_t *o = st__objects_find(r, id);
  if (!o) return;
  for (size_t i = 0; i < o->nleases; i++) {
    if (o->leases[i].conn_id == conn_id) {
      drop_leases(r, o, i, 1);
      *released = 1;
      break;
    }
  }
  *refcount = o->refcount;
  *destroyed = st__objects_collect(r, o);
}

/* Every lease of a closed connection; returns how many. */
size_t st__objects_release_conn(st__objects_t *r, uint64_t conn_id) {
  size_t n = 0;
  st__object_t *o = r->all_head;
  while (o) {
    st__object_t *next = o->all_next;
    for (size_t i = 0; i < o->nleases; i++) {
      if (o->leases[i].conn_id == conn_id) {
        n += drop_leases(r, o, i, 0);
        st__objects_collect(r, o);
        break;
      }
    }
    o = next;
  }
  return n;
}

/* A task's hold on an unfetched result. */
void st__objects_hold(st__objects_t *r, st__object_t *o) {
  o->holds++;
  recount(r, o);
}

/* Gives a hold back, the object kept; see objects.h. */
void st__objects_unhold_keep(st__objects_t *r, st__object_t *o) {
  if (o->holds) o->holds--;
  recount(r, o);
}

/* Gives a hold back; destroys the object if nothing else holds it. */
void st__objects_unhold(st__objects_t *r, st__object_t *o) {
  st__objects_unhold_keep(r, o);
  st__objects_collect(r, o);
}

/* Drops the cache entries of (endpoint, key) on every device; 1 if one
 * existed. */
int st__objects_uncache(st__objects_t *r, const char *endpoint, const char *key, size_t key_len) {
  int found = 0;
  st__object_t *o = r->lru_head;
  while (o) {
    st__object_t *next = o->lru_next;
    if (strcmp(o->endpoint, endpoint) == 0 && o->cache_key && o->cache_key_len == key_len &&
        memcmp(o->cache_key, key, key_len) == 0) {
      drop_cache_entry(r, o);
      st__objects_collect(r, o);
      found = 1;
    }
    o = next;
  }
  return found;
}

/* Drops every cache entry of an endpoint; returns how many. */
size_t st__objects_uncache_endpoint(st__objects_t *r, const char *endpoint) {
  size_t n = 0;
  st__object_t *o = r->lru_head;
  while (o) {
    st__object_t *next = o->lru_next;
    if (strcmp(o->endpoint, endpoint) == 0) {
      drop_cache_entry(r, o);
      st__objects_collect(r, o);
      n++;
    }
    o = next;
  }
  return n;
}

/* Per-device figures. */
void st__objects_stats(const st__objects_t *r, const char *device, st__budget_stats_t *out) {
  memset(out, 0, sizeof *out);
  int bi = -1;
  for (int i = 0; i < r->nbudgets; i++)
    if (strcmp(r->budgets[i].device, device) == 0) bi = i;
  if (bi < 0) return;
  if (r->budgets[bi].ordinal >= -1) {
    st__ledger_stats_t l;
    st__ledger_stats(r->budgets[bi].ordinal, &l);
    out->budget = l.budget;
    out->used_bytes = l.used;
  }
  out->object_bytes = r->budgets[bi].bytes;
  out->objects = r->budgets[bi].objects;
  out->cached_bytes = r->budgets[bi].part[ST__OBJ_CACHED];
  out->leased_bytes = r->budgets[bi].part[ST__OBJ_LEASED];
  out->task_bytes = r->budgets[bi].part[ST__OBJ_TASK];
}
