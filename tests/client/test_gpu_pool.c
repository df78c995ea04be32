/* Result pools on a CUDA device (docs/pool.md, sections 1-3; label gpu,
 * skipped without a device), through libstclient and raw sockets against
 * a real stserver, with small slabs (pool.cuda_slab_bytes = 4 MiB, a
 * 64 MiB cap per connection):
 *   - fresh CUDA results are regions of a VMM slab: the slab's descriptor
 *     and the page go once, later results send none; info counts the slab
 *     in memory["cuda:0"].pool_bytes until the connection closes;
 *   - thousands of calls with random frees: every held result keeps its
 *     bytes and no two held results overlap;
 *   - the skipped zero fill (pool_kit.h): ones skip it, zeros and empty
 *     read zero in a region that held other bytes, and every maker that
 *     skips it writes every byte;
 *   - forged frees through the page (a wrong generation, a slot never
 *     handed out, a second free) free nothing: no held region is handed
 *     out again and its device bytes stay;
 *   - a client SIGKILLed with results outstanding gives its slabs back:
 *     the server's used and pool bytes on cuda:0 and the device's free memory
 *     (cuMemGetInfo, in this process) come back to the start;
 *   - budgets count CUDA slabs: with memory_budget["cuda:0"] = 64 MiB the
 *     pool's slabs are at most a quarter of it, charged to it, and a
 *     result past them gets an allocation of its own (pool_fallbacks);
 *   - a region whose DLPack export is released while the legacy default
 *     stream is held up (a host function waiting on a gate) is not handed
 *     out again until that stream passed the release; st_client_close
 *     waits for it;
 *   - slabs shrink: with pool.idle_s = 0.2, slabs of 2, 4 and 8 MiB whose
 *     results were all freed retire but the oldest, and the device gets
 *     their memory back (server and client both let go);
 *   - under the defaults the first CUDA slab is one 2 MiB granule, and
 *     CUDA slabs count in the uid's quotas.pool_bytes: past it, results
 *     get allocations of their own (pool_fallbacks), every one correct.
 */
#define PK_WITH_CUDA
#include <signal.h>
#include <st/client.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_kit.h"
#include "st/dlpack.h"
#include "fixture.h"
#include "holder_kit.h"
#include "pool_kit.h"
#include "wire.h"
#include "../server/gpu_kit.h"

#define MiB (1u << 20)

static stt_server_t srv;
static rc_t M;   /* the monitor: info */

static const stt_endpoint_t endpoints[] = {{"make.lua", PK_MAKE}, {NULL, NULL}};

static int64_t used(void) { return rc_info_int(&M, "memory.cuda:0.used_bytes"); }
static int64_t pool_bytes(void) { return rc_info_int(&M, "memory.cuda:0.pool_bytes"); }

/* Polls until the server's used bytes on cuda:0 are `want`; returns them. */
static int64_t wait_used(int64_t want) {
  double end = stt_now_ms() + 10000;
  while (used() != want && stt_now_ms() < end) stt_sleep_ms(10);
  return used();
}

/* Polls until the pools' slab bytes on cuda:0 are back to 0. 0 or -1. */
static int wait_pool_empty(void) {
  return rc_wait_info(&M, "memory.cuda:0.pool_bytes", 0, 10000);
}

/* make{full, v} on cuda: 1000 floats, NULL when it fails. */
static st_result_t *fill(st_client_t *c, float v) { return pk_make(c, "full", v); }

static int holds(const st_result_t *r, float v) {
  const st_tensor_t *t = st_result_tensor(r, 0);
  float buf[PK_N];
  if (!t || t->device != ST_DEVICE_CUDA || t->numel != PK_N ||
      st__cuda_copy_to_host(buf, (uint64_t)(uintptr_t)t->data, sizeof buf, t->device_index, NULL,
                            0) != ST_OK)
    return 0;
  for (int i = 0; i < PK_N; i++)
    if (buf[i] != v) return 0;
  return 1;
}

