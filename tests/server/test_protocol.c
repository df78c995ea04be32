/* Wire-level tests of a real stserver over raw sockets: hello, ping,
 * unknown methods, bad params, split and pipelined frames, garbage and
 * oversize frames, the half-sent frame timeout, BUSY, max_connections and
 * descriptors sent by clients. */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "check.h"
#include "st/wire.h"
#include "wire.h"

static stt_server_t S;

static const char SLOW[] =
    "return st.endpoint{\n"
    "  name = \"slow\", params = { s = 0.2 },\n"
    "  build = function(a) st.sleep(a.s); return 42 end,\n"
    "}\n";

TEST(hello_fields) {
  OPEN_RC(c, S.socket);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 7, 'hello', [{protocol: %d, client: 'test_protocol'}]]",
                ST_PROTOCOL_VERSION) == 1);
  CHECK_EQ_INT(m.type, ST_MSG_RESPONSE);
  CHECK_EQ_INT(m.id, 7);
  CHECK_REPLY(&m, ST_OK, NULL);
  const msgpack_object *res = m.result;
  CHECK_EQ_INT(obj_int(obj_get(res, "protocol")), ST_PROTOCOL_VERSION);
  CHECK_STR_EQ(obj_str(obj_get(res, "version")), ST_VERSION_STRING);
  const char *sid = obj_str(obj_get(res, "server_id"));
  CHECK_EQ_INT(strlen(sid), 32);
  CHECK_EQ_INT(strspn(sid, "0123456789abcdef"), 32);
  CHECK_EQ_INT(obj_int(obj_get(res, "pid")), S.pid);
  CHECK_EQ_INT(obj_int(obj_get(res, "device")), 0);
  const msgpack_object *devs = obj_get(res, "devices");
  CHECK(devs && devs->type == MSGPACK_OBJECT_ARRAY && devs->via.array.size >= 1);
  CHECK_STR_EQ(obj_str(obj_get(&devs->via.array.ptr[0], "kind")), "cpu");
  CHECK_EQ_INT(obj_int(obj_path(res, "limits.max_message_bytes")), 65536);
  CHECK_EQ_INT(obj_int(obj_path(res, "limits.max_inflight")), 2);
  char saved[40];
  snprintf(saved, sizeof saved, "%s", sid);
  msg_free(&m);

  /* The server id is per process: the same on a second connection. */
  CHECK(rc_rpcf(&c, &m, "[0, 8, 'hello', []]") == 1);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "server_id")), saved);
  msg_free(&m);

  /* A newer protocol than the server's is refused; the connection stays. */
  CHECK_RPC(&c, ST_ERR_PROTOCOL, "protocol", "[0, 9, 'hello', [{protocol: %d}]]",
            ST_PROTOCOL_VERSION + 1);
  CHECK(stt_ping(c.fd, 10) == 0);
  rc_close(&c);
}

/* Well-formed requests the server refuses; each keeps the connection. */
static const frame_case_t refused[] = {
    {"[0, 2, 'frobnicate', []]", ST_ERR_UNKNOWN_METHOD, "frobnicate"},
    /* an unknown parameter name */
    {"[0, 1, 'ping', [{loud: true}]]", ST_ERR_INVALID_ARGUMENT, "loud"},
    /* params with two elements */
    {"[0, 2, 'info', [{}, {}]]", ST_ERR_INVALID_ARGUMENT, NULL},
    /* a parameter of the wrong type */
    {"[0, 3, 'hello', [{protocol: 'one'}]]", ST_ERR_INVALID_ARGUMENT, NULL},
    /* call without an endpoint name */
    {"[0, 4, 'call', [{endpoint: 5}]]", ST_ERR_INVALID_ARGUMENT, NULL},
};

TEST(refused_requests_keep_the_connection) {
  OPEN_RC(c, S.socket);
  CHECK(stt_ping(c.fd, 1) == 0);
  CHECK_RPC_TABLE(&c, refused, sizeof refused / sizeof refused[0]);
  CHECK(stt_ping(c.fd, 5) == 0);
  rc_close(&c);
}

/* The bytes of one hello request. */
static void hello_bytes(mpbuf_t *b, uint32_t id) {
  mpbuf_init(b);
  stt_pack(&b->pk, "[0, %u, 'hello', [{client: 'split-test'}]]", id);
}

