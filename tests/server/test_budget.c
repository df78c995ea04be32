/* The memory budget over the real socket (memory_budget = { cpu = 2.5
 * pages }): every arena counts its allocated size (whole pages) from
 * allocation on; cached objects nothing holds are evicted least recently
 * used first to make room; an allocation that cannot fit even after
 * evicting them fails with OUT_OF_MEMORY naming the budget, and nothing is
 * evicted for nothing; info reports the bytes per device. */
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "check.h"
#include "endpoints.h"
#include "wire.h"

static stt_server_t S;
static int64_t P;   /* the page size: what a small CPU arena takes */

static int alive(rc_t *c, int64_t oid) {
  return info_field(c, (uint64_t)oid, "id") == oid;
}

TEST(lru_eviction_then_out_of_memory) {
  rc_t c, h;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(rc_open(&h, S.socket) == 0);
  int64_t ev0 = rc_info_int(&c, "counters.evictions");
  msg_t m;
  CHECK(rk_call(&c, "blob", "n", P - 96, &m) == 1 && !m.error);
  int64_t a = obj_field(&m, "id");
  msg_free(&m);
  CHECK(rk_call(&c, "blob", "n", P - 95, &m) == 1 && !m.error);
  int64_t b = obj_field(&m, "id");
  msg_free(&m);
  /* A hit makes a the most recently used: b goes first. */
  CHECK(rk_call(&c, "blob", "n", P - 96, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_field(&m, "id"), a);
  CHECK_EQ_INT(obj_field(&m, "bytes"), P - 96);   /* the object's own size */
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.budget"), P * 5 / 2);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.cached_bytes"), 2 * P);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.used_bytes"), 2 * P);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.leased_bytes"), 0);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.objects"), 2);
  CHECK(rk_call(&c, "blob", "n", P - 94, &m) == 1 && !m.error);
  int64_t d = obj_field(&m, "id");
  msg_free(&m);
  CHECK(alive(&c, a));
  CHECK(!alive(&c, b));
  CHECK(alive(&c, d));
  CHECK_EQ_INT(rc_info_int(&c, "counters.evictions"), ev0 + 1);
  /* A leased object of one page: a (least recently used) is evicted, and
   * that is enough. */
  CHECK(rk_call(&h, "held", "n", P / 2, &m) == 1 && !m.error);
  int64_t l = obj_field(&m, "id");
  msg_free(&m);
  CHECK(!alive(&c, a));
  CHECK(alive(&c, d));
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.leased_bytes"), P);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.cached_bytes"), P);
  /* Two more pages cannot fit while the lease holds one: refused before
   * anything is allocated, and the cached d is not evicted for nothing. */
  int64_t refused0 = rc_info_int(&c, "counters.budget_refusals");
  CHECK(rk_call(&c, "held", "n", P + 1, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, NULL);
  char want[300];
  snprintf(want, sizeof want,
           "an allocation of %lld bytes on cpu does not fit its memory budget: %lld of %lld "
           "bytes in use",
           (long long)(2 * P), (long long)(2 * P), (long long)(P * 5 / 2));
  CHECK_CONTAINS(msg_errmsg(&m), want);
  CHECK_CONTAINS(msg_errmsg(&m), "(memory_budget.cpu sets it)");
  msg_free(&m);
  CHECK(alive(&c, d));
  CHECK_EQ_INT(rc_info_int(&c, "counters.budget_refusals"), refused0 + 1);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.objects"), 2);
  CHECK(rc_wait_info(&c, "arenas.count", 2, 5000) == 0);   /* nothing of the refused one */
  /* Larger than the whole budget. */
  CHECK(rk_call(&c, "blob", "n", 3 * P, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, "is larger than its memory budget");
  msg_free(&m);
  /* The lease goes back: now it fits (d is evicted). */
  rc_close(&h);
  CHECK(rc_wait_info(&c, "memory.cpu.leased_bytes", 0, 5000) == 0);
  CHECK(rk_call(&c, "held", "n", P + 1, &m) == 1 && !m.error);
  msg_free(&m);
  CHECK(!alive(&c, l));
  CHECK(!alive(&c, d));
  rc_close(&c);
}

TEST(task_results_count_until_fetched) {
  OPEN_RC(c, S.socket);
  CHECK(rc_wait_info(&c, "memory.cpu.objects", 0, 5000) == 0);
  uint64_t t = rk_submit(&c, "held", "n", 3000);
  CHECK(rk_wait_status(&c, t, "completed", 5000) == 0);
  /* Kept by the task, no lease yet: task bytes, not leased bytes. */
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.task_bytes"), P);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.leased_bytes"), 0);
  msg_t m;
  CHECK(rk_id(&c, "result", "task_id", t, &m) == 1 && !m.error);
  rc_drop_fds(&c);
  int64_t oid = obj_field(&m, "id");
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.leased_bytes"), P);   /* result's lease */
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.task_bytes"), 0);
  CHECK(rk_id(&c, "release", "object_id", (uint64_t)oid, &m) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "destroyed")), 1);
  msg_free(&m);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.leased_bytes"), 0);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cpu.object_bytes"), 0);
  CHECK_EQ_INT(rc_info_int(&c, "objects.count"), 0);
  rc_close(&c);
}

static const stt_endpoint_t endpoints[] = {
    {"blob.lua", STT_EP_BLOB},
    {"held.lua", STT_EP_HELD},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  P = sysconf(_SC_PAGESIZE);
  char config[128];
  snprintf(config, sizeof config, "workers = 2, memory_budget = { cpu = %lld },",
           (long long)(P * 5 / 2));
  stt_server_setup(&S, config, endpoints);
  RUN(lru_eviction_then_out_of_memory);
  RUN(task_results_count_until_fetched);
  return stt_server_finish(&S);
}
