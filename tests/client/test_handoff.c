/* Hand-offs (docs/pool.md, section 5) through libstclient against a real
 * stserver, CPU memory, consumers in processes of their own (the CUDA
 * path is test_gpu_handoff.c):
 *   - requests flow producer -> 2 consumers with checksums, chunks
 *     recycled through few chunks;
 *   - every order: the producer publishing before its consumers open,
 *     the consumers first, a consumer joining mid-stream (on a slot
 *     never opened: it gets what waited for it; on one taken back: it
 *     counts from its open);
 *   - a chunk is never acquired again while a consumer has not
 *     acknowledged it; the producer's wait ends with a clear TIMEOUT;
 *   - a consumer SIGKILLed mid-request has its acknowledgements made by
 *     the server, and its slot can be opened again;
 *   - forged acknowledgements (a stale sequence, twice, the producer's)
 *     change nothing;
 *   - limits refuse bad and oversize creates with clear messages;
 *   - a producer that leaves: consumers' waits fail, what they hold
 *     stays mapped; delete lets go at once;
 *   - server descriptors, budget and arenas are back at the start after
 *     everything closed.
 */
#include "handoff_kit.h"

static stt_server_t srv;
static st_client_t *cli;

#define CHUNK 8192u

/* The server's figures with only `cli` connected: every test ends there. */
static hk_figures_t baseline;
static hk_figures_t base(void) { return baseline; }

/* Acquires, fills from the next sequence and publishes `bytes`. */
static int produce(st_handoff_t *h, int timeout_ms, uint64_t bytes, int *chunk, uint64_t *seq,
                   uint64_t *sum) {
  void *data;
  int rc = st_handoff_acquire(h, timeout_ms, chunk, &data);
  if (rc != ST_OK) return rc;
  static uint64_t salt = 1;
  hk_fill(data, bytes, salt++);
  *sum = hk_sum(data, bytes);
  return st_handoff_publish(h, *chunk, bytes, seq);
}

/* A hand-off of 2 chunks and 2 consumer processes a and b; both chunks
 * published with `bytes`, both taken by both, acknowledged by a only. */
typedef struct held {
  st_handoff_t *p;
  hk_consumer_t a, b;
  int chunk[2];
  uint64_t seq[2], sum[2];
} held_t;

/* Sets up *w as above. 1 when all of it worked. */
static int both_taken_b_holds(const char *name, uint64_t bytes, held_t *w) {
  if (stt_client_report(cli, name, st_handoff_create(cli, name, "cpu", CHUNK, 2, 2, &w->p)) !=
          ST_OK ||
      hk_spawn(&w->a, srv.socket, name, NULL) != 0 || hk_spawn(&w->b, srv.socket, name, NULL) != 0)
    return 0;
  for (int i = 0; i < 2; i++)
    if (produce(w->p, 1000, bytes, &w->chunk[i], &w->seq[i], &w->sum[i]) != ST_OK ||
        hk_do(&w->a, HK_TAKE, w->chunk[i], w->seq[i], w->sum[i], bytes) != ST_OK ||
        hk_do(&w->a, HK_ACK, w->chunk[i], w->seq[i], 0, 0) != ST_OK ||
        hk_do(&w->b, HK_TAKE, w->chunk[i], w->seq[i], w->sum[i], bytes) != ST_OK)
      return 0;
  return 1;
}

