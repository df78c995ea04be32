/* stcli's task, object and admin commands, the real binary (ST_CLI_BIN)
 * against a real stserver: submit / wait (plain progress lines, and a
 * progress bar on a terminal) / status / result / cancel / tasks, the
 * object line of managed calls, objects, release, invalidate, reload and
 * stats, with their output, --json and exit codes. */
#include <st/client.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cli_run.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

/* The first line of R.out as a task id (0 when it is not one). */
static unsigned long long out_id(void) {
  char *end;
  unsigned long long id = strtoull(R.out, &end, 10);
  return end != R.out && *end == '\n' ? id : 0;
}

/* Runs stcli with stderr on a pseudo-terminal: R.err gets what a
 * terminal would show. Returns the exit code. */
static int run_tty(const char *const *args) {
  return stt_run(&R, cli_bin, args, NULL, STT_PTY_ERR);
}

/* Polls `stcli --json status ID` until the status is `want` (5 s). */
static int wait_status(const char *id, const char *want) {
  char needle[64];
  snprintf(needle, sizeof needle, "\"status\": \"%s\"", want);
  double end = stt_now_ms() + 5000;
  while (stt_now_ms() < end) {
    if (STCLI(SOCK, "--json", "status", id) == 0 && strstr(R.out, needle)) return 1;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
  fprintf(stderr, "task %s never became %s: %s%s\n", id, want, R.out, R.err);
  return 0;
}

TEST(help_for_every_command) {
  const char *cmds[] = {"submit", "wait",    "status",     "result", "cancel", "tasks",
                        "objects", "release", "invalidate", "reload", "stats"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    check_command_help(cmds[i]);
    char want[80];
    CHECK_EQ_INT(STCLI("--help"), 0);
    snprintf(want, sizeof want, "\n  %s ", cmds[i]);
    CHECK_CONTAINS(R.out, want);
  }
}

TEST(usage_errors) {
  CHECK_EQ_INT(STCLI(SOCK, "status"), 2);
  CHECK_CONTAINS(R.err, "stcli: USAGE: status needs a task id");
  CHECK_EQ_INT(STCLI(SOCK, "status", "abc"), 2);
  CHECK_CONTAINS(R.err, "needs a task id (a number), not 'abc'");
  CHECK_EQ_INT(STCLI(SOCK, "status", "1", "2"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "wait", "1", "--timeout", "soon"), 2);
  CHECK_CONTAINS(R.err, "--timeout needs a duration (5, 2.5s, 500ms, 1m), not 'soon'");
  CHECK_EQ_INT(STCLI(SOCK, "result", "1", "--values=x"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "submit"), 2);
  CHECK_CONTAINS(R.err, "submit needs an endpoint name");
  CHECK_EQ_INT(STCLI(SOCK, "submit", "steps", "n:int=x"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--status"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "extra"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--limit", "0"), 2);
  CHECK_CONTAINS(R.err, "--limit needs a number in 1..1000");
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--before", "x"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "release"), 2);
  CHECK_CONTAINS(R.err, "release needs an object id");
  CHECK_EQ_INT(STCLI(SOCK, "invalidate"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "invalidate", "lin", "n=1", "--all"), 2);
  CHECK_CONTAINS(R.err, "--all drops every entry");
  CHECK_EQ_INT(STCLI(SOCK, "objects", "x"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "reload", "--frob"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "stats", "x"), 2);
  CHECK_STR_EQ(R.out, "");
}

TEST(managed_call_prints_its_object) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "lin", "n=5"), 0);
  CHECK_CONTAINS_ALL(R.out, "(tensor)  float32  [5]  cpu  20 bytes\nobject ", " (lease, refcount ",
                            ", cache key lin:5)\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "call", "lin", "n=5"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"value\": {");
  CHECK_CONTAINS(R.out, "\"object\": {\"id\": ");
  CHECK_CONTAINS(R.out, "\"cache_key\": \"lin:5\", \"cached\": true, \"managed\": true, "
                        "\"lease\": true");
  /* Plain endpoints print no object line. */
  CHECK_EQ_INT(STCLI(SOCK, "call", "plain"), 0);
  CHECK_STR_EQ(R.out, "(tensor)  float32  [2]  cpu  8 bytes\n");
}

