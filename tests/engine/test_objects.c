/* Unit tests of the object registry (src/engine/objects.c): ids, the
 * cache index, leases counted per connection, holds, LRU eviction for the
 * ledger's budget and descriptor cap (st__objects_reclaim), that nothing
 * is evicted for nothing, that every arena goes when the objects do, and
 * that the figures info reads follow every change. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "engine/objects.h"
#include "mem/arena.h"
#include "mem/ledger.h"
#include "st/errors.h"

/* A result holding one fresh CPU arena of `bytes`. */
static void make_result(st__build_result_t *r, uint64_t bytes) {
  st__build_result_init(r);
  st__arena_t *a = NULL;
  if (st__arena_new_cpu(bytes, &a, NULL, 0) != ST_OK) abort();
  r->arenas = malloc(sizeof *r->arenas);
  r->arenas[0] = a;
  r->narenas = 1;
  r->bytes = bytes;
  msgpack_sbuffer_write(&r->value, "\xc0", 1);
}

static st__object_t *add(st__objects_t *reg, const char *ep, const char *key, int cache,
                         int managed, uint64_t bytes, int *rc, char *err) {
  st__build_result_t r;
  make_result(&r, bytes);
  st__object_spec_t spec = {.endpoint = ep, .cache_key = key,
                            .cache_key_len = key ? strlen(key) : 0,
                            .cache = cache, .managed = managed};
  st__object_t *o = NULL;
  *rc = st__objects_add(reg, &spec, &r, &o, err, 256);
  st__build_result_destroy(&r);   /* empty after a successful add */
  return o;
}

static uint64_t live_arenas(void) {
  uint64_t n = 0;
  st__arena_stats(&n, NULL);
  return n;
}

TEST(cache_leases_and_holds) {
  st__objects_t reg;
  st__objects_init(&reg);
  uint64_t arenas0 = live_arenas();
  int rc;
  char err[256];
  st__object_t *a = add(&reg, "e", "k1", 1, 1, 100, &rc, err);
  CHECK_ERR(rc, ST_OK);
  CHECK_EQ_INT(a->id, 1);
  CHECK(a->cached);
  CHECK_STR_EQ(a->device, "cpu");
  CHECK(st__objects_lookup(&reg, "e", "k1", 2) == a);
  CHECK(st__objects_lookup(&reg, "e", "k2", 2) == NULL);
  CHECK(st__objects_lookup(&reg, "f", "k1", 2) == NULL);
  CHECK(st__objects_find(&reg, 1) == a);
  /* Leases count per connection. */
  CHECK_ERR(st__objects_lease(&reg, a, 7), ST_OK);
  CHECK_ERR(st__objects_lease(&reg, a, 7), ST_OK);
  CHECK_ERR(st__objects_lease(&reg, a, 8), ST_OK);
  CHECK_EQ_INT(a->refcount, 3);
  CHECK_EQ_INT(reg.leases, 3);
  int released, destroyed;
  uint32_t refs;
  st__objects_release(&reg, 1, 9, &released, &destroyed, &refs);
  CHECK(!released && !destroyed);
  CHECK_EQ_INT(refs, 3);
  st__objects_release(&reg, 1, 7, &released, &destroyed, &refs);
  CHECK(released && !destroyed);
  CHECK_EQ_INT(refs, 2);
  CHECK_EQ_INT(st__objects_release_conn(&reg, 7), 1);
  CHECK_EQ_INT(st__objects_release_conn(&reg, 7), 0);
  CHECK_EQ_INT(a->refcount, 1);
  /* Uncached but leased: alive; the last lease destroys it. */
  CHECK_EQ_INT(st__objects_uncache(&reg, "e", "k1", 2), 1);
  CHECK_EQ_INT(st__objects_uncache(&reg, "e", "k1", 2), 0);
  CHECK(st__objects_find(&reg, 1) == a);
  st__objects_release(&reg, 1, 8, &released, &destroyed, &refs);
  CHECK(released && destroyed);
  CHECK(st__objects_find(&reg, 1) == NULL);
  st__objects_release(&reg, 1, 8, &released, &destroyed, &refs);
  CHECK(!released && destroyed);
  /* A hold keeps an uncached object until unhold. */
  st__object_t *b = add(&reg, "e", NULL, 0, 0, 10, &rc, err);
  CHECK_EQ_INT(b->id, 2);
  st__objects_hold(&reg, b);
  CHECK_EQ_INT(st__objects_collect(&reg, b), 0);
  st__objects_unhold(&reg, b);
  CHECK(st__objects_find(&reg, 2) == NULL);
  /* A second entry under the same key replaces the first. */
  st__object_t *c1 = add(&reg, "e", "k", 1, 0, 10, &rc, err);
  st__object_t *c2 = add(&reg, "e", "k", 1, 0, 10, &rc, err);
  (void)c1;
  CHECK(st__objects_lookup(&reg, "e", "k", 1) == c2);
  CHECK(st__objects_find(&reg, 3) == NULL);
  CHECK_EQ_INT(reg.count, 1);
  add(&reg, "e", "j", 1, 0, 10, &rc, err);
  add(&reg, "g", "j", 1, 0, 10, &rc, err);
  CHECK_EQ_INT(st__objects_uncache_endpoint(&reg, "e"), 2);
  CHECK_EQ_INT(reg.count, 1);
  st__objects_free(&reg);
  CHECK_EQ_INT(live_arenas(), arenas0);
}