TEST(split_frames) {
  OPEN_RC(c, S.socket);
  mpbuf_t r;
  hello_bytes(&r, 11);
  /* One byte per write, each read by the server on its own. */
  for (size_t i = 0; i < r.sb.size; i++) {
    CHECK(rc_send(&c, r.sb.data + i, 1) == 0);
    CHECK(rc_wait_drained(&c, 2000) == 0);
  }
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(m.id, 11);
  CHECK(m.error == NULL);
  msg_free(&m);
  /* Every split point of the frame. */
  for (size_t cut = 1; cut < r.sb.size; cut++) {
    CHECK(rc_send(&c, r.sb.data, cut) == 0);
    CHECK(rc_wait_drained(&c, 2000) == 0);
    CHECK(rc_send(&c, r.sb.data + cut, r.sb.size - cut) == 0);
    CHECK(rc_next(&c, &m, 5000) == 1);
    CHECK_EQ_INT(m.id, 11);
    CHECK(m.error == NULL);
    msg_free(&m);
  }
  mpbuf_free(&r);
  rc_close(&c);
}

TEST(pipelined_requests) {
  OPEN_RC(c, S.socket);
  mpbuf_t r;
  mpbuf_init(&r);
  for (uint32_t id = 1; id <= 50; id++)
    stt_pack(&r.pk, "[0, %u, '%s', []]", 1000 + id, id % 2 ? "ping" : "hello");
  CHECK(rc_send(&c, r.sb.data, r.sb.size) == 0);
  mpbuf_free(&r);
  int seen[51] = {0};
  for (int i = 0; i < 50; i++) {
    msg_t m;
    CHECK(rc_next(&c, &m, 5000) == 1);
    CHECK(m.error == NULL);
    CHECK(m.id > 1000 && m.id <= 1050);
    uint32_t k = m.id - 1000;
    CHECK(!seen[k]);
    seen[k] = 1;
    if (k % 2) CHECK(st__str_eq(m.result, "pong"));
    else CHECK(obj_get(m.result, "server_id") != NULL);
    msg_free(&m);
  }
  rc_close(&c);
}

/* Streams the server cannot read: each gets one error reply for no
 * request, then the server closes that connection (and only that one). */
static const struct {
  const char *bytes;
  size_t len;
} garbage[] = {
    {"\xc1\xc1garbage", 9}, /* 0xc1 is never used by msgpack */
    {"\x05", 1},             /* a message of the wrong shape: a bare integer */
};

TEST(garbage_closes_only_that_client) {
  rc_t good, bad;
  CHECK(rc_open(&good, S.socket) == 0);
  CHECK(stt_ping(good.fd, 1) == 0);
  int64_t before = rc_info_int(&good, "counters.protocol_errors");
  for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
    CHECK(rc_open(&bad, S.socket) == 0);
    CHECK(rc_send(&bad, garbage[i].bytes, garbage[i].len) == 0);
    CHECK_CLOSED_WITH(&bad, ST_ERR_PROTOCOL, NULL);
    rc_close(&bad);
  }
  CHECK(stt_ping(good.fd, 2) == 0);
  CHECK_EQ_INT(rc_info_int(&good, "counters.protocol_errors"), before + 2);
  rc_close(&good);
}

TEST(oversize_frame) {
  OPEN_RC(c, S.socket);
  /* The server may close before it read everything: ignore send errors. */
  (void)rc_sendf(&c, "[0, 5, 'ping', [{pad: bin(200000)}]]");
  CHECK_CLOSED_WITH(&c, ST_ERR_LIMIT, NULL);
  rc_close(&c);
}

TEST(half_sent_frame_times_out) {
  OPEN_RC(c, S.socket);
  mpbuf_t r;
  hello_bytes(&r, 3);
  double t0 = stt_now_ms();
  CHECK(rc_send(&c, r.sb.data, 4) == 0);
  mpbuf_free(&r);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  double waited = stt_now_ms() - t0;
  CHECK_EQ_INT(m.id, 0);
  CHECK_REPLY(&m, ST_ERR_TIMEOUT, NULL);
  msg_free(&m);
  CHECK(waited >= 250);   /* frame_timeout_ms = 300 */
  CHECK(waited < 4000);
  CHECK_EQ_INT(rc_next(&c, &m, 5000), 0);
  rc_close(&c);
}

TEST(completed_frames_do_not_time_out) {
  /* A connection that idles between whole frames is never timed out. */
  OPEN_RC(c, S.socket);
  CHECK(stt_ping(c.fd, 1) == 0);
  msg_t m;
  CHECK_EQ_INT(rc_next(&c, &m, 600), -1);   /* nothing arrives: no TIMEOUT */
  CHECK(stt_ping(c.fd, 2) == 0);
  rc_close(&c);
}