TEST(requests_flow_to_two_consumers_and_chunks_recycle) {
  hk_figures_t start = base();
  st_handoff_t *p = NULL;
  CHECK_RC(st_handoff_create(cli, "flow", "cpu", CHUNK, 3, 2, &p), ST_OK, cli);
  hk_consumer_t k[2];
  CHECK(hk_spawn(&k[0], srv.socket, "flow", NULL) == 0);
  CHECK(hk_spawn(&k[1], srv.socket, "flow", NULL) == 0);
  CHECK(k[0].slot != k[1].slot);
  for (int i = 0; i < 300; i++) {
    int chunk;
    uint64_t seq, sum, bytes = 1 + (uint64_t)(i * 97) % CHUNK;
    CHECK_ERR_MSG(produce(p, 5000, bytes, &chunk, &seq, &sum), ST_OK, st_handoff_error(p));
    for (int j = 0; j < 2; j++) {
      CHECK_EQ_INT(hk_do(&k[j], HK_TAKE, chunk, seq, sum, bytes), ST_OK);
      CHECK_EQ_INT(hk_do(&k[j], HK_ACK, chunk, seq, 0, 0), ST_OK);
    }
  }
  hk_end(&k[0], 0);
  hk_end(&k[1], 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

TEST(a_chunk_is_not_acquired_again_before_every_ack) {
  hk_figures_t start = base();
  held_t w;
  CHECK(both_taken_b_holds("held", 100, &w));
  st_handoff_t *p = w.p;
  /* b holds both: nothing is free, the wait ends with TIMEOUT */
  int c;
  double t0 = stt_now_ms();
  CHECK_ERR(st_handoff_acquire(p, 150, &c, NULL), ST_ERR_TIMEOUT);
  CHECK(stt_now_ms() - t0 >= 140);
  CHECK_CONTAINS(st_handoff_error(p), "no chunk became free within 150 ms");
  uint64_t s, pending;
  CHECK_EQ_INT(st_handoff_pending(p, w.chunk[0], &s, &pending), ST_OK);
  CHECK(s == w.seq[0] && pending == (1u << w.b.slot));
  /* one ack frees exactly that chunk */
  CHECK_EQ_INT(hk_do(&w.b, HK_ACK, w.chunk[1], w.seq[1], 0, 0), ST_OK);
  CHECK_EQ_INT(st_handoff_acquire(p, 1000, &c, NULL), ST_OK);
  CHECK_EQ_INT(c, w.chunk[1]);
  CHECK_ERR(st_handoff_acquire(p, 50, &c, NULL), ST_ERR_TIMEOUT);
  /* the chunk b still holds keeps its contents */
  CHECK_EQ_INT(hk_do(&w.b, HK_TAKE, w.chunk[0], w.seq[0], w.sum[0], 100), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, w.chunk[1]), ST_OK);
  hk_end(&w.a, 0);
  hk_end(&w.b, 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

/* The producer waits in acquire: the server's sweep wakes it. */
TEST(a_consumer_killed_mid_request_has_its_acks_made) {
  hk_figures_t start = base();
  held_t w;
  CHECK(both_taken_b_holds("killed", 64, &w));
  st_handoff_t *p = w.p;
  CHECK_ERR(st_handoff_acquire(p, 20, NULL, NULL), ST_ERR_TIMEOUT);
  int bslot = w.b.slot;
  hk_end(&w.b, 1);   /* SIGKILL while it holds both chunks */
  int c;
  CHECK_ERR_MSG(st_handoff_acquire(p, 5000, &c, NULL), ST_OK, st_handoff_error(p));
  CHECK_EQ_INT(st_handoff_acquire(p, 5000, &c, NULL), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, w.chunk[0]), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, w.chunk[1]), ST_OK);
  /* with its slot gone a publish waits for `a` alone */
  int ch;
  uint64_t s, sm, pending;
  CHECK_EQ_INT(produce(p, 1000, 64, &ch, &s, &sm), ST_OK);
  CHECK_EQ_INT(st_handoff_pending(p, ch, NULL, &pending), ST_OK);
  CHECK(pending == (1u << w.a.slot));
  CHECK_EQ_INT(hk_do(&w.a, HK_TAKE, ch, s, sm, 64), ST_OK);
  CHECK_EQ_INT(hk_do(&w.a, HK_ACK, ch, s, 0, 0), ST_OK);
  /* a new consumer takes the slot back, and counts again */
  hk_consumer_t b2;
  CHECK(hk_spawn(&b2, srv.socket, "killed", NULL) == 0);
  CHECK_EQ_INT(b2.slot, bslot);
  CHECK_EQ_INT(produce(p, 1000, 64, &ch, &s, &sm), ST_OK);
  CHECK_EQ_INT(st_handoff_pending(p, ch, NULL, &pending), ST_OK);
  CHECK(pending == ((1u << w.a.slot) | (1u << b2.slot)));
  hk_end(&b2, 0);   /* leaving politely makes its acks too */
  CHECK_EQ_INT(hk_do(&w.a, HK_ACK, ch, s, 0, 0), ST_OK);
  CHECK_EQ_INT(st_handoff_acquire(p, 5000, &c, NULL), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, c), ST_OK);
  hk_end(&w.a, 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

/* Whether this process maps `p` writable ('w' in /proc/self/maps):
 * 1, 0, or -1 when no mapping holds it. */
static int mapped_writable(const void *p) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int w = -1;
  uintptr_t a = (uintptr_t)p;
  while (f && w < 0 && fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && a >= lo && a < hi)
      w = perms[1] == 'w';
  }
  if (f) fclose(f);
  return w;
}