TEST(fresh_cuda_results_come_from_the_pool) {
  OPEN_CLIENT(c, srv.socket);
  int64_t sent = rc_info_int(&M, "counters.fds_sent"), u0 = used();
  for (int i = 0; i < 200; i++) {
    st_result_t *r = fill(c, (float)i);
    CHECK(r && holds(r, (float)i));
    st_result_free(r);
  }
  CHECK_EQ_INT(rc_info_int(&M, "counters.fds_sent") - sent, 2);   /* the slab, the page */
  CHECK_EQ_INT(used() - u0, 4 * MiB);                              /* one slab */
  CHECK_EQ_INT(pool_bytes(), 4 * MiB);   /* info counts it as pool bytes of cuda:0 */
  CHECK_EQ_INT(rc_info_int(&M, "memory.cpu.pool_bytes"), 0);
  st_client_close(c);
  CHECK_EQ_INT(wait_used(u0), u0);
  CHECK(wait_pool_empty() == 0);
}

static void drop(st_result_t *r, float v, unsigned *seed) { st_result_free(r); }

TEST(held_results_keep_their_bytes_under_random_frees) {
  OPEN_CLIENT(c, srv.socket);
  CHECK(pk_churn(c, 3000, 40, 777, PK_BYTES, 100, fill, holds, drop) == 0);
  CHECK_EQ_INT(rc_info_int(&M, "counters.pool_fallbacks"), 0);
  st_client_close(c);
}

/* ------------------------------------------------ forged frees (raw wire) */

typedef struct {
  int64_t offset, size, slot, gen;
} region_t;

typedef struct {
  rc_t c;
  uint32_t *page;
  size_t page_len;
  st__cuda_mapping_t slab;   /* the first slab, imported */
  int64_t slab_id;
} raw_t;

/* Calls make{full, v} on cuda over the raw connection; the reply's region
 * into *r (the slab imported and the page mapped when they come). */
static int raw_fill(raw_t *p, float v, region_t *r) {
  static uint32_t id = 100;
  msg_t m;
  int before = p->c.nfds;
  if (rc_rpcf(&p->c, &m, "[0, %u, 'call', [{endpoint: 'make', args: {kind: 'full', dev: "
              "'cuda', v: %g}}]]", id++, (double)v) != 1)
    return -1;
  int rc = m.error ? -1 : 0;
  const msgpack_object *e = rc ? NULL : &obj_get(m.result, "arenas")->via.array.ptr[0];
  const msgpack_object *pool = e ? obj_get(e, "pool") : NULL;
  const msgpack_object *pp = e ? obj_get(m.result, "pool_page") : NULL;
  int *fds = p->c.fds + before;
  if (!pool || (p->slab_id && obj_int(obj_get(e, "id")) != p->slab_id)) rc = -1;   /* one slab */
  if (rc == 0 && pp) {
    p->page_len = (size_t)obj_int(obj_get(pp, "bytes"));
    void *b = mmap(NULL, p->page_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                   fds[obj_int(obj_get(pp, "fd"))], 0);
    p->page = b == MAP_FAILED ? NULL : b;
  }
  if (rc == 0 && obj_get(e, "fd")) {
    const msgpack_object *u = obj_get(e, "uuid");
    char uuid[ST_CUDA_UUID_LEN];
    snprintf(uuid, sizeof uuid, "%.*s", (int)u->via.str.size, u->via.str.ptr);
    p->slab_id = obj_int(obj_get(e, "id"));
    if (st__cuda_import(fds[obj_int(obj_get(e, "fd"))], (uint64_t)obj_int(obj_get(e, "bytes")),
                        uuid, &p->slab, NULL, 0) != ST_OK)
      rc = -1;
  }
  if (rc == 0) {
    r->offset = obj_int(obj_get(pool, "offset"));
    r->size = obj_int(obj_get(pool, "size"));
    r->slot = obj_int(obj_get(pool, "slot"));
    r->gen = obj_int(obj_get(pool, "gen"));
  }
  if (m.error) fprintf(stderr, "   make: %s: %s\n", msg_errname(&m), msg_errmsg(&m));
  msg_free(&m);
  rc_drop_fds(&p->c);
  return rc == 0 && p->page && p->slab.dptr ? 0 : -1;
}

