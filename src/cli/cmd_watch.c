/* stcli watch: the server's counters, sampled with `info` every interval
 * over one connection. Rates (requests/s, calls/s) are the difference
 * between two samples over the server's uptime between them.
 *
 * On a terminal the screen is redrawn in place; otherwise (a pipe, a
 * file) each sample is one line of key=value words, or with --json one
 * JSON object per line. Ctrl-C ends it with exit 0; a server that goes
 * away ends it with exit 3.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

#define DEFAULT_INTERVAL_S 1.0
#define MIN_INTERVAL_S 0.01

enum { TASK_STATES = 5 };
static const char *const task_states[TASK_STATES] = {"pending", "running", "completed", "failed",
                                                     "cancelled"};

/* One sample: the numbers stcli shows (NAN when the server does not
 * report one) and the info reply they came from. */
typedef struct sample {
  double mono;           /* local monotonic seconds when it arrived */
  double uptime;
  double connections, requests, calls, errors, hits, misses, objects;
  double tasks[TASK_STATES];
  st_result_t *info;     /* owned; NULL once only the numbers are kept */
} sample_t;

/* Set by SIGINT while stcli sleeps between samples. */
static volatile sig_atomic_t stop_requested;
/* Nonzero while a request is in flight: SIGINT then ends stcli at once. */
static volatile sig_atomic_t in_request;
/* Nonzero while the terminal's cursor is hidden. */
static volatile sig_atomic_t cursor_hidden;

static const char show_cursor[] = "\033[?25h\n";

static void on_sigint(int sig) {
  (void)sig;
  if (in_request) {
    /* A request can block as long as the server takes: leave now. */
    if (cursor_hidden) {
      ssize_t w = write(STDOUT_FILENO, show_cursor, sizeof show_cursor - 1);
      (void)w;
    }
    _exit(CLI_OK);
  }
  stop_requested = 1;
}

static double now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double number(const st_value_t *map, const char *key) {
  double d;
  return cli_value_number(st_value_get(map, key), &d) ? d : NAN;
}

static void sample_read(sample_t *s, st_result_t *info) {
  const st_value_t *v = st_result_value(info);
  const st_value_t *counters = st_value_get(v, "counters");
  const st_value_t *tasks = st_value_get(v, "tasks");
  s->mono = now_mono();
  s->info = info;
  s->uptime = number(v, "uptime_s");
  s->connections = number(v, "connections");
  s->requests = number(counters, "requests");
  s->calls = number(counters, "calls");
  s->errors = number(counters, "errors");
  s->hits = number(counters, "cache_hits");
  s->misses = number(counters, "cache_misses");
  s->objects = number(st_value_get(v, "objects"), "count");
  for (int k = 0; k < TASK_STATES; k++) s->tasks[k] = number(tasks, task_states[k]);
}

/* Seconds between two samples: by the server's uptime when it reports
 * one, else by stcli's clock. */
static double elapsed(const sample_t *prev, const sample_t *cur) {
  if (!isnan(prev->uptime) && !isnan(cur->uptime) && cur->uptime > prev->uptime)
    return cur->uptime - prev->uptime;
  return cur->mono - prev->mono;
}

/* Per second change of a counter between samples; NAN without a
 * previous sample or a value. */
static double rate(const sample_t *prev, const sample_t *cur, double a, double b) {
  if (!prev || isnan(a) || isnan(b) || b < a) return NAN;
  double dt = elapsed(prev, cur);
  return dt > 0 ? (b - a) / dt : NAN;
}

/* "%.0f" of a number, "-" for NAN. */
static const char *num(double d, char *buf, size_t len) {
  if (isnan(d)) return "-";
  snprintf(buf, len, "%.0f", d);
  return buf;
}

static const char *num1(double d, char *buf, size_t len) {
  if (isnan(d)) return "-";
  snprintf(buf, len, "%.1f", d);
  return buf;
}

/* ---------------------------------------------------------------- output */

/* One line of key=value words. */
static void print_line(const sample_t *cur, double req_rate, double call_rate) {
  char b[16][32], when[32];
  time_t t = time(NULL);
  struct tm tm;
  if (!localtime_r(&t, &tm) || !strftime(when, sizeof when, "%H:%M:%S", &tm))
    snprintf(when, sizeof when, "-");
  printf("time=%s uptime=%s connections=%s requests=%s requests/s=%s calls=%s calls/s=%s "
         "errors=%s cache_hits=%s cache_misses=%s",
         when, isnan(cur->uptime) ? "-" : (snprintf(b[0], 32, "%.3f", cur->uptime), b[0]),
         num(cur->connections, b[1], 32), num(cur->requests, b[2], 32),
         num1(req_rate, b[3], 32), num(cur->calls, b[4], 32), num1(call_rate, b[5], 32),
         num(cur->errors, b[6], 32), num(cur->hits, b[7], 32), num(cur->misses, b[8], 32));
  for (int k = 0; k < TASK_STATES; k++)
    printf(" tasks_%s=%s", task_states[k], num(cur->tasks[k], b[9], 32));
  printf(" objects=%s", num(cur->objects, b[10], 32));
  const st_value_t *mem = st_value_get(st_result_value(cur->info), "memory");
  for (size_t i = 0; mem && mem->kind == ST_VALUE_MAP && i < mem->as.map.len; i++) {
    const st_value_t *dev = &mem->as.map.values[i];
    char *name = cli_value_text(&mem->as.map.keys[i]);
    double used = number(dev, "object_bytes");   /* cached + leased + task */
    printf(" memory.%s=%.0f", name ? name : "?", isnan(used) ? 0 : used);
    free(name);
  }
  printf("\n");
}