TEST(max_inflight_busy) {
  OPEN_RC(c, S.socket);
  CHECK(rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: 0.3}}]], "
                    "[0, 2, 'call', [{endpoint: 'slow', args: {s: 0.3}}]], "
                    "[0, 3, 'call', [{endpoint: 'slow', args: {s: 0.3}}]], [0, 4, 'ping', []]") == 0);
  int busy3 = 0, busy4 = 0, ok = 0;
  for (int i = 0; i < 4; i++) {
    msg_t m;
    CHECK(rc_next(&c, &m, 10000) == 1);
    if (m.id == 3 || m.id == 4) {
      CHECK_REPLY(&m, ST_ERR_BUSY, NULL);
      if (m.id == 3) busy3 = 1;
      else busy4 = 1;
      /* BUSY comes at once, before the calls finish. */
      CHECK(ok == 0);
    } else {
      CHECK(m.error == NULL);
      CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 42);
      ok++;
    }
    msg_free(&m);
  }
  CHECK(busy3 && busy4);
  CHECK_EQ_INT(ok, 2);
  /* Room again once they completed. */
  CHECK(stt_ping(c.fd, 5) == 0);
  rc_close(&c);
}

TEST(client_fds_are_closed) {
  OPEN_RC(c, S.socket);
  CHECK(stt_ping(c.fd, 1) == 0);
  int64_t before_count = rc_info_int(&c, "counters.fds_received");
  int before = stt_proc_fd_count(S.pid);
  CHECK(before > 0);
  for (int round = 0; round < 10; round++) {
    int p[2];
    CHECK(pipe(p) == 0);
    msg_t m;
    CHECK(rc_rpcf_fds(&c, &m, p, 2, "[0, %d, 'ping', []]", 100 + round) == 1);
    CHECK_EQ_INT(m.id, 100 + round);
    CHECK(st__str_eq(m.result, "pong"));
    msg_free(&m);
  }
  CHECK(proc_fd_count_reaches(S.pid, before, 0) == 0);
  CHECK_EQ_INT(stt_proc_fd_count(S.pid), before);
  CHECK_EQ_INT(rc_info_int(&c, "counters.fds_received"), before_count + 20);
  rc_close(&c);
}

TEST(notifications_are_ignored) {
  /* Unknown ones, and releases that are not {object_id: n}, change
   * nothing and get no reply; the connection goes on. */
  OPEN_RC(c, S.socket);
  CHECK(rc_sendf(&c, "[2, 'whatever', []], [2, 'release', []], [2, 'release', [{object_id: -1}]], "
                     "[2, 'release', [{object_id: 1, x: 2}]], "
                     "[0, 77, 'ping', []]") == 0);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(m.id, 77);
  msg_free(&m);
  rc_close(&c);
}

TEST(half_closed_client_gets_replies) {
  /* A client that shuts down its sending side still receives the replies
   * of what it sent, then the server closes. */
  OPEN_RC(c, S.socket);
  CHECK(rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: 0.05}}]], [0, 2, 'ping', []]") ==
        0);
  CHECK(shutdown(c.fd, SHUT_WR) == 0);
  int got = 0;
  msg_t m;
  while (got < 2) {
    CHECK(rc_next(&c, &m, 5000) == 1);
    CHECK(m.error == NULL);
    got++;
    msg_free(&m);
  }
  CHECK_EQ_INT(rc_next(&c, &m, 5000), 0);
  rc_close(&c);
}

/* A server of its own for one test: `config` goes into its config table. */
static int with_own_server(const char *config, void (*body)(stt_server_t *s)) {
  static stt_server_t own;
  stt_server_init(&own);
  stt_server_config(&own, config);
  stt_write_endpoint(&own, "slow.lua", SLOW);
  int rc = stt_server_run(&own, body);
  stt_server_cleanup(&own);
  return rc;
}

