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
 *     servers' transfer counts are back to none running. */
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

int main(void) {
  gk_require_device();
  rk_main_start_with(", nccl_library = '/nonexistent/libnccl.so.2'");
  RUN(cuda_to_cuda_staged_over_ucx);
  RUN(cuda_to_cpu);
  RUN(cpu_to_cuda);
  return rk_main_end();
}
