/* Pulls between CPU and CUDA memory (docs/multihost.md, "Pulling a key":
 * memories of either kind) through the public API, on two stservers on
 * loopback that are peers (tests/peer/remote_kit.h) with NCCL unusable on
 * both (peer.nccl_library names no file), so that every pull with a CUDA
 * end goes over UCX with that end staged through host memory by its
 * transfer helper. Label gpu: skipped without a device.
 *   - a CUDA key pulled to a CUDA device, to the CPU (device = "cpu"), and
 *     a CPU key pulled to a CUDA device (device = "cuda:0"): each copy on
 *     the memory asked for, every byte equal to the source's;
 *   - the receiver's CUDA used bytes grow by the copies' arenas only, and
 *     the helpers' staging leaves nothing behind: after the pulls, both
 *     servers' transfer counts are back to none running;
 *   - a CUDA live key pulled live to a CUDA device follows 20 updates of
 *     its publisher: the replica reaches the last version under the same
 *     number, with its bytes (docs/multihost.md, "Live replication"); the
 *     same with peer.live_reads = "staged" (a device copy first). */
#include <inttypes.h>

#include "../peer/remote_kit.h"
#include "../server/gpu_kit.h"

/* rk_fill_cpu's bytes, into CUDA memory through a host copy. */
static int fill_cuda(const st_tensor_t *t, int k, int salt) {
  uint8_t *h = malloc(RK_SIZES[k]);
  if (!h) return -1;
  for (size_t i = 0; i < RK_SIZES[k]; i++) h[i] = rk_pattern(i, k, salt);
  char err[256];
  int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, RK_SIZES[k], t->device_index,
                                   err, sizeof err);
  if (rc != ST_OK) fprintf(stderr, "   fill: %s\n", err);
  free(h);
  return rc == ST_OK ? 0 : -1;
}

/* Pulls `key` from alpha to beta as `as` onto `device`; its final status. */
static const char *pull_to(const char *key, const char *as, const char *device, char *status,
                           size_t len) {
  st_client_t *c = NULL;
  char err[256];
  status[0] = '\0';
  if (st_client_connect(BETA.socket, &c, err, sizeof err) != ST_OK) return status;
  st_pull_opts_t o = {.as = as, .device = device};
  uint64_t id = 0;
  if (st_client_pull(c, key, "alpha", &o, &id) == ST_OK) rk_wait_end(c, id, status, len);
  else fprintf(stderr, "   pull %s: %s\n", key, st_client_error(c));
  if (strcmp(status, "completed")) {
    st_result_t *info = NULL;
    if (id && st_client_task_status(c, id, &info) == ST_OK) {
      const st_value_t *m = st_value_get(st_value_get(st_result_value(info), "error"), "message");
      fprintf(stderr, "   pull %s to %s: %s\n", key, device,
              m && m->kind == ST_VALUE_STRING ? m->as.str.ptr : status);
      st_result_free(info);
    }
  }
  st_client_close(c);
  return status;
}

TEST(cuda_to_cuda_staged_over_ucx) {
  CHECK(rk_put_on(ALPHA.socket, "w/gpu", 3, "cuda", fill_cuda) >= 1);
  int64_t used0 = server_info_int(&BETA, "memory.cuda:0.used_bytes");
  char status[64];
  CHECK_STR_EQ(pull_to("w/gpu", "w/gpu", "cuda:0", status, sizeof status), "completed");
  CHECK(rk_holds_on(BETA.socket, "w/gpu", 0, 3, ST_DEVICE_CUDA));
  int64_t grown = server_info_int(&BETA, "memory.cuda:0.used_bytes") - used0;
  fprintf(stderr, "   beta's CUDA bytes grew by %lld for %zu bytes of tensors\n",
          (long long)grown, RK_SIZES[0] + RK_SIZES[1] + RK_SIZES[2]);
  CHECK(grown >= (int64_t)(RK_SIZES[0] + RK_SIZES[1] + RK_SIZES[2]) &&
        grown <= (int64_t)(RK_SIZES[0] + RK_SIZES[1] + RK_SIZES[2]) + 3 * 2 * (int64_t)RK_MIB);
}

TEST(cuda_to_cpu) {
  char status[64];
  CHECK_STR_EQ(pull_to("w/gpu", "w/gpu-on-cpu", "cpu", status, sizeof status), "completed");
  CHECK(rk_holds_on(BETA.socket, "w/gpu-on-cpu", 0, 3, ST_DEVICE_CPU));
}

TEST(cpu_to_cuda) {
  CHECK(rk_put(ALPHA.socket, "w/cpu", 5) >= 1);
  char status[64];
  CHECK_STR_EQ(pull_to("w/cpu", "w/cpu-on-gpu", "cuda:0", status, sizeof status), "completed");
  CHECK(rk_holds_on(BETA.socket, "w/cpu-on-gpu", 0, 5, ST_DEVICE_CUDA));
  /* Nothing left running on either side. */
  CHECK(server_wait_info(&BETA, "transfers.pulls", 0));
  CHECK(server_wait_info(&ALPHA, "transfers.lends", 0));
}

