/* Result pools on the wire (docs/pool.md, sections 1-3; docs/protocol.md
 * "Result pools"), against a real stserver over raw sockets, with small
 * slabs (slabs of 64 KiB first, at most 256 KiB each) so that regions are recycled:
 *   - a client whose hello lists "pool" gets plain results as regions of
 *     a slab: the slab's descriptor once, the control page once;
 *   - a region freed through the page (freed[slot] = gen, freed_count
 *     bumped) is handed out again; one not freed never is, while held,
 *     and its bytes stay what the endpoint wrote;
 *   - forged frees (a slot never handed out, a wrong generation, the same
 *     free twice, garbage in every word, a huge freed_count) free
 *     nothing: later results are correct and no held region moves;
 *   - a client that never frees gets arenas of their own once the pool
 *     is full (counters.pool_fallbacks moves, metrics say the same), with
 *     correct results;
 *   - without the feature, results are arenas of their own, as before;
 *   - slabs shrink (a server of its own, pool.idle_s = 0.2): an idle slab
 *     is retired (pool_bytes drops) and its index's bit set in the page's
 *     `retired` word; while the client leaves the bit set the index is not
 *     given to a new slab; bits the client sets on live slabs change
 *     nothing; once it clears the bit, a new slab takes the index.
 */
#include <sys/mman.h>

#include "check.h"
#include "wire.h"

#define SLAB (64u << 10)
#define N 1024                /* floats per result: one 4 KiB region */

static stt_server_t S;
static rc_t M;   /* the monitor connection: info */

static const char EP_FILL[] =
    "return st.endpoint{ name = 'fill', params = { v = 0, n = 1024 },\n"
    "  build = function(a) return st.full{ a.n, value = a.v, dtype = 'float32' } end }\n";

static uint32_t next_id = 100;

/* One pooled connection: its mappings of the page and the slabs. */
typedef struct {
  rc_t c;
  uint32_t *page;
  size_t page_len;
  uint32_t nslots;
  struct {
    int64_t id;
    char *base;
    size_t len;
  } slab[32];
  int nslabs;
} pc_t;

/* A result: where it lies (base NULL: an arena of its own, mapped at
 * `own`) and its slot and generation. */
typedef struct {
  float *data;
  void *own;
  size_t own_len;
  int64_t slab, index, offset, size, slot, gen;
} res_t;

static int open_pool_at(pc_t *p, const char *sock, const char *features) {
  memset(p, 0, sizeof *p);
  if (rc_open(&p->c, sock) != 0) return -1;
  msg_t m;
  int rc = rc_rpcf(&p->c, &m, "[0, 1, 'hello', [{protocol: 1, features: %s}]]", features);
  int ok = rc == 1 && !m.error;
  if (rc == 1) msg_free(&m);
  return ok ? 0 : -1;
}

static int open_pool(pc_t *p, const char *features) {
  return open_pool_at(p, S.socket, features);
}

static void close_pool(pc_t *p) {
  for (int i = 0; i < p->nslabs; i++) munmap(p->slab[i].base, p->slab[i].len);
  if (p->page) munmap(p->page, p->page_len);
  rc_close(&p->c);
}

static void *map_fd(int fd, size_t len) {
  void *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return b == MAP_FAILED ? NULL : b;
}

/* Calls fill(v) and maps what the reply brings. 0, or -1 (printed). */
static int call_fill(pc_t *p, float v, res_t *r) {
  memset(r, 0, sizeof *r);
  msg_t m;
  int before = p->c.nfds;
  if (rc_rpcf(&p->c, &m, "[0, %u, 'call', [{endpoint: 'fill', args: {v: %g}}]]", next_id++,
              (double)v) != 1)
    return -1;
  if (m.error) {
    fprintf(stderr, "   fill: %s: %s\n", msg_errname(&m), msg_errmsg(&m));
    msg_free(&m);
    return -1;
  }
  int *fds = p->c.fds + before;
  const msgpack_object *e = &obj_get(m.result, "arenas")->via.array.ptr[0];
  const msgpack_object *pool = obj_get(e, "pool");
  const msgpack_object *pp = obj_get(m.result, "pool_page");
  int rc = 0;
  if (pp) {
    p->page_len = (size_t)obj_int(obj_get(pp, "bytes"));
    p->nslots = (uint32_t)obj_int(obj_get(pp, "slots"));
    p->page = map_fd(fds[obj_int(obj_get(pp, "fd"))], p->page_len);
    if (!p->page || p->page[0] != 0x4c505453u) rc = -1;
  }
  if (!pool) {   /* an arena of its own */
    r->own_len = (size_t)obj_int(obj_get(e, "bytes"));
    r->own = map_fd(fds[obj_int(obj_get(e, "fd"))], r->own_len);
    r->data = r->own;
    r->slab = -1;
  } else {
    r->slab = obj_int(obj_get(e, "id"));
    r->index = obj_int(obj_get(pool, "slab"));
    r->offset = obj_int(obj_get(pool, "offset"));
    r->size = obj_int(obj_get(pool, "size"));
    r->slot = obj_int(obj_get(pool, "slot"));
    r->gen = obj_int(obj_get(pool, "gen"));
    if (obj_get(e, "fd")) {
      size_t len = (size_t)obj_int(obj_get(e, "bytes"));
      p->slab[p->nslabs].id = r->slab;
      p->slab[p->nslabs].len = len;
      p->slab[p->nslabs++].base = map_fd(fds[obj_int(obj_get(e, "fd"))], len);
    }
    for (int i = 0; i < p->nslabs; i++)
      if (p->slab[i].id == r->slab) r->data = (float *)(p->slab[i].base + r->offset);
  }
  msg_free(&m);
  rc_drop_fds(&p->c);
  return r->data && rc == 0 ? 0 : -1;
}

