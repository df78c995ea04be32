/* Wire-level tests of a real stserver over raw sockets: hello, ping,
 * unknown methods, bad params, split and pipelined frames, garbage and
 * oversize frames, the half-sent frame timeout, BUSY, max_connections and
 * descriptors sent by clients. */
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "check.h"
#include "raw.h"
#include "st/errors.h"
#include "st/wire.h"

static stt_server_t S;

static const char *SLOW =
    "return st.endpoint{\n"
    "  name = \"slow\", params = { s = 0.2 },\n"
    "  build = function(a) st.sleep(a.s); return 42 end,\n"
    "}\n";

TEST(hello_fields) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_head(&r, 7, "hello");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 2);
  pk_str(&r.pk, "protocol");
  msgpack_pack_int(&r.pk, ST_PROTOCOL_VERSION);
  pk_str(&r.pk, "client");
  pk_str(&r.pk, "test_protocol");
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.type, ST_MSG_RESPONSE);
  CHECK_EQ_INT(m.id, 7);
  CHECK(m.error == NULL);
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
  rq_init(&r);
  rq_simple(&r, 8, "hello");
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_STR_EQ(obj_str(obj_get(m.result, "server_id")), saved);
  msg_free(&m);

  /* A newer protocol than the server's is refused; the connection stays. */
  rq_init(&r);
  rq_head(&r, 9, "hello");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "protocol");
  msgpack_pack_int(&r.pk, ST_PROTOCOL_VERSION + 1);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 9);
  CHECK_EQ_INT(msg_code(&m), 1);
  CHECK_STR_EQ(msg_errname(&m), "PROTOCOL");
  CHECK_CONTAINS(msg_errmsg(&m), "protocol");
  msg_free(&m);
  CHECK(stt_ping(c.fd, 10) == 0);
  rc_close(&c);
}

TEST(ping_and_unknown_method) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(stt_ping(c.fd, 1) == 0);
  rq_t r;
  rq_init(&r);
  rq_simple(&r, 2, "frobnicate");
  msg_t m;
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 2);
  CHECK_EQ_INT(msg_code(&m), 16);
  CHECK_STR_EQ(msg_errname(&m), "UNKNOWN_METHOD");
  CHECK_CONTAINS(msg_errmsg(&m), "frobnicate");
  CHECK(m.result->type == MSGPACK_OBJECT_NIL);
  msg_free(&m);
  CHECK(stt_ping(c.fd, 3) == 0);
  rc_close(&c);
}

TEST(bad_params) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  msg_t m;
  rq_t r;
  /* An unknown parameter name. */
  rq_init(&r);
  rq_head(&r, 1, "ping");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "loud");
  msgpack_pack_true(&r.pk);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  CHECK_CONTAINS(msg_errmsg(&m), "loud");
  msg_free(&m);
  /* params with two elements. */
  rq_init(&r);
  rq_head(&r, 2, "info");
  msgpack_pack_array(&r.pk, 2);
  msgpack_pack_map(&r.pk, 0);
  msgpack_pack_map(&r.pk, 0);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(m.id, 2);
  CHECK_EQ_INT(msg_code(&m), 14);
  msg_free(&m);
  /* A parameter of the wrong type. */
  rq_init(&r);
  rq_head(&r, 3, "hello");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "protocol");
  pk_str(&r.pk, "one");
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  msg_free(&m);
  /* call without an endpoint name. */
  rq_init(&r);
  rq_head(&r, 4, "call");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "endpoint");
  msgpack_pack_int(&r.pk, 5);
  CHECK(rc_rpc(&c, &r, &m) == 1);
  CHECK_EQ_INT(msg_code(&m), 14);
  msg_free(&m);
  /* Well-formed requests with bad params keep the connection. */
  CHECK(stt_ping(c.fd, 5) == 0);
  rc_close(&c);
}

/* The bytes of one hello request. */
static void hello_bytes(rq_t *r, uint32_t id) {
  rq_init(r);
  rq_head(r, id, "hello");
  msgpack_pack_array(&r->pk, 1);
  msgpack_pack_map(&r->pk, 1);
  pk_str(&r->pk, "client");
  pk_str(&r->pk, "split-test");
}

TEST(split_frames) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
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
  rq_free(&r);
  rc_close(&c);
}

TEST(pipelined_requests) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  for (uint32_t id = 1; id <= 50; id++) rq_simple(&r, 1000 + id, id % 2 ? "ping" : "hello");
  CHECK(rc_send_rq(&c, &r) == 0);
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