static int raw_holds(const raw_t *p, const region_t *r, float v) {
  float buf[PK_N];
  if (st__cuda_copy_to_host(buf, p->slab.dptr + (uint64_t)r->offset, sizeof buf, p->slab.ordinal,
                            NULL, 0) != ST_OK)
    return 0;
  for (int i = 0; i < PK_N; i++)
    if (buf[i] != v) return 0;
  return 1;
}

static void page_free(raw_t *p, uint32_t slot, uint32_t gen) {
  __atomic_store_n(&p->page[16 + slot], gen, __ATOMIC_RELEASE);
  __atomic_add_fetch(&p->page[3], 1, __ATOMIC_RELEASE);
}

static int apart(const region_t *a, const region_t *b) {
  return a->offset + a->size <= b->offset || b->offset + b->size <= a->offset;
}

TEST(forged_frees_free_nothing) {
  raw_t p;
  memset(&p, 0, sizeof p);
  CHECK(rc_open(&p.c, srv.socket) == 0);
  msg_t m;
  CHECK(rc_rpcf(&p.c, &m, "[0, 1, 'hello', [{protocol: 1, features: ['pool']}]]") == 1);
  msg_free(&m);
  region_t a, b, x;
  CHECK(raw_fill(&p, 1.0f, &a) == 0 && raw_fill(&p, 2.0f, &b) == 0);
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen + 1);      /* a wrong generation */
  page_free(&p, (uint32_t)b.slot + 7, 1);                     /* a slot never handed out */
  for (int i = 0; i < 20; i++) {
    CHECK(raw_fill(&p, 3.0f, &x) == 0);
    CHECK(apart(&x, &a) && apart(&x, &b));
    page_free(&p, (uint32_t)x.slot, (uint32_t)x.gen);
  }
  CHECK(raw_holds(&p, &a, 1.0f) && raw_holds(&p, &b, 2.0f));
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen);           /* a real free */
  /* a's bytes are free again: one of the next two regions (both held)
   * takes them; which one is the allocator's choice. */
  region_t x2;
  CHECK(raw_fill(&p, 4.0f, &x) == 0 && raw_fill(&p, 6.0f, &x2) == 0);
  CHECK(!apart(&x, &a) || !apart(&x2, &a));
  CHECK(apart(&x, &x2) && apart(&x, &b) && apart(&x2, &b));
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen);           /* the same free again */
  region_t y;
  CHECK(raw_fill(&p, 5.0f, &y) == 0);
  CHECK(apart(&y, &x) && apart(&y, &x2) && apart(&y, &b));
  CHECK(raw_holds(&p, &x, 4.0f) && raw_holds(&p, &x2, 6.0f) && raw_holds(&p, &b, 2.0f) &&
        raw_holds(&p, &y, 5.0f));
  st__cuda_unmap(&p.slab);
  if (p.page) munmap(p.page, p.page_len);
  rc_close(&p.c);
}

/* ------------------------------------------------ a client SIGKILLed */

TEST(a_sigkilled_client_gives_its_slabs_back) {
  /* The baselines once the slabs of the tests before are back: a client
   * closed just before may still hold one until the server reads its
   * close. */
  CHECK(wait_pool_empty() == 0);
  int64_t u0 = used();
  uint64_t free0 = gk_free();
  pid_t pid = pk_holder(srv.socket, 50);
  CHECK(pid > 0);
  int64_t held = used(), pooled = pool_bytes();
  pk_kill(pid);    /* before any check can return: a live holder outlasts the test */
  CHECK(held >= u0 + 4 * MiB);
  CHECK(pooled >= 4 * MiB);
  CHECK_EQ_INT(wait_used(u0), u0);
  CHECK(wait_pool_empty() == 0);
  CHECK(gk_wait_back_to(free0, 10000) == 0);
}

/* ------------------------------------------------ frees after the device */

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <pthread.h>

