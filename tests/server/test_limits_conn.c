/* What one connection may hold, against a real stserver with small
 * limits (docs/operations.md, "Limits"):
 *   - a client that pipelines calls without reading their replies holds
 *     at most limits.max_fds_per_connection descriptors and
 *     limits.max_queued_bytes_per_connection arena bytes: the replies past
 *     them get LIMIT naming the key, while another client keeps calling;
 *   - all connections together hold at most limits.max_fds_all_connections
 *     descriptors: a reply past it gets LIMIT, and descriptors a client
 *     sends past it are closed on arrival (its request gets LIMIT); both
 *     work again once the greedy clients read;
 *   - accept when the server is out of descriptors: the client gets LIMIT,
 *     the server keeps serving and logs it once;
 *   - stserver --check shows the limits.
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "check.h"
#include "proc.h"
#include "wire.h"

static stt_server_t S;

/* blob: a plain float32 tensor of n elements (one arena, 4n bytes). */
static const char EP_BLOB[] =
    "return st.endpoint{ name = \"blob\", params = { n = 4 },\n"
    "  build = function(a) return st.zeros{a.n, dtype = \"float32\"} end }\n";
/* first: the first float64 of a tensor argument. */
static const char EP_FIRST[] =
    "return st.endpoint{ name = \"first\",\n"
    "  params = { x = st.tensor_param{ dtype = \"float64\", device = \"cpu\" } },\n"
    "  build = function(a) return a.x:get(0) end }\n";

#define PER_FDS 8
#define ALL_FDS 24
#define PER_BYTES (1 << 20)

/* ------------------------------------------------------------- helpers */

/* Sends n calls of blob(elems) on c at once, without reading. 0 or -1. */
static int send_blobs(rc_t *c, int n, int elems, uint32_t first_id) {
  mpbuf_t b;
  mpbuf_init(&b);
  for (int i = 0; i < n; i++)
    stt_pack(&b.pk, "[0, %u, 'call', [{endpoint: 'blob', args: {n: %d}}]]",
             first_id + (uint32_t)i, elems);
  int rc = rc_send(c, b.sb.data, b.sb.size);
  mpbuf_free(&b);
  return rc;
}

/* Waits until the server answered every call it accepted (counters.calls
 * reached `calls` and nothing is in flight). 0 or -1. */
static int all_answered(rc_t *mon, int64_t calls) {
  double end = stt_now_ms() + 10000;
  while (stt_now_ms() < end) {
    if (rc_info_int(mon, "counters.calls") >= calls && rc_info_int(mon, "inflight") == 0)
      return 0;
    stt_sleep_ms(5);
  }
  return -1;
}

/* Reads n replies on c: *ok counts results, the others must be LIMIT
 * errors whose message contains `key`. 0 or -1. */
static int read_replies(rc_t *c, int n, const char *key, int *ok) {
  *ok = 0;
  for (int i = 0; i < n; i++) {
    msg_t m;
    if (rc_next(c, &m, 10000) != 1) {
      fprintf(stderr, "   reply %d of %d missing\n", i + 1, n);
      return -1;
    }
    if (!m.error) {
      (*ok)++;
    } else if (-msg_code(&m) != ST_ERR_LIMIT || !strstr(msg_errmsg(&m), key)) {
      fprintf(stderr, "   reply %d: %s '%s', expected LIMIT naming %s\n", i + 1,
              msg_errname(&m), msg_errmsg(&m), key);
      msg_free(&m);
      return -1;
    }
    msg_free(&m);
  }
  rc_drop_fds(c);
  return 0;
}

/* One blob(elems) call on c that must succeed with one descriptor. */
static int blob_ok(rc_t *c, int elems) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, 5, 'call', [{endpoint: 'blob', args: {n: %d}}]]", elems) != 1)
    return -1;
  int good = !m.error && c->nfds == 1;
  msg_free(&m);
  rc_drop_fds(c);
  return good ? 0 : -1;
}

/* Polls (5 s) until a blob call on c succeeds again. */
static int blob_ok_soon(rc_t *c) {
  double end = stt_now_ms() + 5000;
  while (stt_now_ms() < end) {
    if (blob_ok(c, 4) == 0) return 0;
    stt_sleep_ms(20);
  }
  return -1;
}

