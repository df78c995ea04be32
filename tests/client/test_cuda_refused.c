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
#include "fake_server.h"

#define UUID "GPU-12345678-9abc-def0-1234-56789abcdef0"

static fake_server_t fs;

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  if (strcmp(method, "call") != 0) return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
  char ep[64];
  fake_param_str(params, "endpoint", ep, sizeof ep);
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  int64_t shape[1] = {4}, stride[1] = {1};
  static const float data[4] = {1, 2, 3, 4};
  int fds[2] = {fake_memfd(2u << 20, NULL, 0, 1), -1}, nfds = 1;
  msgpack_pack_map(&pk, 2);
  fake_pack_str(&pk, "value");
  if (strcmp(ep, "mixed") == 0) {
    /* A CPU arena first (it gets mapped), then the CUDA one. */
    fds[1] = fds[0];
    fds[0] = fake_memfd(4096, data, sizeof data, 1);
    nfds = 2;
    msgpack_pack_array(&pk, 2);
    fake_pack_tensor(&pk, 0, 0, "float32", 1, shape, stride);
    fake_pack_tensor(&pk, 1, 0, "float32", 1, shape, stride);
    fake_pack_str(&pk, "arenas");
    msgpack_pack_array(&pk, 2);
    fake_pack_arena_full(&pk, 0, 4096, "cpu", "", "memfd", 600);
    fake_pack_arena_full(&pk, 1, 2u << 20, "cuda", UUID, "vmm", 601);
  } else if (strcmp(ep, "legacy") == 0) {
    /* A legacy CUDA IPC arena: a handle, no descriptor. */
    close(fds[0]);
    nfds = 0;
    fake_pack_tensor(&pk, 0, 0, "float32", 1, shape, stride);
    fake_pack_str(&pk, "arenas");
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 8);
    fake_pack_str(&pk, "bytes");
    msgpack_pack_uint64(&pk, 2u << 20);
    fake_pack_str(&pk, "device");
    fake_pack_str(&pk, "cuda");
    fake_pack_str(&pk, "uuid");
    fake_pack_str(&pk, UUID);
    fake_pack_str(&pk, "backend");
    fake_pack_str(&pk, "legacy");
    fake_pack_str(&pk, "id");
    msgpack_pack_uint64(&pk, 500);
    static const unsigned char handle[64] = {1, 2, 3};
    fake_pack_str(&pk, "ipc_handle");
    msgpack_pack_bin(&pk, sizeof handle);
    msgpack_pack_bin_body(&pk, handle, sizeof handle);
    fake_pack_str(&pk, "device_index");
    msgpack_pack_uint32(&pk, 0);
    fake_pack_str(&pk, "storage_bytes");
    msgpack_pack_uint64(&pk, 16);
  } else {
    fake_pack_tensor(&pk, 0, 0, "float32", 1, shape, stride);
    fake_pack_str(&pk, "arenas");
    msgpack_pack_array(&pk, 1);
    fake_pack_arena_full(&pk, 0, 2u << 20, "cuda", UUID, "vmm", 500);
  }
  int rc = fake_reply(conn, id, &sb, fds, nfds);
  for (int i = 0; i < nfds; i++) close(fds[i]);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

static st_client_t *connect_fake(void) {
  char err[256];
  st_client_t *c = NULL;
  if (st_client_connect(fs.path, &c, err, sizeof err) != ST_OK)
    fprintf(stderr, "connect: %s\n", err);
  return c;
}

TEST(cuda_reply_without_a_device_is_capability) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  int fds0 = fake_count_fds();
  size_t mapped0, mapped;
  st_open_cache_stats(&mapped0, NULL);
  st_client_t *c = connect_fake();
  CHECK(c);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_call(c, "one", NULL, &r), ST_ERR_CAPABILITY);
  CHECK(r == NULL);
  fprintf(stderr, "   %s\n", st_client_error(c));
  CHECK_STR_EQ(st_client_error_name(c), "CAPABILITY");
  CHECK(strncmp(st_client_error(c), "no CUDA device: ", 16) == 0);
  CHECK_CONTAINS(st_client_error(c), "arena 500 is on " UUID);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  /* The connection is fine and a second refusal says the same. */
  double rtt;
  CHECK_EQ_INT(st_client_ping(c, &rtt), ST_OK);
  CHECK_EQ_INT(st_client_call(c, "one", NULL, &r), ST_ERR_CAPABILITY);
  CHECK(strncmp(st_client_error(c), "no CUDA device: ", 16) == 0);
  st_client_close(c);
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  CHECK_EQ_INT(fake_count_fds(), fds0);
}

TEST(cpu_arena_of_a_refused_reply_is_unmapped) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  int fds0 = fake_count_fds();
  size_t mapped0, mapped;
  st_open_cache_stats(&mapped0, NULL);
  st_client_t *c = connect_fake();
  CHECK(c);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_call(c, "mixed", NULL, &r), ST_ERR_CAPABILITY);
  CHECK(r == NULL);
  CHECK_CONTAINS(st_client_error(c), "arena 601 is on " UUID);
  st_open_cache_stats(&mapped, NULL);
  CHECK_EQ_INT(mapped, mapped0);
  st_client_close(c);
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  CHECK_EQ_INT(fake_count_fds(), fds0);
}

/* A legacy CUDA IPC arena (no descriptor) is for PyTorch: CAPABILITY. */
TEST(legacy_arena_is_capability) {
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  int fds0 = fake_count_fds();
  st_client_t *c = connect_fake();
  CHECK(c);
  st_result_t *r = NULL;
  int rc = st_client_call(c, "legacy", NULL, &r);
  if (rc != ST_ERR_CAPABILITY) fprintf(stderr, "   %s\n", st_client_error(c));
  CHECK_EQ_INT(rc, ST_ERR_CAPABILITY);
  CHECK(r == NULL);
  CHECK_CONTAINS(st_client_error(c),
                 "legacy CUDA IPC arenas are for PyTorch's rebuild_cuda_tensor; use ipc = vmm");
  st_client_close(c);
  CHECK_EQ_INT(fake_wait_idle(&fs, 2000), 0);
  CHECK_EQ_INT(fake_count_fds(), fds0);
}

int main(void) {
  /* Before anything touches CUDA: no device is visible to this process. */
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  fs.on_request = on_request;
  fake_start(&fs);
  /* A first refusal loads the CUDA runtime, which may keep descriptors of
   * its own open for the life of the process: count after it. */
  st_client_t *c = connect_fake();
  st_result_t *r = NULL;
  if (!c || st_client_call(c, "one", NULL, &r) != ST_ERR_CAPABILITY) {
    fprintf(stderr, "warm-up call did not fail with CAPABILITY\n");
    return 1;
  }
  st_client_close(c);
  RUN(cuda_reply_without_a_device_is_capability);
  RUN(cpu_arena_of_a_refused_reply_is_unmapped);
  RUN(legacy_arena_is_capability);
  fake_stop(&fs);
  return stt_summary();
}
