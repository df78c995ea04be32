/* Result pools shrink with use (docs/pool.md, section 1): through
 * libstclient against a real stserver with pool.idle_s = 0.2 and slabs of
 * 64, 128 and 256 KiB (4 KiB results: 16, 32 and 64 of them):
 *   - a slab with a region the client holds is never retired, however
 *     long the client goes on calling; every held result keeps its bytes;
 *   - once its regions are freed, a slab idle for idle_s is retired while
 *     the client calls: the server's pool bytes and arena count drop, and
 *     the client's mapping of the slab goes (/proc/self/maps); the oldest
 *     slab stays;
 *   - the pool grows again afterwards, its new slabs taking the retired
 *     slabs' indices, with correct results.
 */
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argcache_kit.h"
#include "client_kit.h"
#include "fixture.h"

#define N 1024   /* floats per result: 4 KiB, one page of a slab */
#define KIB 1024

static stt_server_t srv;
static st_client_t *mon;   /* info */

static const stt_endpoint_t endpoints[] = {
    {"fill.lua",
     "return st.endpoint{ name = 'fill', params = { v = 0 },\n"
     "  build = function(a) return st.full{ 1024, value = a.v, dtype = 'float32' } end }\n"},
    {NULL, NULL}};

static int64_t pool_bytes(void) {
  st_result_t *r = NULL;
  if (st_client_info(mon, &r) != ST_OK) return -1;
  const st_value_t *v =
      st_value_get(st_value_get(st_value_get(st_result_value(r), "memory"), "cpu"), "pool_bytes");
  int64_t n = v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
  st_result_free(r);
  return n;
}

/* The server's memfd arenas this process maps that are at least a slab
 * (the control page is 8 KiB; results are regions, not mappings). */
static int slab_maps(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return -1;
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && strstr(line, "/memfd:st-arena-") &&
        hi - lo >= 64 * KIB)
      n++;
  }
  fclose(f);
  return n;
}

static st_result_t *fill(st_client_t *c, float v) {
  st_args_t *a = st_args_new();
  st_args_int(a, "v", (int64_t)v);
  st_result_t *r = NULL;
  int rc = st_client_call(c, "fill", a, &r);
  st_args_free(a);
  if (rc != ST_OK) fprintf(stderr, "   fill: %s\n", st_client_error(c));
  return rc == ST_OK ? r : NULL;
}

static int holds(const st_result_t *r, float v) {
  const st_tensor_t *t = r ? st_result_tensor(r, 0) : NULL;
  if (!t || t->numel != N) return 0;
  for (int i = 0; i < N; i++)
    if (((const float *)t->data)[i] != v) return 0;
  return 1;
}

/* One call whose result is checked and freed: 1, or 0 when it was wrong. */
static int call_once(st_client_t *c, float v) {
  st_result_t *x = fill(c, v);
  int ok = holds(x, v);
  if (x) st_result_free(x);
  return ok;
}

/* Calls on c until the pool holds `bytes` in `maps` slabs mapped here (the
 * server retires at an allocation, the client lets go at its next
 * request), at most 10 s. 1 when it got there with every result correct. */
static int call_until(st_client_t *c, int64_t bytes, int maps) {
  double end = stt_now_ms() + 10000;
  for (int i = 0; stt_now_ms() < end; i++) {
    if (!call_once(c, (float)(1000 + i % 7))) return 0;
    if (pool_bytes() == bytes && slab_maps() == maps) return 1;
  }
  fprintf(stderr, "   pool_bytes %lld, %d slabs mapped\n", (long long)pool_bytes(), slab_maps());
  return 0;
}

/* Calls on c for ms milliseconds; 1 when every result was correct. */
static int call_for(st_client_t *c, double ms) {
  double end = stt_now_ms() + ms;
  while (stt_now_ms() < end)
    if (!call_once(c, -3.0f)) return 0;
  return 1;
}

enum { HOLD = 60 };   /* 16 + 32 + 12: three slabs */

/* Holds HOLD results r[i] = i: the pool's three slabs. */
static void grow_to_three(st_client_t *c, st_result_t **r) {
  for (int i = 0; i < HOLD; i++) CHECK((r[i] = fill(c, (float)i)) != NULL);
  CHECK_EQ_INT(pool_bytes(), 448 * KIB);
  CHECK_EQ_INT(slab_maps(), 3);
}

TEST(idle_slabs_retire_and_held_ones_stay) {
  OPEN_CLIENT(c, srv.socket);
  int64_t arenas0 = ak_info_int(mon, "arenas", "count");
  st_result_t *r[HOLD];
  grow_to_three(c, r);
  int64_t arenas3 = ak_info_int(mon, "arenas", "count");
  CHECK(arenas3 >= arenas0 + 3);
  /* Every slab holds a region the client holds: none goes. */
  CHECK(call_for(c, 1000));
  CHECK_EQ_INT(pool_bytes(), 448 * KIB);
  CHECK_EQ_INT(slab_maps(), 3);
  /* r[20] is in the 128 KiB slab: that one stays, the 256 KiB one goes. */
  for (int i = 0; i < HOLD; i++)
    if (i != 20) {
      CHECK(holds(r[i], (float)i));
      st_result_free(r[i]);
    }
  CHECK(call_until(c, 192 * KIB, 2));
  CHECK(call_for(c, 1000));
  CHECK_EQ_INT(pool_bytes(), 192 * KIB);
  CHECK(holds(r[20], 20.0f));
  st_result_free(r[20]);
  /* Now it goes too; the first slab stays. */
  CHECK(call_until(c, 64 * KIB, 1));
  CHECK_EQ_INT(ak_info_int(mon, "arenas", "count"), arenas3 - 2);
  CHECK(call_for(c, 600));
  CHECK_EQ_INT(pool_bytes(), 64 * KIB);
  /* It grows again, into the indices the client let go. */
  grow_to_three(c, r);
  for (int i = 0; i < HOLD; i++) {
    CHECK(holds(r[i], (float)i));
    st_result_free(r[i]);
  }
  CHECK(call_until(c, 64 * KIB, 1));
  st_client_close(c);
}

int main(void) {
  stt_server_setup(&srv,
                   "workers = 1, pool = { slab_bytes = 65536, max_bytes_per_connection = 524288,"
                   " idle_s = 0.2 },",
                   endpoints);
  mon = stt_client_open(srv.socket);
  if (!mon) return 1;
  RUN(idle_slabs_retire_and_held_ones_stay);
  st_client_close(mon);
  return stt_server_finish(&srv);
}
