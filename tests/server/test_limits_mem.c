/* What the server allocates for results, over the real socket: every
 * arena counts against its device's memory budget from allocation until
 * the server drops it, plain and task results included, and is refused
 * before it is allocated when it cannot fit (cached objects are evicted to
 * make room, transient results never); arenas that keep a descriptor
 * (memfd) count against limits.max_arena_fds, whose default is half of
 * RLIMIT_NOFILE, and cached objects are evicted for descriptors too, so
 * they cannot fill the descriptor table.
 *
 * Small limits only: a 1 MiB budget, 32 descriptors, and a server whose
 * RLIMIT_NOFILE is lowered to 256 (setrlimit before it starts). */
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "endpoints.h"
#include "wire.h"

#define KiB 1024
#define MiB (1024 * 1024)

static stt_server_t S;

/* The budget of S: 1 MiB of cpu memory, 32 arena descriptors. */
#define S_CONFIG "workers = 2, memory_budget = { cpu = 1048576 }, limits = { max_arena_fds = 32 },"

static void wait_idle(rc_t *c) {
  CHECK(rc_wait_info(c, "objects.count", 0, 5000) == 0);
  CHECK(rc_wait_info(c, "memory.cpu.used_bytes", 0, 5000) == 0);
  CHECK(rc_wait_info(c, "arenas.fds", 0, 5000) == 0);
}

/* Finding: a plain result was outside the budget (and max_object_bytes
 * was 64 GiB), so one call could commit any amount of memory. */
TEST(plain_results_are_refused_before_allocating) {
  OPEN_RC(c, S.socket);
  wait_idle(&c);
  int64_t refused0 = rc_info_int(&c, "counters.budget_refusals");
  msg_t m;
  CHECK(rk_call(&c, "plain", "n", 2 * MiB, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY,
              "an allocation of 2097152 bytes on cpu is larger than its memory budget of "
              "1048576 bytes (memory_budget.cpu sets it)");
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "counters.budget_refusals"), refused0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "arenas.count"), 0);
  /* What fits is served, and gives its bytes back once sent. */
  CHECK(rk_call(&c, "plain", "n", 512 * KiB, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rc_wait_info(&c, "memory.cpu.used_bytes", 0, 5000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "limits.max_object_bytes"), 0);
  rc_close(&c);
}

/* Unfetched task results hold their bytes until fetched (or expired); a
 * task that does not fit fails with OUT_OF_MEMORY, and fetching a result
 * makes room again. */
