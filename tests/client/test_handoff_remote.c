/* Hand-offs across servers (docs/multihost.md, "Hand-offs across
 * servers"): alpha's producer publishes chunks of hand-offs alpha exports,
 * consumers on beta open them as "name@alpha" (UCX over TCP on lo,
 * tests/peer/remote_kit.h), each consumer in a process of its own:
 *   - a ticket (chunk, seq) of alpha's producer reads the same on beta,
 *     bytes and sizes checked (an empty chunk too), whether it was
 *     published before the mirror existed or after; with 4 chunks and 40
 *     requests the chunks are recycled on both servers, and the producer
 *     is held back until beta's consumer acknowledged (backpressure);
 *   - names and refusals: not exported, not a peer, malformed, a slot
 *     count exhausted; a mirror deleted on beta lets alpha's producer go;
 *   - beta's consumer SIGKILLed mid-request changes nothing for alpha's
 *     own consumer: the producer goes on past its chunk count, and the
 *     hand-off can be opened from beta again;
 *   - what each server reports: `handoffs` lists the follower on alpha and
 *     the mirror (source, state, engine, chunks in) on beta, `stcli
 *     handoffs` prints both, info counts them;
 *   - alpha SIGKILLed: beta's consumer still reads and acknowledges what
 *     arrived, a wait for more fails at once (the producer is gone), beta
 *     serves on and refuses to open the lost mirror again. */
#include <signal.h>
#include <sys/wait.h>

#include "../peer/remote_kit.h"
#include "handoff_kit.h"

#define CHUNK 70000u
#define CHUNKS 4

static st_client_t *pc;   /* alpha: the producer's connection */

/* Acquires (waiting at most `timeout_ms`), fills `bytes` from salt and
 * publishes: ST_OK with the ticket and the checksum. */
static int produce(st_handoff_t *h, int timeout_ms, uint64_t bytes, uint64_t salt, int *chunk,
                   uint64_t *seq, uint64_t *sum) {
  void *data;
  int rc = st_handoff_acquire(h, timeout_ms, chunk, &data);
  if (rc != ST_OK) return rc;
  hk_fill(data, bytes, salt);
  *sum = hk_sum(data, bytes);
  return st_handoff_publish(h, *chunk, bytes, seq);
}

/* The bytes of request r: all sizes up to a chunk, one of them empty. */
static uint64_t size_of(int r) { return r == 5 ? 0 : 1 + ((uint64_t)r * 9973u) % CHUNK; }

TEST(tickets_read_the_same_on_both_servers) {
  st_handoff_t *p = NULL;
  CHECK_ERR_MSG(st_handoff_create(pc, "kv1", "cpu", CHUNK, CHUNKS, 1, &p), ST_OK,
                st_client_error(pc));
  /* Two publishes before anyone on beta opened: they wait for the peer's
   * slot, and come over when the mirror is made. */
  int chunk[CHUNKS];
  uint64_t seq[CHUNKS], sum[CHUNKS], bytes[CHUNKS];
  for (int i = 0; i < 2; i++) {
    bytes[i] = size_of(100 + i);
    CHECK_ERR_MSG(produce(p, 1000, bytes[i], 100 + i, &chunk[i], &seq[i], &sum[i]), ST_OK,
                  st_handoff_error(p));
  }
  hk_consumer_t k;
  CHECK(hk_spawn(&k, BETA.socket, "kv1@alpha", NULL) == 0);
  CHECK_EQ_INT(k.slot, 0);
  for (int i = 0; i < 2; i++) {
    CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[i], seq[i], sum[i], bytes[i]), ST_OK);
    CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[i], seq[i], 0, 0), ST_OK);
  }
  /* 40 requests through 4 chunks: one at a time, then four at once (one
   * batch, or several), each read on beta with the producer's ticket. */
  for (int r = 0; r < 40; r++) {
    int n = r < 20 ? 1 : CHUNKS;
    for (int i = 0; i < n; i++) {
      bytes[i] = size_of(r * CHUNKS + i);
      CHECK_ERR_MSG(produce(p, 10000, bytes[i], (uint64_t)(r * CHUNKS + i), &chunk[i], &seq[i],
                            &sum[i]),
                    ST_OK, st_handoff_error(p));
    }
    for (int i = 0; i < n; i++) {
      CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[i], seq[i], sum[i], bytes[i]), ST_OK);
      CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[i], seq[i], 0, 0), ST_OK);
    }
  }
  /* Backpressure: beta's consumer holds all four chunks there; alpha's
   * producer publishes four more, which wait on alpha for the mirror's
   * chunks (the peer's slot keeps them), and then finds none free. One
   * acknowledgement on beta lets that chunk's next publish move, which
   * frees alpha's chunk. Memory: four chunks on each server. */
  for (int i = 0; i < CHUNKS; i++) {
    bytes[i] = 64;
    CHECK_EQ_INT(produce(p, 1000, 64, 7000 + i, &chunk[i], &seq[i], &sum[i]), ST_OK);
    CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[i], seq[i], sum[i], 64), ST_OK);
  }
  int c2[CHUNKS];
  uint64_t s2[CHUNKS], u2[CHUNKS];
  for (int i = 0; i < CHUNKS; i++)
    CHECK_EQ_INT(produce(p, 1000, 64, 7200 + i, &c2[i], &s2[i], &u2[i]), ST_OK);
  int c5;
  uint64_t s5, u5;
  CHECK_ERR(produce(p, 300, 64, 7100, &c5, &s5, &u5), ST_ERR_TIMEOUT);
  CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[0], seq[0], 0, 0), ST_OK);
  CHECK_ERR_MSG(produce(p, 10000, 64, 7101, &c5, &s5, &u5), ST_OK, st_handoff_error(p));
  CHECK_EQ_INT(c5, chunk[0]);
  for (int i = 1; i < CHUNKS; i++) CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[i], seq[i], 0, 0), ST_OK);
  for (int i = 0; i < CHUNKS; i++) {
    CHECK_EQ_INT(hk_do(&k, HK_TAKE, c2[i], s2[i], u2[i], 64), ST_OK);
    CHECK_EQ_INT(hk_do(&k, HK_ACK, c2[i], s2[i], 0, 0), ST_OK);
  }
  CHECK_EQ_INT(hk_do(&k, HK_TAKE, c5, s5, u5, 64), ST_OK);
  hk_end(&k, 0);
  CHECK_EQ_INT(st_handoff_close(p), ST_OK);
}

