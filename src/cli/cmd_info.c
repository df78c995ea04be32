/* stcli info and stcli endpoints: what the server is and what it serves.
 * Both print a human summary, or with --json the server's whole reply. The
 * summary is tolerant of fields it does not know: anything that is not a
 * plain scalar is shown as compact JSON. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static void line(const char *label, const st_value_t *v) {
  if (!v) return;
  char *s = cli_value_text(v);
  printf("%-12s %s\n", label, s ? s : "?");
  free(s);
}

/* "k1 v1, k2 v2" for a map, wrapped under the label, else the value. */
static void map_line(const char *label, const st_value_t *v) {
  if (!v) return;
  if (v->kind != ST_VALUE_MAP) {
    line(label, v);
    return;
  }
  size_t col = (size_t)printf("%-12s", label);
  for (size_t i = 0; i < v->as.map.len; i++) {
    char *k = cli_value_text(&v->as.map.keys[i]);
    char *s = cli_value_text(&v->as.map.values[i]);
    size_t need = (k ? strlen(k) : 1) + (s ? strlen(s) : 1) + 3;
    if (i && col + need > 100) {
      printf(",\n%-12s", "");
      col = 12;
    } else if (i) {
      col += (size_t)printf(",");
    }
    col += (size_t)printf(" %s %s", k ? k : "?", s ? s : "?");
    free(k);
    free(s);
  }
  printf("\n");
}

/* A time in seconds since the epoch as local "YYYY-MM-DD HH:MM:SS". */
static void format_time(const st_value_t *v, char *buf, size_t len) {
  double t = v->kind == ST_VALUE_FLOAT ? v->as.number
             : v->kind == ST_VALUE_INT ? (double)v->as.integer : -1;
  struct tm tm;
  time_t secs = (time_t)t;
  if (t < 0 || !localtime_r(&secs, &tm) || !strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm)) {
    char *s = cli_value_text(v);
    snprintf(buf, len, "%s", s ? s : "?");
    free(s);
  }
}

static void generation_line(const st_value_t *gen) {
  if (!gen) return;
  if (gen->kind != ST_VALUE_MAP) {
    line("generation", gen);
    return;
  }
  const st_value_t *num = st_value_get(gen, "number"), *eps = st_value_get(gen, "endpoints"),
                   *at = st_value_get(gen, "loaded_at"), *last = st_value_get(gen, "last_reload");
  char *n = num ? cli_value_text(num) : NULL;
  char *e = eps ? cli_value_text(eps) : NULL;
  char a[64] = "";
  if (at) format_time(at, a, sizeof a);
  printf("%-12s #%s", "generation", n ? n : "?");
  if (e) printf(", %s endpoints", e);
  if (*a) printf(", loaded at %s", a);
  printf("\n");
  free(n);
  free(e);
  if (last && last->kind == ST_VALUE_MAP) {
    const st_value_t *ok = st_value_get(last, "ok"), *err = st_value_get(last, "error");
    if (ok && ok->kind == ST_VALUE_BOOL && !ok->as.boolean) {
      char *m = err ? cli_value_text(err) : NULL;
      printf("%-12s FAILED: %s\n", "last reload", m ? m : "?");
      free(m);
    } else if (ok && ok->kind == ST_VALUE_BOOL) {
      printf("%-12s ok\n", "last reload");
    }
  }
}

static void devices_lines(const st_value_t *devs) {
  if (!devs) return;
  if (devs->kind != ST_VALUE_ARRAY) {
    line("devices", devs);
    return;
  }
  if (devs->as.array.len == 0) printf("%-12s none\n", "devices");
  for (size_t i = 0; i < devs->as.array.len; i++) {
    const st_value_t *d = &devs->as.array.items[i];
    char *s = NULL;
    if (d->kind == ST_VALUE_MAP) {
      /* "cpu", or "0: cuda NVIDIA H200 GPU-..." */
      const st_value_t *index = st_value_get(d, "index");
      char *kind = cli_value_text(st_value_get(d, "kind"));
      char *name = cli_value_text(st_value_get(d, "name"));
      char *uuid = cli_value_text(st_value_get(d, "uuid"));
      char buf[512];
      int n = 0;
      if (index && index->kind == ST_VALUE_INT && index->as.integer >= 0)
        n = snprintf(buf, sizeof buf, "%lld: ", (long long)index->as.integer);
      snprintf(buf + n, sizeof buf - (size_t)n, "%s%s%s%s%s", kind ? kind : "?",
               name && *name && (!kind || strcmp(name, kind) != 0) ? " " : "",
               name && *name && (!kind || strcmp(name, kind) != 0) ? name : "",
               uuid && *uuid && strcmp(uuid, "-") != 0 ? " " : "",
               uuid && *uuid && strcmp(uuid, "-") != 0 ? uuid : "");
      free(kind);
      free(name);
      free(uuid);
      s = strdup(buf);
    } else {
      s = cli_value_text(d);
    }
    printf("%-12s %s\n", i ? "" : "devices", s ? s : "?");
    free(s);
  }
}

