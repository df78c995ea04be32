/* stcli reload and stats: reload the endpoint files (as SIGHUP does), and
 * the server's counters in a compact form. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

/* ---------------------------------------------------------------- reload */

/* "a, b" of an array of names, or "-". */
static void names_line(const char *label, const st_value_t *list) {
  printf("%-10s", label);
  size_t n = list && list->kind == ST_VALUE_ARRAY ? list->as.array.len : 0;
  for (size_t i = 0; i < n; i++) {
    char *s = cli_value_text(&list->as.array.items[i]);
    printf("%s%s", i ? ", " : "", s ? s : "?");
    free(s);
  }
  printf("%s\n", n ? "" : "-");
}

static int run_reload(cli_t *g, int argc, char **argv) {
  st_result_t *r;
  int code = cli_fetch_plain(g, &cli_reload_command, argc, argv, st_client_reload, &r);
  if (code != CLI_OK || !r) return code;
  const st_value_t *v = st_result_value(r);
  const st_value_t *ok = st_value_get(v, "ok");
  int good = ok && ok->kind == ST_VALUE_BOOL && ok->as.boolean;
  if (g->json) {
    code = cli_print_json_owned(st_value_json(v, 1));
  } else if (good) {
    double gen = 0;
    cli_value_number(st_value_get(v, "generation"), &gen);
    printf("reload ok: generation %.0f\n", gen);
    names_line("changed", st_value_get(v, "changed"));
    names_line("added", st_value_get(v, "added"));
    names_line("removed", st_value_get(v, "removed"));
  }
  if (!good) {
    const char *err = cli_value_str(st_value_get(v, "error"));
    fprintf(stderr, "stcli: CONFIGURATION: %s (the old endpoints keep serving)\n",
            err ? err : "the reload failed");
    code = CLI_SERVER_ERROR;
  }
  st_result_free(r);
  return code;
}

const cli_command_t cli_reload_command = {
    "reload",
    "reload",
    "Reload the endpoint files, as SIGHUP does.",
    "The server loads and checks every endpoint file, then swaps them in;\n"
    "work in flight finishes on the old ones, and the caches of changed and\n"
    "removed endpoints are dropped. Prints \"reload ok: generation N\" and the\n"
    "changed, added and removed endpoints. A file that does not load leaves\n"
    "the old generation serving: the error (with file:line) goes to stderr as\n"
    "\"stcli: CONFIGURATION: ...\" and the exit code is 1. With --json, prints\n"
    "the server's reply {ok, generation, error, changed, added, removed}.\n",
    run_reload,
    "",
};

/* ----------------------------------------------------------------- stats */

/* A number member of a map, or -1 when absent. */
static double member(const st_value_t *map, const char *key) {
  double d;
  return cli_value_number(st_value_get(map, key), &d) ? d : -1;
}

/* Appends ", <label> <n>" (or "<label> <n>" first) when the member
 * exists; `bytes` prints it as a size. */
static void item(int *first, const char *label, const st_value_t *map, const char *key,
                 int bytes) {
  double d = member(map, key);
  if (d < 0) return;
  char buf[32];
  if (bytes)
    cli_format_bytes(d, buf, sizeof buf);
  else
    snprintf(buf, sizeof buf, "%.0f", d);
  printf("%s%s %s", *first ? "" : ", ", label, buf);
  *first = 0;
}

/* One line "label  items..." when at least one item exists. */
typedef struct stat_item {
  const char *label, *key;
  int bytes;
} stat_item_t;

static void stat_line(const char *label, const char *prefix, const st_value_t *map,
                      const stat_item_t *items) {
  if (!map || map->kind != ST_VALUE_MAP) return;
  int any = 0;
  for (const stat_item_t *it = items; it->key && !any; it++) any = member(map, it->key) >= 0;
  if (!any) return;
  printf("%-9s %s", label, prefix);
  int first = 1;
  for (const stat_item_t *it = items; it->key; it++) item(&first, it->label, map, it->key, it->bytes);
  printf("\n");
}

static int fetch_metrics(st_client_t *c, st_result_t **out) {
  return st_client_rpc(c, "metrics", NULL, out);
}

/* stats [--prometheus] [--textfile PATH]: *prometheus set by either
 * option, *textfile by the second. */
