/* What a put checks of a CUDA descriptor, and the releases the loop hands
 * off (docs/keys.md, section 1, "Cost"; mem/arena_release.h), against a
 * real stserver on any host (the CUDA path: test_gpu_keys.c):
 *   - a put whose "vmm" arena is no exported CUDA allocation (a memfd, a
 *     pipe, a socket, another character device) is refused at the put
 *     with INVALID_ARGUMENT "not an exported CUDA allocation" and what
 *     the descriptor is: an fstat decides, before anything asks for a
 *     CUDA driver (a host without one refused it as CAPABILITY before);
 *     no key is made and the server keeps none of the descriptors;
 *   - a key of big memfd allocations the publisher freed (so that the
 *     key holds the last references) deleted, or its version pushed out
 *     by a later put (keys.max_versions = 2): the loop hands their final
 *     release to the releaser (info arenas.released_off_loop counts
 *     them), and info's figures are settled: right after it, without
 *     polling, the server's descriptors, arenas and budget are back at
 *     the start.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handoff_kit.h"
#include "wire.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

#define UUID "GPU-12345678-9abc-def0-1234-56789abcdef0"
#define TWO_MIB (2ull << 20)

/* A raw put of key = {w: 16 float32} on a "vmm" arena whose descriptor is
 * fd (closed here); the reply in *m. 1 on a reply. */
static int raw_vmm_put(rc_t *c, const char *key, int fd, msg_t *m) {
  int fds[1] = {fd};
  return rc_rpcf_fds(c, m, fds, 1,
                     "[0, 1, 'put', [{key: '%s', value: {w: tensor(0, 0, 'float32', [16], [1])}, "
                     "arenas: [{fd: 0, bytes: %llu, device: 'cuda', uuid: '" UUID "', "
                     "backend: 'vmm', id: 77}]}]]",
                     key, (unsigned long long)TWO_MIB);
}

/* Puts key with a vmm arena of descriptor fd (closed here) and checks the
 * refusal names `what`. */
static void refused_at_put(const char *key, int fd, const char *what) {
  OPEN_RC(c, srv.socket);
  msg_t m;
  CHECK(raw_vmm_put(&c, key, fd, &m) == 1);
  CHECK_REPLY(&m, ST_ERR_INVALID_ARGUMENT, "not an exported CUDA allocation");
  CHECK_REPLY(&m, ST_ERR_INVALID_ARGUMENT, what);
  msg_free(&m);
  rc_close(&c);
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, key, 0, 0, &r, NULL), ST_ERR_NOT_FOUND, cli);
}

TEST(a_descriptor_that_is_no_cuda_allocation_is_refused_at_put) {
  int fd = memfd_create("not-cuda", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CHECK(fd >= 0 && ftruncate(fd, (off_t)TWO_MIB) == 0);
  refused_at_put("nc/memfd", fd, "the descriptor is a regular file");
  int p[2];
  CHECK_EQ_INT(pipe(p), 0);
  refused_at_put("nc/pipe", p[0], "the descriptor is a pipe");
  close(p[1]);
  int sv[2];
  CHECK_EQ_INT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  refused_at_put("nc/socket", sv[0], "the descriptor is a socket");
  close(sv[1]);
  /* A character device, but not the NVIDIA control device (1:3). */
  fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  CHECK(fd >= 0);
  refused_at_put("nc/null", fd, "the descriptor is the character device 1:3");
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* info's arenas.released_off_loop. */
static int64_t released(void) { return hk_info(cli, "arenas", "released_off_loop", NULL); }

/* Right now (info settles first): the server's figures are the start's. */
static int settled_at_baseline(void) {
  int64_t pending = hk_info(cli, "arenas", "releasing", NULL);
  hk_figures_t f = hk_figures(cli, srv.pid, "cpu");
  if (pending == 0 && f.fds == baseline.fds && f.used == baseline.used &&
      f.arenas == baseline.arenas)
    return 1;
  fprintf(stderr, "   releasing %lld; fds %lld (want %lld), used %lld (%lld), arenas %lld (%lld)\n",
          (long long)pending, (long long)f.fds, (long long)baseline.fds, (long long)f.used,
          (long long)baseline.used, (long long)f.arenas, (long long)baseline.arenas);
  return 0;
}

/* A put of key = {a, b}: two fresh 2 MiB memfd allocations of
 * st_tensor_alloc (the caller frees *out). The version or 0. */
static uint64_t put_two(const char *key, st_result_t *out[2]) {
  int64_t n = (int64_t)(TWO_MIB / sizeof(float));
  char err[256];
  st_args_t *a = st_args_new();
  uint64_t version = 0;
  int rc = ST_OK;
  for (int i = 0; i < 2 && rc == ST_OK; i++) {
    rc = st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &out[i], err, sizeof err);
    if (rc == ST_OK) rc = st_args_tensor(a, i ? "b" : "a", st_result_tensor(out[i], 0), err,
                                         sizeof err);
  }
  if (rc == ST_OK) rc = st_client_put(cli, key, a, ST_KEY_PINNED, 0, &version);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s %s\n", key, err, st_client_error(cli));
  st_args_free(a);
  return rc == ST_OK ? version : 0;
}

TEST(big_releases_leave_the_loop_and_info_is_settled) {
  int64_t r0 = released();
  CHECK(r0 >= 0);
  st_result_t *t[6] = {0};
  CHECK_EQ_INT(put_two("rel/a", &t[0]), 1);
  /* Freed here: the connection's argument cache forgets them with the next
   * request, and the key's version holds the last references. */
  st_result_free(t[0]);
  st_result_free(t[1]);
  CHECK_EQ_INT(put_two("rel/a", &t[2]), 2);
  CHECK_EQ_INT(released(), r0);   /* nothing dropped yet */
  /* A third version pushes the first out (max_versions = 2): its two
   * arenas' last references go on the loop. */
  CHECK_EQ_INT(put_two("rel/a", &t[4]), 3);
  CHECK_EQ_INT(released(), r0 + 2);
  CHECK_EQ_INT(hk_info(cli, "arenas", "releasing", NULL), 0);
  for (int i = 2; i < 6; i++) st_result_free(t[i]);
  CHECK_RC(st_client_delete(cli, "rel/a"), ST_OK, cli);   /* with the forgets */
  CHECK(settled_at_baseline());
  CHECK_EQ_INT(released(), r0 + 6);
}

int main(void) {
  cli = hk_start(&srv,
                 "memory_budget = { cpu = 64 * 1024 * 1024 }, keys = { max_versions = 2 }, "
                 "pool = { max_regions = 0 },",
                 NULL, &baseline);
  RUN(a_descriptor_that_is_no_cuda_allocation_is_refused_at_put);
  RUN(big_releases_leave_the_loop_and_info_is_settled);
  return stt_client_finish(cli, &srv);
}