/* One line per connection that holds something (info's "holdings"):
 * "conn 7 pid 4242 myapp: leases 2, buffers 1, replies 3 fds 4096 bytes". */
static void holdings_lines(const st_value_t *list) {
  if (!list || list->kind != ST_VALUE_ARRAY) return;
  for (size_t i = 0; i < list->as.array.len; i++) {
    const st_value_t *e = &list->as.array.items[i];
    if (e->kind != ST_VALUE_MAP) continue;
    char *conn = cli_value_text(st_value_get(e, "conn"));
    char *pid = cli_value_text(st_value_get(e, "pid"));
    const char *client = cli_value_str(st_value_get(e, "client"));
    printf("%-12s conn %s pid %s%s%s:", i ? "" : "holdings", conn ? conn : "?", pid ? pid : "?",
           client && *client ? " " : "", client && *client ? client : "");
    free(conn);
    free(pid);
    int first = 1;
    for (size_t k = 0; k < e->as.map.len; k++) {
      const st_value_t *row = &e->as.map.values[k];
      if (row->kind != ST_VALUE_MAP) continue;
      const char *name = cli_value_str(&e->as.map.keys[k]);
      printf("%s %s", first ? "" : ",", name ? name : "?");
      first = 0;
      static const char *const figures[] = {"items", "fds", "bytes"};
      for (size_t f = 0; f < 3; f++) {
        const st_value_t *x = st_value_get(row, figures[f]);
        if (!x || x->kind != ST_VALUE_INT || x->as.integer == 0) continue;
        printf(" %lld%s%s", (long long)x->as.integer, f ? " " : "", f ? figures[f] : "");
      }
    }
    printf("\n");
  }
}

/* An integer of map m at key, or -1. */
static long long int_at(const st_value_t *m, const char *key) {
  const st_value_t *v = m ? st_value_get(m, key) : NULL;
  return v && v->kind == ST_VALUE_INT ? (long long)v->as.integer : -1;
}

/* What survives a restart (info's "restart"): whether the published
 * state is kept in the service's fd store, and what the start restored:
 *   restart      kept in the fd store: generation 3, 41 of 4096 descriptors, journal 9120 bytes
 *   restored     4 keys (45 versions, 233472 bytes), 1 buffers from generation 2; 0 refused, 1 torn */
static void restart_lines(const st_value_t *r) {
  if (!r || r->kind != ST_VALUE_MAP) return;
  const st_value_t *kept = st_value_get(r, "kept");
  if (kept && kept->kind == ST_VALUE_BOOL && kept->as.boolean)
    printf("%-12s kept in the fd store: generation %lld, %lld of %lld descriptors, journal %lld "
           "bytes\n", "restart", int_at(r, "generation"), int_at(r, "stored"),
           int_at(r, "store_max"), int_at(r, "journal_bytes"));
  else
    printf("%-12s not kept (no service fd store)\n", "restart");
  const st_value_t *got = st_value_get(r, "restored");
  if (int_at(got, "from_generation") <= 0) return;
  printf("%-12s %lld keys (%lld versions, %lld bytes), %lld buffers from generation %lld; "
         "%lld refused, %lld torn\n", "restored", int_at(got, "keys"), int_at(got, "versions"),
         int_at(got, "bytes"), int_at(got, "buffers"), int_at(got, "from_generation"),
         int_at(got, "refused"), int_at(got, "torn"));
}