static int parse_stats(cli_t *g, int argc, char **argv, int *prometheus, const char **textfile,
                       int *done) {
  const cli_command_t *cmd = &cli_stats_command;
  const char *v;
  *done = 0;
  for (int i = 1; i < argc; i++) {
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--prometheus") == 0) {
      *prometheus = 1;
    } else if (cli_option("--textfile", argc, argv, &i, &v)) {
      if (!v || !*v) return cli_usage(cmd->name, "--textfile needs a directory or a .prom file");
      *textfile = v;
      *prometheus = 1;
    } else if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(cmd, stdout);
      *done = 1;
      return CLI_OK;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      return cli_usage_unknown(cmd, argv[i]);
    } else {
      return cli_usage(cmd->name, "unexpected argument '%s'", argv[i]);
    }
  }
  if (*prometheus && g->json)
    return cli_usage(cmd->name, "--prometheus prints the metrics text; it takes no --json");
  return CLI_OK;
}

/* The file --textfile PATH names: PATH itself when it ends in ".prom",
 * else PATH/sharedtensor.prom. 0, or -1 when it does not fit. */
static int textfile_path(const char *path, char *out, size_t len) {
  size_t n = strlen(path);
  int file = n > 5 && strcmp(path + n - 5, ".prom") == 0;
  int w = file ? snprintf(out, len, "%s", path)
               : snprintf(out, len, "%s%ssharedtensor.prom", path,
                          path[n - 1] == '/' ? "" : "/");
  return w < 0 || (size_t)w >= len ? -1 : 0;
}

/* Writes text[0..n) to `file` atomically for node_exporter's textfile
 * collector: into a temporary file of the same directory (a dot name
 * without ".prom", which the collector skips), flushed to disk, then
 * renamed over `file`; a reader sees the old file or the new one, never
 * half of one. ST_OK-like 0, or -1 with the reason on stderr (nothing is
 * left behind). */