TEST(objects_release_invalidate) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "lin", "n=6"), 0);
  unsigned long long id = 0;
  const char *o = strstr(R.out, "object ");
  CHECK(o && sscanf(o, "object %llu", &id) == 1 && id > 0);
  CHECK_EQ_INT(STCLI(SOCK, "objects"), 0);
  CHECK_CONTAINS_ALL(R.out, "ID", "ENDPOINT", "CACHE KEY", "REFCOUNT", "BYTES", "DEVICE", "AGE",
                     "lin:6", "cpu");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "objects"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"cache_key\": \"lin:6\"");
  char ids[32];
  snprintf(ids, sizeof ids, "%llu", id);
  /* stcli's own connection never holds the lease another one took. */
  CHECK_EQ_INT(STCLI(SOCK, "release", ids), 0);
  CHECK_CONTAINS(R.out, "no lease of this connection to release");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "release", ids), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"released\": false");
  CHECK_EQ_INT(STCLI(SOCK, "invalidate", "lin", "n=6"), 0);
  CHECK_STR_EQ(R.out, "lin: dropped the cache entry\n");
  CHECK_EQ_INT(STCLI(SOCK, "invalidate", "lin", "n=6"), 0);
  CHECK_STR_EQ(R.out, "lin: no cache entry for these arguments\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "invalidate", "lin", "--args-json", "{\"n\": 6}"), 0);
  CHECK_STR_EQ(R.out, "{\"dropped\": false}\n");
  CHECK_EQ_INT(STCLI(SOCK, "call", "lin", "n=7"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "call", "lin", "n=8"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "invalidate", "lin", "--all"), 0);
  CHECK_CONTAINS(R.out, "lin: dropped ");
  CHECK_CONTAINS(R.out, " cache entries\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "invalidate", "lin", "--all"), 0);
  CHECK_STR_EQ(R.out, "{\"count\": 0}\n");
  CHECK_EQ_INT(STCLI(SOCK, "invalidate", "nosuch", "--all"), 1);
  CHECK_CONTAINS(R.err, "stcli: UNKNOWN_ENDPOINT: ");
  CHECK_EQ_INT(STCLI(SOCK, "objects"), 0);
  CHECK(strstr(R.out, "lin:6") == NULL);
}

TEST(submit_wait_status_result) {
  CHECK_EQ_INT(STCLI(SOCK, "submit", "steps", "n=20"), 0); /* 1 s: several polls */
  unsigned long long id = out_id();
  CHECK(id > 0);
  char ids[32];
  snprintf(ids, sizeof ids, "%llu", id);
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids), 0);
  CHECK_STR_EQ(R.out, "(tensor)  float32  [3]  cpu  12 bytes\n");
  /* Not a terminal: progress as plain lines on stderr. */
  char line[64];
  snprintf(line, sizeof line, "task %s running ", ids);
  CHECK_CONTAINS(R.err, line);
  CHECK_CONTAINS(R.err, "% step ");
  CHECK(strchr(R.err, '\r') == NULL);
  CHECK_EQ_INT(STCLI(SOCK, "status", ids), 0);
  CHECK_CONTAINS_ALL(R.out, "task        ", "endpoint    steps\n", "status      completed\n",
                            "progress    100%  step 20\n", "created     ", " ago)\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "status", ids), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"status\": \"completed\"");
  /* wait took the plain result. */
  CHECK_EQ_INT(STCLI(SOCK, "result", ids), 1);
  CHECK_CONTAINS(R.err, "stcli: TASK: ");
  CHECK_CONTAINS(R.err, "already taken");
  /* submit, then result once it completed. */
  CHECK_EQ_INT(STCLI(SOCK, "--json", "submit", "steps", "n=1", "dt=0.0"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "{\"task_id\": ");
  id = strtoull(R.out + strlen("{\"task_id\": "), NULL, 10);
  snprintf(ids, sizeof ids, "%llu", id);
  CHECK(wait_status(ids, "completed"));
  CHECK_EQ_INT(STCLI(SOCK, "result", ids, "--values"), 0);
  CHECK_CONTAINS(R.out, "(tensor)  float32  [3]  cpu  12 bytes\n  values: 0 1 2\n");
  /* A managed task: wait prints the object line too. */
  CHECK_EQ_INT(STCLI(SOCK, "submit", "lin", "n=9"), 0);
  snprintf(ids, sizeof ids, "%llu", out_id());
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids), 0);
  CHECK_CONTAINS(R.out, "(tensor)  float32  [9]  cpu  36 bytes\nobject ");
  CHECK_CONTAINS(R.out, "cache key lin:9)");
  CHECK_EQ_INT(STCLI(SOCK, "status", "999999"), 1);
  CHECK_CONTAINS(R.err, "stcli: NOT_FOUND: ");
}

