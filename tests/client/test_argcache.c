/* The argument cache of tensor arguments through libstclient against a real
 * stserver (docs/pool.md, section 4; CPU memory, the CUDA path is
 * tests/client/test_gpu_argcache.c), with limits.max_cached_arguments = 2:
 *   - a tensor passed again goes without its descriptor (fds_received
 *     does not move) and the endpoint reads what the caller wrote since;
 *     the endpoint's writes are the caller's;
 *   - freeing the allocation tells the server with the next request (a
 *     ping here): its arena count is back;
 *   - past the bound the server drops the least recently used entry and
 *     the library sends the descriptor again by itself: every call works;
 *   - closing a connection drops what it kept.
 */
#include <st/client.h>
#include <string.h>

#include "argcache_kit.h"
#include "fixture.h"

static stt_server_t srv;
static st_client_t *cli;

static const char ep_add[] =
    "return st.endpoint{ name = \"add\", params = { x = st.tensor_param{ dtype = \"float32\" },\n"
    "  k = 0 }, build = function(a) local v = a.x:get(0); a.x:add_(a.k); return v end }\n";

static int64_t fds_received(void) { return ak_info_int(cli, "counters", "fds_received"); }
static int64_t arenas(void) { return ak_info_int(cli, "arenas", "count"); }

/* A float32[4] from st_tensor_alloc whose first element is v. */
static st_result_t *tensor_of(float v) {
  st_result_t *r = NULL;
  char err[256];
  int64_t n[1] = {4};
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "st_tensor_alloc: %s\n", err);
    return NULL;
  }
  ((float *)st_result_tensor(r, 0)->data)[0] = v;
  return r;
}

static float first(st_result_t *t) { return ((float *)st_result_tensor(t, 0)->data)[0]; }

TEST(a_tensor_passed_again_goes_without_its_descriptor) {
  int64_t base = arenas();
  st_result_t *x = tensor_of(1.0f);
  CHECK(x);
  int64_t before = fds_received();
  CHECK(ak_add(cli, x, 10) == 1.0);
  CHECK(first(x) == 11.0f);                            /* the endpoint's write */
  CHECK_EQ_INT(fds_received(), before + 1);
  ((float *)st_result_tensor(x, 0)->data)[0] = 5.0f;   /* the caller's write */
  CHECK(ak_add(cli, x, 1) == 5.0);
  CHECK(first(x) == 6.0f);
  CHECK(ak_add(cli, x, 1) == 6.0);
  CHECK_EQ_INT(fds_received(), before + 1);            /* none sent again */
  CHECK_EQ_INT(arenas(), base + 1);                    /* imported once, kept */
  st_result_free(x);                                   /* forget rides on ... */
  double rtt;
  CHECK_RC(st_client_ping(cli, &rtt), ST_OK, cli);     /* ... the next request */
  CHECK_EQ_INT(arenas(), base);
}

TEST(past_the_bound_the_library_resends_by_itself) {
  int64_t base = arenas();
  st_result_t *t[3] = {tensor_of(10.0f), tensor_of(20.0f), tensor_of(30.0f)};
  CHECK(t[0] && t[1] && t[2]);
  int64_t before = fds_received();
  /* three allocations in turn through a cache of two: every use after
   * the first round finds its entry evicted */
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 3; i++) CHECK(ak_add(cli, t[i], 0) == 10.0 * (i + 1));
  CHECK_EQ_INT(fds_received(), before + 9);
  CHECK_EQ_INT(arenas(), base + 2);
  /* two of them fit: used again, they go without descriptors */
  before = fds_received();
  for (int round = 0; round < 3; round++)
    for (int i = 1; i < 3; i++) CHECK(ak_add(cli, t[i], 0) == 10.0 * (i + 1));
  CHECK_EQ_INT(fds_received(), before);   /* t[1] and t[2] were the last two sent */
  for (int i = 0; i < 3; i++) st_result_free(t[i]);
  double rtt;
  CHECK_RC(st_client_ping(cli, &rtt), ST_OK, cli);
  CHECK_EQ_INT(arenas(), base);
}

TEST(closing_a_connection_drops_what_it_kept) {
  int64_t base = arenas();
  OPEN_CLIENT(other, srv.socket);
  st_result_t *x = tensor_of(2.0f);
  CHECK(x && ak_add(other, x, 0) == 2.0 && ak_add(other, x, 0) == 2.0);
  CHECK_EQ_INT(arenas(), base + 1);
  st_client_close(other);
  double end = stt_now_ms() + 5000;
  while (arenas() != base && stt_now_ms() < end) stt_sleep_ms(5);
  CHECK_EQ_INT(arenas(), base);
  /* the allocation itself is the caller's, and still works elsewhere */
  CHECK(ak_add(cli, x, 1) == 2.0 && first(x) == 3.0f);
  st_result_free(x);
}

static const stt_endpoint_t endpoints[] = {{"add.lua", ep_add}, {NULL, NULL}};

int main(void) {
  /* The counts below are of the arguments' arenas: results of their own,
   * not regions of a result pool (whose slab and page are arenas too;
   * test_pool.c). */
  setenv("ST_CLIENT_POOL", "0", 1);
  cli = stt_serve_client(&srv, "limits = { max_cached_arguments = 2 },", endpoints);
  RUN(a_tensor_passed_again_goes_without_its_descriptor);
  RUN(past_the_bound_the_library_resends_by_itself);
  RUN(closing_a_connection_drops_what_it_kept);
  return stt_client_finish(cli, &srv);
}