static int run_info(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done, code = cli_parse_plain(g, &cli_info_command, argc, argv, 0, 0, "", pos, &done);
  if (code != CLI_OK || done) return code;
  st_result_t *r;
  code = cli_fetch(g, st_client_info, &r);
  if (code != CLI_OK) return code;
  const st_value_t *v = st_result_value(r);
  if (g->json) {
    return cli_print_result_json(r);
  }
  line("server", st_value_get(v, "server_id"));
  line("version", st_value_get(v, "version"));
  line("pid", st_value_get(v, "pid"));
  const st_value_t *up = st_value_get(v, "uptime_s");
  if (up && (up->kind == ST_VALUE_FLOAT || up->kind == ST_VALUE_INT))
    printf("%-12s %.1f s\n", "uptime",
           up->kind == ST_VALUE_FLOAT ? up->as.number : (double)up->as.integer);
  const st_value_t *ready = st_value_get(v, "ready");
  if (ready && ready->kind == ST_VALUE_BOOL)
    printf("%-12s %s\n", "ready", ready->as.boolean ? "yes" : "no");
  generation_line(st_value_get(v, "generation"));
  devices_lines(st_value_get(v, "devices"));
  map_line("workers", st_value_get(v, "workers"));
  map_line("connections", st_value_get(v, "connections"));
  map_line("counters", st_value_get(v, "counters"));
  map_line("limits", st_value_get(v, "limits"));
  holdings_lines(st_value_get(v, "holdings"));
  restart_lines(st_value_get(v, "restart"));
  st_result_free(r);
  return CLI_OK;
}

const cli_command_t cli_info_command = {
    "info",
    "info",
    "Show the server's version, uptime, generation, devices, workers, counters and what "
    "survives a restart.",
    "With --json, prints the server's whole info map.\n",
    run_info,
    "",
};

/* ------------------------------------------------------------ endpoints */

/* The endpoint's options that are not at their default, as the server
 * names them in non_default (docs/protocol.md, `endpoints`), except the
 * ones with a column of their own: a true boolean as its name, anything
 * else as name=value ("managed cache_format_key=lin:{n} timeout=5"), or
 * "-". */
static char *flags_text(const st_value_t *e) {
  static const char *const columns[] = {"execution", "concurrency"};
  char buf[512] = "";
  size_t len = 0;
  const st_value_t *names = st_value_get(e, "non_default");
  size_t n = names && names->kind == ST_VALUE_ARRAY ? names->as.array.len : 0;
  for (size_t i = 0; i < n && len < sizeof buf; i++) {
    const char *name = cli_value_str(&names->as.array.items[i]);
    if (!name || strcmp(name, columns[0]) == 0 || strcmp(name, columns[1]) == 0) continue;
    const st_value_t *v = st_value_get(e, name);
    if (v && v->kind == ST_VALUE_BOOL && v->as.boolean) {
      len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? " " : "", name);
      continue;
    }
    char *t = v ? cli_value_text(v) : NULL;
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s=%s", len ? " " : "", name,
                            t ? t : "?");
    free(t);
  }
  if (len >= sizeof buf) len = sizeof buf - 1;
  return strdup(len ? buf : "-");
}

/* Nonzero if the STRING `key` is an element of the ARRAY `list`. */
static int is_listed(const st_value_t *list, const st_value_t *key) {
  if (!list || list->kind != ST_VALUE_ARRAY || key->kind != ST_VALUE_STRING) return 0;
  for (size_t i = 0; i < list->as.array.len; i++) {
    const st_value_t *e = &list->as.array.items[i];
    if (e->kind == ST_VALUE_STRING && e->as.str.len == key->as.str.len &&
        memcmp(e->as.str.ptr, key->as.str.ptr, key->as.str.len) == 0)
      return 1;
  }
  return 0;
}

/* "x (required), n=4, dtype=\"float32\"" or "-"; a required tensor
 * parameter shows its type instead: "x (tensor(float32, cuda))". */
