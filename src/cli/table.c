/* stcli: small helpers of the task and object commands: text tables,
 * ids, durations and times, plain command lines, value accessors. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

/* A text table: columns as wide as their widest cell, two spaces apart. */
typedef struct table {
  size_t ncol;
  const char *const *heads;
  char **cells;           /* nrows * ncol owned strings (NULL: "?") */
  size_t nrows, cap;
} table_t;

static void table_init(table_t *t, size_t ncol, const char *const *heads) {
  memset(t, 0, sizeof *t);
  t->ncol = ncol;
  t->heads = heads;
}

/* Adds a row; takes the ncol strings in row[] (owned, may be NULL).
 * Returns 0, or -1 when out of memory (the strings are freed). */
static int table_add(table_t *t, char **row) {
  if (t->nrows == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    char **p = realloc(t->cells, cap * t->ncol * sizeof *p);
    if (!p) {
      for (size_t k = 0; k < t->ncol; k++) free(row[k]);
      return -1;
    }
    t->cells = p;
    t->cap = cap;
  }
  memcpy(t->cells + t->nrows * t->ncol, row, t->ncol * sizeof *row);
  t->nrows++;
  return 0;
}

static const char *cell(const table_t *t, size_t i, size_t k) {
  const char *s = t->cells[i * t->ncol + k];
  return s ? s : "?";
}

/* Prints the heads and rows on stdout. */
static void table_print(const table_t *t) {
  size_t width[16];
  size_t ncol = t->ncol < 16 ? t->ncol : 16;
  for (size_t k = 0; k < ncol; k++) {
    width[k] = strlen(t->heads[k]);
    for (size_t i = 0; i < t->nrows; i++)
      if (strlen(cell(t, i, k)) > width[k]) width[k] = strlen(cell(t, i, k));
  }
  for (size_t i = 0; i <= t->nrows; i++) {
    for (size_t k = 0; k < ncol; k++) {
      const char *s = i == 0 ? t->heads[k] : cell(t, i - 1, k);
      if (k + 1 == ncol)
        printf("%s\n", s);
      else
        printf("%-*s  ", (int)width[k], s);
    }
  }
}

static void table_free(table_t *t) {
  for (size_t i = 0; i < t->nrows * t->ncol; i++) free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
}

/* See cli.h. */
char *cli_age_cell(const st_value_t *e, double now) {
  double created;
  char age[32] = "-";
  if (cli_value_number(st_value_get(e, "created_at"), &created))
    cli_format_duration(now - created, age, sizeof age);
  return strdup(age);
}

/* See cli.h. */
int cli_print_listing(const cli_t *g, st_result_t *r, size_t ncol, const char *const *heads,
                      void (*fill)(const st_value_t *e, double now, char **row),
                      const char *empty, ...) {
  const st_value_t *v = st_result_value(r);
  if (g->json || v->kind != ST_VALUE_ARRAY) return cli_print_result_json(r);
  table_t t;
  table_init(&t, ncol, heads);
  double now = cli_now_unix();
  char *row[CLI_TABLE_MAX_COLS];
  int code = CLI_OK;
  for (size_t i = 0; i < v->as.array.len && code == CLI_OK; i++) {
    fill(&v->as.array.items[i], now, row);
    if (table_add(&t, row) != 0) {
      fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot build the table\n");
      code = CLI_SERVER_ERROR;
    }
  }
  if (code == CLI_OK && t.nrows == 0) {
    va_list ap;
    va_start(ap, empty);
    vprintf(empty, ap);
    va_end(ap);
  } else if (code == CLI_OK) {
    table_print(&t);
  }
  table_free(&t);
  st_result_free(r);
  return code;
}

/* See cli.h. */
char *cli_strdupf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

/* See cli.h. */
int cli_value_number(const st_value_t *v, double *out) {
  if (v && v->kind == ST_VALUE_INT) {
    *out = (double)v->as.integer;
    return 1;
  }
  if (v && v->kind == ST_VALUE_FLOAT) {
    *out = v->as.number;
    return 1;
  }
  return 0;
}

/* See cli.h. */
const char *cli_value_str(const st_value_t *v) {
  return v && v->kind == ST_VALUE_STRING ? v->as.str.ptr : NULL;
}