/* A number as JSON (null when absent). */
static void json_num(const char *key, double d, int first) {
  char buf[64];
  cli_format_json_number(isnan(d) ? NAN : d, buf, sizeof buf);
  printf("%s\"%s\": %s", first ? "" : ", ", key, buf);
}

/* One JSON object per sample. */
static void print_json(const sample_t *cur, double req_rate, double call_rate) {
  const st_value_t *v = st_result_value(cur->info);
  printf("{");
  json_num("uptime_s", cur->uptime, 1);
  json_num("connections", cur->connections, 0);
  json_num("requests", cur->requests, 0);
  json_num("requests_per_s", req_rate, 0);
  json_num("calls", cur->calls, 0);
  json_num("calls_per_s", call_rate, 0);
  json_num("errors", cur->errors, 0);
  json_num("cache_hits", cur->hits, 0);
  json_num("cache_misses", cur->misses, 0);
  json_num("objects", cur->objects, 0);
  const char *maps[] = {"tasks", "memory"};
  for (int k = 0; k < 2; k++) {
    const st_value_t *m = st_value_get(v, maps[k]);
    char *s = m ? st_value_json(m, 0) : NULL;
    printf(", \"%s\": %s", maps[k], s ? s : "null");
    free(s);
  }
  printf("}\n");
}

/* The whole screen, redrawn from the top left. */
static void print_screen(const char *server_id, const sample_t *cur, double interval,
                         double req_rate, double call_rate, double err_rate) {
  char b[8][32], up[32] = "-";
  if (!isnan(cur->uptime)) cli_format_duration(cur->uptime, up, sizeof up);
  printf("\033[H\033[J");
  printf("stcli watch  %s  every %.1f s  (Ctrl-C to quit)\n\n", server_id ? server_id : "?",
         interval);
  printf("%-12s %s\n", "uptime", up);
  printf("%-12s %s\n", "connections", num(cur->connections, b[0], 32));
  printf("%-12s %-12s %s/s\n", "requests", num(cur->requests, b[1], 32),
         num1(req_rate, b[2], 32));
  printf("%-12s %-12s %s/s\n", "calls", num(cur->calls, b[3], 32), num1(call_rate, b[4], 32));
  printf("%-12s %-12s %s/s\n", "errors", num(cur->errors, b[5], 32), num1(err_rate, b[6], 32));
  printf("%-12s hits %s, misses %s\n", "cache", num(cur->hits, b[0], 32),
         num(cur->misses, b[1], 32));
  printf("%-12s", "tasks");
  for (int k = 0; k < TASK_STATES; k++)
    printf("%s %s %s", k ? "," : "", task_states[k], num(cur->tasks[k], b[2], 32));
  printf("\n");
  const st_value_t *v = st_result_value(cur->info);
  const st_value_t *objects = st_value_get(v, "objects");
  char bytes[32] = "-";
  double ob = number(objects, "bytes");
  if (!isnan(ob)) cli_format_bytes(ob, bytes, sizeof bytes);
  printf("%-12s %s (leases %s, %s)\n", "objects", num(cur->objects, b[3], 32),
         num(number(objects, "leases"), b[4], 32), bytes);
  const st_value_t *mem = st_value_get(v, "memory");
  size_t nmem = mem && mem->kind == ST_VALUE_MAP ? mem->as.map.len : 0;
  if (nmem == 0) printf("%-12s -\n", "memory");
  for (size_t i = 0; i < nmem; i++) {
    const st_value_t *dev = &mem->as.map.values[i];
    char *name = cli_value_text(&mem->as.map.keys[i]);
    char cached[32] = "-", leased[32] = "-", task[32] = "-", budget[32] = "none";
    double d;
    if (!isnan(d = number(dev, "cached_bytes"))) cli_format_bytes(d, cached, sizeof cached);
    if (!isnan(d = number(dev, "leased_bytes"))) cli_format_bytes(d, leased, sizeof leased);
    if (!isnan(d = number(dev, "task_bytes"))) cli_format_bytes(d, task, sizeof task);
    if (!isnan(d = number(dev, "budget")) && d > 0) cli_format_bytes(d, budget, sizeof budget);
    printf("%-12s %s: cached %s, leased %s, task %s, budget %s\n", i ? "" : "memory",
           name ? name : "?", cached, leased, task, budget);
    free(name);
  }
}

/* ------------------------------------------------------------------- run */