TEST(wait_draws_a_progress_bar_on_a_terminal) {
  CHECK_EQ_INT(STCLI(SOCK, "submit", "steps", "n=10", "dt=0.05"), 0);
  char ids[32];
  snprintf(ids, sizeof ids, "%llu", out_id());
  CHECK_EQ_INT(run_tty((const char *const[]){SOCK, "wait", ids, NULL}), 0);
  CHECK_CONTAINS_ALL(R.err, "\r", "[###", "%  step ", "\033[K");
  CHECK_STR_EQ(R.out, "(tensor)  float32  [3]  cpu  12 bytes\n");
}

TEST(wait_timeout_cancel_and_failures) {
  CHECK_EQ_INT(STCLI(SOCK, "submit", "sleeper"), 0);
  char ids[32];
  snprintf(ids, sizeof ids, "%llu", out_id());
  double t0 = stt_now_ms();
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids, "--timeout", "0.3"), 4);
  CHECK(stt_now_ms() - t0 < 3000);
  CHECK_CONTAINS(R.err, "stcli: TIMEOUT: task ");
  CHECK_CONTAINS(R.err, " is still ");
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--status", "running"), 0);
  CHECK_CONTAINS_ALL(R.out, "ID", "STATUS", "sleeper");
  /* One page of one: the newest, this task; below it, not this one. */
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--limit", "1", "--ids"), 0);
  char want[40];
  snprintf(want, sizeof want, "%s\n", ids);
  CHECK_STR_EQ(R.out, want);
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--before", ids, "--ids"), 0);
  CHECK(strstr(R.out, want) != R.out);
  CHECK_EQ_INT(STCLI(SOCK, "cancel", ids), 0);
  CHECK(strstr(R.out, ": running, asked to stop\n") || strstr(R.out, ": cancelled\n"));
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids), 1);
  CHECK_CONTAINS(R.err, "stcli: CANCELLED: ");
  CHECK_EQ_INT(STCLI(SOCK, "cancel", ids), 0);
  CHECK_CONTAINS(R.out, ": cancelled\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "cancel", ids), 0);
  CHECK(json_ok(R.out));
  /* A failing build. */
  CHECK_EQ_INT(STCLI(SOCK, "submit", "bad"), 0);
  snprintf(ids, sizeof ids, "%llu", out_id());
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids), 1);
  CHECK_CONTAINS(R.err, "stcli: ENDPOINT: ");
  CHECK_CONTAINS(R.err, "bad.lua:3");
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--status", "failed"), 0);
  CHECK_CONTAINS(R.out, "bad");
  CHECK_CONTAINS(R.out, "ENDPOINT: ");
  CHECK_EQ_INT(STCLI(SOCK, "tasks"), 0);
  CHECK_CONTAINS(R.out, "steps");
  CHECK_CONTAINS(R.out, "cancelled");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "tasks"), 0);
  CHECK(json_ok(R.out));
  CHECK_EQ_INT(STCLI(SOCK, "tasks", "--status", "pending"), 0);
  CHECK_STR_EQ(R.out, "(no pending tasks)\n");
  CHECK_EQ_INT(STCLI(SOCK, "submit", "nosuch"), 1);
  CHECK_CONTAINS(R.err, "stcli: UNKNOWN_ENDPOINT: ");
  CHECK_EQ_INT(STCLI(SOCK, "submit", "steps", "zzz=1"), 1);
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: ");
}