static char *params_text(const st_value_t *e) {
  size_t cap = 256, len = 0;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  buf[0] = '\0';
  const st_value_t *req = st_value_get(e, "required");
  const st_value_t *params = st_value_get(e, "params");
  for (int pass = 0; pass < 2; pass++) {
    const st_value_t *src = pass == 0 ? req : params;
    if (!src) continue;
    size_t n = pass == 0 ? (src->kind == ST_VALUE_ARRAY ? src->as.array.len : 0)
                         : (src->kind == ST_VALUE_MAP ? src->as.map.len : 0);
    for (size_t i = 0; i < n; i++) {
      if (pass == 1 && is_listed(req, &src->as.map.keys[i])) continue;  /* shown as required */
      char *k = cli_value_text(pass == 0 ? &src->as.array.items[i] : &src->as.map.keys[i]);
      char *d = pass == 0 ? NULL : st_value_json(&src->as.map.values[i], 0);
      size_t need = len + (k ? strlen(k) : 1) + (d ? strlen(d) : 0) + 16;
      /* a tensor parameter shows its type: "x (tensor(float32, any))" */
      const char *ty = pass == 0 && k ? cli_value_str(st_value_get(st_value_get(e, "types"), k))
                                      : NULL;
      if (ty && strncmp(ty, "tensor", 6) != 0) ty = NULL;
      if (ty) need += strlen(ty);
      if (need > cap) {
        while (cap < need) cap *= 2;
        char *p = realloc(buf, cap);
        if (!p) {
          free(k);
          free(d);
          free(buf);
          return NULL;
        }
        buf = p;
      }
      if (pass == 0)
        len += (size_t)sprintf(buf + len, "%s%s (%s)", len ? ", " : "", k ? k : "?",
                               ty ? ty : "required");
      else
        len += (size_t)sprintf(buf + len, "%s%s=%s", len ? ", " : "", k ? k : "?", d ? d : "?");
      free(k);
      free(d);
    }
  }
  if (!len) strcpy(buf, "-");
  return buf;
}

/* One name of a listing (--names, --params): a line, or with --json an
 * element of the array the caller opens and closes; *shown counts them.
 * NULL is skipped. */
static void print_name(const cli_t *g, const char *name, size_t *shown) {
  if (!name) return;
  if (g->json) {
    printf("%s", (*shown)++ ? ", " : "");
    cli_print_json_string(stdout, name);
  } else {
    printf("%s\n", name);
  }
}

/* endpoints --names: one name per line, or a JSON array of names. */
static int print_names(const cli_t *g, const st_value_t *v) {
  size_t n = v->kind == ST_VALUE_ARRAY ? v->as.array.len : 0, shown = 0;
  if (g->json) printf("[");
  for (size_t i = 0; i < n; i++)
    print_name(g, cli_value_str(st_value_get(&v->as.array.items[i], "name")), &shown);
  if (g->json) printf("]\n");
  return CLI_OK;
}

/* endpoints --params NAME: the parameter names of endpoint `name`, those
 * without a default first, one per line or a JSON array. */
static int print_params(const cli_t *g, const st_value_t *v, const char *name) {
  size_t n = v->kind == ST_VALUE_ARRAY ? v->as.array.len : 0;
  const st_value_t *e = NULL;
  for (size_t i = 0; i < n && !e; i++) {
    const char *s = cli_value_str(st_value_get(&v->as.array.items[i], "name"));
    if (s && strcmp(s, name) == 0) e = &v->as.array.items[i];
  }
  if (!e) {
    cli_suggest_t s;
    cli_suggest_init(&s, name);
    fprintf(stderr, "stcli: UNKNOWN_ENDPOINT: unknown endpoint '%s'%s\n", name,
            cli_suggest_endpoint(&s, v));
    return CLI_SERVER_ERROR;
  }
  const st_value_t *req = st_value_get(e, "required"), *params = st_value_get(e, "params");
  size_t nreq = req && req->kind == ST_VALUE_ARRAY ? req->as.array.len : 0;
  size_t nparams = params && params->kind == ST_VALUE_MAP ? params->as.map.len : 0;
  size_t shown = 0;
  if (g->json) printf("[");
  for (size_t i = 0; i < nreq + nparams; i++) {
    const st_value_t *k = i < nreq ? &req->as.array.items[i] : &params->as.map.keys[i - nreq];
    if (i < nreq || !is_listed(req, k)) print_name(g, cli_value_str(k), &shown);
  }
  if (g->json) printf("]\n");
  return CLI_OK;
}

