/* stcli submit, wait, status, result, cancel, tasks: builds queued on the
 * server as tasks (docs/protocol.md, `submit` ... `tasks`). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* How long each `wait` request of `stcli wait` lasts: the progress shown
 * is at most this old. */
#define POLL_S 0.2

static const char *status_of(const st_value_t *info) {
  const char *s = cli_value_str(st_value_get(info, "status"));
  return s ? s : "?";
}

static int is_finished(const char *status) {
  return strcmp(status, "completed") == 0 || strcmp(status, "failed") == 0 ||
         strcmp(status, "cancelled") == 0;
}

/* "40%" or "" when the task reports no progress. */
static void progress_text(const st_value_t *info, char *buf, size_t len) {
  double p;
  if (cli_value_number(st_value_get(info, "progress"), &p))
    snprintf(buf, len, "%.0f%%", p * 100);
  else
    snprintf(buf, len, "%s", "");
}

/* "NAME: message" of a task error map, or NULL. Owned. */
static char *error_text(const st_value_t *info) {
  const st_value_t *e = st_value_get(info, "error");
  if (!e || e->kind != ST_VALUE_MAP) return NULL;
  const char *name = cli_value_str(st_value_get(e, "name"));
  const char *msg = cli_value_str(st_value_get(e, "message"));
  return cli_strdupf("%s: %s", name ? name : "ERROR", msg ? msg : "");
}

/* One positional id plus options; `timeout_s`/`nvalues` NULL when the
 * command does not take them. */
static int parse_id_line(cli_t *g, const cli_command_t *cmd, int argc, char **argv, uint64_t *id,
                         double *timeout_s, long *nvalues, int *done) {
  *done = 0;
  const char *word = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v;
    if (timeout_s && cli_option("--timeout", argc, argv, &i, &v)) {
      if (cli_parse_duration(v, timeout_s) != 0)
        return cli_usage(cmd->name, "--timeout needs a duration (5, 2.5s, 500ms, 1m), not '%s'",
                         v ? v : "");
      continue;
    }
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(a, "--help") == 0) {
      cli_print_command_help(cmd, stdout);
      *done = 1;
      return CLI_OK;
    }
    if (nvalues && strcmp(a, "--values") == 0) {
      *nvalues = CLI_DEFAULT_VALUES;
    } else if (nvalues && strncmp(a, "--values=", 9) == 0) {
      if (cli_parse_count(a + 9, 1L << 40, nvalues) != 0)
        return cli_usage(cmd->name, "--values=N needs a count, not '%s'", a + 9);
    } else if (a[0] == '-' && a[1] == '-') {
      return cli_usage_unknown(cmd, a);
    } else if (word) {
      return cli_usage(cmd->name, "unexpected argument '%s'", a);
    } else {
      word = a;
    }
  }
  if (!word) return cli_usage(cmd->name, "%s needs a task id", cmd->name);
  return cli_parse_id(cmd->name, "task", word, id);
}

/* Fetches the result of finished task `id` and prints it like `call`. */
static int fetch_and_print_result(cli_t *g, st_client_t *c, uint64_t id, long nvalues) {
  st_result_t *r = NULL;
  int rc = st_client_task_result(c, id, &r);
  if (rc != ST_OK) return cli_fail(c, rc);
  int code = cli_print_result(g, r, nvalues);
  st_result_free(r);
  return code;
}

/* ---------------------------------------------------------------- submit */

static int run_submit(cli_t *g, int argc, char **argv) {
  cli_call_args_t ca;
  st_client_t *c;
  int code = cli_call_connect(g, &cli_submit_command, argc, argv, 0, &ca, &c);
  if (code != CLI_OK || !c) return code;
  uint64_t id;
  int rc = st_client_submit(c, ca.endpoint, ca.args, &id);
  st_args_free(ca.args);
  if (rc != ST_OK) {
    code = cli_fail_endpoint(c, rc, ca.endpoint);
  } else if (g->json) {
    printf("{\"task_id\": %" PRIu64 "}\n", id);
  } else {
    printf("%" PRIu64 "\n", id);
  }
  st_client_close(c);
  return code;
}

const cli_command_t cli_submit_command = {
    "submit",
    "submit NAME [key=value ...] [--args-json JSON]",
    "Queue a build of an endpoint as a task and print the task id.",
    "Arguments are given as for `call`; the server checks them now, so a bad\n"
    "argument fails here. The build runs in the background: follow it with\n"
    "`stcli wait ID`, `stcli status ID` or `stcli tasks`, and fetch what it\n"
    "built with `stcli result ID` (or `wait`, which does both).\n"
    "With --json, prints {\"task_id\": N}.\n",
    run_submit,
    "--args-json=",
};

/* ------------------------------------------------------------------ wait */

