/* src/server: request accounting (server.h, "stats.c"). Every request
 * dispatch accepts is opened on its connection's table and counted; the
 * first reply queued for its id closes it as ok or failed, with its
 * latency; a connection that closes drops what is still open. So at any
 * moment, per method and in total, requests = ok + failed + dropped +
 * in flight, and the same holds for the calls of each endpoint. Loop
 * thread only. */
#include <stdlib.h>
#include <string.h>

#include "engine/smap.h"
#include "common/clock.h"
#include "server/server.h"

const double st__stats_bucket_bounds[ST__STATS_NBUCKETS] = ST__STATS_BUCKETS;

/* Sets the method names, finds `call`, and makes the endpoint table. */
int st__stats_init(st__server_t *srv, const char *(*name_at)(size_t), size_t n) {
  st__stats_t *s = &srv->stats;
  memset(s, 0, sizeof *s);
  s->call_method = -1;
  if (n > ST__STATS_NMETHODS) abort();   /* a broken invariant: raise NMETHODS */
  for (size_t i = 0; i < n; i++) {
    s->method_names[i] = name_at(i);
    if (strcmp(s->method_names[i], "call") == 0) s->call_method = (int)i;
  }
  s->nmethods = n;
  st__smap_t *m = malloc(sizeof *m);
  if (!m) return ST_ERR_OUT_OF_MEMORY;
  st__smap_init(m);
  s->endpoint_index = m;
  return ST_OK;
}

/* Frees the endpoint table. */
void st__stats_free(st__server_t *srv) {
  st__stats_t *s = &srv->stats;
  for (size_t i = 0; i < s->nendpoints; i++) {
    free(s->endpoints[i]->name);
    free(s->endpoints[i]);
  }
  s->nendpoints = 0;
  if (s->endpoint_index) {
    st__smap_clear(s->endpoint_index);
    free(s->endpoint_index);
    s->endpoint_index = NULL;
  }
}

static uint32_t slot_of(uint32_t id, uint32_t cap) {
  return (id * 2654435761u) & (cap - 1);
}

static int grow(st__open_reqs_t *t) {
  uint32_t cap = t->cap ? t->cap * 2 : 8;
  st__open_req_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return ST_ERR_OUT_OF_MEMORY;
  for (uint32_t i = 0; i < t->cap; i++) {
    if (!t->slots[i].used) continue;
    uint32_t k = slot_of(t->slots[i].id, cap);
    while (slots[k].used) k = (k + 1) & (cap - 1);
    slots[k] = t->slots[i];
  }
  free(t->slots);
  t->slots = slots;
  t->cap = cap;
  return ST_OK;
}

/* The slot of open request `id`, or NULL. */
static st__open_req_t *find(st__open_reqs_t *t, uint32_t id) {
  if (!t->count) return NULL;
  for (uint32_t k = slot_of(id, t->cap);; k = (k + 1) & (t->cap - 1)) {
    if (!t->slots[k].used) return NULL;
    if (t->slots[k].id == id) return &t->slots[k];
  }
}

/* Empties slot `e` and moves later entries of its run back (linear
 * probing without tombstones). */
static void remove_slot(st__open_reqs_t *t, st__open_req_t *e) {
  uint32_t mask = t->cap - 1, i = (uint32_t)(e - t->slots);
  t->slots[i].used = 0;
  t->count--;
  for (uint32_t j = (i + 1) & mask; t->slots[j].used; j = (j + 1) & mask) {
    uint32_t home = slot_of(t->slots[j].id, t->cap);
    /* Entry j may fill the hole at i when its home is not in (i, j]. */
    if (((j - home) & mask) >= ((j - i) & mask)) {
      t->slots[i] = t->slots[j];
      t->slots[j].used = 0;
      i = j;
    }
  }
}

static st__endpoint_stats_t *endpoint_of(st__stats_t *s, uint16_t e) {
  return e ? s->endpoints[e - 1] : NULL;
}

static void count_error(st__server_t *srv, st__method_stats_t *m, int code) {
  m->failed++;
  srv->counters.errors++;
  srv->stats.errors_by_code[code < 0 && code >= ST_ERR_MIN ? -code : 0]++;
}

