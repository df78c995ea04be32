/* stcli, the real binary (ST_CLI_BIN), against a real stserver: every
 * command, typed arguments, --values with checksums, --json output that
 * parses, errors on stderr with the documented exit codes, --help. */
#include <poll.h>
#include <signal.h>
#include <st/client.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

static uint64_t fnv_floats(const float *v, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  const unsigned char *p = (const unsigned char *)v;
  for (size_t i = 0; i < n * sizeof(float); i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

TEST(version_and_help) {
  CHECK_EQ_INT(STCLI("--version"), 0);
  CHECK_CONTAINS(R.out, "stcli " ST_VERSION_STRING);
  CHECK_EQ_INT(STCLI("--help"), 0);
  CHECK_CONTAINS_ALL(R.out, "usage: stcli [global options] COMMAND", "endpoints", "Exit codes");
  const char *cmds[] = {"ping", "info", "endpoints", "call", "help"};
  for (size_t i = 0; i < 5; i++) check_command_help(cmds[i]);
  CHECK_EQ_INT(STCLI("help"), 0);
  CHECK_CONTAINS(R.out, "Commands:");
}

TEST(usage_errors) {
  CHECK_EQ_INT(STCLI("frob"), 2);
  CHECK_CONTAINS(R.err, "stcli: USAGE: unknown command 'frob'");
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(run_env(NULL, (const char *const[]){NULL}), 2);
  CHECK_CONTAINS(R.err, "usage:");
  CHECK_EQ_INT(STCLI("--bogus", "ping"), 2);
  CHECK_CONTAINS(R.err, "unknown option '--bogus'");
  CHECK_EQ_INT(STCLI("--timeout", "soon", "ping"), 2);
  CHECK_CONTAINS(R.err, "--timeout needs a duration");
  CHECK_EQ_INT(STCLI("--device"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "ping", "extra"), 2);
  CHECK_CONTAINS(R.err, "unexpected argument 'extra'");
  CHECK_EQ_INT(STCLI(SOCK, "ping", "--count", "0"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "call"), 2);
  CHECK_CONTAINS(R.err, "call needs an endpoint name");
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "n:int=x"), 2);
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: 'n:int=x': 'x' is not an integer");
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "--args-json", "{\"n\": }"), 2);
  CHECK_CONTAINS(R.err, "--args-json: unexpected '}' (expected a value) at line 1, column 7");
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "--values=x"), 2);
  CHECK_EQ_INT(STCLI("help", "nope"), 2);
}

TEST(ping) {
  CHECK_EQ_INT(STCLI(SOCK, "ping"), 0);
  CHECK_CONTAINS(R.out, "pong from ");
  CHECK_CONTAINS(R.out, " us\n");
  CHECK_EQ_INT(STCLI(SOCK, "ping", "--count", "20"), 0);
  CHECK_CONTAINS_ALL(R.out, "20 pongs from", "min ", "p50 ", "p99 ");
  CHECK_EQ_INT(STCLI("ping", "--count=3", "--json", SOCK), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"count\": 3");
  CHECK_CONTAINS(R.out, "\"p99_us\"");
  /* The socket named by base path and device, by flag or environment. */
  CHECK_EQ_INT(STCLI("--base-path", srv.base, "--device", "0", "ping"), 0);
  CHECK_CONTAINS(R.out, "pong from");
  char env[400];
  snprintf(env, sizeof env, "%s=%s", ST_ENV_BASE_PATH, srv.base);
  CHECK_EQ_INT(run_env(env, (const char *const[]){"ping", NULL}), 0);
  CHECK_CONTAINS(R.out, "pong from");
}

TEST(info) {
  CHECK_EQ_INT(STCLI(SOCK, "info"), 0);
  CHECK_CONTAINS(R.out, "server ");
  CHECK_CONTAINS(R.out, "version      " ST_VERSION_STRING);
  char pid[64];
  snprintf(pid, sizeof pid, "pid          %d\n", (int)srv.pid);
  CHECK_CONTAINS(R.out, pid);
  CHECK_CONTAINS_ALL(R.out, "uptime ", "generation ", "counters ");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "info"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS_ALL(R.out, "\"server_id\": ", "\"counters\": {", "\"generation\": {");
}

