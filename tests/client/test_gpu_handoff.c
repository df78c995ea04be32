/* Hand-offs of CUDA memory (one VMM allocation) between processes through
 * a real stserver (docs/pool.md, section 5; the CPU path and the refusals
 * are test_handoff.c):
 *   - 200 requests of 4 MiB to 2 consumer processes (programs of their
 *     own: this one run again) through 3 chunks, each checked on the host
 *     after a synchronous copy, then acknowledged;
 *   - a consumer SIGKILLed holding a chunk has its acknowledgement made;
 *   - afterwards the server's cuda:0 budget, descriptors and arenas and
 *     the device's free memory are back to their start (within one
 *     allocation granule).
 * Exit 77 without a CUDA device. */
#include "handoff_kit.h"
#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA

#include "client_kit.h"
#include "../server/gpu_kit.h"

#define CHUNK (4u << 20)

static stt_server_t srv;
static st_client_t *cli;
static const char *self;

static int to_host(void *dst, const void *src, uint64_t n, int ordinal) {
  return st__cuda_copy_to_host(dst, (uint64_t)(uintptr_t)src, n, ordinal, NULL, 0);
}

TEST(requests_of_4_mib_flow_and_device_memory_comes_back) {
  hk_figures_t start = hk_figures(cli, srv.pid, "cuda:0");
  CHECK(stt_client_settle(cli));
  uint64_t free0 = gk_free();
  st_handoff_t *p = NULL;
  CHECK_RC(st_handoff_create(cli, "gpu", "cuda:0", CHUNK, 3, 2, &p), ST_OK, cli);
  int dev = -2;
  CHECK_EQ_INT(st_handoff_shape(p, NULL, NULL, NULL, NULL, &dev), ST_OK);
  CHECK_EQ_INT(dev, 0);
  hk_consumer_t k[2];
  CHECK(hk_spawn_exec(&k[0], srv.socket, "gpu", to_host, self) == 0);
  CHECK(hk_spawn_exec(&k[1], srv.socket, "gpu", to_host, self) == 0);
  unsigned char *host = malloc(CHUNK);
  CHECK(host);
  for (int i = 0; i < 200; i++) {
    int chunk;
    void *data;
    uint64_t seq, bytes = CHUNK - (uint64_t)(i % 7) * 4096;
    CHECK_ERR_MSG(st_handoff_acquire(p, 10000, &chunk, &data), ST_OK, st_handoff_error(p));
    hk_fill(host, bytes, (uint64_t)i);
    /* a synchronous copy: the writes are complete before the publish */
    CHECK_EQ_INT(st__cuda_copy_to_device((uint64_t)(uintptr_t)data, host, bytes, 0, NULL, 0),
                 ST_OK);
    CHECK_EQ_INT(st_handoff_publish(p, chunk, bytes, &seq), ST_OK);
    uint64_t sum = hk_sum(host, bytes);
    for (int j = 0; j < 2; j++) {
      CHECK_EQ_INT(hk_do(&k[j], HK_TAKE, chunk, seq, sum, bytes), ST_OK);
      CHECK_EQ_INT(hk_do(&k[j], HK_ACK, chunk, seq, 0, 0), ST_OK);
    }
  }
  /* k[1] takes a chunk and dies before acknowledging it */
  int chunk;
  void *data;
  uint64_t seq;
  CHECK_EQ_INT(st_handoff_acquire(p, 10000, &chunk, &data), ST_OK);
  CHECK_EQ_INT(st_handoff_publish(p, chunk, 0, &seq), ST_OK);
  CHECK_EQ_INT(hk_do(&k[0], HK_ACK, chunk, seq, 0, 0), ST_OK);
  CHECK_EQ_INT(hk_do(&k[1], HK_TAKE, chunk, seq, hk_sum(host, 0), 0), ST_OK);
  hk_end(&k[1], 1);
  for (int n = 0; n < 3; n++) {   /* every chunk comes free, that one too */
    int c;
    CHECK_ERR_MSG(st_handoff_acquire(p, 10000, &c, NULL), ST_OK, st_handoff_error(p));
  }
  hk_end(&k[0], 0);
  free(host);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cuda:0", start));
  CHECK(gk_wait_back_to(free0, 10000) == 0);
}

#endif

int main(int argc, char **argv) {
#ifdef ST_HAVE_CUDA
  hk_consumer_main(argc, argv, to_host);
  self = argv[0];
  cli = hk_gpu_start(&srv);
  if (!cli) return 1;
  RUN(requests_of_4_mib_flow_and_device_memory_comes_back);
  return stt_client_finish(cli, &srv);
#else
  (void)argc;
  (void)argv;
  stt_skip("no CUDA device: built without CUDA support");
  return stt_summary();
#endif
}
