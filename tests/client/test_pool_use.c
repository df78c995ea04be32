/* Result pools that follow use (docs/pool.md, section 1; docs/security.md,
 * finding 4 of the second audit), through libstclient against real stservers:
 *   - 260 connections that each make one tiny pooled call (a server of
 *     its own, memory_budget.cpu = 32 MiB, slabs never retired) hold
 *     small slabs: the pools' bytes stay within a quarter of the budget
 *     (quotas.pool_bytes's default), the ledger far below the
 *     budget, and another client's 8 MiB call still succeeds;
 *   - quotas.pool_bytes bounds the slab bytes of one uid's pools (root's too)
 *     together: past it results get arenas of their own
 *     (counters.pool_fallbacks), every result correct;
 *   - an idle connection's slabs are retired after pool.idle_s, the last
 *     one too: the server's pool bytes and the connection's result_pool
 *     holdings go to 0; its next call makes a small slab again;
 *   - a connection making many calls reuses its slab: one slab, sized to
 *     its results (64 KiB for 4 KiB results, two of them held at a time;
 *     128 KiB for 100 KiB ones), its descriptor sent once, whatever the
 *     number of calls.
 */
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_kit.h"
#include "fixture.h"
#include "holder_kit.h"

#define KIB 1024
#define MIB (1024 * 1024)

static const stt_endpoint_t endpoints[] = {
    {"fill.lua",
     "return st.endpoint{ name = 'fill', params = { v = 0, n = 1 },\n"
     "  build = function(a) return st.full{ a.n, value = a.v, dtype = 'float32' } end }\n"},
    {"big.lua",
     "return st.endpoint{ name = 'big', params = { n = 1 },\n"
     "  build = function(a) return st.zeros{ a.n, dtype = 'uint8' } end }\n"},
    {NULL, NULL}};

/* info's integer at a.b[.c] on c, or -1. */
static int64_t info_at(st_client_t *c, const char *a, const char *b, const char *k) {
  st_result_t *r = NULL;
  if (st_client_info(c, &r) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_value_get(st_result_value(r), a), b);
  if (k) v = st_value_get(v, k);
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

static int64_t pool_bytes(st_client_t *mon) { return info_at(mon, "memory", "cpu", "pool_bytes"); }

/* The result_pool holdings of every connection of this process (bytes,
 * or items), summed. */
static int64_t held_by_pools(st_client_t *mon, const char *what) {
  st_result_t *r = NULL;
  if (st_client_info(mon, &r) != ST_OK) return -1;
  const st_value_t *list = st_value_get(st_result_value(r), "holdings");
  int64_t sum = 0;
  for (size_t i = 0; list && list->kind == ST_VALUE_ARRAY && i < list->as.array.len; i++) {
    const st_value_t *row = &list->as.array.items[i];
    const st_value_t *pid = st_value_get(row, "pid");
    const st_value_t *v = st_value_get(st_value_get(row, "result_pool"), what);
    if (pid && pid->kind == ST_VALUE_INT && pid->as.integer == getpid() && v &&
        v->kind == ST_VALUE_INT)
      sum += v->as.integer;
  }
  st_result_free(r);
  return sum;
}

/* fill{n floats of v} on c; NULL when it fails (the reason printed). */
static st_result_t *fill(st_client_t *c, int64_t n, float v) {
  return stt_call_ints(c, "fill", (const char *const[]){"n", "v"},
                       (const int64_t[]){n, (int64_t)v}, 2);
}

static int holds(const st_result_t *r, int64_t n, float v) {
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (!t || t->numel != n) return 0;
  for (int64_t i = 0; i < n; i++)
    if (((const float *)t->data)[i] != v) return 0;
  return 1;
}

/* One call of n floats, checked and freed: 1 when it was right. */
static int call_once(st_client_t *c, int64_t n, float v) {
  st_result_t *r = fill(c, n, v);
  int ok = r && holds(r, n, v);
  st_result_free(r);
  return ok;
}

/* Polls until fn(mon, arg) is `want`, at most 10 s; returns the last value. */
static int64_t wait_for(int64_t (*fn)(st_client_t *, const char *), st_client_t *mon,
                        const char *arg, int64_t want) {
  double end = stt_now_ms() + 10000;
  int64_t v;
  while ((v = fn(mon, arg)) != want && stt_now_ms() < end) stt_sleep_ms(10);
  return v;
}

static int64_t pool_bytes_of(st_client_t *mon, const char *unused) {
  (void)unused;
  return pool_bytes(mon);
}

/* ------------------------------------- many connections, one call each */

enum { CONNS = 260 };
#define BUDGET (32 * MIB)

static void many_body(stt_server_t *s) {
  st_client_t *mon = stt_client_open(s->socket);
  CHECK(mon);
  static st_client_t *c[CONNS];
  int opened = 0;
  for (int i = 0; i < CONNS; i++) {
    c[i] = stt_client_open(s->socket);
    if (!c[i]) break;
    opened++;
    CHECK(call_once(c[i], 1, (float)(i % 100)));
  }
  CHECK_EQ_INT(opened, CONNS);
  /* Another client's 8 MiB call still fits. */
  st_client_t *other = stt_client_open(s->socket);
  CHECK(other);
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 8 * MIB);
  st_result_t *big = NULL;
  CHECK_RC(st_client_call(other, "big", a, &big), ST_OK, other);
  st_args_free(a);
  const st_tensor_t *t = big ? st_result_tensor(big, 0) : NULL;
  CHECK(t && t->nbytes == 8 * MIB && ((const char *)t->data)[8 * MIB - 1] == 0);
  st_result_free(big);
  st_client_close(other);
  int64_t pooled = pool_bytes(mon), used = info_at(mon, "memory", "cpu", "used_bytes");
  fprintf(stderr, "   %d connections: pool_bytes %lld, used_bytes %lld of %d\n", opened,
          (long long)pooled, (long long)used, BUDGET);
  /* Small slabs, within the uid's quarter of the budget; the ledger far
   * below the budget. */
  CHECK(pooled > 0 && pooled <= BUDGET / 4);
  CHECK(used >= 0 && used <= BUDGET / 2);
  /* Every connection still gets correct results. */
  for (int i = 0; i < opened; i += 13) CHECK(call_once(c[i], 1024, 3.0f));
  for (int i = 0; i < opened; i++) st_client_close(c[i]);
  CHECK_EQ_INT(wait_for(pool_bytes_of, mon, NULL, 0), 0);
  st_client_close(mon);
}