/* The `handoffs` entry named `name` of the server at socket (NULL when
 * absent); *keep holds the reply (free it). */
static const st_value_t *listed(const char *socket, const char *name, st_result_t **keep) {
  *keep = NULL;
  st_client_t *c = stt_client_open(socket);
  if (!c) return NULL;
  if (st_client_rpc(c, "handoffs", NULL, keep) != ST_OK) {
    st_client_close(c);
    return NULL;
  }
  st_client_close(c);
  const st_value_t *v = st_result_value(*keep);
  for (size_t i = 0; v && v->kind == ST_VALUE_ARRAY && i < v->as.array.len; i++) {
    const st_value_t *n = st_value_get(&v->as.array.items[i], "name");
    if (n && n->kind == ST_VALUE_STRING && !strcmp(n->as.str.ptr, name))
      return &v->as.array.items[i];
  }
  return NULL;
}

static int64_t int_of(const st_value_t *m, const char *k) {
  const st_value_t *v = m ? st_value_get(m, k) : NULL;
  return v && v->kind == ST_VALUE_INT ? v->as.integer : -1;
}

static const char *str_of(const st_value_t *m, const char *k) {
  const st_value_t *v = m ? st_value_get(m, k) : NULL;
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : "";
}

/* stcli handoffs on the server at socket: its output (owned). */
static char *stcli_handoffs(const char *socket) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' --socket '%s' handoffs 2>&1", getenv("ST_CLI_BIN"), socket);
  FILE *f = popen(cmd, "r");
  if (!f) return NULL;
  char *out = calloc(1, 65536);
  size_t n = out ? fread(out, 1, 65535, f) : 0;
  (void)n;
  pclose(f);
  return out;
}