TEST(garbage_closes_only_that_client) {
  rc_t good, bad;
  CHECK(rc_open(&good, S.socket) == 0);
  CHECK(rc_open(&bad, S.socket) == 0);
  CHECK(stt_ping(good.fd, 1) == 0);
  int64_t before = rc_info_int(&good, "counters.protocol_errors");
  /* 0xc1 is never used by msgpack. */
  const char junk[] = "\xc1\xc1garbage";
  CHECK(rc_send(&bad, junk, sizeof junk - 1) == 0);
  msg_t m;
  CHECK(rc_next(&bad, &m, 5000) == 1);
  CHECK_EQ_INT(m.type, ST_MSG_RESPONSE);
  CHECK_EQ_INT(m.id, 0);
  CHECK_EQ_INT(msg_code(&m), 1);
  CHECK_STR_EQ(msg_errname(&m), "PROTOCOL");
  msg_free(&m);
  CHECK_EQ_INT(rc_next(&bad, &m, 5000), 0);   /* then the server closes */
  rc_close(&bad);
  /* A message of the wrong shape (a bare integer) is a protocol error too. */
  CHECK(rc_open(&bad, S.socket) == 0);
  CHECK(rc_send(&bad, "\x05", 1) == 0);
  CHECK(rc_next(&bad, &m, 5000) == 1);
  CHECK_EQ_INT(msg_code(&m), 1);
  msg_free(&m);
  CHECK_EQ_INT(rc_next(&bad, &m, 5000), 0);
  rc_close(&bad);
  CHECK(stt_ping(good.fd, 2) == 0);
  CHECK_EQ_INT(rc_info_int(&good, "counters.protocol_errors"), before + 2);
  rc_close(&good);
}

TEST(oversize_frame) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_head(&r, 5, "ping");
  msgpack_pack_array(&r.pk, 1);
  msgpack_pack_map(&r.pk, 1);
  pk_str(&r.pk, "pad");
  static char pad[200000];
  msgpack_pack_bin(&r.pk, sizeof pad);
  msgpack_pack_bin_body(&r.pk, pad, sizeof pad);
  /* The server may close before it read everything: ignore send errors. */
  (void)rc_send(&c, r.sb.data, r.sb.size);
  rq_free(&r);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(msg_code(&m), 9);
  CHECK_STR_EQ(msg_errname(&m), "LIMIT");
  msg_free(&m);
  CHECK_EQ_INT(rc_next(&c, &m, 5000), 0);
  rc_close(&c);
}

TEST(half_sent_frame_times_out) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  hello_bytes(&r, 3);
  double t0 = stt_now_ms();
  CHECK(rc_send(&c, r.sb.data, 4) == 0);
  rq_free(&r);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  double waited = stt_now_ms() - t0;
  CHECK_EQ_INT(m.id, 0);
  CHECK_EQ_INT(msg_code(&m), 12);
  CHECK_STR_EQ(msg_errname(&m), "TIMEOUT");
  msg_free(&m);
  CHECK(waited >= 250);   /* frame_timeout_ms = 300 */
  CHECK(waited < 4000);
  CHECK_EQ_INT(rc_next(&c, &m, 5000), 0);
  rc_close(&c);
}

TEST(completed_frames_do_not_time_out) {
  /* A connection that idles between whole frames is never timed out. */
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(stt_ping(c.fd, 1) == 0);
  msg_t m;
  CHECK_EQ_INT(rc_next(&c, &m, 600), -1);   /* nothing arrives: no TIMEOUT */
  CHECK(stt_ping(c.fd, 2) == 0);
  rc_close(&c);
}

