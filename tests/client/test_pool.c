/* Result pools through libstclient against a real stserver (docs/pool.md,
 * sections 1-3), with small slabs (64 KiB first, pool.slab_bytes = 256 KiB, a 512 KiB
 * cap per connection) so that slabs fill and regions are recycled:
 *   - thousands of calls with random frees (some from another thread,
 *     some through st_result_ref): every held result keeps its bytes, no
 *     two held results overlap, and descriptors go once per slab;
 *   - a managed endpoint's fresh results are regions too, each with its
 *     object and lease (release destroys it; the slab goes once);
 *   - results outlive st_client_close: they stay readable, and freeing
 *     them later writes into no freed memory;
 *   - a forked child that frees an inherited result frees nothing;
 *   - a client SIGKILLed with results outstanding gives its slabs back
 *     (the server's descriptors, arenas and pool bytes as before it);
 *   - a client that never frees gets arenas of their own once its pool
 *     is full (pool_fallbacks moves), with correct results;
 *   - ST_CLIENT_POOL=0: results are arenas of their own, as before;
 *   - budgets count slabs: with memory_budget.cpu = 1 MiB the pool stays
 *     within a quarter of it and a build that needs more than is left
 *     gets the budget's error;
 *   - slabs shrink with use (a server of its own, pool.idle_s = 0.2; 4 KiB
 *     results: 16, 32 and 64 fill slabs of 64, 128 and 256 KiB): a slab
 *     with a region the client holds is never retired, however long the
 *     client goes on calling; once its regions are freed, a slab idle for
 *     idle_s is retired while the client calls (the server's pool bytes
 *     and arena count drop, the client's mapping of it goes: see
 *     /proc/self/maps), the oldest stays, and the pool grows again into
 *     the retired slabs' indices, every result correct.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <st/client.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "argcache_kit.h"
#include "client_kit.h"
#include "fixture.h"
#include "holder_kit.h"

#define N 1024   /* floats per result: 4 KiB */
#define KIB 1024

static stt_server_t srv;
static st_client_t *mon;   /* info */

static const stt_endpoint_t endpoints[] = {
    {"fill.lua",
     "return st.endpoint{ name = 'fill', params = { v = 0, n = 1024 },\n"
     "  build = function(a) return st.full{ a.n, value = a.v, dtype = 'float32' } end }\n"},
    {"big.lua",
     "return st.endpoint{ name = 'big', params = { n = 1 },\n"
     "  build = function(a) return st.zeros{ a.n, dtype = 'uint8' } end }\n"},
    {"mfill.lua",
     "return st.endpoint{ name = 'mfill', managed = true, params = { v = 0, n = 1024 },\n"
     "  build = function(a) return st.full{ a.n, value = a.v, dtype = 'float32' } end }\n"},
    {NULL, NULL}};

static int64_t info(const char *section, const char *key) {
  return ak_info_int(mon, section, key);
}