TEST(each_server_reports_its_side) {
  st_handoff_t *p = NULL;
  CHECK_EQ_INT(st_handoff_create(pc, "kv7", "cpu", 4096, 3, 1, &p), ST_OK);
  hk_consumer_t k;
  CHECK(hk_spawn(&k, BETA.socket, "kv7@alpha", NULL) == 0);
  int chunk;
  uint64_t seq, sum;
  for (int r = 0; r < 5; r++) {
    CHECK_EQ_INT(produce(p, 10000, 1000, (uint64_t)r, &chunk, &seq, &sum), ST_OK);
    CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk, seq, sum, 1000), ST_OK);
    CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk, seq, 0, 0), ST_OK);
  }
  st_result_t *ra, *rb;
  const st_value_t *a = listed(ALPHA.socket, "kv7", &ra), *b = listed(BETA.socket, "kv7@alpha", &rb);
  CHECK(a != NULL && b != NULL);
  CHECK_EQ_INT(int_of(a, "chunks"), 3);
  CHECK_EQ_INT(int_of(a, "consumers"), 1);
  CHECK_EQ_INT(int_of(a, "open"), 1);           /* beta's slot */
  const st_value_t *fol = st_value_get(a, "followers");
  CHECK(fol && fol->kind == ST_VALUE_ARRAY && fol->as.array.len == 1);
  if (fol && fol->kind == ST_VALUE_ARRAY && fol->as.array.len == 1) {
    CHECK_STR_EQ(str_of(&fol->as.array.items[0], "peer"), "beta");
    CHECK_EQ_INT(int_of(&fol->as.array.items[0], "slot"), 0);
  }
  CHECK(st_value_get(a, "mirror") && st_value_get(a, "mirror")->kind == ST_VALUE_NIL);
  const st_value_t *m = b ? st_value_get(b, "mirror") : NULL;
  CHECK(m && m->kind == ST_VALUE_MAP);
  CHECK_STR_EQ(str_of(m, "peer"), "alpha");
  CHECK_STR_EQ(str_of(m, "source"), "kv7");
  CHECK_STR_EQ(str_of(m, "state"), "live");
  CHECK_STR_EQ(str_of(m, "engine"), "ucx");
  CHECK_EQ_INT(int_of(m, "chunks_in"), 5);
  CHECK_EQ_INT(int_of(m, "bytes_in"), 5000);
  CHECK_EQ_INT(int_of(b, "pending"), 0);        /* every chunk acknowledged */
  st_result_free(ra);
  st_result_free(rb);
  CHECK_EQ_INT(server_info_int(&ALPHA, "transfers.handoff_followers"), 1);
  CHECK_EQ_INT(server_info_int(&BETA, "transfers.handoff_mirrors"), 1);
  char *oa = stcli_handoffs(ALPHA.socket), *ob = stcli_handoffs(BETA.socket);
  CHECK(oa && ob);
  if (oa && ob) {
    CHECK_CONTAINS(oa, "followed by beta");
    CHECK_CONTAINS(ob, "mirror of alpha over ucx: live, 5 chunks");
  }
  free(oa);
  free(ob);
  hk_end(&k, 0);
  CHECK_EQ_INT(st_handoff_close(p), ST_OK);
}