static int holds(const res_t *r, float v) {
  for (int i = 0; i < N; i++)
    if (r->data[i] != v) return 0;
  return 1;
}

/* The sample of metric `series` (no labels) on the monitor; -1 when
 * absent. */
static double metric(const char *series) {
  msg_t m;
  if (rc_rpcf(&M, &m, "[0, 5, 'metrics', []]") != 1) return -1;
  double v = -1;
  size_t n = strlen(series);
  if (!m.error && m.result && m.result->type == MSGPACK_OBJECT_STR) {
    char *text = strndup(m.result->via.str.ptr, m.result->via.str.size);
    for (const char *q = text; q && *q; q = strchr(q, '\n') ? strchr(q, '\n') + 1 : NULL)
      if (strncmp(q, series, n) == 0 && q[n] == ' ') v = strtod(q + n + 1, NULL);
    free(text);
  }
  msg_free(&m);
  return v;
}

static void page_free(pc_t *p, uint32_t slot, uint32_t gen) {
  __atomic_store_n(&p->page[16 + slot], gen, __ATOMIC_RELEASE);
  __atomic_add_fetch(&p->page[3], 1, __ATOMIC_RELEASE);
}

static void drop(res_t *r) {
  if (r->own) munmap(r->own, r->own_len);
  r->own = NULL;
}

TEST(the_slab_and_the_page_go_once_and_freed_regions_come_back) {
  pc_t p;
  CHECK(open_pool(&p, "['pool', 'arena_refs']") == 0);
  int64_t sent = rc_info_int(&M, "counters.fds_sent");
  res_t a, b;
  CHECK(call_fill(&p, 1.0f, &a) == 0);
  CHECK(a.slab > 0 && p.page && p.nslabs == 1);
  CHECK(rc_info_int(&M, "counters.fds_sent") == sent + 2);   /* slab + page */
  CHECK(holds(&a, 1.0f));
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen);
  CHECK(call_fill(&p, 2.0f, &b) == 0);
  CHECK(b.slab == a.slab && b.offset == a.offset && b.slot == a.slot && b.gen != a.gen);
  CHECK(holds(&b, 2.0f));
  CHECK(rc_info_int(&M, "counters.fds_sent") == sent + 2);   /* nothing more */
  CHECK(rc_info_int(&M, "memory.cpu.pool_bytes") >= SLAB);
  close_pool(&p);
}

/* Many calls, random frees: a held region is never handed out again and
 * keeps its bytes; slabs fill and regions are recycled. */
TEST(held_regions_are_never_handed_out_again) {
  pc_t p;
  CHECK(open_pool(&p, "['pool']") == 0);
  enum { HOLD = 24 };
  res_t held[HOLD];
  float val[HOLD];
  int n = 0, recycled = 0;
  unsigned seed = 12345;
  int64_t first_slot_seen[4096] = {0};
  for (int i = 0; i < 3000; i++) {
    if (n == HOLD || (n > 0 && rand_r(&seed) % 3 == 0)) {
      int k = (int)(rand_r(&seed) % (unsigned)n);
      if (held[k].slab >= 0) page_free(&p, (uint32_t)held[k].slot, (uint32_t)held[k].gen);
      drop(&held[k]);
      held[k] = held[n - 1];
      val[k] = val[n - 1];
      n--;
    }
    res_t r;
    float v = (float)(i + 1);
    CHECK(call_fill(&p, v, &r) == 0);
    CHECK(holds(&r, v));
    if (r.slab >= 0 && r.slot < 4096) recycled += first_slot_seen[r.slot]++ > 0;
    for (int k = 0; k < n; k++) {
      CHECK(held[k].slab < 0 || r.slab != held[k].slab || r.offset + r.size <= held[k].offset ||
            held[k].offset + held[k].size <= r.offset);
      CHECK(holds(&held[k], val[k]));
    }
    held[n] = r;
    val[n++] = v;
  }
  CHECK(recycled > 1000);
  for (int k = 0; k < n; k++) drop(&held[k]);
  close_pool(&p);
}

