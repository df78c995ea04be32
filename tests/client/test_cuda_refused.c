/* A reply carrying CUDA memory, received by a process that cannot map it:
 * the call fails with CAPABILITY "no CUDA device: <reason> (arena N is on
 * GPU-...)", before anything is imported, and leaves nothing behind (no
 * descriptor, no mapping, the connection usable). Runs on every host: the
 * process hides all GPUs with CUDA_VISIBLE_DEVICES= before CUDA is first
 * touched, so a GPU host answers like a host without a driver. The
 * descriptors are memfds, which the client must never get as far as
 * importing. */
#include <st/client.h>
#include <stdlib.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"

#define UUID "GPU-12345678-9abc-def0-1234-56789abcdef0"

static fake_server_t fs;

#define T4(a) "tensor(" #a ", 0, 'float32', [4], [1])"
#define CUDA_ARENA(fd, id)                                                                \
  "{fd: " #fd ", bytes: 2097152, device: 'cuda', uuid: '" UUID "', backend: 'vmm', id: " #id \
  "}"

/* The reply of each endpoint: its result (stt_pack text), and whether a
 * CPU memfd comes before the CUDA arena's descriptor (-1: no descriptor). */
static const struct {
  const char *endpoint, *result;
  int cpu_first;
} replies[] = {
    /* A CPU arena first (it gets mapped), then the CUDA one. */
    {"mixed", "{value: [" T4(0) ", " T4(1) "], arenas: [{fd: 0, bytes: 4096, device: 'cpu', "
              "backend: 'memfd', id: 600}, " CUDA_ARENA(1, 601) "]}", 1},
    /* A legacy CUDA IPC arena: a handle, no descriptor. */
    {"legacy", "{value: " T4(0) ", arenas: [{bytes: 2097152, device: 'cuda', uuid: '" UUID "', "
               "backend: 'legacy', id: 500, ipc_handle: bin(64, 1, 2, 3), device_index: 0, "
               "storage_bytes: 16}]}", -1},
    {"one", "{value: " T4(0) ", arenas: [" CUDA_ARENA(0, 500) "]}", 0},
};

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  size_t k = 0;
  while (k + 1 < sizeof replies / sizeof replies[0] && strcmp(ep, replies[k].endpoint) != 0) k++;
  static const float data[4] = {1, 2, 3, 4};
  int fds[2], nfds = 0;
  if (replies[k].cpu_first == 1) fds[nfds++] = fake_memfd(4096, data, sizeof data, 1);
  if (replies[k].cpu_first >= 0) fds[nfds++] = fake_memfd(2u << 20, NULL, 0, 1);
  int rc = fake_replyf(conn, id, fds, nfds, "%s", replies[k].result);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  return rc;
}

/* Replies the client must refuse with CAPABILITY before it imports
 * anything: the endpoint, how the message starts (NULL: any) and a part
 * of it. A legacy CUDA IPC arena (no descriptor) is for PyTorch. */
static const struct refusal {
  const char *endpoint, *start, *part;
} refusals[] = {
    {"one", "no CUDA device: ", "arena 500 is on " UUID},
    {"mixed", NULL, "arena 601 is on " UUID},
    {"legacy", NULL, "legacy CUDA IPC arenas are for PyTorch's rebuild_cuda_tensor; use ipc = vmm"},
};

/* A call of `endpoint` is refused as the row says. */
static void expect_refusal(st_client_t *c, const struct refusal *f) {
  st_result_t *r = NULL;
  int rc = st_client_call(c, f->endpoint, NULL, &r);
  fprintf(stderr, "   %s: %s\n", f->endpoint, st_client_error(c));
  CHECK_RC(rc, ST_ERR_CAPABILITY, c);
  CHECK(r == NULL);
  CHECK_STR_EQ(st_client_error_name(c), "CAPABILITY");
  if (f->start) CHECK(strncmp(st_client_error(c), f->start, strlen(f->start)) == 0);
  CHECK_CONTAINS(st_client_error(c), f->part);
}

/* Each refusal leaves no descriptor and no mapping behind, and the
 * connection is fine: a second refusal says the same. */
TEST(cuda_replies_without_a_device_are_capability) {
  for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++) {
    CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
    int fds0 = fake_count_fds();
    size_t mapped0, mapped;
    st_open_cache_stats(&mapped0, NULL);
    OPEN_CLIENT(c, fs.path);
    expect_refusal(c, &refusals[i]);
    st_open_cache_stats(&mapped, NULL);
    CHECK_EQ_INT(mapped, mapped0);
    double rtt;
    CHECK_RC(st_client_ping(c, &rtt), ST_OK, c);
    expect_refusal(c, &refusals[i]);
    st_client_close(c);
    CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
    CHECK_EQ_INT(fake_count_fds(), fds0);
  }
}

int main(void) {
  /* Before anything touches CUDA: no device is visible to this process. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  fs.on_request = on_request;
  fake_start(&fs);
  /* A first refusal loads the CUDA runtime, which may keep descriptors of
   * its own open for the life of the process: count after it. */
  st_client_t *c = stt_client_open(fs.path);
  st_result_t *r = NULL;
  if (!c || st_client_call(c, "one", NULL, &r) != ST_ERR_CAPABILITY) {
    fprintf(stderr, "warm-up call did not fail with CAPABILITY\n");
    return 1;
  }
  st_client_close(c);
  RUN(cuda_replies_without_a_device_are_capability);
  fake_stop(&fs);
  return stt_summary();
}
