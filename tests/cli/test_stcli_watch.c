/* stcli watch, the real binary (ST_CLI_BIN) against real stservers:
 * key=value lines with rates checked against the counters, JSON lines, the
 * redrawn screen on a terminal, Ctrl-C, a server that goes away: exit 3. */
#include <math.h>
#include <signal.h>
#include <st/client.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "cli_run.h"
#include "endpoints.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

/* ------------------------------------------------- a running stcli */

static int proc_start(stt_proc_t *p, const char *const *args) {
  return stt_proc_start(p, cli_bin, args, NULL, 0);
}

/* Waits (10 s) until stdout holds `n` lines. 1 when it does. */
static int proc_wait_lines(stt_proc_t *p, int n) {
  double end = stt_now_ms() + 10000;
  while (stt_count_lines(p->out) < n && stt_now_ms() < end && (p->fd_out >= 0 || p->fd_err >= 0))
    stt_proc_read(p, 100);
  return stt_count_lines(p->out) >= n;
}

/* The number after " key=" (or "key=" at the start) in a line; NAN when
 * it is "-"; -1e300 when the key is missing. */
static double field(const char *line, const char *key) {
  char needle[64];
  snprintf(needle, sizeof needle, " %s=", key);
  const char *at;
  if (strncmp(line, needle + 1, strlen(needle) - 1) == 0)
    at = line + strlen(needle) - 1;
  else if ((at = strstr(line, needle)))
    at += strlen(needle);
  else
    return -1e300;
  if (*at == '-' && (at[1] == ' ' || at[1] == '\n' || !at[1])) return NAN;
  return strtod(at, NULL);
}

/* ------------------------------------------------------------- tests */

TEST(watch_lines_and_rates) {
  /* Two tasks for the tasks_* counters. */
  CHECK_EQ_INT(STCLI(SOCK, "submit", "t", "n=2"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "submit", "t", "n=3"), 0);
  stt_proc_t p;
  CHECK_EQ_INT(proc_start(&p, (const char *const[]){SOCK, "watch", "--count", "2",
                                                    "--interval", "1", NULL}),
               0);
  CHECK(proc_wait_lines(&p, 1));
  /* Five calls between the two samples. */
  st_client_t *c = NULL;
  char err[256];
  CHECK_ERR_MSG(st_client_connect(srv.socket, &c, err, sizeof err), ST_OK, err);
  for (int k = 0; c && k < 5; k++) {
    st_result_t *r = NULL;
    CHECK_RC(st_client_call(c, "t", NULL, &r), ST_OK, c);
    st_result_free(r);
  }
  st_client_close(c);
  CHECK_EQ_INT(stt_proc_finish(&p, 10000), 0);
  CHECK_EQ_INT(stt_count_lines(p.out), 2);
  CHECK_STR_EQ(p.err, "");
  char *l1 = p.out, *l2 = strchr(p.out, '\n');
  if (!l2) return;
  *l2++ = '\0';
  CHECK(strncmp(l1, "time=", 5) == 0);
  const char *keys[] = {"uptime", "connections", "requests", "calls", "errors", "cache_hits",
                        "cache_misses", "tasks_pending", "tasks_running", "tasks_completed",
                        "tasks_failed", "tasks_cancelled", "objects", "memory.cpu"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    CHECK(field(l1, keys[k]) >= 0);
    CHECK(field(l2, keys[k]) >= 0);
  }
  /* No rate in the first sample. */
  CHECK(isnan(field(l1, "requests/s")));
  CHECK(isnan(field(l1, "calls/s")));
  double dt = field(l2, "uptime") - field(l1, "uptime");
  CHECK(dt > 0.8 && dt < 3);
  double calls = field(l2, "calls") - field(l1, "calls");
  double reqs = field(l2, "requests") - field(l1, "requests");
  CHECK(calls == 5);
  CHECK(reqs >= 6); /* the calls, a hello, and watch's own info */
  CHECK(fabs(field(l2, "calls/s") - calls / dt) < 0.06);
  CHECK(fabs(field(l2, "requests/s") - reqs / dt) < 0.06);
  CHECK(field(l1, "tasks_completed") + field(l1, "tasks_pending") +
            field(l1, "tasks_running") >= 2); /* the two tasks submitted first */
}