typedef struct progress_view {
  int tty;              /* draw a bar on stderr, else print changes */
  int drawn;            /* a bar is on the screen                   */
  char last[256];       /* the last plain line printed              */
} progress_view_t;

static void progress_clear(progress_view_t *pv) {
  if (pv->drawn) fprintf(stderr, "\r\033[K");
  pv->drawn = 0;
}

static void progress_show(progress_view_t *pv, uint64_t id, const st_value_t *info) {
  const char *status = status_of(info);
  const char *note = cli_value_str(st_value_get(info, "note"));
  double p = -1;
  int has_p = cli_value_number(st_value_get(info, "progress"), &p);
  if (has_p) p = p < 0 ? 0 : p > 1 ? 1 : p;
  if (pv->tty) {
    enum { WIDTH = 30 };
    char bar[WIDTH + 1];
    int fill = has_p ? (int)(p * WIDTH + 0.5) : 0;
    for (int k = 0; k < WIDTH; k++) bar[k] = k < fill ? '#' : '-';
    bar[WIDTH] = '\0';
    fprintf(stderr, "\r\033[Ktask %" PRIu64 " [%s] ", id, bar);
    if (has_p) fprintf(stderr, "%3.0f%%", p * 100);
    else fprintf(stderr, "%s", status);
    if (note && *note) fprintf(stderr, "  %.60s", note);
    fflush(stderr);
    pv->drawn = 1;
    return;
  }
  char line[256];
  int n = snprintf(line, sizeof line, "task %" PRIu64 " %s", id, status);
  if (has_p && n > 0 && (size_t)n < sizeof line)
    n += snprintf(line + n, sizeof line - (size_t)n, " %.0f%%", p * 100);
  if (note && *note && n > 0 && (size_t)n < sizeof line)
    snprintf(line + n, sizeof line - (size_t)n, " %s", note);
  if (strcmp(line, pv->last) != 0) {
    fprintf(stderr, "%s\n", line);
    snprintf(pv->last, sizeof pv->last, "%s", line);
  }
}

