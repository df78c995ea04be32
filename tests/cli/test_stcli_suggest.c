/* stcli's "did you mean", the real binary (ST_CLI_BIN) against a real
 * stserver: an unknown command or option (exit 2) names the closest
 * command or option, an endpoint the server does not know (exit 1, asked
 * of the server on that error) the closest endpoint; nothing is suggested
 * when nothing is close. */
#include <stdlib.h>

#include "check.h"
#include "cli_run.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

/* A command line (after --socket S), its exit code and its whole stderr
 * (stdout stays empty). */
typedef struct {
  int code;
  const char *err;
  const char *args[6];
} case_t;

static void check_cases(const case_t *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const char *argv[9] = {"--socket", srv.socket};
    for (size_t k = 0; k < 6 && cases[i].args[k]; k++) argv[2 + k] = cases[i].args[k];
    CHECK_EQ_INT(run_env(NULL, argv), cases[i].code);
    CHECK_STR_EQ(R.err, cases[i].err);
    CHECK_STR_EQ(R.out, "");
  }
}

#define SEE_MAIN " (see 'stcli --help')\n"

TEST(unknown_command) {
  static const case_t cases[] = {
      {2, "stcli: USAGE: unknown command 'cal'; did you mean 'call'?" SEE_MAIN, {"cal"}},
      {2, "stcli: USAGE: unknown command 'endpionts'; did you mean 'endpoints'?" SEE_MAIN,
       {"endpionts"}},
      {2, "stcli: USAGE: unknown command 'invalid'; did you mean 'invalidate'?" SEE_MAIN,
       {"invalid"}},
      {2, "stcli: USAGE: unknown command 'frobnicate'" SEE_MAIN, {"frobnicate"}},
      {2, "stcli: USAGE: unknown command 'x'" SEE_MAIN, {"x"}},
      {2, "stcli: USAGE: unknown command 'cal'; did you mean 'call'?" SEE_MAIN, {"help", "cal"}},
  };
  check_cases(cases, sizeof cases / sizeof cases[0]);
}

#define UNKNOWN_OPTION "stcli: USAGE: unknown option "

TEST(unknown_option) {
  static const case_t cases[] = {
      {2, UNKNOWN_OPTION "'--jsn'; did you mean '--json'?" SEE_MAIN, {"--jsn", "ping"}},
      {2, UNKNOWN_OPTION "'--verison'; did you mean '--version'?" SEE_MAIN, {"--verison"}},
      {2, UNKNOWN_OPTION "'--intervl'; did you mean '--interval'? (see 'stcli help watch')\n",
       {"watch", "--intervl", "1"}},
      {2, UNKNOWN_OPTION "'--valeus'; did you mean '--values'? (see 'stcli help call')\n",
       {"call", "hello", "--valeus"}},
      {2, UNKNOWN_OPTION "'--stauts'; did you mean '--status'? (see 'stcli help tasks')\n",
       {"tasks", "--stauts", "pending"}},
      {2, UNKNOWN_OPTION "'--cuont'; did you mean '--count'? (see 'stcli help ping')\n",
       {"ping", "--cuont", "3"}},
      {2, UNKNOWN_OPTION "'--param'; did you mean '--params'? (see 'stcli help endpoints')\n",
       {"endpoints", "--param", "hello"}},
      {2, UNKNOWN_OPTION "'--sockt'; did you mean '--socket'? (see 'stcli help status')\n",
       {"status", "--sockt", "x", "5"}},
      {2, UNKNOWN_OPTION "'--timeot'; did you mean '--timeout'? (see 'stcli help wait')\n",
       {"wait", "1", "--timeot", "5"}},
      {2, UNKNOWN_OPTION "'--zzz' (see 'stcli help call')\n", {"call", "hello", "--zzz"}},
      /* Words that are not options stay what they were. */
      {2, "stcli: USAGE: unexpected argument 'now' (see 'stcli help watch')\n", {"watch", "now"}},
  };
  check_cases(cases, sizeof cases / sizeof cases[0]);
}

#define UNKNOWN_ENDPOINT "stcli: UNKNOWN_ENDPOINT: unknown endpoint "

TEST(unknown_endpoint) {
  static const case_t cases[] = {
      {1, UNKNOWN_ENDPOINT "'hell'; did you mean 'hello'?\n", {"call", "hell"}},
      {1, UNKNOWN_ENDPOINT "'wrold'; did you mean 'world'?\n", {"--json", "call", "wrold", "n=1"}},
      {1, UNKNOWN_ENDPOINT "'helo'; did you mean 'hello'?\n", {"submit", "helo"}},
      {1, UNKNOWN_ENDPOINT "'hlelo'; did you mean 'hello'?\n", {"invalidate", "hlelo", "--all"}},
      {1, UNKNOWN_ENDPOINT "'hel'; did you mean 'hello'?\n", {"invalidate", "hel", "n=2"}},
      {1, UNKNOWN_ENDPOINT "'hell'; did you mean 'hello'?\n", {"endpoints", "--params", "hell"}},
      /* Nothing close: the server's message alone. */
      {1, UNKNOWN_ENDPOINT "'zzzz'\n", {"call", "zzzz"}},
      {1, UNKNOWN_ENDPOINT "'u'\n", {"call", "u"}},
  };
  check_cases(cases, sizeof cases / sizeof cases[0]);
  /* Other errors are not touched. */
  CHECK_EQ_INT(STCLI(SOCK, "call", "hello", "m=1"), 1);
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: ");
  CHECK(strstr(R.err, "did you mean") == NULL);
}

static const stt_endpoint_t endpoints[] = {
    {"t.lua", STT_EP_T},
    {"hello.lua",
     "return st.endpoint{ name = \"hello\", params = { n = 1 },\n"
     "  build = function(a) return 1 end }\n"},
    {"world.lua",
     "return st.endpoint{ name = \"world\", params = { n = 1 },\n"
     "  build = function(a) return 2 end }\n"},
    {NULL, NULL},
};

int main(void) {
  cli_setup(&srv, NULL, endpoints);
  RUN(unknown_command);
  RUN(unknown_option);
  RUN(unknown_endpoint);
  return stt_server_finish(&srv);
}