/* ------------------------------------------------------------- tests */

TEST(a_client_that_never_reads_holds_at_most_its_descriptors) {
  OPEN_RC(mon, S.socket);
  OPEN_RC(greedy, S.socket);
  OPEN_RC(other, S.socket);
  int base = stt_proc_fd_count(S.pid);
  int64_t calls = rc_info_int(&mon, "counters.calls");
  enum { N = 60 };
  CHECK(send_blobs(&greedy, N, 4, 1000) == 0);
  CHECK(all_answered(&mon, calls + N) == 0);
  /* the server holds no more than the limit for it... */
  CHECK(stt_proc_fd_count(S.pid) <= base + PER_FDS);
  /* ...and another client keeps calling */
  for (int i = 0; i < 20; i++) CHECK(blob_ok(&other, 4) == 0);
  int ok = 0;
  CHECK(read_replies(&greedy, N, "limits.max_fds_per_connection = 8", &ok) == 0);
  CHECK(ok >= 1 && ok <= PER_FDS);
  /* once it read them, it calls as usual */
  CHECK(blob_ok_soon(&greedy) == 0);
  rc_close(&greedy);
  rc_close(&other);
  CHECK(rc_wait_info(&mon, "held.fds", 0, 5000) == 0);
  rc_close(&mon);
}

TEST(a_client_that_never_reads_pins_at_most_its_bytes) {
  OPEN_RC(mon, S.socket);
  OPEN_RC(greedy, S.socket);
  OPEN_RC(other, S.socket);
  int64_t calls = rc_info_int(&mon, "counters.calls");
  enum { N = 6, ELEMS = 65536 };   /* 256 KiB each: 4 fit in 1 MiB */
  CHECK(send_blobs(&greedy, N, ELEMS, 2000) == 0);
  CHECK(all_answered(&mon, calls + N) == 0);
  for (int i = 0; i < 5; i++) CHECK(blob_ok(&other, ELEMS) == 0);
  int ok = 0;
  CHECK(read_replies(&greedy, N, "limits.max_queued_bytes_per_connection = 1048576", &ok) == 0);
  CHECK(ok >= 1 && ok <= PER_BYTES / (ELEMS * 4));
  CHECK(blob_ok_soon(&greedy) == 0);
  rc_close(&greedy);
  rc_close(&other);
  CHECK(rc_wait_info(&mon, "held.bytes", 0, 5000) == 0);
  rc_close(&mon);
}

#define FIRST_CALL(id)                                                              \
  "[0, " #id ", 'call', [{endpoint: 'first', args: {x: tensor(0, 0, 'float64', [1], " \
  "[1])}, arenas: [{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 1}]}]]"