/* Only the producer writes a hand-off's data: a consumer maps it
 * read-only (a uid granted read cannot write the creator's chunks). */
TEST(consumers_map_the_data_read_only) {
  st_handoff_t *p = NULL, *x = NULL;
  CHECK_RC(st_handoff_create(cli, "rodata", "cpu", CHUNK, 1, 1, &p), ST_OK, cli);
  OPEN_CLIENT(cx, srv.socket);
  CHECK_RC(st_handoff_open(cx, "rodata", &x), ST_OK, cx);
  int ch;
  uint64_t seq, sum;
  void *wrote = NULL, *read = NULL;
  CHECK_EQ_INT(st_handoff_acquire(p, 1000, &ch, &wrote), ST_OK);
  CHECK_EQ_INT(mapped_writable(wrote), 1);
  CHECK_EQ_INT(st_handoff_cancel(p, ch), ST_OK);
  CHECK_EQ_INT(produce(p, 1000, 10, &ch, &seq, &sum), ST_OK);
  CHECK_EQ_INT(st_handoff_read(x, ch, seq, 1000, &read, NULL), ST_OK);
  CHECK(read != NULL && hk_sum(read, 10) == sum);
  CHECK_EQ_INT(mapped_writable(read), 0);
  CHECK_EQ_INT(st_handoff_ack(x, ch, seq), ST_OK);
  st_handoff_close(x);
  st_client_close(cx);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", base()));
}