/* A host function on the legacy default stream that returns once the gate
 * opens: the stream's later work, and events recorded after it, wait. */
static int gate_open;

static void CUDART_CB gate(void *arg) {
  (void)arg;
  while (!__atomic_load_n(&gate_open, __ATOMIC_ACQUIRE)) usleep(1000);
}

static int close_gate(void) {
  __atomic_store_n(&gate_open, 0, __ATOMIC_RELEASE);
  return cudaSetDevice(0) == cudaSuccess && cudaLaunchHostFunc(cudaStreamLegacy, gate, NULL) ==
                                                 cudaSuccess
             ? 0
             : -1;
}

static void *open_gate_later(void *arg) {
  (void)arg;
  stt_sleep_ms(300);
  __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
  return NULL;
}

/* Whether tensor 0 of r lies in [lo, lo + PK_BYTES). */
static int in_bytes_of(const st_result_t *r, uintptr_t lo) {
  uintptr_t a = (uintptr_t)st_result_tensor(r, 0)->data;
  return a < lo + PK_BYTES && lo < a + PK_BYTES;
}

/* A fresh result exported through DLPack and the caller's reference
 * dropped: the export holds the last one. *lo gets its device address. */
static DLManagedTensorVersioned *exported(st_client_t *c, float v, uintptr_t *lo) {
  st_result_t *r = fill(c, v);
  if (!r) return NULL;
  *lo = (uintptr_t)st_result_tensor(r, 0)->data;
  DLManagedTensorVersioned *x = st_tensor_dlpack(r, st_result_tensor(r, 0), 1);
  st_result_free(r);
  return x;
}

TEST(a_region_released_through_dlpack_waits_for_the_default_stream) {
  OPEN_CLIENT(c, srv.socket);
  uintptr_t lo = 0;
  DLManagedTensorVersioned *x = exported(c, 1.0f, &lo);
  CHECK(x);
  CHECK(close_gate() == 0);
  x->deleter(x);   /* the last reference, while the stream is held up */
  /* Until the gate opens: no copy (a synchronous copy would wait for it)
   * and no CHECK (a failure would leave it shut). */
  enum { HELD = 4 };
  st_result_t *held[HELD];
  int elsewhere = 1;
  for (int i = 0; i < HELD; i++) {
    held[i] = fill(c, 2.0f + (float)i);
    if (!held[i] || in_bytes_of(held[i], lo)) elsewhere = 0;
  }
  __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
  CHECK(cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess);
  CHECK(elsewhere);   /* no held result took the bytes the stream may still read */
  /* The event completed: the next request gives the region back, and
   * one of the next two regions (both held) takes its bytes. */
  st_result_t *a = fill(c, 5.0f), *b = fill(c, 6.0f);
  CHECK(a && b && (in_bytes_of(a, lo) || in_bytes_of(b, lo)));
  CHECK(holds(a, 5.0f) && holds(b, 6.0f));
  for (int i = 0; i < HELD; i++) {
    CHECK(holds(held[i], 2.0f + (float)i));
    st_result_free(held[i]);
  }
  st_result_free(a);
  st_result_free(b);
  /* A free still waiting when the connection closes is waited for. */
  x = exported(c, 7.0f, &lo);
  CHECK(x && close_gate() == 0);
  x->deleter(x);
  pthread_t t;
  if (pthread_create(&t, NULL, open_gate_later, NULL) != 0) {
    __atomic_store_n(&gate_open, 1, __ATOMIC_RELEASE);
    STT_FAIL("pthread_create failed");
  }
  st_client_close(c);
  int waited = __atomic_load_n(&gate_open, __ATOMIC_ACQUIRE);   /* close returned after it */
  pthread_join(t, NULL);
  CHECK(waited);
  CHECK(wait_pool_empty() == 0);
}
#endif

/* ------------------------------------------------ budgets */