static int64_t pool_bytes(void) {
  st_result_t *r = NULL;
  if (st_client_info(mon, &r) != ST_OK) return -1;
  const st_value_t *v =
      st_value_get(st_value_get(st_value_get(st_result_value(r), "memory"), "cpu"), "pool_bytes");
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* Polls until the pools' bytes are `want` (closed connections let their
 * slabs go on the server's next loop turns); returns them. */
static int64_t wait_pool_bytes(int64_t want) {
  double end = stt_now_ms() + 5000;
  while (pool_bytes() != want && stt_now_ms() < end) stt_sleep_ms(5);
  return pool_bytes();
}

static st_result_t *fill(st_client_t *c, float v) {
  return stt_call_ints(c, "fill", (const char *const[]){"v"}, (const int64_t[]){(int64_t)v}, 1);
}

static int holds(const st_result_t *r, float v) {
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (!t || t->numel != N) return 0;
  for (int i = 0; i < N; i++)
    if (((const float *)t->data)[i] != v) return 0;
  return 1;
}

/* ------------------------------------------------ managed results */

/* A managed endpoint's fresh result is a region of the caller's pool with
 * its object and lease as before: 300 calls, each released and freed,
 * send the slab and the page once; each reply names a new object with
 * one lease, which release gives back (the object is destroyed); the
 * server ends with no object and its pool bytes only. */
TEST(managed_fresh_results_are_regions_with_their_lease) {
  OPEN_CLIENT(c, srv.socket);
  int64_t sent = info("counters", "fds_sent"), objects = info("objects", "count");
  uint64_t last = 0;
  for (int i = 0; i < 300; i++) {
    st_result_t *r = stt_call_ints(c, "mfill", (const char *const[]){"v"},
                                   (const int64_t[]){i}, 1);
    CHECK(r && holds(r, (float)i));
    st_object_info_t o;
    CHECK(st_result_object(r, &o) == ST_OK);
    CHECK(o.managed && o.lease && o.refcount == 1 && !o.cached && o.id > last);
    last = o.id;
    int released = 0, destroyed = 0;
    CHECK(st_client_release(c, o.id, &released, &destroyed, NULL) == ST_OK);
    CHECK(released && destroyed);
    CHECK(holds(r, (float)i));   /* the client's mapping outlives the object */
    st_result_free(r);
  }
  CHECK(info("counters", "fds_sent") - sent <= 2);   /* the slab, the page */
  CHECK_EQ_INT(info("objects", "count"), objects);
  CHECK(pool_bytes() > 0);
  st_client_close(c);
  CHECK_EQ_INT(wait_pool_bytes(0), 0);
}

static void *free_on_thread(void *r) {
  st_result_free(r);
  return NULL;
}

/* The three ways a held result goes: at once, its last reference on
 * another thread, or two references (the region stays until both go). */
static void drop_some_way(st_result_t *r, float v, unsigned *seed) {
  switch (rand_r(seed) % 3) {
  case 0: st_result_free(r); break;
  case 1: {
    pthread_t th;
    CHECK(pthread_create(&th, NULL, free_on_thread, r) == 0);
    pthread_join(th, NULL);
    break;
  }
  default:
    st_result_ref(r);
    st_result_free(r);
    CHECK(holds(r, v));
    st_result_free(r);
  }
}

TEST(held_results_keep_their_bytes_under_random_frees) {
  OPEN_CLIENT(c, srv.socket);
  int64_t sent = info("counters", "fds_sent");
  CHECK(pk_churn(c, 3000, 40, 4242, N * 4, 1, fill, holds, drop_some_way) == 0);
  /* Slabs of 64, 128 and 256 KiB hold 40 results: three slabs, the page. */
  CHECK(info("counters", "fds_sent") - sent <= 8);
  CHECK_EQ_INT(info("counters", "pool_fallbacks"), 0);
  st_client_close(c);
}

TEST(results_outlive_close) {
  int64_t base = wait_pool_bytes(0);
  OPEN_CLIENT(c, srv.socket);
  st_result_t *a = fill(c, 5.0f), *b = fill(c, 6.0f);
  CHECK(a && b);
  CHECK(pool_bytes() > base);
  st_client_close(c);
  CHECK_EQ_INT(wait_pool_bytes(base), base);   /* the server let the slabs go */
  CHECK(holds(a, 5.0f) && holds(b, 6.0f));
  st_result_free(a);                  /* into a page the server let go */
  CHECK(holds(b, 6.0f));
  st_result_free(b);
}

/* A child that inherited a result and frees it frees nothing of the
 * parent's: the region is not handed out again while the parent holds it. */
TEST(a_forked_child_freeing_a_result_frees_nothing) {
  OPEN_CLIENT(c, srv.socket);
  st_result_t *r = fill(c, 77.0f);
  CHECK(r);
  pid_t pid = fork();
  if (pid == 0) {
    st_result_free(r);
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int i = 0; i < 100; i++) {
    st_result_t *x = fill(c, (float)i);
    CHECK(x && holds(x, (float)i));
    st_result_free(x);
    CHECK(holds(r, 77.0f));
  }
  st_result_free(r);
  st_client_close(c);
}

TEST(a_sigkilled_client_gives_its_slabs_back) {
  int64_t bytes0 = wait_pool_bytes(0), fds0 = info("arenas", "fds"),
          count0 = info("arenas", "count");
  pid_t pid = pk_holder(srv.socket, 50);
  CHECK(pid > 0);
  CHECK(pool_bytes() > bytes0);
  pk_kill(pid);
  double end = stt_now_ms() + 5000;
  while ((pool_bytes() != bytes0 || info("arenas", "fds") != fds0) && stt_now_ms() < end)
    stt_sleep_ms(5);
  CHECK_EQ_INT(pool_bytes(), bytes0);
  CHECK_EQ_INT(info("arenas", "fds"), fds0);
  CHECK_EQ_INT(info("arenas", "count"), count0);
}

TEST(a_client_that_never_frees_falls_back_to_arenas_of_their_own) {
  CHECK_EQ_INT(wait_pool_bytes(0), 0);
  OPEN_CLIENT(c, srv.socket);
  int64_t fb = info("counters", "pool_fallbacks");
  enum { CALLS = 300 };   /* 1.2 MiB held: more than the 512 KiB cap */
  static st_result_t *r[CALLS];
  for (int i = 0; i < CALLS; i++) CHECK((r[i] = fill(c, (float)i)) != NULL);
  for (int i = 0; i < CALLS; i++) CHECK(holds(r[i], (float)i));
  CHECK(info("counters", "pool_fallbacks") > fb);
  CHECK(pool_bytes() <= 512 << 10);
  for (int i = 0; i < CALLS; i++) st_result_free(r[i]);
  st_client_close(c);
}

TEST(without_the_pool_results_are_arenas_of_their_own) {
  setenv("ST_CLIENT_POOL", "0", 1);
  OPEN_CLIENT(c, srv.socket);
  unsetenv("ST_CLIENT_POOL");
  int64_t sent = info("counters", "fds_sent");
  for (int i = 0; i < 4; i++) {
    st_result_t *r = fill(c, 1.0f);
    CHECK(r && holds(r, 1.0f));
    st_result_free(r);
  }
  CHECK_EQ_INT(info("counters", "fds_sent") - sent, 4);
  st_client_close(c);
}

/* A server of its own: memory_budget.cpu = 1 MiB. */
static void budget_body(stt_server_t *s) {
  st_client_t *c = stt_client_open(s->socket);
  st_client_t *keep = mon;
  mon = stt_client_open(s->socket);
  CHECK(c && mon);
  enum { CALLS = 100 };
  static st_result_t *r[CALLS];
  for (int i = 0; i < CALLS; i++) CHECK((r[i] = fill(c, (float)i)) != NULL);
  for (int i = 0; i < CALLS; i++) CHECK(holds(r[i], (float)i));
  int64_t pb = pool_bytes();
  CHECK(pb > 0 && pb <= (1 << 20) / 4);
  /* 900 KiB cannot fit beside the pool's slabs. */
  st_args_t *a = st_args_new();
  st_args_int(a, "n", 900 << 10);
  st_result_t *big = NULL;
  int rc = st_client_call(c, "big", a, &big);
  st_args_free(a);
  CHECK_RC(rc, ST_ERR_OUT_OF_MEMORY, c);
  CHECK(strstr(st_client_error(c), "memory_budget.cpu") != NULL);
  for (int i = 0; i < CALLS; i++) st_result_free(r[i]);
  st_client_close(c);
  st_client_close(mon);
  mon = keep;
}

TEST(budgets_count_slabs) {
  CHECK(pk_run_own_server("workers = 1, memory_budget = { cpu = 1048576 },"
                          " pool = { slab_bytes = 65536 },",
                          endpoints, budget_body) == 0);
}

/* The server's memfd arenas this process maps that are at least a slab
 * (the control page is 8 KiB; results are regions, not mappings). */
static int slab_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && strstr(line, "/memfd:st-arena-") &&
        hi - lo >= 64 * KIB)
      n++;
  }
  fclose(f);
  return n;
}