static int write_textfile(const char *file, const char *text, size_t n) {
  char tmp[4200];
  const char *slash = strrchr(file, '/');
  int dlen = slash ? (int)(slash - file + 1) : 0;
  snprintf(tmp, sizeof tmp, "%.*s.%s.%ld.tmp", dlen, file, slash ? slash + 1 : file,
           (long)getpid());
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "stcli: IO: cannot write the textfile %s: %s\n", tmp, strerror(errno));
    return -1;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t w = write(fd, text + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  int err = done < n ? errno : 0;
  if (!err && fsync(fd) != 0) err = errno;
  if (close(fd) != 0 && !err) err = errno;
  if (!err && rename(tmp, file) != 0) err = errno;
  if (err) {
    fprintf(stderr, "stcli: IO: cannot write the textfile %s: %s\n", file, strerror(err));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* stats --prometheus: the `metrics` method's text as it is, on stdout or
 * (textfile) into a node_exporter textfile. When the server cannot be
 * reached, the textfile is removed: its metrics go absent, not stale. */
static int print_metrics(cli_t *g, const char *textfile) {
  char file[4096];
  if (textfile && textfile_path(textfile, file, sizeof file) != 0)
    return cli_usage("stats", "--textfile: the path is too long");
  st_result_t *r;
  int code = cli_fetch(g, fetch_metrics, &r);
  if (code != CLI_OK) {
    if (textfile && (code == CLI_NO_CONNECTION || code == CLI_TIMEOUT) && unlink(file) == 0)
      fprintf(stderr, "stcli: removed %s (no server answered)\n", file);
    return code;
  }
  const st_value_t *v = st_result_value(r);
  if (v->kind != ST_VALUE_STRING) {
    fprintf(stderr, "stcli: PROTOCOL: metrics did not answer with text\n");
    st_result_free(r);
    return CLI_SERVER_ERROR;
  }
  if (textfile) {
    code = write_textfile(file, v->as.str.ptr, v->as.str.len) == 0 ? CLI_OK : CLI_SERVER_ERROR;
    st_result_free(r);
    return code;
  }
  fwrite(v->as.str.ptr, 1, v->as.str.len, stdout);
  st_result_free(r);
  return fflush(stdout) == 0 ? CLI_OK : CLI_SERVER_ERROR;
}

static int run_stats(cli_t *g, int argc, char **argv) {
  int prometheus = 0, done;
  const char *textfile = NULL;
  int code = parse_stats(g, argc, argv, &prometheus, &textfile, &done);
  if (code != CLI_OK || done) return code;
  if (prometheus) return print_metrics(g, textfile);
  st_result_t *r;
  code = cli_fetch(g, st_client_info, &r);
  if (code != CLI_OK) return code;
  const st_value_t *v = st_result_value(r);
  static const char *const parts[] = {"counters", "tasks", "objects", "memory", NULL};
  if (g->json) {
    /* The parts of info the summary draws on, indented as every --json
     * output is (a part's own lines one level deeper). */
    printf("{");
    int first = 1;
    for (size_t i = 0; parts[i]; i++) {
      const st_value_t *p = st_value_get(v, parts[i]);
      if (!p) continue;
      char *s = st_value_json(p, 1);
      printf("%s\n  \"%s\": ", first ? "" : ",", parts[i]);
      cli_print_json_nested(s);
      free(s);
      first = 0;
    }
    printf("\n}\n");
    st_result_free(r);
    return CLI_OK;
  }
  static const stat_item_t requests[] = {{"requests", "requests", 0},
                                         {"ok", "requests_ok", 0},
                                         {"errors", "errors", 0},
                                         {"dropped", "requests_dropped", 0},
                                         {NULL, NULL, 0}};
  static const stat_item_t calls[] = {
      {"calls", "calls", 0},   {"ok", "calls_ok", 0},   {"failed", "calls_failed", 0},
      {"dropped", "calls_dropped", 0}, {"builds", "builds", 0},
      {"submitted", "tasks_submitted", 0}, {NULL, NULL, 0}};
  static const stat_item_t cache[] = {{"hits", "cache_hits", 0},
                                      {"misses", "cache_misses", 0},
                                      {"evictions", "evictions", 0},
                                      {"singleflight joins", "joins", 0},
                                      {"invalidations", "invalidations", 0},
                                      {NULL, NULL, 0}};
  static const stat_item_t tasks[] = {
      {"pending", "pending", 0},     {"running", "running", 0},
      {"completed", "completed", 0}, {"failed", "failed", 0},
      {"cancelled", "cancelled", 0}, {NULL, NULL, 0}};
  static const stat_item_t objects[] = {
      {"count", "count", 0}, {"leases", "leases", 0}, {"bytes", "bytes", 1}, {NULL, NULL, 0}};
  static const stat_item_t memory[] = {{"cached", "cached_bytes", 1},
                                       {"leased", "leased_bytes", 1},
                                       {"task", "task_bytes", 1},
                                       {"budget", "budget", 1},
                                       {"objects", "objects", 0},
                                       {NULL, NULL, 0}};
  const st_value_t *counters = st_value_get(v, "counters");
  stat_line("requests", "", counters, requests);
  stat_line("calls", "", counters, calls);
  stat_line("cache", "", counters, cache);
  stat_line("tasks", "", st_value_get(v, "tasks"), tasks);
  stat_line("objects", "", st_value_get(v, "objects"), objects);
  const st_value_t *mem = st_value_get(v, "memory");
  for (size_t i = 0; mem && mem->kind == ST_VALUE_MAP && i < mem->as.map.len; i++) {
    char *dev = cli_value_text(&mem->as.map.keys[i]);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s: ", dev ? dev : "?");
    free(dev);
    stat_line("memory", prefix, &mem->as.map.values[i], memory);
  }
  st_result_free(r);
  return CLI_OK;
}

const cli_command_t cli_stats_command = {
    "stats",
    "stats [--prometheus [--textfile DIR|FILE.prom]]",
    "Show the server's counters compactly: requests, cache, tasks, objects, memory.",
    "Lines (each only when the server reports it):\n"
    "  requests   requests received, answered ok, with an error, dropped\n"
    "  calls      calls received, ok, failed, dropped; builds, tasks submitted\n"
    "  cache      hits, misses, evictions, singleflight joins, invalidations\n"
    "  tasks      how many are pending, running, completed, failed, cancelled\n"
    "  objects    count, leases (all connections), bytes\n"
    "  memory     per device (\"cpu: ...\"): bytes of cached objects, of\n"
    "             leased ones, of those a finished task keeps; budget (0:\n"
    "             none), objects\n"
    "Read from `info` (`stcli info` shows everything). With --json, prints\n"
    "the counters, tasks, objects and memory parts of info.\n\n"
    "Options:\n"
    "  --prometheus   print the server's metrics in the Prometheus text\n"
    "                 format instead (the `metrics` method)\n"
    "  --textfile P   write that text for node_exporter's textfile collector\n"
    "                 instead of printing it: P/sharedtensor.prom, or P when\n"
    "                 it ends in .prom; atomically (a temporary file renamed\n"
    "                 over it). When no server answers, the file is removed\n"
    "                 (exit 3). docs/operations.md, \"Monitoring\"\n",
    run_stats,
    "--prometheus --textfile=",
};