/* endpoints [--names | --params NAME]: *params is NAME or NULL. */
static int parse_endpoints(cli_t *g, int argc, char **argv, int *names, const char **params,
                           int *done) {
  const cli_command_t *cmd = &cli_endpoints_command;
  *done = 0;
  for (int i = 1; i < argc; i++) {
    const char *v;
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--names") == 0) {
      *names = 1;
    } else if (cli_option("--params", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(cmd->name, "--params needs an endpoint name");
      *params = v;
    } else if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(cmd, stdout);
      *done = 1;
      return CLI_OK;
    } else {
      return cli_usage_unknown(cmd, argv[i]);
    }
  }
  if (*names && *params) return cli_usage(cmd->name, "give --names or --params NAME, not both");
  return CLI_OK;
}

static int run_endpoints(cli_t *g, int argc, char **argv) {
  int names = 0, done;
  const char *params = NULL;
  int code = parse_endpoints(g, argc, argv, &names, &params, &done);
  if (code != CLI_OK || done) return code;
  st_result_t *r;
  code = cli_fetch(g, st_client_endpoints, &r);
  if (code != CLI_OK) return code;
  const st_value_t *v = st_result_value(r);
  if (names || params) {
    code = params ? print_params(g, v, params) : print_names(g, v);
    st_result_free(r);
    return code;
  }
  if (g->json || v->kind != ST_VALUE_ARRAY) {
    return cli_print_result_json(r);
  }
  size_t n = v->as.array.len;
  enum { NAME, EXEC, CONC, FLAGS, PARAMS, NCOL };
  static const char *const heads[NCOL] = {"NAME", "EXECUTION", "CONCURRENCY", "FLAGS", "PARAMS"};
  char **cells = calloc((n ? n : 1) * NCOL, sizeof *cells);
  if (!cells) {
    st_result_free(r);
    fprintf(stderr, "stcli: OUT_OF_MEMORY: cannot build the table\n");
    return CLI_SERVER_ERROR;
  }
  size_t width[NCOL];
  for (int k = 0; k < NCOL; k++) width[k] = strlen(heads[k]);
  for (size_t i = 0; i < n; i++) {
    const st_value_t *e = &v->as.array.items[i];
    char **row = cells + i * NCOL;
    row[NAME] = cli_value_text(st_value_get(e, "name"));
    row[EXEC] = cli_value_text(st_value_get(e, "execution"));
    row[CONC] = cli_value_text(st_value_get(e, "concurrency"));
    row[FLAGS] = flags_text(e);
    row[PARAMS] = params_text(e);
    for (int k = 0; k < NCOL; k++) {
      if (!row[k]) row[k] = strdup("?");
      if (row[k] && strlen(row[k]) > width[k]) width[k] = strlen(row[k]);
    }
  }
  printf("%-*s  %-*s  %-*s  %-*s  %s\n", (int)width[NAME], heads[NAME], (int)width[EXEC],
         heads[EXEC], (int)width[CONC], heads[CONC], (int)width[FLAGS], heads[FLAGS],
         heads[PARAMS]);
  for (size_t i = 0; i < n; i++) {
    char **row = cells + i * NCOL;
    printf("%-*s  %-*s  %-*s  %-*s  %s\n", (int)width[NAME], row[NAME] ? row[NAME] : "?",
           (int)width[EXEC], row[EXEC] ? row[EXEC] : "?", (int)width[CONC],
           row[CONC] ? row[CONC] : "?", (int)width[FLAGS], row[FLAGS] ? row[FLAGS] : "?",
           row[PARAMS] ? row[PARAMS] : "?");
  }
  if (n == 0) printf("(no endpoints)\n");
  for (size_t i = 0; i < n * NCOL; i++) free(cells[i]);
  free(cells);
  st_result_free(r);
  return CLI_OK;
}

const cli_command_t cli_endpoints_command = {
    "endpoints",
    "endpoints [--names | --params NAME]",
    "List the endpoints the server serves, with their options and parameters.",
    "Columns: NAME, EXECUTION (direct|task), CONCURRENCY (parallel|serialized),\n"
    "FLAGS (the other options not at their default: a true one by its name,\n"
    "e.g. managed, the rest as name=value, e.g. timeout=5), PARAMS (required\n"
    "ones first, then name=default as JSON).\n"
    "With --json, prints the server's whole reply.\n\n"
    "Options:\n"
    "  --names        only the names, one per line (with --json, an array);\n"
    "                 shell completion uses this\n"
    "  --params NAME  only the parameter names of endpoint NAME, those without\n"
    "                 a default first, one per line (with --json, an array);\n"
    "                 shell completion uses this\n",
    run_endpoints,
    "--names --params=",
};