TEST(forged_acks_change_nothing) {
  st_handoff_t *p = NULL, *x = NULL, *y = NULL;
  CHECK_RC(st_handoff_create(cli, "forged", "cpu", CHUNK, 1, 2, &p), ST_OK, cli);
  OPEN_CLIENT(cx, srv.socket);
  OPEN_CLIENT(cy, srv.socket);
  CHECK_RC(st_handoff_open(cx, "forged", &x), ST_OK, cx);
  CHECK_RC(st_handoff_open(cy, "forged", &y), ST_OK, cy);
  int ch;
  uint64_t s1, s2, sum, pending, seq;
  CHECK_EQ_INT(produce(p, 1000, 10, &ch, &s1, &sum), ST_OK);
  CHECK_ERR(st_handoff_ack(x, ch, s1 + 1), ST_ERR_STALE_HANDLE);   /* not yet published */
  CHECK_ERR(st_handoff_ack(x, ch, 0), ST_ERR_STALE_HANDLE);
  CHECK_ERR(st_handoff_ack(x, ch, 1ull << 40), ST_ERR_STALE_HANDLE);
  CHECK_ERR(st_handoff_ack(x, 7, s1), ST_ERR_INVALID_ARGUMENT);     /* no such chunk */
  CHECK_ERR(st_handoff_ack(p, ch, s1), ST_ERR_INVALID_ARGUMENT);    /* the producer */
  CHECK_EQ_INT(st_handoff_ack(x, ch, s1), ST_OK);
  CHECK_ERR(st_handoff_ack(x, ch, s1), ST_ERR_INVALID_ARGUMENT);    /* twice */
  CHECK_CONTAINS(st_handoff_error(x), "already acknowledged");
  CHECK_ERR(st_handoff_read(x, ch, s1, 0, NULL, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_handoff_pending(p, ch, &seq, &pending), ST_OK);
  CHECK(seq == s1 && pending == 2u);                                /* y still owes */
  CHECK_ERR(st_handoff_acquire(p, 0, &ch, NULL), ST_ERR_TIMEOUT);
  CHECK_EQ_INT(st_handoff_ack(y, ch, s1), ST_OK);
  /* recycled: the old sequence is stale for everyone */
  CHECK_EQ_INT(produce(p, 1000, 10, &ch, &s2, &sum), ST_OK);
  CHECK(s2 != s1);
  CHECK_ERR(st_handoff_ack(x, ch, s1), ST_ERR_STALE_HANDLE);
  CHECK_ERR(st_handoff_ack(y, ch, s1), ST_ERR_STALE_HANDLE);
  CHECK_ERR(st_handoff_read(y, ch, s1, 0, NULL, NULL), ST_ERR_STALE_HANDLE);
  CHECK_EQ_INT(st_handoff_pending(p, ch, &seq, &pending), ST_OK);
  CHECK(seq == s2 && pending == 3u);
  /* a publish the consumer waits for arrives within its timeout */
  CHECK_ERR(st_handoff_read(x, ch, s2 + 1, 30, NULL, NULL), ST_ERR_TIMEOUT);
  CHECK_ERR(st_handoff_publish(p, ch, 10, NULL), ST_ERR_INVALID_ARGUMENT);   /* not acquired */
  CHECK_ERR(st_handoff_cancel(p, ch), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_handoff_ack(x, ch, s2), ST_OK);
  CHECK_EQ_INT(st_handoff_ack(y, ch, s2), ST_OK);
  CHECK_EQ_INT(st_handoff_acquire(p, 0, &ch, NULL), ST_OK);
  CHECK_ERR(st_handoff_publish(p, ch, CHUNK + 1, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_handoff_error(p), "do not fit a chunk of 8192");
  CHECK_EQ_INT(st_handoff_cancel(p, ch), ST_OK);
  st_handoff_close(x);
  st_handoff_close(y);
  st_client_close(cx);
  st_client_close(cy);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", base()));
}

TEST(limits_refuse_with_clear_messages) {
  hk_figures_t start = base();
  st_handoff_t *h = NULL;
  char longname[80];
  memset(longname, 'n', 65);
  longname[65] = 0;
  CHECK_RC(st_handoff_create(cli, longname, "cpu", 1, 1, 1, &h), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_RC(st_handoff_create(cli, "a/b", "cpu", 1, 1, 1, &h), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "1 to 64 characters");
  CHECK_RC(st_handoff_create(cli, "x", "cpu", 0, 1, 1, &h), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_RC(st_handoff_create(cli, "x", "cpu", 1, 1, 32, &h), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "'consumers' must be 1 to 31");
  CHECK_RC(st_handoff_create(cli, "x", "cpu", 1, 65, 1, &h), ST_ERR_LIMIT, cli);
  CHECK_CONTAINS(st_client_error(cli), "65 chunks pass limits.max_handoff_chunks = 64");
  CHECK_RC(st_handoff_create(cli, "x", "tpu", 1, 1, 1, &h), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_RC(st_handoff_create(cli, "x", "cuda:9", 1, 1, 1, &h), ST_ERR_CAPABILITY, cli);
  /* 4 x 16 MiB against a 48 MiB budget */
  CHECK_RC(st_handoff_create(cli, "x", "cpu", 16u << 20, 4, 1, &h), ST_ERR_OUT_OF_MEMORY, cli);
  CHECK_CONTAINS(st_client_error(cli), "memory_budget.cpu");
  CHECK_RC(st_handoff_open(cli, "nobody", &h), ST_ERR_NOT_FOUND, cli);
  /* per connection: 3 */
  st_handoff_t *hs[3];
  for (int i = 0; i < 3; i++) {
    char name[16];
    snprintf(name, sizeof name, "n%d", i);
    CHECK_RC(st_handoff_create(cli, name, "cpu", 4096, 1, 1, &hs[i]), ST_OK, cli);
  }
  CHECK_RC(st_handoff_create(cli, "n3", "cpu", 4096, 1, 1, &h), ST_ERR_LIMIT, cli);
  CHECK_CONTAINS(st_client_error(cli), "limits.max_handoffs_per_connection = 3");
  OPEN_CLIENT(o, srv.socket);
  CHECK_RC(st_handoff_create(o, "n0", "cpu", 4096, 1, 1, &h), ST_ERR_INVALID_ARGUMENT, o);
  CHECK_CONTAINS(st_client_error(o), "a hand-off named 'n0' exists");
  CHECK_RC(st_handoff_open(o, "n0", &h), ST_OK, o);
  st_handoff_t *h2 = NULL;
  CHECK_RC(st_handoff_open(o, "n0", &h2), ST_ERR_INVALID_ARGUMENT, o);   /* already */
  OPEN_CLIENT(o2, srv.socket);
  CHECK_RC(st_handoff_open(o2, "n0", &h2), ST_ERR_LIMIT, o2);           /* 1 slot */
  CHECK_CONTAINS(st_client_error(o2), "has 1 consumer slots and all are open");
  st_client_close(o2);
  st_handoff_close(h);
  st_client_close(o);
  for (int i = 0; i < 3; i++) CHECK_RC(st_handoff_close(hs[i]), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

TEST(the_producer_leaving_and_delete) {
  hk_figures_t start = base();
  OPEN_CLIENT(pc, srv.socket);
  st_handoff_t *p = NULL, *x = NULL;
  CHECK_RC(st_handoff_create(pc, "gone", "cpu", CHUNK, 2, 1, &p), ST_OK, pc);
  CHECK_RC(st_handoff_open(cli, "gone", &x), ST_OK, cli);
  int ch;
  uint64_t s, sum;
  CHECK_EQ_INT(produce(p, 1000, 500, &ch, &s, &sum), ST_OK);
  CHECK_RC(st_handoff_close(p), ST_OK, pc);   /* the producer leaves */
  st_client_close(pc);
  CHECK_ERR(st_handoff_read(x, (ch + 1) % 2, 1000, 5000, NULL, NULL), ST_ERR_STALE_HANDLE);
  CHECK_CONTAINS(st_handoff_error(x), "the producer closed");
  void *data;
  uint64_t bytes;
  CHECK_EQ_INT(st_handoff_read(x, ch, s, 0, &data, &bytes), ST_OK);   /* still readable */
  CHECK(bytes == 500 && hk_sum(data, bytes) == sum);
  CHECK_EQ_INT(st_handoff_ack(x, ch, s), ST_OK);
  CHECK_RC(st_handoff_close(x), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
  /* delete: the server lets go at once; handles keep their mappings */
  CHECK_RC(st_handoff_create(cli, "del", "cpu", CHUNK, 2, 1, &p), ST_OK, cli);
  OPEN_CLIENT(o, srv.socket);
  CHECK_RC(st_handoff_open(o, "del", &x), ST_OK, o);
  CHECK_EQ_INT(produce(p, 1000, 700, &ch, &s, &sum), ST_OK);
  CHECK_RC(st_handoff_delete(o, "del"), ST_OK, o);
  CHECK_RC(st_handoff_delete(o, "del"), ST_ERR_NOT_FOUND, o);
  hk_figures_t with_o = start;
  with_o.fds++;   /* o's socket */
  CHECK(hk_back_to(cli, srv.pid, "cpu", with_o));
  CHECK_EQ_INT(st_handoff_read(x, ch, s, 0, &data, &bytes), ST_OK);
  CHECK(bytes == 700 && hk_sum(data, bytes) == sum);
  CHECK_ERR(st_handoff_acquire(p, 1000, &ch, NULL), ST_ERR_STALE_HANDLE);
  CHECK_CONTAINS(st_handoff_error(p), "was deleted");
  CHECK_RC(st_handoff_close(x), ST_OK, o);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  st_client_close(o);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

/* Every order of opening and publishing (pool.md: slots never opened
 * count from creation; a slot taken back counts from its open on). */
TEST(every_order_of_open_and_publish) {
  hk_figures_t start = base();
  st_handoff_t *p = NULL;
  int ch[2], c;
  uint64_t seq[2], sum[2], pending;
  /* the producer first: both chunks published before any consumer opens */
  CHECK_RC(st_handoff_create(cli, "order", "cpu", CHUNK, 2, 2, &p), ST_OK, cli);
  for (int i = 0; i < 2; i++)
    CHECK_EQ_INT(produce(p, 1000, 200, &ch[i], &seq[i], &sum[i]), ST_OK);
  CHECK_EQ_INT(st_handoff_pending(p, ch[0], NULL, &pending), ST_OK);
  CHECK(pending == 3u);
  hk_consumer_t a, b;
  CHECK(hk_spawn(&a, srv.socket, "order", NULL) == 0);
  CHECK(hk_spawn(&b, srv.socket, "order", NULL) == 0);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(st_handoff_pending(p, ch[i], NULL, &pending), ST_OK);
    CHECK(pending == 3u);     /* the opens kept what waits for them */
    CHECK_EQ_INT(hk_do(&a, HK_TAKE, ch[i], seq[i], sum[i], 200), ST_OK);
    CHECK_EQ_INT(hk_do(&a, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
    CHECK_EQ_INT(hk_do(&b, HK_TAKE, ch[i], seq[i], sum[i], 200), ST_OK);
    CHECK_EQ_INT(hk_do(&b, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
  }
  CHECK_EQ_INT(st_handoff_acquire(p, 1000, &c, NULL), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, c), ST_OK);
  hk_end(&a, 0);
  hk_end(&b, 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);

  /* the consumers first, then the publishes */
  CHECK_RC(st_handoff_create(cli, "order", "cpu", CHUNK, 2, 2, &p), ST_OK, cli);
  CHECK(hk_spawn(&a, srv.socket, "order", NULL) == 0);
  CHECK(hk_spawn(&b, srv.socket, "order", NULL) == 0);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(produce(p, 1000, 300, &ch[i], &seq[i], &sum[i]), ST_OK);
    CHECK_EQ_INT(hk_do(&a, HK_TAKE, ch[i], seq[i], sum[i], 300), ST_OK);
    CHECK_EQ_INT(hk_do(&b, HK_TAKE, ch[i], seq[i], sum[i], 300), ST_OK);
    CHECK_EQ_INT(hk_do(&a, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
    CHECK_EQ_INT(hk_do(&b, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
  }
  hk_end(&b, 0);

  /* a consumer joining mid-stream: a holds slot 0 and acknowledged
   * chunk 0; b's slot was used and left, so a new consumer taking it
   * counts from its open: the chunk published before waits for a alone */
  CHECK_EQ_INT(produce(p, 1000, 400, &ch[0], &seq[0], &sum[0]), ST_OK);
  CHECK_EQ_INT(st_handoff_pending(p, ch[0], NULL, &pending), ST_OK);
  CHECK(pending == (1u << a.slot));
  hk_consumer_t late;
  CHECK(hk_spawn(&late, srv.socket, "order", NULL) == 0);
  CHECK_EQ_INT(hk_do(&a, HK_ACK, ch[0], seq[0], 0, 0), ST_OK);
  CHECK_EQ_INT(produce(p, 1000, 500, &ch[1], &seq[1], &sum[1]), ST_OK);
  CHECK_EQ_INT(st_handoff_pending(p, ch[1], NULL, &pending), ST_OK);
  CHECK(pending == ((1u << a.slot) | (1u << late.slot)));
  CHECK_EQ_INT(hk_do(&late, HK_TAKE, ch[1], seq[1], sum[1], 500), ST_OK);
  CHECK_EQ_INT(hk_do(&late, HK_ACK, ch[1], seq[1], 0, 0), ST_OK);
  CHECK_EQ_INT(hk_do(&a, HK_ACK, ch[1], seq[1], 0, 0), ST_OK);
  hk_end(&a, 0);
  hk_end(&late, 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);

  /* a consumer joining mid-stream on a slot never opened: a takes slot
   * 0, two requests go by, then b opens slot 1 and gets both */
  CHECK_RC(st_handoff_create(cli, "order", "cpu", CHUNK, 2, 2, &p), ST_OK, cli);
  CHECK(hk_spawn(&a, srv.socket, "order", NULL) == 0);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(produce(p, 1000, 600, &ch[i], &seq[i], &sum[i]), ST_OK);
    CHECK_EQ_INT(hk_do(&a, HK_TAKE, ch[i], seq[i], sum[i], 600), ST_OK);
    CHECK_EQ_INT(hk_do(&a, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
  }
  CHECK_ERR(st_handoff_acquire(p, 20, &c, NULL), ST_ERR_TIMEOUT);   /* they wait for b */
  CHECK(hk_spawn(&b, srv.socket, "order", NULL) == 0);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(hk_do(&b, HK_TAKE, ch[i], seq[i], sum[i], 600), ST_OK);
    CHECK_EQ_INT(hk_do(&b, HK_ACK, ch[i], seq[i], 0, 0), ST_OK);
  }
  CHECK_EQ_INT(st_handoff_acquire(p, 1000, &c, NULL), ST_OK);
  CHECK_EQ_INT(st_handoff_cancel(p, c), ST_OK);
  hk_end(&a, 0);
  hk_end(&b, 0);
  CHECK_RC(st_handoff_close(p), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", start));
}

int main(void) {
  cli = hk_start(&srv,
                 "memory_budget = { cpu = 48 * 1024 * 1024 }, limits = { "
                 "max_handoff_chunks = 64, max_handoffs_per_connection = 3 },",
                 NULL, &baseline);
  RUN(requests_flow_to_two_consumers_and_chunks_recycle);
  RUN(every_order_of_open_and_publish);
  RUN(a_chunk_is_not_acquired_again_before_every_ack);
  RUN(a_consumer_killed_mid_request_has_its_acks_made);
  RUN(forged_acks_change_nothing);
  RUN(consumers_map_the_data_read_only);
  RUN(limits_refuse_with_clear_messages);
  RUN(the_producer_leaving_and_delete);
  return stt_client_finish(cli, &srv);
}
