/* CUDA arenas and the server's limits, over the real socket: a VMM arena
 * keeps no descriptor in the server (each reply carries a fresh export),
 * so cached CUDA objects never count against limits.max_arena_fds or fill
 * the descriptor table; and every CUDA arena is charged to its device's
 * memory_budget before cuMemCreate, plain results included. Needs a CUDA
 * device (label gpu). */
#include <signal.h>
#include <stdio.h>

#include "check.h"
#include "gpu_kit.h"
#include "mem/cuda.h"
#include "wire.h"

#define MiB (1024 * 1024)

#ifdef ST_HAVE_CUDA

static stt_server_t S;

TEST(vmm_objects_keep_no_descriptor) {
  OPEN_RC(c, S.socket);
  int fds0 = stt_proc_fd_count(S.pid);
  msg_t m;
  /* More cached objects than limits.max_arena_fds (16). */
  for (int i = 0; i < 24; i++) {
    CHECK(rc_call(&c, "gblob", "n", 1000 + i, &m) == 1 && !m.error);
    CHECK_EQ_INT(c.nfds, 1);   /* one exported descriptor per reply */
    rc_drop_fds(&c);
    msg_free(&m);
  }
  CHECK_EQ_INT(rc_info_int(&c, "objects.count"), 24);
  CHECK_EQ_INT(rc_info_int(&c, "arenas.fds"), 0);
  CHECK_EQ_INT(rc_info_int(&c, "counters.evictions"), 0);
  CHECK(proc_fd_count_reaches(S.pid, fds0 + 4, 0) == 0);
  /* A cache hit exports again. */
  CHECK(rc_call(&c, "gblob", "n", 1000, &m) == 1 && !m.error);
  CHECK_EQ_INT(c.nfds, 1);
  rc_drop_fds(&c);
  msg_free(&m);
  msg_t inv;
  CHECK(rc_rpcf(&c, &inv, "[0, 9, 'invalidate_endpoint', [{endpoint: 'gblob'}]]") == 1);
  msg_free(&inv);
  CHECK(rc_wait_info(&c, "memory.cuda:0.used_bytes", 0, 5000) == 0);
  rc_close(&c);
}

TEST(cuda_budget_refuses_before_allocating) {
  OPEN_RC(c, S.socket);
  uint64_t free0 = gk_free();
  msg_t m;
  CHECK(rc_call(&c, "gplain", "n", 128 * MiB, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, "on cuda:0 is larger than its memory budget of 67108864");
  CHECK_CONTAINS(msg_errmsg(&m), "memory_budget[\"cuda:0\"]");
  msg_free(&m);
  /* Plain results count: three of 24 MiB do not fit 64 MiB at once. */
  uint64_t t[3];
  for (int i = 0; i < 3; i++) t[i] = rk_submit(&c, "gplain", "n", 24 * MiB);
  CHECK(rk_wait_status(&c, t[0], "completed", 10000) == 0);
  CHECK(rk_wait_status(&c, t[1], "completed", 10000) == 0);
  CHECK(rk_wait_status(&c, t[2], "failed", 10000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "memory.cuda:0.used_bytes"), 48 * MiB);
  for (int i = 0; i < 2; i++) {
    CHECK(rk_id(&c, "result", "task_id", t[i], &m) == 1 && !m.error);
    rc_drop_fds(&c);
    msg_free(&m);
  }
  CHECK(rc_wait_info(&c, "memory.cuda:0.used_bytes", 0, 5000) == 0);
  CHECK(gk_wait_back_to(free0, 10000) == 0);
  rc_close(&c);
}

static const stt_endpoint_t endpoints[] = {
    {"gblob.lua",
     "return st.endpoint{ name = 'gblob', device = 'cuda', cache_format_key = 'g:{n}',\n"
     "  params = { n = 1 },\n"
     "  build = function(a) return st.zeros{a.n, dtype = 'uint8'} end }\n"},
    {"gplain.lua",
     "return st.endpoint{ name = 'gplain', device = 'cuda', params = { n = 1 },\n"
     "  build = function(a) return st.zeros{a.n, dtype = 'uint8'} end }\n"},
    {NULL, NULL},
};

#endif /* ST_HAVE_CUDA */

int main(void) {
  char why[512];
  if (st__cuda_available(why, sizeof why) != ST_OK) stt_skip(why);
#ifdef ST_HAVE_CUDA
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S,
                   "workers = 2, memory_budget = { [\"cuda:0\"] = 64 * 1024 * 1024 },"
                   " limits = { max_arena_fds = 16 },",
                   endpoints);
  RUN(vmm_objects_keep_no_descriptor);
  RUN(cuda_budget_refuses_before_allocating);
  return stt_server_finish(&S);
#endif
  return stt_summary();
}