TEST(watch_json) {
  CHECK_EQ_INT(STCLI(SOCK, "--json", "watch", "--count", "2", "--interval", "0.05"), 0);
  CHECK_EQ_INT(stt_count_lines(R.out), 2);
  char *l2 = strchr(R.out, '\n');
  if (!l2) return;
  *l2++ = '\0';
  CHECK(json_ok(R.out));
  CHECK(json_ok(l2));
  CHECK_CONTAINS(R.out, "\"requests_per_s\": null");
  CHECK_CONTAINS(l2, "\"requests_per_s\": ");
  CHECK(strstr(l2, "\"requests_per_s\": null") == NULL);
  CHECK_CONTAINS(l2, "\"tasks\": {");
  CHECK_CONTAINS(l2, "\"memory\": {\"cpu\":{");
}

/* stcli with stdout on a pseudo-terminal; R.out gets what the terminal
 * shows. Returns the exit code. */
static int run_on_tty(const char *const *args) {
  return stt_run(&R, cli_bin, args, NULL, STT_PTY_OUT);
}

TEST(watch_screen_on_a_terminal) {
  CHECK_EQ_INT(run_on_tty((const char *const[]){SOCK, "watch", "--count", "2", "--interval",
                                                "0.05", NULL}),
               0);
  /* Two screens, each drawn from the top left, the cursor hidden, then
   * shown again. */
  const char *first = strstr(R.out, "\033[H\033[J");
  CHECK(first != NULL);
  CHECK(first && strstr(first + 1, "\033[H\033[J") != NULL);
  CHECK_CONTAINS_ALL(R.out, "\033[?25l", "\033[?25h", "stcli watch  ", "requests     ");
  CHECK_CONTAINS(R.out, "-/s");   /* no rate on the first screen */
  CHECK_CONTAINS(R.out, ".0/s");  /* ... but on the second */
  CHECK_CONTAINS_ALL(R.out, "cache        hits ", "tasks        pending ",
                            "memory       cpu: cached ");
}

TEST(watch_ctrl_c) {
  stt_proc_t p;
  CHECK_EQ_INT(proc_start(&p, (const char *const[]){SOCK, "watch", "--interval", "0.1", NULL}),
               0);
  CHECK(proc_wait_lines(&p, 1));
  kill(p.pid, SIGINT);
  CHECK_EQ_INT(stt_proc_finish(&p, 10000), 0);
  CHECK_STR_EQ(p.err, "");
}

TEST(watch_server_gone) {
  stt_server_t s2;
  stt_server_init(&s2);
  stt_write_endpoint(&s2, "t.lua",
                     "return st.endpoint{ name = \"t\", build = function(a) return 1 end }\n");
  if (stt_server_start(&s2) != 0) {
    CHECK(0);
    stt_server_cleanup(&s2);
    return;
  }
  stt_proc_t p;
  CHECK_EQ_INT(proc_start(&p, (const char *const[]){"--socket", s2.socket, "watch",
                                                    "--interval", "0.05", NULL}),
               0);
  CHECK(proc_wait_lines(&p, 1));
  CHECK_EQ_INT(stt_server_stop(&s2), 0);
  CHECK_EQ_INT(stt_proc_finish(&p, 10000), 3);
  CHECK_CONTAINS(p.err, "stcli: IO: the server went away");
  stt_server_cleanup(&s2);
}

TEST(watch_usage_and_exit_codes) {
  CHECK_EQ_INT(STCLI(SOCK, "watch", "--interval", "x"), 2);
  CHECK_CONTAINS(R.err, "stcli: USAGE: --interval needs seconds");
  CHECK_EQ_INT(STCLI(SOCK, "watch", "--interval", "0"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "watch", "--count", "0"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "watch", "--count"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "watch", "now"), 2);
  CHECK_CONTAINS(R.err, "unexpected argument 'now'");
  CHECK_EQ_INT(STCLI("watch", "--help"), 0);
  CHECK_CONTAINS(R.out, "usage: stcli [global options] watch [--interval S] [--count N]");
  char missing[400];
  snprintf(missing, sizeof missing, "%s/none-0.sock", srv.dir);
  CHECK_EQ_INT(STCLI("--socket", missing, "watch", "--count", "1"), 3);
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(STCLI(SOCK, "watch", "--count=1", "--interval=0.5"), 0);
  CHECK_EQ_INT(stt_count_lines(R.out), 1);
}

static const stt_endpoint_t endpoints[] = {
    {"t.lua", STT_EP_T},
    {NULL, NULL},
};

int main(void) {
  cli_setup(&srv, NULL, endpoints);
  RUN(watch_lines_and_rates);
  RUN(watch_json);
  RUN(watch_screen_on_a_terminal);
  RUN(watch_ctrl_c);
  RUN(watch_server_gone);
  RUN(watch_usage_and_exit_codes);
  return stt_server_finish(&srv);
}