TEST(task_results_hold_the_budget_until_fetched) {
  OPEN_RC(c, S.socket);
  wait_idle(&c);
  uint64_t t1 = rk_submit(&c, "plain", "n", 400 * KiB);
  CHECK(rk_wait_status(&c, t1, "completed", 5000) == 0);
  uint64_t t2 = rk_submit(&c, "plain", "n", 400 * KiB);
  CHECK(rk_wait_status(&c, t2, "completed", 5000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.used_bytes"), 800 * KiB);
  uint64_t t3 = rk_submit(&c, "plain", "n", 400 * KiB);
  CHECK(rk_wait_status(&c, t3, "failed", 5000) == 0);
  msg_t m;
  CHECK(rk_id(&c, "result", "task_id", t3, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, "does not fit its memory budget: 819200 of 1048576");
  msg_free(&m);
  CHECK(rk_id(&c, "result", "task_id", t1, &m) == 1 && !m.error);
  rc_drop_fds(&c);
  msg_free(&m);
  uint64_t t4 = rk_submit(&c, "plain", "n", 400 * KiB);
  CHECK(rk_wait_status(&c, t4, "completed", 5000) == 0);
  CHECK(rk_id(&c, "result", "task_id", t2, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(rk_id(&c, "result", "task_id", t4, &m) == 1 && !m.error);
  msg_free(&m);
  rc_close(&c);
}

/* A transient result that does not fit makes the cache give room back,
 * least recently used first. */
TEST(cached_objects_are_evicted_for_a_plain_result) {
  OPEN_RC(c, S.socket);
  wait_idle(&c);
  int64_t ev0 = rc_info_int(&c, "counters.evictions");
  msg_t m;
  for (int i = 0; i < 3; i++) {
    CHECK(rk_call(&c, "blob", "n", 300 * KiB + 1 + i, &m) == 1 && !m.error);
    msg_free(&m);
  }
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.cached_bytes"), 3 * (300 * KiB + 4 * KiB));
  CHECK(rk_call(&c, "plain", "n", 400 * KiB, &m) == 1 && !m.error);
  msg_free(&m);
  /* 3 x 304 KiB cached: 400 KiB more fit once the oldest is gone. */
  CHECK_EQ_INT(rc_info_int(&c, "counters.evictions"), ev0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "objects.count"), 2);
  msg_t inv;
  CHECK(rc_rpcf(&c, &inv, "[0, 9, 'invalidate_endpoint', [{endpoint: 'blob'}]]") == 1);
  msg_free(&inv);
  rc_close(&c);
}

/* Objects a client holds keep their descriptors: past limits.max_arena_fds
 * a call fails with a LIMIT that says so, the server serves on, and the
 * leases given back make room. */
TEST(held_descriptors_hit_a_clear_limit) {
  OPEN_RC(c, S.socket);
  OPEN_RC(other, S.socket);
  wait_idle(&c);
  msg_t m;
  for (int i = 0; i < 32; i++) {
    CHECK(rk_call(&c, "held", "n", 1, &m) == 1 && !m.error);
    msg_free(&m);
  }
  CHECK_EQ_INT(rc_info_int(&c, "arenas.fds"), 32);
  CHECK_EQ_INT(rc_info_int(&c, "arenas.max_fds"), 32);
  CHECK(rk_call(&c, "held", "n", 1, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_LIMIT, "32 of 32 arena descriptors in use");
  CHECK_CONTAINS(msg_errmsg(&m), "limits.max_arena_fds");
  msg_free(&m);
  CHECK(stt_ping(other.fd, 4) == 0);
  rc_close(&c);
  CHECK(rc_wait_info(&other, "arenas.fds", 0, 5000) == 0);
  CHECK(rk_call(&other, "held", "n", 1, &m) == 1 && !m.error);
  msg_free(&m);
  rc_close(&other);
}

static const stt_endpoint_t endpoints[] = {
    {"plain.lua",
     "return st.endpoint{ name = 'plain', params = { n = 1 },\n"
     "  build = function(a) return st.zeros{a.n, dtype = 'uint8'} end }\n"},
    {"blob.lua", STT_EP_BLOB},
    {"held.lua", STT_EP_HELD},
    {NULL, NULL},
};

/* ------------------------------------------- a server with 256 descriptors */

enum { NOFILE = 256, KEYS = 600 };

/* Finding: every cached object kept its memfd open and eviction counted
 * bytes only, so small cached objects used up the descriptor table (and
 * then every allocation failed, for every client). With the default cap
 * (half of RLIMIT_NOFILE) the cache evicts for descriptors. */
static void fd_table_body(stt_server_t *s) {
  OPEN_RC(c, s->socket);
  CHECK_EQ_INT(rc_info_int(&c, "arenas.max_fds"), NOFILE / 2);
  /* The default cpu budget: half of the memory this host allows. */
  int64_t budget = rc_info_int(&c, "memory.cpu.budget");
  CHECK(budget > 0);
  CHECK(budget <= (int64_t)sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / 2);
  msg_t m;
  int failed = 0;
  for (int i = 0; i < KEYS && !failed; i++) {
    CHECK(rk_call(&c, "blob", "n", i + 1, &m) == 1);
    failed = m.error != NULL;
    msg_free(&m);
  }
  CHECK(!failed);
  CHECK(rc_info_int(&c, "arenas.fds") <= NOFILE / 2);
  CHECK(rc_info_int(&c, "counters.evictions") >= KEYS - NOFILE / 2);
  CHECK(stt_proc_fd_count(s->pid) < NOFILE - 32);
  CHECK(stt_ping(c.fd, 5) == 0);
  rc_close(&c);
}

TEST(cached_objects_do_not_exhaust_the_descriptor_table) {
  static stt_server_t own;
  struct rlimit old, low;
  CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0);
  low = old;
  low.rlim_cur = NOFILE;   /* the server inherits it */
  CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  stt_server_prepare(&own, "workers = 2,", endpoints);
  int rc = stt_server_run(&own, fd_table_body);
  stt_server_cleanup(&own);
  CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK_EQ_INT(rc, 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, S_CONFIG, endpoints);
  RUN(plain_results_are_refused_before_allocating);
  RUN(task_results_hold_the_budget_until_fetched);
  RUN(cached_objects_are_evicted_for_a_plain_result);
  RUN(held_descriptors_hit_a_clear_limit);
  RUN(cached_objects_do_not_exhaust_the_descriptor_table);
  return stt_server_finish(&S);
}