TEST(many_connections_with_one_tiny_call_each_hold_small_slabs) {
  CHECK(pk_run_own_server("workers = 1, memory_budget = { cpu = 33554432 },"
                          " pool = { idle_s = 0 },",
                          endpoints, many_body) == 0);
}

/* ---------------------------------------------------- the per-uid quota */

enum { QCONNS = 40 };

static void quota_body(stt_server_t *s) {
  st_client_t *mon = stt_client_open(s->socket);
  CHECK(mon);
  int64_t fb0 = info_at(mon, "counters", "pool_fallbacks", NULL);
  static st_client_t *c[QCONNS];
  static st_result_t *r[QCONNS];
  /* 40 connections holding a 4 KiB result each: 40 slabs of 64 KiB would
   * be 2.5 MiB; the uid may hold 1 MiB. */
  for (int i = 0; i < QCONNS; i++) {
    CHECK((c[i] = stt_client_open(s->socket)) != NULL);
    CHECK((r[i] = fill(c[i], 1024, (float)i)) != NULL);
  }
  CHECK(pool_bytes(mon) <= 1 * MIB);
  CHECK_EQ_INT(held_by_pools(mon, "bytes"), pool_bytes(mon));
  CHECK(info_at(mon, "counters", "pool_fallbacks", NULL) > fb0);
  for (int i = 0; i < QCONNS; i++) CHECK(holds(r[i], 1024, (float)i));
  /* Past the quota, arenas of their own keep working both ways. */
  for (int i = 0; i < QCONNS; i++) CHECK(call_once(c[i], 1024, 7.0f));
  for (int i = 0; i < QCONNS; i++) {
    st_result_free(r[i]);
    st_client_close(c[i]);
  }
  CHECK_EQ_INT(wait_for(pool_bytes_of, mon, NULL, 0), 0);
  /* The quota is given back with the slabs: a new connection pools. */
  st_client_t *d = stt_client_open(s->socket);
  CHECK(d);
  int64_t fb = info_at(mon, "counters", "pool_fallbacks", NULL);
  CHECK(call_once(d, 1024, 1.0f));
  CHECK_EQ_INT(pool_bytes(mon), 64 * KIB);
  CHECK_EQ_INT(info_at(mon, "counters", "pool_fallbacks", NULL), fb);
  st_client_close(d);
  st_client_close(mon);
}

