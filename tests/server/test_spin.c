/* spin_us over the real socket: with the loop and the workers polling
 * instead of sleeping (docs/operations.md, "spin_us"), builds from two
 * connections, tasks and their waits all come back right; a connection
 * that only pings while another's build runs is answered at once, not
 * after the loop's poll for completions; and a SIGTERM while the loop
 * polls ends the running build and exits cleanly. The poll is set to
 * 100 ms, so that a loop that ignored its sockets while polling would
 * show in seconds, not microseconds. */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

/* 400 builds from two connections, each answer checked. */
TEST(builds_from_two_connections_come_back) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  for (int i = 0; i < 200; i++) {
    msg_t ma, mb;
    CHECK(rc_sendf(&a, "[0, %d, 'call', [{endpoint: 'twice', args: {n: %d}}]]", i, i) == 0);
    CHECK(rc_sendf(&b, "[0, %d, 'call', [{endpoint: 'twice', args: {n: %d}}]]", i, -i) == 0);
    CHECK(rc_next(&a, &ma, 10000) == 1 && !ma.error);
    CHECK(rc_next(&b, &mb, 10000) == 1 && !mb.error);
    CHECK_EQ_INT(obj_int(obj_get(ma.result, "value")), 2 * i);
    CHECK_EQ_INT(obj_int(obj_get(mb.result, "value")), -2 * i);
    msg_free(&ma);
    msg_free(&mb);
  }
  rc_close(&a);
  rc_close(&b);
}

/* Submitted tasks complete and their waits return while the loop polls. */
TEST(tasks_and_waits) {
  OPEN_RC(c, S.socket);
  for (int i = 0; i < 50; i++) {
    msg_t m;
    int64_t t = (int64_t)rk_submit(&c, "twice", "n", i);
    CHECK(t > 0);
    CHECK(rc_rpcf(&c, &m, "[0, 2, 'wait', [{task_id: %lld, timeout: 10.0}]]", (long long)t) ==
              1 &&
          !m.error);
    CHECK_STR_EQ(obj_str(obj_get(m.result, "status")), "completed");
    msg_free(&m);
    CHECK(rk_id(&c, "result", "task_id", (uint64_t)t, &m) == 1 && !m.error);
    CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 2 * i);
    msg_free(&m);
  }
  rc_close(&c);
}

/* While one connection's build runs for 3 s (the loop polls for its
 * completion after every iteration), another connection's pings are
 * answered without waiting for the 100 ms polls to end: at most 4 of 20
 * take 50 ms or more (a busy machine may delay a few), where a loop that
 * looked at its sockets only between polls makes every other one wait
 * about 100 ms. */
TEST(pings_are_answered_while_the_loop_polls) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  CHECK(rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'slow', args: {}}]]") == 0);
  CHECK(rc_wait_info(&b, "inflight", 1, 5000) == 0);
  int slow = 0;
  for (int i = 0; i < 20; i++) {
    double t0 = stt_now_ms();
    CHECK(stt_ping(b.fd, 100 + i) == 0);
    slow += stt_now_ms() - t0 >= 50;
  }
  CHECK(slow <= 4);
  msg_t m;
  CHECK(rc_next(&a, &m, 10000) == 1 && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 7);
  msg_free(&m);
  rc_close(&a);
  rc_close(&b);
}

/* SIGTERM while a build runs and the loop polls for it: the build is
 * cancelled at the grace's end, its caller told, the server exits 0. */
TEST(sigterm_while_polling_exits_cleanly) {
  stt_server_t T;
  stt_server_init(&T);
  stt_server_config(&T, "workers = 2, spin_us = 100000, shutdown_grace_s = 0.2,");
  stt_write_endpoint(&T, "long.lua",
                     "return st.endpoint{ name = 'long', build = function() st.sleep(30) "
                     "return 1 end }\n");
  if (stt_server_start(&T) != 0) {
    stt_server_cleanup(&T);
    CHECK(0);
  }
  rc_t a;
  int ok = rc_open(&a, T.socket) == 0 &&
           rc_sendf(&a, "[0, 1, 'call', [{endpoint: 'long', args: {}}]]") == 0;
  rc_t w;
  ok = ok && rc_open(&w, T.socket) == 0 && rc_wait_info(&w, "inflight", 1, 5000) == 0;
  if (ok) rc_close(&w);
  kill(T.pid, SIGTERM);
  msg_t m;
  int got = ok ? rc_next(&a, &m, 10000) : -1;
  int status = stt_server_wait_exit(&T, 10000);
  if (status < 0) stt_server_stop(&T);
  stt_server_cleanup(&T);
  CHECK(ok && got == 1);
  if (got == 1) {
    CHECK_REPLY(&m, ST_ERR_CANCELLED, NULL);
    msg_free(&m);
  }
  if (ok) rc_close(&a);
  CHECK_EQ_INT(status, 0);
}

static const stt_endpoint_t endpoints[] = {
    {"twice.lua",
     "return st.endpoint{ name = 'twice', params = { n = 0 },\n"
     "  build = function(a) return 2 * a.n end }\n"},
    {"slow.lua",
     "return st.endpoint{ name = 'slow', build = function() st.sleep(3) return 7 end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2, spin_us = 100000,", endpoints);
  RUN(builds_from_two_connections_come_back);
  RUN(tasks_and_waits);
  RUN(pings_are_answered_while_the_loop_polls);
  int status = stt_server_stop(&S);
  RUN(sigterm_while_polling_exits_cleanly);
  return stt_server_end(&S, status);
}