TEST(max_inflight_busy) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_call(&r, 1, "slow", 1, "s", 'd', 0.3);
  rq_call(&r, 2, "slow", 1, "s", 'd', 0.3);
  rq_call(&r, 3, "slow", 1, "s", 'd', 0.3);
  rq_simple(&r, 4, "ping");
  CHECK(rc_send_rq(&c, &r) == 0);
  int busy3 = 0, busy4 = 0, ok = 0;
  for (int i = 0; i < 4; i++) {
    msg_t m;
    CHECK(rc_next(&c, &m, 10000) == 1);
    if (m.id == 3 || m.id == 4) {
      CHECK_EQ_INT(msg_code(&m), 11);
      CHECK_STR_EQ(msg_errname(&m), "BUSY");
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
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  CHECK(stt_ping(c.fd, 1) == 0);
  int64_t before_count = rc_info_int(&c, "counters.fds_received");
  int before = proc_fd_count(S.pid);
  CHECK(before > 0);
  for (int round = 0; round < 10; round++) {
    int p[2];
    CHECK(pipe(p) == 0);
    rq_t r;
    rq_init(&r);
    rq_simple(&r, 100 + (uint32_t)round, "ping");
    char ctl[CMSG_SPACE(sizeof(int) * 2)];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {.iov_base = r.sb.data, .iov_len = r.sb.size};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                        .msg_controllen = sizeof ctl};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * 2);
    memcpy(CMSG_DATA(cm), p, sizeof p);
    CHECK(sendmsg(c.fd, &mh, MSG_NOSIGNAL) == (ssize_t)r.sb.size);
    rq_free(&r);
    close(p[0]);
    close(p[1]);
    msg_t m;
    CHECK(rc_next(&c, &m, 5000) == 1);
    CHECK_EQ_INT(m.id, 100 + round);
    CHECK(st__str_eq(m.result, "pong"));
    msg_free(&m);
  }
  /* The server closes a message's strays right after dispatching it, so
   * just after the reply that sent the last pong: poll. */
  double end = stt_now_ms() + 5000;
  while (proc_fd_count(S.pid) != before && stt_now_ms() < end) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECK_EQ_INT(proc_fd_count(S.pid), before);
  CHECK_EQ_INT(rc_info_int(&c, "counters.fds_received"), before_count + 20);
  rc_close(&c);
}

TEST(notifications_are_ignored) {
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  msgpack_pack_array(&r.pk, 3);
  msgpack_pack_int(&r.pk, 2);
  pk_str(&r.pk, "whatever");
  msgpack_pack_array(&r.pk, 0);
  rq_simple(&r, 77, "ping");
  CHECK(rc_send_rq(&c, &r) == 0);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(m.id, 77);
  msg_free(&m);
  rc_close(&c);
}

TEST(half_closed_client_gets_replies) {
  /* A client that shuts down its sending side still receives the replies
   * of what it sent, then the server closes. */
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);
  rq_t r;
  rq_init(&r);
  rq_call(&r, 1, "slow", 1, "s", 'd', 0.05);
  rq_simple(&r, 2, "ping");
  CHECK(rc_send_rq(&c, &r) == 0);
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
  int started = stt_server_start(&own);
  if (started == 0) body(&own);
  int status = started == 0 ? stt_server_stop(&own) : -1;
  stt_server_cleanup(&own);
  return started == 0 && status == 0 ? 0 : -1;
}

static void backpressure_body(stt_server_t *s) {
  /* A client that sends many requests before reading: the server stops
   * reading while its replies pile up, and every reply arrives in the end
   * once the client reads. Answering all N requests would queue about
   * 100 MB of replies, so the server must pause long before that; the
   * client sends without reading until its sends make no progress for
   * 500 ms (the server stopped reading), and only then reads. */
  enum { N = 100000 };
  rc_t c;
  CHECK(rc_open(&c, s->socket) == 0);
  rq_t r;
  rq_init(&r);
  for (uint32_t id = 1; id <= N; id++) rq_simple(&r, id, "info");
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
  rq_free(&r);
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
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(m.id, 0);
  CHECK_EQ_INT(msg_code(&m), 9);
  CHECK_STR_EQ(msg_errname(&m), "LIMIT");
  CHECK_CONTAINS(msg_errmsg(&m), "max_connections");
  msg_free(&m);
  CHECK_EQ_INT(rc_next(&c, &m, 5000), 0);
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
  stt_server_init(&S);
  stt_server_config(&S,
                    "limits = { max_message_bytes = 65536, frame_timeout_ms = 300, "
                    "max_inflight = 2 },");
  stt_write_endpoint(&S, "slow.lua", SLOW);
  if (stt_server_start(&S) != 0) {
    stt_server_cleanup(&S);
    return 1;
  }
  RUN(hello_fields);
  RUN(ping_and_unknown_method);
  RUN(bad_params);
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
  int status = stt_server_stop(&S);
  if (status != 0) {
    fprintf(stderr, "server exit status %d\n", status);
    stt_failed++;
  }
  stt_server_cleanup(&S);
  return stt_summary();
}