/* One call whose result is checked and freed: 1, or 0 when it was wrong. */
static int call_once(st_client_t *c, float v) {
  st_result_t *x = fill(c, v);
  int ok = x && holds(x, v);
  if (x) st_result_free(x);
  return ok;
}

/* Calls on c until the pool holds `bytes` in `maps` slabs mapped here (the
 * server retires at an allocation, the client lets go at its next
 * request), at most 10 s. 1 when it got there with every result correct. */
static int call_until(st_client_t *c, int64_t bytes, int maps) {
  double end = stt_now_ms() + 10000;
  for (int i = 0; stt_now_ms() < end; i++) {
    if (!call_once(c, (float)(1000 + i % 7))) return 0;
    if (pool_bytes() == bytes && slab_maps() == maps) return 1;
  }
  fprintf(stderr, "   pool_bytes %lld, %d slabs mapped\n", (long long)pool_bytes(), slab_maps());
  return 0;
}

/* Calls on c for ms milliseconds; 1 when every result was correct. */
static int call_for(st_client_t *c, double ms) {
  double end = stt_now_ms() + ms;
  while (stt_now_ms() < end)
    if (!call_once(c, -3.0f)) return 0;
  return 1;
}

enum { HOLD = 60 };   /* 16 + 32 + 12: three slabs */