TEST(forged_frees_free_nothing) {
  pc_t p;
  CHECK(open_pool(&p, "['pool']") == 0);
  res_t a, b, c;
  CHECK(call_fill(&p, 7.0f, &a) == 0);
  CHECK(call_fill(&p, 8.0f, &b) == 0);
  /* A slot never handed out, a wrong generation, a slot past the end. */
  page_free(&p, (uint32_t)(a.slot + 500) % p.nslots, 1);
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen + 1);
  __atomic_add_fetch(&p.page[3], 0x7fffffffu, __ATOMIC_RELEASE);   /* huge freed_count */
  for (int i = 0; i < 10; i++) {
    res_t r;
    CHECK(call_fill(&p, 20.0f + (float)i, &r) == 0);
    CHECK(r.slot != a.slot && r.slot != b.slot);
    CHECK(holds(&r, 20.0f + (float)i));
    drop(&r);
  }
  CHECK(holds(&a, 7.0f) && holds(&b, 8.0f));
  /* The same free twice: the second finds the slot handed out again. */
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen);
  CHECK(call_fill(&p, 9.0f, &c) == 0);
  page_free(&p, (uint32_t)a.slot, (uint32_t)a.gen);
  for (int i = 0; i < 4; i++) {
    res_t r;
    CHECK(call_fill(&p, 30.0f + (float)i, &r) == 0);
    CHECK(r.slot != c.slot || r.slab < 0);
    CHECK(holds(&r, 30.0f + (float)i));
  }
  CHECK(holds(&c, 9.0f) && holds(&b, 8.0f));
  /* Garbage in every word of the page, header included. */
  for (size_t i = 0; i < p.page_len / 4; i++) p.page[i] = 0xdeadbeefu ^ (uint32_t)i;
  for (int i = 0; i < 4; i++) {
    res_t r;
    CHECK(call_fill(&p, 40.0f + (float)i, &r) == 0);
    CHECK(holds(&r, 40.0f + (float)i));
  }
  CHECK(holds(&c, 9.0f) && holds(&b, 8.0f));
  close_pool(&p);
}

TEST(a_client_that_never_frees_gets_arenas_of_their_own) {
  /* The slabs of the connections closed before go first. */
  CHECK(rc_wait_info(&M, "memory.cpu.pool_bytes", 0, 5000) == 0);
  pc_t p;
  CHECK(open_pool(&p, "['pool']") == 0);
  int64_t fb = rc_info_int(&M, "counters.pool_fallbacks");
  enum { CALLS = 200 };   /* 800 KiB: more than the 256 KiB cap */
  static res_t r[CALLS];
  int own = 0;
  for (int i = 0; i < CALLS; i++) {
    CHECK(call_fill(&p, (float)i, &r[i]) == 0);
    own += r[i].slab < 0;
  }
  for (int i = 0; i < CALLS; i++) CHECK(holds(&r[i], (float)i));
  CHECK(own > 0);
  CHECK(rc_info_int(&M, "counters.pool_fallbacks") >= fb + own);
  CHECK(rc_info_int(&M, "memory.cpu.pool_bytes") <= 256 << 10);
  /* metrics: the same figures. */
  CHECK_EQ_INT((int64_t)metric("sharedtensor_pool_fallbacks_total"),
               rc_info_int(&M, "counters.pool_fallbacks"));
  CHECK_EQ_INT((int64_t)metric("sharedtensor_pool_bytes"),
               rc_info_int(&M, "memory.cpu.pool_bytes"));
  for (int i = 0; i < CALLS; i++) drop(&r[i]);
  close_pool(&p);
}

TEST(without_the_feature_results_are_arenas_of_their_own) {
  pc_t p;
  CHECK(open_pool(&p, "['arena_refs']") == 0);
  res_t r;
  CHECK(call_fill(&p, 3.0f, &r) == 0);
  CHECK(r.slab < 0 && !p.page && holds(&r, 3.0f));
  drop(&r);
  close_pool(&p);
}

/* The page's `retired` word (byte 16). */
static uint32_t retired(const pc_t *p) {
  return __atomic_load_n(&p->page[4], __ATOMIC_ACQUIRE);
}

/* Holds n results of p in r (values base + i). */
static void hold(pc_t *p, res_t *r, int n, float base) {
  for (int i = 0; i < n; i++) CHECK(call_fill(p, base + (float)i, &r[i]) == 0 && r[i].slab > 0);
}