TEST(reclaim_evicts_lru_for_the_ledger) {
  st__objects_t reg;
  st__objects_init(&reg);
  const uint64_t P = (uint64_t)sysconf(_SC_PAGESIZE);
  CHECK_ERR(st__objects_set_budget(&reg, "cpu", 3 * P), ST_OK);
  uint64_t arenas0 = live_arenas();
  int rc;
  char err[256];
  st__object_t *a = add(&reg, "e", "a", 1, 0, 400, &rc, err);
  st__object_t *b = add(&reg, "e", "b", 1, 0, 400, &rc, err);
  st__object_t *c = add(&reg, "e", "c", 1, 0, 400, &rc, err);
  CHECK_ERR(rc, ST_OK);
  (void)b;
  st__objects_touch(&reg, a);                  /* b is now the least recently used */
  st__budget_stats_t s;
  st__objects_stats(&reg, "cpu", &s);
  CHECK_EQ_INT(s.budget, 3 * P);
  CHECK_EQ_INT(s.used_bytes, 3 * P);
  CHECK_EQ_INT(s.cached_bytes, 3 * P);
  CHECK_EQ_INT(a->bytes, 400);                 /* the object's size is its arenas' */
  /* The budget is full: an arena is refused before it exists (no hook
   * here to evict for it). */
  st__arena_t *x = NULL;
  CHECK_ERR(st__arena_new_cpu(1, &x, err, sizeof err), ST_ERR_OUT_OF_MEMORY);
  CHECK_CONTAINS(err, "memory_budget.cpu");
  CHECK_EQ_INT(live_arenas(), arenas0 + 3);
  /* Reclaim evicts the least recently used until one page fits. */
  CHECK_EQ_INT(st__objects_reclaim(&reg, -1, P, 0), 1);
  CHECK(st__objects_lookup(&reg, "e", "b", 1) == NULL);
  CHECK(st__objects_lookup(&reg, "e", "a", 1) == a);
  CHECK_EQ_INT(reg.evictions, 1);
  CHECK_EQ_INT(st__objects_reclaim(&reg, -1, P, 0), 0);   /* fits already */
  /* Leased objects are never evicted, and nothing goes for nothing. */
  CHECK_ERR(st__objects_lease(&reg, a, 1), ST_OK);
  CHECK_EQ_INT(st__objects_reclaim(&reg, -1, 3 * P, 0), 0);
  CHECK(st__objects_lookup(&reg, "e", "c", 1) == c);
  st__objects_stats(&reg, "cpu", &s);
  CHECK_EQ_INT(s.leased_bytes, P);
  CHECK_EQ_INT(s.cached_bytes, P);
  CHECK_EQ_INT(st__objects_reclaim(&reg, -1, 2 * P, 0), 1);
  CHECK(st__objects_lookup(&reg, "e", "c", 1) == NULL);
  /* Descriptors: a cap at what is open now makes the next memfd arena
   * wait for an eviction of one that keeps a descriptor. */
  st__object_t *d = add(&reg, "e", "d", 1, 0, 10, &rc, err);
  CHECK(d != NULL);
  st__ledger_stats_t l;
  st__ledger_stats(-1, &l);
  st__ledger_set_fd_cap(l.fds);
  CHECK_ERR(st__arena_new_cpu(1, &x, err, sizeof err), ST_ERR_LIMIT);
  CHECK_CONTAINS(err, "limits.max_arena_fds");
  CHECK_EQ_INT(st__objects_reclaim(&reg, -1, 0, 1), 1);
  CHECK(st__objects_lookup(&reg, "e", "d", 1) == NULL);
  CHECK_ERR(st__arena_new_cpu(1, &x, err, sizeof err), ST_OK);
  st__arena_unref(x);
  st__ledger_set_fd_cap(0);
  st__objects_set_budget(&reg, "cpu", 0);
  st__objects_free(&reg);
  CHECK_EQ_INT(live_arenas(), arenas0);
  st__ledger_stats(-1, &l);
  CHECK_EQ_INT(l.used, 0);
}