/* Holds HOLD results r[i] = i: the pool's three slabs. */
static void grow_to_three(st_client_t *c, st_result_t **r) {
  for (int i = 0; i < HOLD; i++) CHECK((r[i] = fill(c, (float)i)) != NULL);
  CHECK_EQ_INT(pool_bytes(), 448 * KIB);
  CHECK_EQ_INT(slab_maps(), 3);
}

/* A server of its own: pool.idle_s = 0.2. */
static void shrink_body(stt_server_t *s) {
  st_client_t *c = stt_client_open(s->socket);
  st_client_t *keep = mon;
  mon = stt_client_open(s->socket);
  CHECK(c && mon);
  int64_t arenas0 = ak_info_int(mon, "arenas", "count");
  st_result_t *r[HOLD];
  grow_to_three(c, r);
  int64_t arenas3 = ak_info_int(mon, "arenas", "count");
  CHECK(arenas3 >= arenas0 + 3);
  /* Every slab holds a region the client holds: none goes. */
  CHECK(call_for(c, 1000));
  CHECK_EQ_INT(pool_bytes(), 448 * KIB);
  CHECK_EQ_INT(slab_maps(), 3);
  /* r[20] is in the 128 KiB slab: that one stays, the 256 KiB one goes. */
  for (int i = 0; i < HOLD; i++)
    if (i != 20) {
      CHECK(holds(r[i], (float)i));
      st_result_free(r[i]);
    }
  CHECK(call_until(c, 192 * KIB, 2));
  CHECK(call_for(c, 1000));
  CHECK_EQ_INT(pool_bytes(), 192 * KIB);
  CHECK(holds(r[20], 20.0f));
  st_result_free(r[20]);
  /* Now it goes too; the first slab stays. A result held in it while
   * the figures are read keeps it whatever the scheduler does: an idle
   * connection's last slab is retired too (after idle_s without a call). */
  CHECK(call_until(c, 64 * KIB, 1));
  st_result_t *pin = fill(c, 7.0f);
  CHECK(pin != NULL);
  CHECK_EQ_INT(ak_info_int(mon, "arenas", "count"), arenas3 - 2);
  CHECK(call_for(c, 600));
  CHECK_EQ_INT(pool_bytes(), 64 * KIB);
  CHECK(holds(pin, 7.0f));
  st_result_free(pin);
  /* It grows again, into the indices the client let go. */
  grow_to_three(c, r);
  for (int i = 0; i < HOLD; i++) {
    CHECK(holds(r[i], (float)i));
    st_result_free(r[i]);
  }
  CHECK(call_until(c, 64 * KIB, 1));
  st_client_close(c);
  st_client_close(mon);
  mon = keep;
}

TEST(idle_slabs_retire_and_held_ones_stay) {
  CHECK(pk_run_own_server("workers = 1, pool = { slab_bytes = 262144,"
                          " max_bytes_per_connection = 524288, idle_s = 0.2 },",
                          endpoints, shrink_body) == 0);
}

int main(int argc, char **argv) {
  pk_holder_main(argc, argv, fill);
  mon = stt_serve_client(&srv,
                         "workers = 1, pool = { slab_bytes = 262144, max_bytes_per_connection = 524288 },",
                         endpoints);
  RUN(held_results_keep_their_bytes_under_random_frees);
  RUN(managed_fresh_results_are_regions_with_their_lease);
  RUN(results_outlive_close);
  RUN(a_forked_child_freeing_a_result_frees_nothing);
  RUN(a_sigkilled_client_gives_its_slabs_back);
  RUN(a_client_that_never_frees_falls_back_to_arenas_of_their_own);
  RUN(without_the_pool_results_are_arenas_of_their_own);
  RUN(budgets_count_slabs);
  RUN(idle_slabs_retire_and_held_ones_stay);
  return stt_client_finish(mon, &srv);
}