static void budget_body(stt_server_t *s) {
  rc_t keep = M;
  CHECK(rc_open(&M, s->socket) == 0);
  st_client_t *c = stt_client_open(s->socket);
  CHECK(c);
  int64_t u0 = used(), fb = rc_info_int(&M, "counters.pool_fallbacks");
  enum { HELD = 17 };
  st_result_t *r[HELD];
  st_args_t *a = st_args_new();
  st_args_string(a, "kind", "ones");
  st_args_string(a, "dev", "cuda");
  st_args_int(a, "n", 262144);   /* 1 MiB */
  for (int i = 0; i < HELD; i++) {
    CHECK_EQ_INT(st_client_call(c, "make", a, &r[i]), ST_OK);
    /* A quarter of 64 MiB: one slab of 16 MiB holds the first 16. */
    if (i == 0) CHECK_EQ_INT(used() - u0, 16 * MiB);
  }
  st_args_free(a);
  CHECK_EQ_INT(rc_info_int(&M, "counters.pool_fallbacks") - fb, 1);
  /* The 17th is an allocation of its own: a plain result, so it leaves
   * the server's books once the client has read its reply (the client
   * owns it); the slab stays charged while the connection lives. */
  CHECK_EQ_INT(wait_used(u0 + 16 * MiB), u0 + 16 * MiB);
  for (int i = 0; i < HELD; i++) st_result_free(r[i]);
  st_client_close(c);
  CHECK_EQ_INT(wait_used(u0), u0);
  rc_close(&M);
  M = keep;
}

TEST(budgets_count_cuda_slabs) {
  CHECK(pk_run_own_server("workers = 1, memory_budget = { ['cuda:0'] = 67108864 },"
                          " pool = { cuda_slab_bytes = 33554432 },",
                          endpoints, budget_body) == 0);
}

/* ------------------------------------------------ slabs shrink */

/* make{full, n = 1 MiB of float32, v} on CUDA; NULL when it fails. */
static st_result_t *make_mib(st_client_t *c, float v) {
  st_args_t *a = st_args_new();
  st_args_string(a, "kind", "full");
  st_args_string(a, "dev", "cuda");
  st_args_int(a, "n", 262144);
  st_args_float(a, "v", v);
  st_result_t *r = NULL;
  int rc = st_client_call(c, "make", a, &r);
  st_args_free(a);
  if (rc != ST_OK) fprintf(stderr, "   make: %s\n", st_client_error(c));
  return rc == ST_OK ? r : NULL;
}

static int mib_holds(const st_result_t *r, float v) {
  float x[2];
  const st_tensor_t *t = st_result_tensor(r, 0);
  pk_get(t, 0, &x[0], sizeof x[0]);
  pk_get(t, t->nbytes - sizeof x[1], &x[1], sizeof x[1]);
  return x[0] == v && x[1] == v;
}

/* Calls (checked and freed) until the pool's bytes are `want`: 1, or 0
 * after 10 s or a wrong result. */
static int call_until_pool(st_client_t *c, int64_t want) {
  double end = stt_now_ms() + 10000;
  for (int i = 0; stt_now_ms() < end; i++) {
    st_result_t *x = make_mib(c, (float)(100 + i % 5));
    int ok = x && mib_holds(x, (float)(100 + i % 5));
    st_result_free(x);
    if (!ok) return 0;
    if (pool_bytes() == want) return 1;
  }
  fprintf(stderr, "   pool_bytes %lld, want %lld\n", (long long)pool_bytes(), (long long)want);
  return 0;
}