/* Counts request `id` of method row `method` and opens it. */
int st__stats_open(st__server_t *srv, st__open_reqs_t *open, uint32_t id, size_t method) {
  st__stats_t *s = &srv->stats;
  if (method > ST__STATS_NMETHODS) method = ST__STATS_NMETHODS;
  st__method_stats_t *m = &s->methods[method];
  m->requests++;
  srv->counters.requests++;
  if ((int)method == s->call_method) srv->counters.calls++;
  if ((open->count + 1) * 2 > open->cap && grow(open) != ST_OK) {
    count_error(srv, m, ST_ERR_OUT_OF_MEMORY);
    if ((int)method == s->call_method) srv->counters.calls_failed++;
    return ST_ERR_OUT_OF_MEMORY;
  }
  uint32_t k = slot_of(id, open->cap);
  while (open->slots[k].used) k = (k + 1) & (open->cap - 1);
  open->slots[k] = (st__open_req_t){
      .id = id, .used = 1, .method = (uint8_t)method, .endpoint = 0, .accepted = st__now_mono()};
  open->count++;
  m->inflight++;
  return ST_OK;
}

/* The open call `id` is a call of endpoint `name`. */
void st__stats_endpoint(st__server_t *srv, st__open_reqs_t *open, uint32_t id, const char *name) {
  st__stats_t *s = &srv->stats;
  st__open_req_t *e = find(open, id);
  if (!e) return;
  size_t len = strlen(name);
  uintptr_t at = (uintptr_t)st__smap_get(s->endpoint_index, name, len);
  if (!at) {
    /* A new name; past the cap, the shared entry "" (made once). */
    const char *key = s->nendpoints < ST__STATS_MAX_ENDPOINTS ? name : "";
    size_t klen = s->nendpoints < ST__STATS_MAX_ENDPOINTS ? len : 0;
    at = (uintptr_t)st__smap_get(s->endpoint_index, key, klen);
    if (!at) {
      st__endpoint_stats_t *es = calloc(1, sizeof *es);
      if (es) es->name = strdup(key);
      if (!es || !es->name ||
          st__smap_put(s->endpoint_index, key, klen, (void *)(s->nendpoints + 1)) != ST_OK) {
        if (es) free(es->name);
        free(es);
        return;   /* out of memory: the call counts by method only */
      }
      s->endpoints[s->nendpoints++] = es;
      at = s->nendpoints;
    }
  }
  e->endpoint = (uint16_t)at;
}

/* A reply to `id` was queued. */
void st__stats_answered(st__server_t *srv, st__open_reqs_t *open, uint32_t id, int code) {
  st__stats_t *s = &srv->stats;
  st__open_req_t *e = find(open, id);
  if (!e) return;
  st__method_stats_t *m = &s->methods[e->method];
  int call = (int)e->method == s->call_method;
  st__endpoint_stats_t *es = endpoint_of(s, e->endpoint);
  double took = st__now_mono() - e->accepted;
  remove_slot(open, e);
  m->inflight--;
  if (code == ST_OK) {
    m->ok++;
    srv->counters.requests_ok++;
    if (call) srv->counters.calls_ok++;
    if (es) es->ok++;
  } else {
    count_error(srv, m, code);
    if (call) srv->counters.calls_failed++;
    if (es) es->failed++;
  }
  size_t b = 0;
  while (b < ST__STATS_NBUCKETS && took > st__stats_bucket_bounds[b]) b++;
  m->buckets[b]++;
  m->seconds += took;
}

/* The connection closed: what it is still owed is dropped. */
void st__stats_dropped(st__server_t *srv, st__open_reqs_t *open) {
  st__stats_t *s = &srv->stats;
  for (uint32_t i = 0; i < open->cap && open->count; i++) {
    st__open_req_t *e = &open->slots[i];
    if (!e->used) continue;
    st__method_stats_t *m = &s->methods[e->method];
    m->inflight--;
    m->dropped++;
    srv->counters.requests_dropped++;
    if ((int)e->method == s->call_method) srv->counters.calls_dropped++;
    st__endpoint_stats_t *es = endpoint_of(s, e->endpoint);
    if (es) es->dropped++;
    e->used = 0;
    open->count--;
  }
  free(open->slots);
  open->slots = NULL;
  open->cap = open->count = 0;
}
