/* The argument cache of CUDA tensor arguments (VMM) through libstclient
 * against a real stserver (docs/pool.md, section 4), with
 * limits.max_cached_arguments = 2:
 *   - a device tensor passed again goes without its descriptor
 *     (fds_received does not move, the server's arena count neither) and
 *     the endpoint reads what the caller wrote since; the endpoint's
 *     in-place writes are the caller's;
 *   - past the bound the library resends by itself: every call works;
 *   - once the client frees its allocations and makes one more request,
 *     or closes its connection, device memory is back to its baseline.
 * The CPU path: tests/client/test_argcache.c. Exit 77 without a CUDA
 * device. */
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "argcache_kit.h"
#include "fixture.h"
#include "mem/cuda.h"

#include "client_kit.h"
#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define MiB (1024ull * 1024ull)

static const char ep_add[] =
    "return st.endpoint{ name = \"add\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float32\", device = \"cuda\" }, k = 0 },\n"
    "  build = function(a) local v = a.x:get(0); a.x:add_(a.k); return v end }\n";

static stt_server_t srv;
static st_client_t *cli;

/* Writes v into element 0 of t (device memory). */
static int set_first(const st_tensor_t *t, float v) {
  char err[256];
  int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, &v, sizeof v, t->device_index,
                                   err, sizeof err);
  if (rc != ST_OK) fprintf(stderr, "   copy: %s\n", err);
  return rc;
}

/* A CUDA float32 tensor of n elements whose first is v, or NULL. */
static st_result_t *cuda_of(int64_t n, float v) {
  st_result_t *r = stt_tensor_alloc_1d("cuda:0", ST_DTYPE_FLOAT32, n);
  if (!r) return NULL;
  if (set_first(st_result_tensor(r, 0), v) != ST_OK) {
    st_result_free(r);
    return NULL;
  }
  return r;
}

TEST(a_device_tensor_passed_again_goes_without_its_descriptor) {
  CHECK(stt_client_settle(cli));
  uint64_t base = gk_free();
  int64_t arenas = ak_info_int(cli, "arenas", "count");
  st_result_t *x = cuda_of((int64_t)(16 * MiB / sizeof(float)), 1.0f);
  CHECK(x);
  const st_tensor_t *t = st_result_tensor(x, 0);
  int64_t received = ak_info_int(cli, "counters", "fds_received");
  CHECK(ak_add(cli, x, 10) == 1.0);
  CHECK(st_tensor_get(t, 0) == 11.0);                 /* the endpoint's write */
  CHECK_EQ_INT(set_first(t, 5.0f), ST_OK);            /* the caller's write */
  CHECK(ak_add(cli, x, 1) == 5.0);
  CHECK(ak_add(cli, x, 1) == 6.0);
  CHECK(st_tensor_get(t, 0) == 7.0);
  CHECK_EQ_INT(ak_info_int(cli, "counters", "fds_received"), received + 1);
  CHECK_EQ_INT(ak_info_int(cli, "arenas", "count"), arenas + 1);   /* imported once, kept */
  st_result_free(x);
  double rtt;
  CHECK_RC(st_client_ping(cli, &rtt), ST_OK, cli);     /* carries forget */
  CHECK_EQ_INT(ak_info_int(cli, "arenas", "count"), arenas);
  CHECK(gk_wait_back_to(base, 10000) == 0);
}

TEST(past_the_bound_and_after_close_nothing_stays) {
  CHECK(stt_client_settle(cli));
  uint64_t base = gk_free();
  OPEN_CLIENT(other, srv.socket);
  st_client_set_timeout(other, 60000);
  st_result_t *t[3] = {cuda_of(1024, 10.0f), cuda_of(1024, 20.0f), cuda_of(1024, 30.0f)};
  CHECK(t[0] && t[1] && t[2]);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 3; i++) CHECK(ak_add(other, t[i], 0) == 10.0 * (i + 1));
  for (int i = 0; i < 3; i++) st_result_free(t[i]);
  st_client_close(other);   /* no forget sent: closing drops the entries */
  CHECK(gk_wait_back_to(base, 10000) == 0);
}

#endif

int main(void) {
  gk_require_device();
#ifdef ST_HAVE_CUDA
  stt_server_setup(&srv, "workers = 1, limits = { max_cached_arguments = 2 },",
                   (const stt_endpoint_t[]){{"add.lua", ep_add}, {NULL, NULL}});
  cli = stt_client_open(srv.socket);
  if (!cli) return 1;
  st_client_set_timeout(cli, 60000);
  /* A first call creates the worker's context and stream before any
   * baseline; its tensor is freed and forgotten. */
  st_result_t *warm = cuda_of(16, 0.0f);
  if (!warm || ak_add(cli, warm, 0) != 0.0) stt_failed++;
  st_result_free(warm);
  double rtt;
  st_client_ping(cli, &rtt);
  RUN(a_device_tensor_passed_again_goes_without_its_descriptor);
  RUN(past_the_bound_and_after_close_nothing_stays);
  return stt_client_finish(cli, &srv);
#endif
  return stt_summary();
}