static void shrink_body(stt_server_t *s) {
  rc_t keep = M;
  CHECK(rc_open(&M, s->socket) == 0);
  st_client_t *c = stt_client_open(s->socket);
  CHECK(c);
  enum { HELD = 14 };   /* 2 + 4 + 8 results of 1 MiB: slabs of 2, 4 and 8 MiB */
  st_result_t *r[HELD];
  for (int i = 0; i < HELD; i++) CHECK((r[i] = make_mib(c, (float)i)) != NULL);
  CHECK_EQ_INT(pool_bytes(), 14 * MiB);
  uint64_t grown = gk_free();
  for (int i = 0; i < HELD; i++) {
    CHECK(mib_holds(r[i], (float)i));
    st_result_free(r[i]);
  }
  /* Idle for pool.idle_s, the 4 and 8 MiB slabs go; the oldest stays. */
  CHECK(call_until_pool(c, 2 * MiB));
  /* Both sides let go of them: the server released its allocations and
   * this process unmapped its imports before its next request, so the
   * device has their 12 MiB back (other processes may allocate meanwhile:
   * at least 8 MiB, within 10 s). */
  double end = stt_now_ms() + 10000;
  while (gk_free() < grown + 8 * MiB && stt_now_ms() < end) CHECK(call_until_pool(c, 2 * MiB));
  CHECK(gk_free() >= grown + 8 * MiB);
  st_client_close(c);
  CHECK(wait_pool_empty() == 0);
  rc_close(&M);
  M = keep;
}

TEST(idle_cuda_slabs_retire) {
  CHECK(pk_run_own_server("workers = 1, pool = { cuda_slab_bytes = 2097152,"
                          " cuda_max_bytes_per_connection = 16777216, idle_s = 0.2 },",
                          endpoints, shrink_body) == 0);
}

/* ------------------------------------------------ per-uid bytes, small first slab */

/* Under the defaults the first CUDA slab is one 2 MiB granule; with
 * quotas.pool_bytes = 6 MiB, 1 MiB results fill slabs of 2 and 4 MiB,
 * and the next (8 MiB) would pass the quota: the results past it get
 * allocations of their own, every one correct. */
static void quota_body(stt_server_t *s) {
  rc_t keep = M;
  CHECK(rc_open(&M, s->socket) == 0);
  st_client_t *c = stt_client_open(s->socket);
  CHECK(c);
  st_result_t *tiny = fill(c, 7.0f);
  CHECK(tiny && holds(tiny, 7.0f));
  CHECK_EQ_INT(pool_bytes(), 2 * MiB);   /* not 32 MiB for 4 KB */
  st_result_free(tiny);
  enum { HELD = 8 };
  int64_t fallbacks = rc_info_int(&M, "counters.pool_fallbacks");
  st_result_t *r[HELD];
  for (int i = 0; i < HELD; i++) CHECK((r[i] = make_mib(c, (float)i)) != NULL);
  CHECK_EQ_INT(pool_bytes(), 6 * MiB);
  CHECK(rc_info_int(&M, "counters.pool_fallbacks") - fallbacks >= 2);
  for (int i = 0; i < HELD; i++) {
    CHECK(mib_holds(r[i], (float)i));
    st_result_free(r[i]);
  }
  st_client_close(c);
  CHECK(wait_pool_empty() == 0);
  rc_close(&M);
  M = keep;
}

TEST(cuda_slabs_start_small_and_count_in_the_uids_pool_bytes) {
  CHECK(pk_run_own_server("workers = 1, pool = { idle_s = 0 }, quotas = { pool_bytes = 6291456 },",
                          endpoints, quota_body) == 0);
}

int main(int argc, char **argv) {
  gk_require_device();
  pk_dev = "cuda";
  pk_holder_main(argc, argv, fill);
  stt_server_setup(&srv,
                   "workers = 1, pool = { cuda_slab_bytes = 4194304,"
                   " cuda_max_bytes_per_connection = 67108864 },",
                   endpoints);
  if (rc_open(&M, srv.socket) != 0) return 1;
  RUN(fresh_cuda_results_come_from_the_pool);
  RUN(held_results_keep_their_bytes_under_random_frees);
  pk_socket = srv.socket;
  PK_RUN_FILL_TESTS();
  RUN(forged_frees_free_nothing);
  RUN(a_sigkilled_client_gives_its_slabs_back);
#ifdef ST_HAVE_CUDA
  RUN(a_region_released_through_dlpack_waits_for_the_default_stream);
#endif
  RUN(budgets_count_cuda_slabs);
  RUN(idle_cuda_slabs_retire);
  RUN(cuda_slabs_start_small_and_count_in_the_uids_pool_bytes);
  rc_close(&M);
  return stt_server_finish(&srv);
}