TEST(all_connections_together_hold_at_most_their_descriptors) {
  OPEN_RC(mon, S.socket);
  rc_t g[ALL_FDS / PER_FDS];
  int64_t calls = rc_info_int(&mon, "counters.calls");
  for (int i = 0; i < ALL_FDS / PER_FDS; i++) {
    CHECK(rc_open(&g[i], S.socket) == 0);
    CHECK(send_blobs(&g[i], 2 * PER_FDS, 4, 3000) == 0);
    calls += 2 * PER_FDS;
    CHECK(all_answered(&mon, calls) == 0);
  }
  /* every descriptor for clients is taken: a reply that needs one... */
  OPEN_RC(late, S.socket);
  CHECK_RPC(&late, ST_ERR_LIMIT, "limits.max_fds_all_connections = 24",
            "[0, 1, 'call', [{endpoint: 'blob', args: {}}]]");
  /* ...and descriptors a client sends are closed on arrival */
  int fds[1] = {rc_memfd_with(4096, 7, 0)};
  CHECK(fds[0] >= 0);
  CHECK_RPC_FDS(&late, fds, 1, ST_ERR_LIMIT, "closed on arrival", FIRST_CALL(2));
  CHECK(stt_ping(late.fd, 3) == 0);
  /* one greedy client reads: room again */
  int ok = 0;
  CHECK(read_replies(&g[0], 2 * PER_FDS, "limits.max_fds_per_connection", &ok) == 0);
  CHECK(blob_ok_soon(&late) == 0);
  fds[0] = rc_memfd_with(4096, 7, 0);
  msg_t m;
  CHECK(rc_rpcf_fds(&late, &m, fds, 1, FIRST_CALL(4)) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  msg_free(&m);
  for (int i = 0; i < ALL_FDS / PER_FDS; i++) rc_close(&g[i]);
  rc_close(&late);
  CHECK(rc_wait_info(&mon, "held.fds", 0, 5000) == 0);
  CHECK(rc_wait_info(&mon, "held.bytes", 0, 5000) == 0);
  rc_close(&mon);
}

/* Opens a connection and pings: 1 when served, 0 when refused with LIMIT
 * for want of descriptors (closed then), -1 otherwise. */
static int open_and_ping(rc_t *c) {
  if (rc_open(c, S.socket) != 0 || rc_sendf(c, "[0, 1, 'ping', []]") != 0) return -1;
  msg_t m;
  if (rc_next(c, &m, 5000) != 1) return -1;
  int rc = !m.error                                         ? 1
           : -msg_code(&m) == ST_ERR_LIMIT && m.id == 0 &&
                   strstr(msg_errmsg(&m), "no descriptor left") ? 0
                                                            : -1;
  msg_free(&m);
  if (rc == 0) rc_close(c);
  return rc;
}

TEST(accept_without_descriptors_refuses_and_keeps_serving) {
  OPEN_RC(a, S.socket);
  CHECK(stt_ping(a.fd, 1) == 0);
  struct rlimit saved, tight;
  CHECK(prlimit(S.pid, RLIMIT_NOFILE, NULL, &saved) == 0);
  tight = saved;
  tight.rlim_cur = (rlim_t)stt_proc_fd_count(S.pid) + 2;
  CHECK(prlimit(S.pid, RLIMIT_NOFILE, &tight, NULL) == 0);
  /* connections take the descriptors left; then one gets LIMIT, not a
   * hang or a crash, and so do the next ones */
  enum { MAX = 16 };
  rc_t extra[MAX];
  int n = 0, r = 1;
  while (n < MAX && (r = open_and_ping(&extra[n])) == 1) n++;
  CHECK_EQ_INT(r, 0);
  for (int i = 0; i < 3; i++) {
    rc_t b;
    CHECK_EQ_INT(open_and_ping(&b), 0);
  }
  CHECK(stt_ping(a.fd, 2) == 0);
  for (int i = 0; i < n; i++) CHECK(stt_ping(extra[i].fd, 3) == 0);
  CHECK(prlimit(S.pid, RLIMIT_NOFILE, &saved, NULL) == 0);
  for (int i = 0; i < n; i++) rc_close(&extra[i]);
  rc_t c;
  CHECK_EQ_INT(open_and_ping(&c), 1);
  rc_close(&c);
  rc_close(&a);
  /* said once, not once per attempt */
  char *log = stt_server_log(&S);
  CHECK(log != NULL);
  int said = 0;
  for (const char *p = log; (p = strstr(p, "out of file descriptors")); p++) said++;
  free(log);
  CHECK_EQ_INT(said, 1);
}

TEST(check_shows_the_limits) {
  const char *args[] = {"--config", S.config, "--check", NULL};
  stt_proc_t r;
  CHECK_EQ_INT(stt_run(&r, getenv("ST_SERVER_BIN"), args, NULL, 0), 0);
  CHECK_CONTAINS_ALL(r.out, "max_fds_per_connection=8", "max_fds_all_connections=24",
                            "max_queued_bytes_per_connection=1048576",
                            "max_queued_bytes_all_connections=");
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S,
                   "memory_budget = { cpu = 16 * 2^20 },\n"
                   "limits = { max_fds_per_connection = 8, max_fds_all_connections = 24,\n"
                   "           max_queued_bytes_per_connection = 1048576 },",
                   (const stt_endpoint_t[]){{"blob.lua", EP_BLOB},
                                            {"first.lua", EP_FIRST},
                                            {NULL, NULL}});
  RUN(a_client_that_never_reads_holds_at_most_its_descriptors);
  RUN(a_client_that_never_reads_pins_at_most_its_bytes);
  RUN(all_connections_together_hold_at_most_their_descriptors);
  RUN(accept_without_descriptors_refuses_and_keeps_serving);
  RUN(check_shows_the_limits);
  return stt_server_finish(&S);
}