/* Fills every byte of the CUDA tensors of live key handle k with `b`. */
static int fill_key(st_key_t *k, uint8_t b) {
  st_result_t *r = st_key_result(k);
  for (size_t i = 0; i < st_result_tensor_count(r); i++) {
    const st_tensor_t *t = st_result_tensor(r, i);
    size_t n = (size_t)t->shape[0];
    uint8_t *h = malloc(n);
    if (!h) return -1;
    memset(h, b, n);
    char err[256];
    int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, n, t->device_index, err,
                                     sizeof err);
    free(h);
    if (rc != ST_OK) return -1;
  }
  return 0;
}

/* Alpha's CUDA live key `key` pulled live to cuda:0 on beta follows 20
 * updates, every byte checked. */
static void follow_cuda_live(const char *key) {
  st_client_t *pub = NULL, *c = NULL;
  char err[256];
  CHECK(st_client_connect(ALPHA.socket, &pub, err, sizeof err) == ST_OK);
  CHECK(st_client_connect(BETA.socket, &c, err, sizeof err) == ST_OK);
  if (!pub || !c) return;
  st_result_t *mem = NULL;
  int64_t n = 4 * RK_MIB;
  st_args_t *a = st_args_new();
  uint64_t v = 0;
  CHECK(st_tensor_alloc("cuda", ST_DTYPE_UINT8, 1, &n, &mem, err, sizeof err) == ST_OK);
  CHECK(mem && st_args_tensor(a, "w", st_result_tensor(mem, 0), err, sizeof err) == ST_OK);
  CHECK_EQ_INT(st_client_put(pub, key, a, ST_KEY_PINNED, ST_PUT_LIVE, &v), ST_OK);
  st_args_free(a);
  st_key_t *k = NULL;
  CHECK_EQ_INT(st_key_open(pub, key, 0, &k), ST_OK);
  if (!k) return;
  st_pull_opts_t o = {.live = 1, .device = "cuda:0"};
  uint64_t id = 0;
  char status[64];
  CHECK_EQ_INT(st_client_pull(c, key, "alpha", &o, &id), ST_OK);
  CHECK_STR_EQ(rk_wait_end(c, id, status, sizeof status), "completed");
  st_key_t *mine = NULL;
  CHECK_EQ_INT(st_key_open(c, key, 0, &mine), ST_OK);
  for (int i = 2; i <= 21; i++) {
    CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
    CHECK_EQ_INT(fill_key(k, (uint8_t)i), 0);
    CHECK_EQ_INT(st_key_end_update(k, NULL), ST_OK);
  }
  uint64_t got = 0;
  if (mine) {
    CHECK_EQ_INT(st_key_wait_version(mine, 21, 60000, &got), ST_OK);
    CHECK_EQ_INT(got, 21);
    const st_tensor_t *t = st_result_tensor(st_key_result(mine), 0);
    CHECK(t && t->device == ST_DEVICE_CUDA);
    uint8_t *h = malloc((size_t)n);
    CHECK(h && st_tensor_copy_to_host(t, h, (size_t)n) == ST_OK);
    size_t bad = 0;
    for (int64_t i = 0; h && i < n; i++) bad += h[i] != 21;
    CHECK_EQ_INT(bad, 0);
    free(h);
    st_key_close(mine);
  }
  st_key_close(k);
  st_result_free(mem);
  st_client_close(c);
  st_client_close(pub);
}

TEST(a_cuda_live_key_followed_on_the_device) { follow_cuda_live("w/gpu-live"); }

/* peer.live_reads = "staged": each version copied on alpha's device
 * (cuMemcpyDtoD) before it moves, the same bytes arrive. */
TEST(a_staged_cuda_live_key_followed_on_the_device) {
  CHECK_EQ_INT(rk_stop(), 0);
  CHECK_EQ_INT(rk_start_with(512ull * RK_MIB,
                             ", nccl_library = '/nonexistent/libnccl.so.2', live_reads = 'staged'"),
               0);
  follow_cuda_live("w/gpu-staged");
  CHECK(server_info_int(&ALPHA, "transfers.lends_staged") >= 1);
}

int main(void) {
  gk_require_device();
  rk_main_start_with(", nccl_library = '/nonexistent/libnccl.so.2'");
  RUN(cuda_to_cuda_staged_over_ucx);
  RUN(cuda_to_cpu);
  RUN(cpu_to_cuda);
  RUN(a_cuda_live_key_followed_on_the_device);
  RUN(a_staged_cuda_live_key_followed_on_the_device);
  return rk_main_end();
}