/* Sleeps until the monotonic time `until`, or until SIGINT (which is
 * blocked outside this wait, so none is missed). */
static void pause_until(double until, const sigset_t *open) {
  while (!stop_requested) {
    double left = until - now_mono();
    if (left <= 0) return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    if (ppoll(NULL, 0, &ts, open) < 0 && errno != EINTR) return;
  }
}

static int parse_watch(cli_t *g, int argc, char **argv, double *interval, long *count,
                       int *done) {
  *done = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v;
    if (cli_option("--interval", argc, argv, &i, &v)) {
      double s;
      if (cli_parse_duration(v, &s) != 0 || s < MIN_INTERVAL_S || s > 86400)
        return cli_usage("watch", "--interval needs seconds (a duration, at least %.2f), not '%s'",
                         MIN_INTERVAL_S, v ? v : "");
      *interval = s;
      continue;
    }
    if (cli_option("--count", argc, argv, &i, &v)) {
      if (!v || cli_parse_count(v, 1L << 40, count) != 0 || *count < 1)
        return cli_usage("watch", "--count needs a positive number, not '%s'", v ? v : "");
      continue;
    }
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(a, "--help") == 0) {
      cli_print_command_help(&cli_watch_command, stdout);
      *done = 1;
      return CLI_OK;
    }
    return cli_usage_unknown(&cli_watch_command, a);
  }
  return CLI_OK;
}

static int run_watch(cli_t *g, int argc, char **argv) {
  double interval = DEFAULT_INTERVAL_S;
  long count = -1;
  int done;
  int code = parse_watch(g, argc, argv, &interval, &count, &done);
  if (code != CLI_OK || done) return code;

  /* SIGINT stays blocked except while sleeping or waiting for a reply. */
  sigset_t block, open;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &open);
  sigdelset(&open, SIGINT);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);

  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  int tty = !g->json && isatty(STDOUT_FILENO);
  if (tty) {
    /* One write per screen, so the redraw does not flicker. */
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
    printf("\033[?25l");
    cursor_hidden = 1;
  }
  sample_t prev = {0}, cur = {0};
  int have_prev = 0;
  double start = now_mono();
  for (long n = 0; (count < 0 || n < count) && !stop_requested; n++) {
    if (n > 0) pause_until(start + (double)n * interval, &open);
    if (stop_requested) break;
    st_result_t *info = NULL;
    fflush(stdout);
    in_request = 1;
    sigprocmask(SIG_UNBLOCK, &block, NULL);
    int rc = st_client_info(c, &info);
    sigprocmask(SIG_BLOCK, &block, NULL);
    in_request = 0;
    if (rc != ST_OK) {
      if (tty) printf("\n");
      fflush(stdout);
      if (rc == ST_ERR_IO) {
        const char *msg = st_client_error(c);
        fprintf(stderr, "stcli: IO: the server went away (%s)\n",
                msg && *msg ? msg : st_strerror(rc));
        code = CLI_NO_CONNECTION;
      } else {
        code = cli_fail(c, rc);
      }
      break;
    }
    sample_read(&cur, info);
    const sample_t *p = have_prev ? &prev : NULL;
    double req_rate = rate(p, &cur, prev.requests, cur.requests);
    double call_rate = rate(p, &cur, prev.calls, cur.calls);
    if (g->json)
      print_json(&cur, req_rate, call_rate);
    else if (tty)
      print_screen(st_client_server_id(c), &cur, interval, req_rate, call_rate,
                   rate(p, &cur, prev.errors, cur.errors));
    else
      print_line(&cur, req_rate, call_rate);
    fflush(stdout);
    st_result_free(cur.info);
    cur.info = NULL;
    prev = cur;
    have_prev = 1;
  }
  if (tty) {
    printf("\033[?25h");
    cursor_hidden = 0;
  }
  fflush(stdout);
  st_client_close(c);
  sigprocmask(SIG_UNBLOCK, &block, NULL);
  return code;
}

const cli_command_t cli_watch_command = {
    "watch",
    "watch [--interval S] [--count N]",
    "Show the server's counters live: rates, cache, tasks, objects, memory.",
    "Samples `info` every S seconds over one connection. On a terminal the\n"
    "screen is redrawn: uptime, connections, requests, calls and errors (totals\n"
    "and per second since the previous sample), cache hits and misses, tasks\n"
    "by state, objects, and memory per device. Otherwise each sample is one\n"
    "line of key=value words (time= uptime= connections= requests= requests/s=\n"
    "calls= calls/s= errors= cache_hits= cache_misses= tasks_<state>= objects=\n"
    "memory.<device>=<bytes cached + leased>); with --json one JSON object per\n"
    "line. Rates are \"-\" (null) in the first sample. stcli's own info request\n"
    "counts as one request per sample.\n"
    "Ctrl-C ends it (exit 0); a server that goes away ends it with exit 3.\n\n"
    "Options:\n"
    "  --interval S   seconds between samples (default 1)\n"
    "  --count N      stop after N samples\n",
    run_watch,
    "--interval= --count=",
};