static void free_all(pc_t *p, res_t *r, int n) {
  for (int i = 0; i < n; i++) page_free(p, (uint32_t)r[i].slot, (uint32_t)r[i].gen);
}

/* Calls (freeing each result) until bit `bit` of p's `retired` word is
 * set, at most 10 s; 1 when it is, every result correct. */
static int call_until_retired(pc_t *p, uint32_t bit) {
  double end = stt_now_ms() + 10000;
  for (int i = 0; stt_now_ms() < end && !(retired(p) & bit); i++) {
    res_t r;
    if (call_fill(p, (float)i, &r) != 0 || !holds(&r, (float)i)) return 0;
    page_free(p, (uint32_t)r.slot, (uint32_t)r.gen);
  }
  return (retired(p) & bit) != 0;
}

static void shrink_body(stt_server_t *s) {
  rc_t mon;
  pc_t p;
  CHECK(rc_open(&mon, s->socket) == 0);
  CHECK(open_pool_at(&p, s->socket, "['pool']") == 0);
  enum { H = 17 };   /* 16 fill the first slab: the 17th makes the second */
  res_t r[H];
  hold(&p, r, H, 0.0f);
  CHECK(r[0].index == 0 && r[H - 1].index == 1 && p.nslabs == 2);
  int64_t second = r[H - 1].slab;
  CHECK_EQ_INT(rc_info_int(&mon, "memory.cpu.pool_bytes"), 192 << 10);
  CHECK_EQ_INT(retired(&p), 0);
  free_all(&p, r, H);
  CHECK(call_until_retired(&p, 1u << 1));
  /* A region held while the figures are read keeps the first slab
   * whatever the scheduler does (an idle connection's last slab goes too). */
  res_t pin;
  CHECK(call_fill(&p, 5.0f, &pin) == 0 && holds(&pin, 5.0f));
  CHECK_EQ_INT(rc_info_int(&mon, "memory.cpu.pool_bytes"), 64 << 10);
  CHECK_EQ_INT(retired(&p), 1u << 1);   /* the first slab stays */
  page_free(&p, (uint32_t)pin.slot, (uint32_t)pin.gen);
  /* Left set: the next slab takes another index (its own descriptor). */
  hold(&p, r, H, 100.0f);
  CHECK(r[H - 1].index == 2 && r[H - 1].slab != second && p.nslabs == 3);
  /* Bits set by the client on live slabs change nothing. */
  __atomic_or_fetch(&p.page[4], 1u | (1u << 2), __ATOMIC_RELEASE);
  res_t x;
  CHECK(call_fill(&p, 7.0f, &x) == 0 && holds(&x, 7.0f));
  page_free(&p, (uint32_t)x.slot, (uint32_t)x.gen);
  for (int i = 0; i < H; i++) CHECK(holds(&r[i], 100.0f + (float)i));
  CHECK_EQ_INT(rc_info_int(&mon, "memory.cpu.pool_bytes"), 192 << 10);
  /* Cleared (the client let the slab go): a new slab takes index 1. */
  __atomic_store_n(&p.page[4], 0, __ATOMIC_RELEASE);
  free_all(&p, r, H);
  CHECK(call_until_retired(&p, 1u << 2));
  __atomic_store_n(&p.page[4], 0, __ATOMIC_RELEASE);
  hold(&p, r, H, 200.0f);
  CHECK(r[H - 1].index == 1 && r[H - 1].slab != second && p.nslabs == 4);
  for (int i = 0; i < H; i++) CHECK(holds(&r[i], 200.0f + (float)i));
  close_pool(&p);
  rc_close(&mon);
}

TEST(idle_slabs_retire_and_the_page_says_which) {
  stt_server_t s;
  stt_server_prepare(&s,
                     "workers = 1, pool = { slab_bytes = 262144, max_bytes_per_connection = "
                     "262144, idle_s = 0.2 },",
                     (const stt_endpoint_t[]){{"fill.lua", EP_FILL}, {NULL, NULL}});
  CHECK(stt_server_run(&s, shrink_body) == 0);
  stt_server_cleanup(&s);
}

int main(void) {
  stt_server_setup(&S,
                   "workers = 1, pool = { slab_bytes = 262144, max_bytes_per_connection = 262144 },",
                   (const stt_endpoint_t[]){{"fill.lua", EP_FILL}, {NULL, NULL}});
  rc_open_or_exit(&M, S.socket);
  RUN(the_slab_and_the_page_go_once_and_freed_regions_come_back);
  RUN(held_regions_are_never_handed_out_again);
  RUN(forged_frees_free_nothing);
  RUN(a_client_that_never_frees_gets_arenas_of_their_own);
  RUN(without_the_feature_results_are_arenas_of_their_own);
  RUN(idle_slabs_retire_and_the_page_says_which);
  rc_close(&M);
  return stt_server_finish(&S);
}