TEST(names_and_refusals) {
  st_client_t *b = stt_client_open(BETA.socket);
  CHECK(b != NULL);
  st_handoff_t *p = NULL, *h = NULL;
  CHECK_EQ_INT(st_handoff_create(pc, "secret", "cpu", 4096, 2, 1, &p), ST_OK);
  CHECK_ERR(st_handoff_open(b, "secret@alpha", &h), ST_ERR_AUTH);
  CHECK_CONTAINS(st_client_error(b), "not exported");
  CHECK_ERR(st_handoff_open(b, "kv9@nobody", &h), ST_ERR_NOT_FOUND);
  CHECK_CONTAINS(st_client_error(b), "not a peer");
  CHECK_ERR(st_handoff_open(b, "kv9@alpha", &h), ST_ERR_NOT_FOUND);
  CHECK_ERR(st_handoff_open(b, "a@b@c", &h), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_handoff_open(b, "bad name@alpha", &h), ST_ERR_INVALID_ARGUMENT);
  /* A mirror has the first opener's slot count (1): a second opener gets
   * LIMIT, and the mirror goes on for the first. */
  st_handoff_t *q = NULL;
  CHECK_EQ_INT(st_handoff_create(pc, "kv4", "cpu", 4096, 2, 1, &q), ST_OK);
  CHECK_ERR_MSG(st_handoff_open(b, "kv4@alpha", &h), ST_OK, st_client_error(b));
  st_client_t *b2 = stt_client_open(BETA.socket);
  st_handoff_t *h2 = NULL;
  CHECK_ERR(st_handoff_open(b2, "kv4@alpha", &h2), ST_ERR_LIMIT);
  st_client_close(b2);
  int chunk;
  uint64_t seq, sum;
  CHECK_EQ_INT(produce(q, 1000, 100, 1, &chunk, &seq, &sum), ST_OK);
  void *data;
  uint64_t got;
  CHECK_ERR_MSG(st_handoff_read(h, chunk, seq, 10000, &data, &got), ST_OK, st_handoff_error(h));
  CHECK_EQ_INT(got, 100);
  CHECK(hk_sum(data, got) == sum);
  CHECK_EQ_INT(st_handoff_ack(h, chunk, seq), ST_OK);
  CHECK_EQ_INT(st_handoff_close(h), ST_OK);
  CHECK_EQ_INT(st_handoff_close(q), ST_OK);
  CHECK_EQ_INT(st_handoff_close(p), ST_OK);
  /* st_handoff_open_ex: the first opener gives the mirror two consumer
   * slots, so a second opener gets slot 1; consumers or device for a
   * hand-off of this server is refused, as is a negative count. */
  CHECK_EQ_INT(st_handoff_create(pc, "kv6", "cpu", 4096, 2, 1, &q), ST_OK);
  CHECK_ERR(st_handoff_open_ex(b, "kv6@alpha", -1, NULL, &h), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR_MSG(st_handoff_open_ex(b, "kv6@alpha", 2, "cpu", &h), ST_OK, st_client_error(b));
  int consumers = 0, slot = -2, dev = 0;
  CHECK_EQ_INT(st_handoff_shape(h, NULL, NULL, &consumers, &slot, &dev), ST_OK);
  CHECK_EQ_INT(consumers, 2);
  CHECK_EQ_INT(slot, 0);
  CHECK_EQ_INT(dev, -1);
  b2 = stt_client_open(BETA.socket);
  CHECK_ERR_MSG(st_handoff_open_ex(b2, "kv6@alpha", 5, NULL, &h2), ST_OK, st_client_error(b2));
  CHECK_EQ_INT(st_handoff_shape(h2, NULL, NULL, &consumers, &slot, NULL), ST_OK);
  CHECK_EQ_INT(consumers, 2);   /* a later open's count is ignored */
  CHECK_EQ_INT(slot, 1);
  CHECK_ERR(st_handoff_open_ex(b2, "kv6", 2, NULL, &h2), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(b2), "are for a peer's hand-off");
  st_handoff_close(h2);
  st_client_close(b2);
  CHECK_EQ_INT(st_handoff_close(h), ST_OK);
  CHECK_EQ_INT(st_handoff_close(q), ST_OK);
  /* A mirror deleted on beta ends its subscription: alpha's producer then
   * publishes past its chunk count with nobody following. */
  CHECK_EQ_INT(st_handoff_create(pc, "kv5", "cpu", 4096, 2, 1, &q), ST_OK);
  CHECK_ERR_MSG(st_handoff_open(b, "kv5@alpha", &h), ST_OK, st_client_error(b));
  CHECK_ERR_MSG(st_handoff_delete(b, "kv5@alpha"), ST_OK, st_client_error(b));
  for (int r = 0; r < 6; r++)
    CHECK_ERR_MSG(produce(q, 10000, 10, (uint64_t)r, &chunk, &seq, &sum), ST_OK,
                  st_handoff_error(q));
  st_handoff_close(h);
  CHECK_EQ_INT(st_handoff_close(q), ST_OK);
  st_client_close(b);
}

TEST(a_consumer_killed_on_beta_changes_nothing_on_alpha) {
  st_handoff_t *p = NULL;
  CHECK_EQ_INT(st_handoff_create(pc, "kv2", "cpu", CHUNK, CHUNKS, 2, &p), ST_OK);
  hk_consumer_t ka, kb;
  CHECK(hk_spawn(&ka, ALPHA.socket, "kv2", NULL) == 0);
  CHECK(hk_spawn(&kb, BETA.socket, "kv2@alpha", NULL) == 0);
  int chunk;
  uint64_t seq, sum;
  for (int r = 0; r < 3; r++) {
    CHECK_ERR_MSG(produce(p, 10000, 5000, (uint64_t)r, &chunk, &seq, &sum), ST_OK,
                  st_handoff_error(p));
    CHECK_EQ_INT(hk_do(&ka, HK_TAKE, chunk, seq, sum, 5000), ST_OK);
    CHECK_EQ_INT(hk_do(&ka, HK_ACK, chunk, seq, 0, 0), ST_OK);
    CHECK_EQ_INT(hk_do(&kb, HK_TAKE, chunk, seq, sum, 5000), ST_OK);
    CHECK_EQ_INT(hk_do(&kb, HK_ACK, chunk, seq, 0, 0), ST_OK);
  }
  /* beta's consumer holds one and dies. */
  CHECK_EQ_INT(produce(p, 10000, 5000, 50, &chunk, &seq, &sum), ST_OK);
  CHECK_EQ_INT(hk_do(&kb, HK_TAKE, chunk, seq, sum, 5000), ST_OK);
  hk_end(&kb, 1);
  CHECK_EQ_INT(hk_do(&ka, HK_TAKE, chunk, seq, sum, 5000), ST_OK);
  CHECK_EQ_INT(hk_do(&ka, HK_ACK, chunk, seq, 0, 0), ST_OK);
  /* The mirror ended with its consumer and alpha closed the peer's slot:
   * 3 × the chunks go through alpha's own consumer alone. */
  for (int r = 0; r < 3 * CHUNKS; r++) {
    CHECK_ERR_MSG(produce(p, 10000, 4096, (uint64_t)(100 + r), &chunk, &seq, &sum), ST_OK,
                  st_handoff_error(p));
    CHECK_EQ_INT(hk_do(&ka, HK_TAKE, chunk, seq, sum, 4096), ST_OK);
    CHECK_EQ_INT(hk_do(&ka, HK_ACK, chunk, seq, 0, 0), ST_OK);
  }
  /* And beta may follow it again. */
  CHECK(hk_spawn(&kb, BETA.socket, "kv2@alpha", NULL) == 0);
  CHECK_EQ_INT(produce(p, 10000, 777, 999, &chunk, &seq, &sum), ST_OK);
  CHECK_EQ_INT(hk_do(&kb, HK_TAKE, chunk, seq, sum, 777), ST_OK);
  CHECK_EQ_INT(hk_do(&ka, HK_TAKE, chunk, seq, sum, 777), ST_OK);
  hk_end(&kb, 0);
  hk_end(&ka, 0);
  CHECK_EQ_INT(st_handoff_close(p), ST_OK);
}

TEST(alpha_killed_beta_keeps_what_arrived) {
  st_handoff_t *p = NULL;
  CHECK_EQ_INT(st_handoff_create(pc, "kv3", "cpu", CHUNK, CHUNKS, 1, &p), ST_OK);
  hk_consumer_t k;
  CHECK(hk_spawn(&k, BETA.socket, "kv3@alpha", NULL) == 0);
  int chunk[2];
  uint64_t seq[2], sum[2];
  for (int i = 0; i < 2; i++)
    CHECK_EQ_INT(produce(p, 1000, 3000, (uint64_t)(40 + i), &chunk[i], &seq[i], &sum[i]), ST_OK);
  /* Both arrived (the first read waits for them); then alpha dies. */
  CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[0], seq[0], sum[0], 3000), ST_OK);
  CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[1], seq[1], sum[1], 3000), ST_OK);
  CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[0], seq[0], 0, 0), ST_OK);
  CHECK(kill(ALPHA.pid, SIGKILL) == 0);
  waitpid(ALPHA.pid, NULL, 0);
  ALPHA.pid = -1;
  st_client_close(pc);
  pc = NULL;
  /* What arrived stays readable and acknowledgeable. */
  CHECK_EQ_INT(hk_do(&k, HK_TAKE, chunk[1], seq[1], sum[1], 3000), ST_OK);
  CHECK_EQ_INT(hk_do(&k, HK_ACK, chunk[1], seq[1], 0, 0), ST_OK);
  /* A wait for more fails once beta knows (not at the read's timeout). */
  int rc = ST_ERR_TIMEOUT;
  for (int i = 0; i < 20 && rc == ST_ERR_TIMEOUT; i++)
    rc = hk_do(&k, HK_TAKE, chunk[0], seq[1] + 10, 0, 0);
  CHECK_ERR(rc, ST_ERR_STALE_HANDLE);
  st_client_t *b = stt_client_open(BETA.socket);
  CHECK(b != NULL);
  CHECK_EQ_INT(st_client_ping(b, NULL), ST_OK);
  st_handoff_t *h = NULL;
  CHECK_ERR(st_handoff_open(b, "kv3@alpha", &h), ST_ERR_CAPABILITY);
  st_client_close(b);
  hk_end(&k, 0);
}

int main(void) {
  rk_require();
  if (rk_start_with(512ull * RK_MIB, ", export = { 'w/*', 'kv*' }") != 0) {
    rk_stop();
    fprintf(stderr, "the two servers did not start or link\n");
    return 1;
  }
  pc = stt_client_open(ALPHA.socket);
  if (!pc) return 1;
  RUN(tickets_read_the_same_on_both_servers);
  RUN(names_and_refusals);
  RUN(each_server_reports_its_side);
  RUN(a_consumer_killed_on_beta_changes_nothing_on_alpha);
  RUN(alpha_killed_beta_keeps_what_arrived);
  if (pc) st_client_close(pc);
  if (rk_stop_beta() != 0) return 1;
  return stt_summary();
}
