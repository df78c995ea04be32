/* The zero fill of recycled pool regions (docs/pool.md, section 1) on the
 * CPU, through libstclient against a real stserver: a maker that writes
 * every byte (ones, full, arange, rand, randn, clone, a cast) gets a
 * recycled region without the fill, and does write every byte; zeros and
 * empty always read as zeros, in a region that held other bytes
 * (pool_kit.h; test_gpu_pool.c runs the same on a CUDA device). */
#include <st/client.h>

#include "client_kit.h"
#include "fixture.h"
#include "pool_kit.h"

static stt_server_t srv;

static const stt_endpoint_t endpoints[] = {{"make.lua", PK_MAKE}, {NULL, NULL}};

int main(void) {
  stt_server_setup(&srv, "workers = 1, pool = { slab_bytes = 65536 },", endpoints);
  pk_socket = srv.socket;
  PK_RUN_FILL_TESTS();
  return stt_server_finish(&srv);
}