TEST(reload_and_stats) {
  stt_write_endpoint(&srv, "extra.lua",
                     "return st.endpoint{ name = \"extra\", build = function() return 7 end }\n");
  CHECK_EQ_INT(STCLI(SOCK, "reload"), 0);
  CHECK_CONTAINS_ALL(R.out, "reload ok: generation ", "added     extra\n", "removed   -\n");
  CHECK_EQ_INT(STCLI(SOCK, "call", "extra"), 0);
  CHECK_CONTAINS(R.out, "7");
  stt_write_endpoint(&srv, "broken.lua", "return st.endpoint{ name = \"broken\",\n  = }\n");
  CHECK_EQ_INT(STCLI(SOCK, "reload"), 1);
  CHECK_CONTAINS(R.err, "stcli: CONFIGURATION: ");
  CHECK_CONTAINS(R.err, "broken.lua:2");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "reload"), 1);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"ok\": false");
  char path[400];
  snprintf(path, sizeof path, "%s/broken.lua", srv.endpoints);
  unlink(path);
  snprintf(path, sizeof path, "%s/extra.lua", srv.endpoints);
  unlink(path);
  CHECK_EQ_INT(STCLI(SOCK, "reload"), 0);
  CHECK_CONTAINS(R.out, "removed   extra\n");
  CHECK_EQ_INT(STCLI(SOCK, "stats"), 0);
  CHECK_CONTAINS_ALL(R.out, "requests  requests ", "calls ", "\ncache     hits ",
                     "\ntasks     pending ", "\nobjects   count ", "\nmemory    cpu: cached ");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "stats"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"counters\": {");
}

TEST(no_server) {
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none-0.sock", srv.dir);
  const char *cmds[][3] = {{"submit", "x", NULL}, {"wait", "1", NULL}, {"status", "1", NULL},
                           {"result", "1", NULL}, {"cancel", "1", NULL}, {"tasks", NULL, NULL},
                           {"objects", NULL, NULL}, {"release", "1", NULL},
                           {"invalidate", "x", NULL}, {"reload", NULL, NULL},
                           {"stats", NULL, NULL}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    CHECK_EQ_INT(
        run_env(NULL, (const char *const[]){"--socket", missing, cmds[i][0], cmds[i][1], NULL}),
        3);
    CHECK_CONTAINS(R.err, "stcli: IO: cannot connect to ");
  }
}

static const stt_endpoint_t endpoints[] = {
    {"lin.lua", STT_EP_LIN},
    {"plain.lua", STT_EP_PLAIN_ARANGE},
    {"steps.lua", STT_EP_STEPS},
    {"sleeper.lua", STT_EP_SLEEPER},
    {"bad.lua", STT_EP_BAD},
    {NULL, NULL},
};

int main(void) {
  cli_setup(&srv, "workers = 2,", endpoints);
  RUN(help_for_every_command);
  RUN(usage_errors);
  RUN(managed_call_prints_its_object);
  RUN(objects_release_invalidate);
  RUN(submit_wait_status_result);
  RUN(wait_draws_a_progress_bar_on_a_terminal);
  RUN(wait_timeout_cancel_and_failures);
  RUN(reload_and_stats);
  RUN(no_server);
  return stt_server_finish(&srv);
}