static int run_wait(cli_t *g, int argc, char **argv) {
  uint64_t id;
  double limit_s = -1;
  long nvalues = -1;
  int done;
  int code = parse_id_line(g, &cli_wait_command, argc, argv, &id, &limit_s, &nvalues, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  progress_view_t pv = {.tty = isatty(STDERR_FILENO)};
  double start = cli_now_unix();
  for (;;) {
    double step = POLL_S;
    if (limit_s >= 0) {
      double left = limit_s - (cli_now_unix() - start);
      if (left < step) step = left > 0 ? left : 0;
    }
    st_result_t *info = NULL;
    int rc = st_client_task_wait(c, id, step, &info);
    if (rc != ST_OK) {
      progress_clear(&pv);
      code = cli_fail(c, rc);
      break;
    }
    const st_value_t *v = st_result_value(info);
    const char *status = status_of(v);
    if (is_finished(status)) {
      st_result_free(info);
      progress_clear(&pv);
      code = fetch_and_print_result(g, c, id, nvalues);
      break;
    }
    progress_show(&pv, id, v);
    if (limit_s >= 0 && cli_now_unix() - start >= limit_s) {
      progress_clear(&pv);
      char took[32];
      cli_format_duration(limit_s, took, sizeof took);
      fprintf(stderr, "stcli: TIMEOUT: task %" PRIu64 " is still %s after %s\n", id, status,
              took);
      st_result_free(info);
      code = CLI_TIMEOUT;
      break;
    }
    st_result_free(info);
  }
  st_client_close(c);
  return code;
}

const cli_command_t cli_wait_command = {
    "wait",
    "wait ID [--timeout T] [--values[=N]]",
    "Wait for a task to end, showing its progress, then print its result.",
    "While the task runs, its progress goes to stderr: a bar with the percent\n"
    "and the last note on a terminal, else one line per change\n"
    "(\"task 7 running 40% loading\"). When the task completes, its result is\n"
    "printed like `call` prints one (and is taken: a plain result is handed\n"
    "over once). A failed or cancelled task prints its error and exits 1.\n\n"
    "Options:\n"
    "  --timeout T    give up after T, a duration like the global --timeout's\n"
    "                 (exit 4; the task keeps running). The global --timeout\n"
    "                 (per reply) may be given before the command.\n"
    "  --values[=N]   as for `call`\n",
    run_wait,
    "--timeout= --values",
};

/* ---------------------------------------------------------------- status */

/* "2026-11-21 12:00:00 (4.2 s ago)" or "-". */
static void time_line(const char *label, const st_value_t *info, const char *key, double now) {
  double t;
  char when[64] = "-", ago[32] = "";
  if (cli_value_number(st_value_get(info, key), &t)) {
    cli_format_unix_time(t, when, sizeof when);
    cli_format_duration(now - t, ago, sizeof ago);
    printf("%-11s %s (%s ago)\n", label, when, ago);
  } else {
    printf("%-11s -\n", label);
  }
}

/* The task info map as labelled lines. */
static void print_task_info(const st_value_t *v) {
  double now = cli_now_unix(), id = 0, obj;
  cli_value_number(st_value_get(v, "id"), &id);
  const char *ep = cli_value_str(st_value_get(v, "endpoint"));
  const char *note = cli_value_str(st_value_get(v, "note"));
  char prog[16];
  progress_text(v, prog, sizeof prog);
  printf("%-11s %.0f\n", "task", id);
  printf("%-11s %s\n", "endpoint", ep ? ep : "?");
  printf("%-11s %s\n", "status", status_of(v));
  if (*prog || (note && *note))
    printf("%-11s %s%s%s\n", "progress", *prog ? prog : "-", note && *note ? "  " : "",
           note && *note ? note : "");
  time_line("created", v, "created_at", now);
  time_line("started", v, "started_at", now);
  time_line("completed", v, "completed_at", now);
  double t0, t1;
  if (cli_value_number(st_value_get(v, "started_at"), &t0) &&
      cli_value_number(st_value_get(v, "completed_at"), &t1)) {
    char ran[32];
    cli_format_duration(t1 - t0, ran, sizeof ran);
    printf("%-11s %s\n", "ran", ran);
  }
  char *err = error_text(v);
  if (err) printf("%-11s %s\n", "error", err);
  free(err);
  if (cli_value_number(st_value_get(v, "object_id"), &obj))
    printf("%-11s %.0f\n", "object", obj);
}

/* status and cancel: one request that returns task info. */
static int run_info_command(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                            int cancel) {
  uint64_t id;
  int done;
  int code = parse_id_line(g, cmd, argc, argv, &id, NULL, NULL, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_result_t *info = NULL;
  int rc = cancel ? st_client_task_cancel(c, id, &info) : st_client_task_status(c, id, &info);
  if (rc != ST_OK) {
    code = cli_fail(c, rc);
    st_client_close(c);
    return code;
  }
  st_client_close(c);
  const st_value_t *v = st_result_value(info);
  if (g->json) {
    code = cli_print_json_owned(st_value_json(v, 1));
  } else if (!cancel) {
    print_task_info(v);
  } else {
    const char *status = status_of(v);
    if (strcmp(status, "running") == 0)
      printf("task %" PRIu64 ": running, asked to stop\n", id);
    else if (strcmp(status, "cancelled") == 0)
      printf("task %" PRIu64 ": cancelled\n", id);
    else
      printf("task %" PRIu64 ": %s (already finished, nothing to cancel)\n", id, status);
  }
  st_result_free(info);
  return code;
}

static int run_status(cli_t *g, int argc, char **argv) {
  return run_info_command(g, &cli_status_command, argc, argv, 0);
}

static int run_cancel(cli_t *g, int argc, char **argv) {
  return run_info_command(g, &cli_cancel_command, argc, argv, 1);
}

const cli_command_t cli_status_command = {
    "status",
    "status ID",
    "Show a task: endpoint, status, progress, times, error, object.",
    "With --json, prints the server's task info map.\n",
    run_status,
    "",
};

const cli_command_t cli_cancel_command = {
    "cancel",
    "cancel ID",
    "Cancel a task: a pending one at once, a running one at its next check.",
    "Prints \"task ID: cancelled\", \"task ID: running, asked to stop\" (it ends\n"
    "cancelled when its body next checks), or the status of a task that had\n"
    "already finished (nothing changes). With --json, prints the task info.\n",
    run_cancel,
    "",
};

/* ---------------------------------------------------------------- result */

static int run_result(cli_t *g, int argc, char **argv) {
  uint64_t id;
  long nvalues = -1;
  int done;
  int code = parse_id_line(g, &cli_result_command, argc, argv, &id, NULL, &nvalues, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  code = fetch_and_print_result(g, c, id, nvalues);
  st_client_close(c);
  return code;
}

const cli_command_t cli_result_command = {
    "result",
    "result ID [--values[=N]]",
    "Fetch and print the result of a finished task, like `call`.",
    "A failed task prints its error (e.g. ENDPOINT with file:line), a cancelled\n"
    "one CANCELLED, one still running TASK; all exit 1. A plain result is\n"
    "handed over once: fetching it again is TASK \"result already taken\".\n\n"
    "Options:\n"
    "  --values[=N]   as for `call`\n",
    run_result,
    "--values",
};

/* ----------------------------------------------------------------- tasks */

/* tasks --ids: one id per line, newest first, or a JSON array. */
static int print_ids(const cli_t *g, const st_value_t *v) {
  size_t shown = 0;
  if (g->json) printf("[");
  for (size_t i = 0; i < v->as.array.len; i++) {
    double id;
    if (!cli_value_number(st_value_get(&v->as.array.items[i], "id"), &id)) continue;
    if (g->json)
      printf("%s%.0f", shown++ ? ", " : "", id);
    else
      printf("%.0f\n", id);
  }
  if (g->json) printf("]\n");
  return CLI_OK;
}

/* The listing has tasks of other uids (root's and the server's uid's
 * `tasks` lists every uid's): rows carry an OWNER column. */
static int owner_column;

/* Whether task list v holds a task of another uid than this process's. */
static int others_in(const st_value_t *v) {
  for (size_t i = 0; v && v->kind == ST_VALUE_ARRAY && i < v->as.array.len; i++) {
    double uid = -1;
    if (cli_value_number(st_value_get(&v->as.array.items[i], "uid"), &uid) == 0 &&
        uid != (double)getuid())
      return 1;
  }
  return 0;
}

/* One row of the tasks table. */
static void task_row(const st_value_t *e, double now, char **row) {
  double id = 0;
  char prog[16];
  cli_value_number(st_value_get(e, "id"), &id);
  progress_text(e, prog, sizeof prog);
  const char *ep = cli_value_str(st_value_get(e, "endpoint"));
  const char *note = cli_value_str(st_value_get(e, "note"));
  char *err = error_text(e);
  row[0] = cli_strdupf("%.0f", id);
  row[1] = strdup(ep ? ep : "?");
  row[2] = strdup(status_of(e));
  row[3] = strdup(*prog ? prog : "-");
  row[4] = cli_age_cell(e, now);
  row[5] = err ? err : strdup(note && *note ? note : "-");
  if (owner_column) {
    double uid = -1;
    cli_value_number(st_value_get(e, "uid"), &uid);
    row[6] = uid >= 0 ? cli_strdupf("%.0f", uid) : strdup("-");
  }
}

static int run_tasks(cli_t *g, int argc, char **argv) {
  const char *status = NULL, *word = NULL;
  int ids = 0;
  long limit = 0;
  uint64_t before = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--ids") == 0) {
      ids = 1;
      continue;
    }
    if (cli_option("--status", argc, argv, &i, &status)) {
      if (!status || !*status) return cli_usage("tasks", "--status needs a status");
      continue;
    }
    if (cli_option("--limit", argc, argv, &i, &word)) {
      if (!word || cli_parse_count(word, 1000, &limit) != 0 || limit < 1)
        return cli_usage("tasks", "--limit needs a number in 1..1000");
      continue;
    }
    if (cli_option("--before", argc, argv, &i, &word)) {
      if (!word) return cli_usage("tasks", "--before needs a task id");
      int code = cli_parse_id("tasks", "task", word, &before);
      if (code != CLI_OK) return code;
      continue;
    }
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(a, "--help") == 0) {
      cli_print_command_help(&cli_tasks_command, stdout);
      return CLI_OK;
    }
    return cli_usage_unknown(&cli_tasks_command, a);
  }
  st_client_t *c;
  int code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_result_t *r = NULL;
  int rc = st_client_tasks(c, status, before, (int)limit, &r);
  if (rc != ST_OK) code = cli_fail(c, rc);
  st_client_close(c);
  if (rc != ST_OK) return code;
  const st_value_t *v = st_result_value(r);
  if (ids && v->kind == ST_VALUE_ARRAY) {
    code = print_ids(g, v);
    st_result_free(r);
    return code;
  }
  static const char *const heads[] = {"ID",  "ENDPOINT", "STATUS", "PROGRESS",
                                      "AGE", "NOTE",     "OWNER"};
  owner_column = others_in(v);
  int ncols = owner_column ? 7 : 6;
  if (status) return cli_print_listing(g, r, ncols, heads, task_row, "(no %s tasks)\n", status);
  return cli_print_listing(g, r, ncols, heads, task_row, "(no tasks)\n");
}

const cli_command_t cli_tasks_command = {
    "tasks",
    "tasks [--status S] [--limit N] [--before ID] [--ids]",
    "List the server's tasks, newest first.",
    "Columns: ID, ENDPOINT, STATUS (pending, running, completed, failed,\n"
    "cancelled), PROGRESS, AGE (since it was submitted), NOTE (the last\n"
    "progress note, or the error of a failed task). Finished tasks are kept\n"
    "for a while (tasks.ttl_s in the server's config). One page at a time:\n"
    "the newest 100 by default; the next page is `--before` the last ID.\n\n"
    "Options:\n"
    "  --status S     only tasks in status S\n"
    "  --limit N      at most N tasks (1..1000; default 100)\n"
    "  --before ID    only tasks older than task ID (the next page)\n"
    "  --ids          only the ids, one per line (with --json, an array);\n"
    "                 shell completion uses this\n",
    run_tasks,
    "--status= --limit= --before= --ids",
};