TEST(the_pools_of_one_uid_stay_within_its_pool_bytes) {
  CHECK(pk_run_own_server("workers = 1, pool = { idle_s = 0 }, quotas = { pool_bytes = 1048576 },",
                          endpoints, quota_body) == 0);
}

/* ------------------------------------------------ idle connections */

static void idle_body(stt_server_t *s) {
  st_client_t *mon = stt_client_open(s->socket);
  st_client_t *c = stt_client_open(s->socket);
  CHECK(mon && c);
  /* A held result keeps its slab whatever the clock says. */
  CHECK(call_once(c, 1024, 5.0f));
  st_result_t *r = fill(c, 1024, 6.0f);
  CHECK(r && holds(r, 1024, 6.0f));
  CHECK_EQ_INT(pool_bytes(mon), 64 * KIB);
  CHECK_EQ_INT(held_by_pools(mon, "bytes"), 64 * KIB);
  CHECK_EQ_INT(held_by_pools(mon, "items"), 1);
  /* Freed, and c makes no call now: after idle_s its last slab goes too. */
  st_result_free(r);
  CHECK_EQ_INT(wait_for(pool_bytes_of, mon, NULL, 0), 0);
  CHECK_EQ_INT(wait_for(held_by_pools, mon, "bytes", 0), 0);
  CHECK_EQ_INT(held_by_pools(mon, "items"), 0);
  /* Its next call makes a small slab again, and the result is right. */
  r = fill(c, 1024, 8.0f);
  CHECK(r && holds(r, 1024, 8.0f));
  CHECK_EQ_INT(pool_bytes(mon), 64 * KIB);
  st_result_free(r);
  st_client_close(c);
  CHECK_EQ_INT(wait_for(pool_bytes_of, mon, NULL, 0), 0);
  st_client_close(mon);
}

TEST(an_idle_connection_ends_up_holding_no_slab) {
  CHECK(pk_run_own_server("workers = 1, pool = { idle_s = 0.3 },", endpoints, idle_body) == 0);
}

/* --------------------------------------------------- steady use */

/* CALLS calls of n floats on a new connection (each result freed; with
 * `keep`, after the next call): the pool holds one slab of `slab` bytes
 * all along, and the descriptors of one slab and the page were sent. */
static void steady(st_client_t *mon, const char *socket, int64_t n, int keep, int64_t slab) {
  enum { CALLS = 300 };
  st_client_t *c = stt_client_open(socket);
  CHECK(c);
  int64_t sent = info_at(mon, "counters", "fds_sent", NULL);
  st_result_t *held = NULL;
  for (int i = 0; i < CALLS; i++) {
    st_result_t *r = fill(c, n, (float)(i % 50));
    CHECK(r && holds(r, n, (float)(i % 50)));
    st_result_free(held);
    held = r;
    if (!keep) {
      st_result_free(held);
      held = NULL;
    }
    if (i % 50 == 49) {
      CHECK_EQ_INT(pool_bytes(mon), slab);
      CHECK_EQ_INT(held_by_pools(mon, "items"), 1);
    }
  }
  st_result_free(held);
  CHECK_EQ_INT(info_at(mon, "counters", "fds_sent", NULL) - sent, 2);
  st_client_close(c);
  CHECK_EQ_INT(wait_for(pool_bytes_of, mon, NULL, 0), 0);
}

static void steady_body(stt_server_t *s) {
  st_client_t *mon = stt_client_open(s->socket);
  CHECK(mon);
  steady(mon, s->socket, 1024, 1, 64 * KIB);          /* 4 KiB results: 64 KiB */
  steady(mon, s->socket, 25 * 1024, 0, 128 * KIB);    /* 100 KiB: 128 KiB      */
  st_client_close(mon);
}

TEST(a_connection_that_keeps_calling_reuses_one_slab) {
  CHECK(pk_run_own_server("workers = 1,", endpoints, steady_body) == 0);
}

int main(void) {
  RUN(many_connections_with_one_tiny_call_each_hold_small_slabs);
  RUN(the_pools_of_one_uid_stay_within_its_pool_bytes);
  RUN(an_idle_connection_ends_up_holding_no_slab);
  RUN(a_connection_that_keeps_calling_reuses_one_slab);
  return stt_summary();
}