TEST(endpoints) {
  CHECK_EQ_INT(STCLI(SOCK, "endpoints"), 0);
  CHECK_CONTAINS_ALL(R.out, "NAME", "EXECUTION", "CONCURRENCY", "PARAMS", "\nt ", "n=4", "s=2");
  /* A required parameter is listed once, as required, never as "=null". */
  CHECK_CONTAINS(R.out, "v (required), k=3");
  CHECK(strstr(R.out, "v=null") == NULL);
  CHECK_EQ_INT(STCLI(SOCK, "endpoints", "--json"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"name\": \"t\"");
  CHECK_CONTAINS(R.out, "\"params\": {");
}

TEST(call_values_and_checksums) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "n=5", "--values"), 0);
  CHECK_CONTAINS(R.out, "(tensor)  float32  [5]  cpu  20 bytes\n");
  CHECK_CONTAINS(R.out, "  values: 0 1 2 3 4\n");
  float v5[5] = {0, 1, 2, 3, 4};
  char want[128];
  snprintf(want, sizeof want, "  sum: 10  fnv1a64: 0x%016llx\n",
           (unsigned long long)fnv_floats(v5, 5));
  CHECK_CONTAINS(R.out, want);
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "n=20", "--values=3"), 0);
  CHECK_CONTAINS(R.out, "  values: 0 1 2 ... (17 more)\n");
  CHECK_CONTAINS(R.out, "  sum: 190  ");
  /* Without --values only the description. */
  CHECK_EQ_INT(STCLI(SOCK, "call", "t"), 0);
  CHECK_STR_EQ(R.out, "(tensor)  float32  [4]  cpu  16 bytes\n");
  CHECK_EQ_INT(STCLI(SOCK, "call", "mod", "--values=2"), 0);
  CHECK_CONTAINS(R.out, "weight  float32  [2, 2]  cpu  16 bytes\n  values: 1 1 ... (2 more)\n"
                        "  sum: 4  ");
  CHECK_CONTAINS(R.out, "bias    float32  [2]     cpu  8 bytes\n  values: 0 0\n  sum: 0  ");
  /* Unsigned types print exactly, the top of uint64 included. */
  CHECK_EQ_INT(STCLI(SOCK, "call", "u", "dtype=uint16", "--values"), 0);
  CHECK_CONTAINS(R.out, "(tensor)  uint16  [3]  cpu  6 bytes\n  values: 65535 7 0\n");
  CHECK_EQ_INT(STCLI(SOCK, "call", "u", "dtype=uint32", "--values"), 0);
  CHECK_CONTAINS(R.out, "  values: 4294967295 7 0\n");
  CHECK_EQ_INT(STCLI(SOCK, "call", "u", "dtype=uint64", "--values"), 0);
  CHECK_CONTAINS(R.out, "  values: 18446744073709551615 7 0\n");
}

TEST(call_typed_arguments) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "plain", "n=3", "x=1e3", "s:str=42", "b:bool=1"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"n\": 3");
  CHECK_CONTAINS(R.out, "\"x\": 1000"); /* the server sends integral numbers as integers */
  CHECK_CONTAINS(R.out, "\"s\": \"42\"");
  CHECK_CONTAINS(R.out, "\"b\": true");
  CHECK_EQ_INT(STCLI(SOCK, "call", "plain", "--args-json", "{\"n\": 9, \"s\": \"j\"}", "s=k"), 0);
  CHECK_CONTAINS(R.out, "\"n\": 9");
  CHECK_CONTAINS(R.out, "\"s\": \"k\"");
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "--args-json={\"n\":3}"), 0);
  CHECK_CONTAINS(R.out, "[3]");
}

TEST(call_json) {
  CHECK_EQ_INT(STCLI(SOCK, "--json", "call", "t", "n=2"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS_ALL(R.out, "\"tensor\": {", "\"dtype\": \"float32\"", "\"shape\": [2]",
                            "\"nbytes\": 8");
  CHECK_EQ_INT(STCLI(SOCK, "call", "mod", "--json", "--values"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"module\": {");
  CHECK_CONTAINS(R.out, "{\"name\": \"weight\", \"values\": [1, 1, 1, 1], \"sum\": 4, "
                        "\"fnv1a64\": \"0x");
  CHECK_CONTAINS(R.out, "{\"name\": \"bias\", \"values\": [0, 0], \"sum\": 0, ");
}

TEST(errors_and_exit_codes) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "bad"), 1);
  CHECK_CONTAINS(R.err, "stcli: ENDPOINT: ");
  CHECK_CONTAINS(R.err, "bad.lua:3");
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(STCLI(SOCK, "call", "nosuch"), 1);
  CHECK_CONTAINS(R.err, "stcli: UNKNOWN_ENDPOINT: ");
  CHECK_EQ_INT(STCLI(SOCK, "call", "t", "n=x"), 1); /* the server refuses a string */
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: ");
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none-0.sock", srv.dir);
  CHECK_EQ_INT(STCLI("--socket", missing, "ping"), 3);
  CHECK_CONTAINS(R.err, "stcli: IO: cannot connect to ");
  CHECK_CONTAINS(R.err, "no server is listening");
  CHECK_EQ_INT(STCLI("--base-path", srv.base, "--device", "3", "info"), 3);
  CHECK_CONTAINS(R.err, "-3.sock");
  double t0 = stt_now_ms();
  CHECK_EQ_INT(STCLI(SOCK, "--timeout", "200ms", "call", "slow"), 4);
  CHECK(stt_now_ms() - t0 < 1500);
  CHECK_CONTAINS(R.err, "stcli: TIMEOUT: ");
  t0 = stt_now_ms();
  CHECK_EQ_INT(STCLI(SOCK, "--timeout", "0.2", "call", "slow"), 4);   /* bare: seconds */
  CHECK(stt_now_ms() - t0 < 1500);
  CHECK_EQ_INT(STCLI(SOCK, "--timeout", "200x", "ping"), 2);
  CHECK_CONTAINS(R.err, "--timeout needs a duration");
}