/* See cli.h. */
int cli_parse_id(const char *cmd, const char *what, const char *s, uint64_t *out) {
  if (!s || *s < '0' || *s > '9')
    return cli_usage(cmd, "%s needs a %s id (a number), not '%s'", cmd, what, s ? s : "");
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end)
    return cli_usage(cmd, "%s needs a %s id (a number), not '%s'", cmd, what, s);
  *out = (uint64_t)v;
  return CLI_OK;
}

/* See cli.h. */
void cli_format_duration(double s, char *buf, size_t len) {
  if (s < 0) s = 0;
  if (s < 1)
    snprintf(buf, len, "%.0f ms", s * 1e3);
  else if (s < 60)
    snprintf(buf, len, "%.1f s", s);
  else if (s < 3600)
    snprintf(buf, len, "%.0f min", s / 60);
  else if (s < 86400)
    snprintf(buf, len, "%.1f h", s / 3600);
  else
    snprintf(buf, len, "%.0f d", s / 86400);
}

/* See cli.h. */
void cli_format_bytes(double bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    u++;
  }
  if (u == 0)
    snprintf(buf, len, "%.0f B", bytes);
  else
    snprintf(buf, len, "%.1f %s", bytes, units[u]);
}

/* See cli.h. */
void cli_format_unix_time(double t, char *buf, size_t len) {
  struct tm tm;
  time_t secs = (time_t)t;
  if (t < 0 || !localtime_r(&secs, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm))
    snprintf(buf, len, "%.3f", t);
}

/* See cli.h. */
double cli_now_unix(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* See cli.h. */
int cli_take_flag(int *argc, char **argv, const char *flag) {
  int found = 0, k = 1, i = 1;
  for (; i < *argc && strcmp(argv[i], "--") != 0; i++) {
    if (strcmp(argv[i], flag) == 0) found = 1;
    else argv[k++] = argv[i];
  }
  while (i < *argc) argv[k++] = argv[i++];
  *argc = k;
  return found;
}

int cli_take_option(int *argc, char **argv, const char *opt,
                    int (*take)(const char *value, void *ud), void *ud) {
  int k = 1, i = 1;
  for (; i < *argc && strcmp(argv[i], "--") != 0; i++) {
    const char *v;
    if (!cli_option(opt, *argc, argv, &i, &v)) {
      argv[k++] = argv[i];
      continue;
    }
    int code = take(v, ud);
    if (code != CLI_OK) return code;
  }
  while (i < *argc) argv[k++] = argv[i++];
  *argc = k;
  return CLI_OK;
}

/* See cli.h. */
int cli_parse_plain(cli_t *g, const cli_command_t *cmd, int argc, char **argv, int min, int max,
                    const char *need, const char **pos, int *done) {
  *done = 0;
  int n = 0;
  for (int i = 1; i < argc; i++) {
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(cmd, stdout);
      *done = 1;
      return CLI_OK;
    }
    if (argv[i][0] == '-' && argv[i][1] == '-')
      return cli_usage_unknown(cmd, argv[i]);
    if (n >= max) return cli_usage(cmd->name, "unexpected argument '%s'", argv[i]);
    pos[n++] = argv[i];
  }
  if (n < min) return cli_usage(cmd->name, "%s needs %s", cmd->name, need);
  return CLI_OK;
}

/* See cli.h. */
int cli_print_members(const cli_t *g, st_result_t *r, const char *member) {
  const st_value_t *v = st_result_value(r);
  size_t n = v->kind == ST_VALUE_ARRAY ? v->as.array.len : 0, shown = 0;
  if (g->json) printf("[");
  for (size_t i = 0; i < n; i++) {
    const st_value_t *m = st_value_get(&v->as.array.items[i], member);
    const char *s = cli_value_str(m);
    double d;
    if (s) {
      if (g->json) {
        printf("%s", shown++ ? ", " : "");
        cli_print_json_string(stdout, s);
      } else {
        printf("%s\n", s);
      }
    } else if (cli_value_number(m, &d)) {
      printf(g->json ? "%s%.0f" : "%s%.0f\n", g->json && shown++ ? ", " : "", d);
    }
  }
  if (g->json) printf("]\n");
  st_result_free(r);
  return CLI_OK;
}

/* See cli.h. */
int cli_fetch_plain(cli_t *g, const cli_command_t *cmd, int argc, char **argv,
                    int (*method)(st_client_t *, st_result_t **), st_result_t **out) {
  const char *pos[1];
  int done;
  *out = NULL;
  int code = cli_parse_plain(g, cmd, argc, argv, 0, 0, "", pos, &done);
  if (code != CLI_OK || done) return code;
  return cli_fetch(g, method, out);
}