/* add() that makes room first as the server's ledger hook does, and
 * gives up (NULL) when the budget has none. */
static st__object_t *try_add(st__objects_t *reg, const char *key, int cache, int managed,
                             uint64_t bytes) {
  st__objects_reclaim(reg, -1, bytes, 1);
  st__build_result_t r;
  st__build_result_init(&r);
  st__arena_t *a = NULL;
  if (st__arena_new_cpu(bytes, &a, NULL, 0) != ST_OK) return NULL;
  r.arenas = malloc(sizeof *r.arenas);
  r.arenas[0] = a;
  r.narenas = 1;
  r.bytes = bytes;
  msgpack_sbuffer_write(&r.value, "\xc0", 1);
  st__object_spec_t spec = {.endpoint = "e", .cache_key = key, .cache_key_len = strlen(key),
                            .cache = cache, .managed = managed};
  st__object_t *o = NULL;
  char err[256];
  if (st__objects_add(reg, &spec, &r, &o, err, sizeof err) != ST_OK) o = NULL;
  st__build_result_destroy(&r);
  return o;
}

/* The cpu figures of st__objects_stats as a walk of every object finds
 * them (what info read before the registry kept them), and the sum of the
 * objects' bytes. */
static void walked(const st__objects_t *r, st__budget_stats_t *w, uint64_t *bytes) {
  memset(w, 0, sizeof *w);
  *bytes = 0;
  for (const st__object_t *o = r->all_head; o; o = o->all_next) {
    *bytes += o->bytes;
    for (int i = 0; i < o->ncharges; i++) {
      if (strcmp(r->budgets[o->charges[i].budget].device, "cpu") != 0) continue;
      uint64_t b = o->charges[i].bytes;
      w->objects++;
      w->object_bytes += b;
      if (o->cached && !o->refcount && !o->holds) w->cached_bytes += b;
      else if (o->refcount) w->leased_bytes += b;
      else w->task_bytes += b;
    }
  }
}

