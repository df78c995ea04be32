/* A client that makes the server warn in a loop costs a few log lines,
 * not one line per bad message: 100 connections that each send a
 * response message (a protocol error the server logs as a warning, then
 * closes) leave at most ST_LOG_RATE_BURST such lines per window in the
 * server's log, and the server keeps serving. */
#include <signal.h>

#include "check.h"
#include "common/log.h"
#include "wire.h"

static const char ONE_EP[] =
    "return st.endpoint{ name = 'one', build = function() return 1 end }\n";

static void flood_body(stt_server_t *s) {
  for (int i = 0; i < 100; i++) {
    OPEN_RC(c, s->socket);
    CHECK(rc_sendf(&c, "[1, 7, nil, 'not a request']") == 0);
    msg_t m;
    CHECK(rc_next(&c, &m, 5000) == 1);
    CHECK_REPLY(&m, ST_ERR_PROTOCOL, "response message is not expected");
    msg_free(&m);
    CHECK(rc_next(&c, &m, 5000) == 0);   /* closed */
    rc_close(&c);
  }
  OPEN_RC(c, s->socket);
  CHECK(stt_ping(c.fd, 1) == 0);
  rc_close(&c);
  char *log = stt_server_log(s);
  int n = stt_lines_containing(log, "sent a response message; closing");
  fprintf(stderr, "   %d of 100 warnings logged\n", n);
  /* One window of 10 s, or two when the machine is slow: never all 100. */
  CHECK(n >= ST_LOG_RATE_BURST);
  CHECK(n <= 2 * ST_LOG_RATE_BURST);
  free(log);
}

TEST(repeated_warnings_of_a_flood_are_rate_limited) {
  stt_server_t s;
  stt_server_init(&s);
  stt_server_config(&s, "workers = 1,");
  stt_write_endpoint(&s, "one.lua", ONE_EP);
  CHECK(stt_server_run(&s, flood_body) == 0);
  stt_server_cleanup(&s);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(repeated_warnings_of_a_flood_are_rate_limited);
  return stt_summary();
}