static void backpressure_body(stt_server_t *s) {
  /* A client that sends many requests before reading: the server stops
   * reading while its replies pile up, and every reply arrives in the end
   * once the client reads. Answering all N requests would queue about
   * 100 MB of replies, so the server must pause long before that; the
   * client sends without reading until its sends make no progress for
   * 500 ms (the server stopped reading), and only then reads. */
  enum { N = 100000 };
  OPEN_RC(c, s->socket);
  mpbuf_t r;
  mpbuf_init(&r);
  for (uint32_t id = 1; id <= N; id++) stt_pack(&r.pk, "[0, %u, 'info', []]", id);
  size_t sent = 0;
  int stalled = 0;
  while (sent < r.sb.size && !stalled) {
    ssize_t n = send(c.fd, r.sb.data + sent, r.sb.size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {.fd = c.fd, .events = POLLOUT};
      if (poll(&p, 1, 500) == 0) stalled = 1;
    } else {
      CHECK(0);
    }
  }
  CHECK(stalled);
  CHECK(sent < r.sb.size);
  static unsigned char seen[N + 1];
  memset(seen, 0, sizeof seen);
  int got = 0;
  double end = stt_now_ms() + 30000;
  while (got < N && stt_now_ms() < end) {
    if (sent < r.sb.size) {
      ssize_t n = send(c.fd, r.sb.data + sent, r.sb.size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) sent += (size_t)n;
      else CHECK(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    }
    struct pollfd p = {.fd = c.fd, .events = POLLIN | (sent < r.sb.size ? POLLOUT : 0)};
    poll(&p, 1, 100);
    while (rc_pump(&c) > 0) {
    }
    CHECK(!c.eof);
    msg_t m;
    while (rc_take(&c, &m)) {
      if (m.error) fprintf(stderr, "reply %u: %s: %s\n", m.id, msg_errname(&m), msg_errmsg(&m));
      CHECK(m.error == NULL);
      CHECK(m.id >= 1 && m.id <= N && !seen[m.id]);
      seen[m.id] = 1;
      got++;
      msg_free(&m);
    }
  }
  mpbuf_free(&r);
  CHECK_EQ_INT(got, N);
  CHECK(stt_ping(c.fd, N + 1) == 0);
  CHECK(rc_info_int(&c, "counters.read_pauses") >= 1);
  rc_close(&c);
}

TEST(slow_reader_backpressure) {
  /* The client's sends end mid-frame at arbitrary points, and a loaded
   * machine may leave such a tail for a while: this test runs on a server
   * with the default frame timeout, not the 300 ms of the shared one. */
  CHECK_EQ_INT(with_own_server("", backpressure_body), 0);
}

static void max_connections_body(stt_server_t *s) {
  rc_t a, b, c;
  CHECK(rc_open(&a, s->socket) == 0);
  CHECK(stt_ping(a.fd, 1) == 0);
  /* The fixture's start-up connection is gone once only ours remains. */
  CHECK(rc_wait_info(&a, "connections", 1, 5000) == 0);
  CHECK(rc_open(&b, s->socket) == 0);
  CHECK(stt_ping(b.fd, 1) == 0);
  CHECK(rc_open(&c, s->socket) == 0);
  CHECK_CLOSED_WITH(&c, ST_ERR_LIMIT, "max_connections");
  rc_close(&c);
  CHECK(stt_ping(a.fd, 2) == 0);
  CHECK(stt_ping(b.fd, 2) == 0);
  CHECK_EQ_INT(rc_info_int(&a, "counters.limit_refused"), 1);
  /* A slot frees when a client leaves. */
  rc_close(&b);
  CHECK(rc_wait_info(&a, "connections", 1, 5000) == 0);
  CHECK(rc_open(&c, s->socket) == 0);
  CHECK(stt_ping(c.fd, 3) == 0);
  rc_close(&c);
  rc_close(&a);
}

TEST(max_connections_limit) {
  CHECK_EQ_INT(with_own_server("limits = { max_connections = 2 },", max_connections_body), 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S,
                   "limits = { max_message_bytes = 65536, frame_timeout_ms = 300, "
                   "max_inflight = 2 },",
                   (const stt_endpoint_t[]){{"slow.lua", SLOW}, {NULL, NULL}});
  RUN(hello_fields);
  RUN(refused_requests_keep_the_connection);
  RUN(split_frames);
  RUN(pipelined_requests);
  RUN(garbage_closes_only_that_client);
  RUN(oversize_frame);
  RUN(half_sent_frame_times_out);
  RUN(completed_frames_do_not_time_out);
  RUN(max_inflight_busy);
  RUN(client_fds_are_closed);
  RUN(notifications_are_ignored);
  RUN(half_closed_client_gets_replies);
  RUN(slow_reader_backpressure);
  RUN(max_connections_limit);
  return stt_server_finish(&S);
}