/* Whether the kept figures are the walked ones. */
static int stats_agree(const st__objects_t *reg) {
  st__budget_stats_t s, w;
  uint64_t bytes;
  st__objects_stats(reg, "cpu", &s);
  walked(reg, &w, &bytes);
  int ok = s.objects == w.objects && s.object_bytes == w.object_bytes &&
           s.cached_bytes == w.cached_bytes && s.leased_bytes == w.leased_bytes &&
           s.task_bytes == w.task_bytes && reg->bytes == bytes;
  if (!ok)
    fprintf(stderr, "   kept %llu objects, %llu cached, %llu leased, %llu task, %llu bytes; "
                    "walked %llu, %llu, %llu, %llu, %llu\n", (unsigned long long)s.objects,
            (unsigned long long)s.cached_bytes, (unsigned long long)s.leased_bytes,
            (unsigned long long)s.task_bytes, (unsigned long long)reg->bytes,
            (unsigned long long)w.objects, (unsigned long long)w.cached_bytes,
            (unsigned long long)w.leased_bytes, (unsigned long long)w.task_bytes,
            (unsigned long long)bytes);
  return ok;
}

/* The figures info reads (st__objects_stats, the registry's bytes) are
 * kept as objects change, not walked: after each of a few thousand random
 * changes -- new objects cached or not (a cache slot taken over), leases
 * given and taken back one at a time or a connection's all at once,
 * holds, uncaching, eviction for the budget -- they are what a walk of
 * every object finds. */
TEST(stats_follow_every_change) {
  st__objects_t reg;
  st__objects_init(&reg);
  const uint64_t P = (uint64_t)sysconf(_SC_PAGESIZE);
  CHECK_ERR(st__objects_set_budget(&reg, "cpu", 64 * P), ST_OK);
  uint64_t arenas0 = live_arenas();
  unsigned seed = 12345;
  for (int step = 0; step < 3000 && !stt_failed_now; step++) {
    seed = seed * 1103515245u + 12345u;
    unsigned r = (seed >> 8) & 0xffff;
    st__object_t *all[256];
    size_t n = 0;
    for (st__object_t *o = reg.all_head; o && n < 256; o = o->all_next) all[n++] = o;
    st__object_t *o = n ? all[r % n] : NULL;
    uint64_t conn = 1 + (r >> 4) % 3;
    int released, destroyed;
    uint32_t refs;
    switch ((r >> 7) % 9) {
    case 0:
    case 1: {   /* a new object: cached (a slot of 8), leased, held or collected */
      char key[8];
      snprintf(key, sizeof key, "k%u", (r >> 2) % 8);
      int how = (int)((r >> 11) % 4);
      st__object_t *x = try_add(&reg, key, how == 0, how == 1, 100 + (r % 3) * P);
      if (!x) break;
      if (how == 1) CHECK_ERR(st__objects_lease(&reg, x, conn), ST_OK);
      if (how == 2) st__objects_hold(&reg, x);
      st__objects_collect(&reg, x);
      break;
    }
    case 2:
      if (o) CHECK_ERR(st__objects_lease(&reg, o, conn), ST_OK);
      break;
    case 3:
      if (o) st__objects_release(&reg, o->id, conn, &released, &destroyed, &refs);
      break;
    case 4:
      st__objects_release_conn(&reg, conn);
      break;
    case 5:
      if (o) st__objects_hold(&reg, o);
      break;
    case 6:
      if (o && o->holds) st__objects_unhold(&reg, o);
      break;
    case 7:
      if (o && o->cache_key) st__objects_uncache(&reg, "e", o->cache_key, o->cache_key_len);
      break;
    default:
      st__objects_reclaim(&reg, -1, (r % 8) * P, 0);
      break;
    }
    CHECK(stats_agree(&reg));
  }
  st__objects_set_budget(&reg, "cpu", 0);
  st__objects_free(&reg);
  CHECK_EQ_INT(reg.bytes, 0);
  CHECK_EQ_INT(live_arenas(), arenas0);
}

int main(void) {
  RUN(cache_leases_and_holds);
  RUN(reclaim_evicts_lru_for_the_ledger);
  RUN(stats_follow_every_change);
  return stt_summary();
}