/* --server-uid and $SHARED_TENSOR_SERVER_UID name the uid the server must
 * run as; another uid is refused (exit 3) before anything is sent. */
TEST(server_uid) {
  char me[32], other[32], env[64], want[512];
  snprintf(me, sizeof me, "%u", (unsigned)geteuid());
  snprintf(other, sizeof other, "%u", (unsigned)geteuid() + 1);
  CHECK_EQ_INT(STCLI(SOCK, "--server-uid", me, "ping"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "--server-uid", other, "ping"), 3);
  snprintf(want, sizeof want, "stcli: AUTH: the server at %s runs as uid %s; this client "
           "expects uid %s", srv.socket, me, other);
  CHECK_CONTAINS(R.err, want);
  snprintf(env, sizeof env, "%s=%s", ST_ENV_SERVER_UID, other);
  CHECK_EQ_INT(run_env(env, (const char *const[]){SOCK, "ping", NULL}), 3);
  CHECK_CONTAINS(R.err, "stcli: AUTH: ");
  CHECK_EQ_INT(run_env(env, (const char *const[]){SOCK, "--server-uid", me, "ping", NULL}), 0);
  CHECK_EQ_INT(STCLI(SOCK, "--server-uid", "-1", "ping"), 2);
  CHECK_CONTAINS(R.err, "--server-uid needs a uid");
}

static const stt_endpoint_t served[] = {
    {"t.lua", STT_EP_T},
    {"mod.lua", STT_EP_MOD},
    {"bad.lua", STT_EP_BAD},
    {"need.lua",
     "return st.endpoint{ name = \"need\", params = { v = st.required, k = 3 },\n"
     "  build = function(a) return a.v end }\n"},
    {"slow.lua", STT_EP_SLOW},
    {"u.lua",
     "return st.endpoint{ name = \"u\", params = { dtype = \"uint16\" },\n"
     "  build = function(a) return st.zeros{3, dtype = a.dtype}:fill(-1):set(1, 7):set(2, 0)"
     " end }\n"},
    {"plain.lua",
     "return st.endpoint{ name = \"plain\",\n"
     "  params = { n = 1, x = 0.5, s = \"a\", b = false },\n"
     "  build = function(a) return { n = a.n, x = a.x, s = a.s, b = a.b } end }\n"},
    {NULL, NULL},
};

/* Any method by name: one with a command of its own and one without. */
TEST(rpc_any_method) {
  CHECK_EQ_INT(STCLI(SOCK, "rpc", "endpoints", "--json"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"name\": \"t\"");
  CHECK_EQ_INT(STCLI(SOCK, "rpc", "keys", "prefix=nothing-here"), 0);
  CHECK_CONTAINS(R.out, "[]");
  CHECK_EQ_INT(STCLI(SOCK, "rpc", "tasks", "status=bogus"), 1);
  CHECK_CONTAINS_ALL(R.err, "INVALID_ARGUMENT", "'status' must be one of");
  CHECK_EQ_INT(STCLI(SOCK, "rpc", "no_such_method"), 1);
  CHECK_CONTAINS(R.err, "unknown method 'no_such_method'");
  CHECK_EQ_INT(STCLI(SOCK, "rpc"), 2);
}

int main(void) {
  cli_setup(&srv, NULL, served);
  RUN(version_and_help);
  RUN(usage_errors);
  RUN(ping);
  RUN(info);
  RUN(endpoints);
  RUN(call_values_and_checksums);
  RUN(call_typed_arguments);
  RUN(call_json);
  RUN(errors_and_exit_codes);
  RUN(server_uid);
  RUN(rpc_any_method);
  return stt_server_finish(&srv);
}
