/* stcli: what every command shares: global options, usage errors, the
 * connection, and how errors become messages and exit codes (docs/cli.md).
 * The command table and dispatch are in main.c; commands call these and
 * never main.c, so that main.c alone depends on every command.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char cli_global_options[] = "--socket= --base-path= --device= --json --timeout= --server-uid= --help";

const char cli_global_help[] =
    "Global options (before or after the command):\n"
    "  --socket PATH     connect to this socket (overrides --base-path/--device)\n"
    "  --base-path PATH  socket base; the socket is PATH-<device>.sock\n"
    "                    (default: $" ST_ENV_BASE_PATH ", else the first\n"
    "                    that exists of $XDG_RUNTIME_DIR/" ST_XDG_BASE_PATH "-N.sock,\n"
    "                    " ST_RUN_BASE_PATH "-N.sock, " ST_DEFAULT_BASE_PATH "-N.sock)\n"
    "  --device N        device index of the socket (default 0)\n"
    "  --json            print machine-readable JSON\n"
    "  --timeout T       give up connecting (connect and hello) and waiting for each\n"
    "                    reply after T (a duration: 5, 2.5s, 500ms, 1m; a bare\n"
    "                    number is seconds; default and 0: 10 s to connect, then\n"
    "                    no limit)\n"
    "  --server-uid UID  the uid the server must run as (default: $" ST_ENV_SERVER_UID ",\n"
    "                    else this user's uid or root)\n"
    "  --help            show help (also: stcli help COMMAND)\n"
    "  --version         print the version\n";

/* A duration as every --timeout of stcli takes it: a non-negative decimal
 * number with an optional unit, "ms", "s" (the default) or "m", at most
 * 2^30 ms. 0 and *seconds set, or -1 (NULL or malformed). */
int cli_parse_duration(const char *v, double *seconds) {
  if (!v || !*v) return -1;
  char *end = NULL;
  double x = strtod(v, &end);
  if (end == v || !(x >= 0)) return -1;
  double scale;
  if (!*end || strcmp(end, "s") == 0) scale = 1.0;
  else if (strcmp(end, "ms") == 0) scale = 0.001;
  else if (strcmp(end, "m") == 0) scale = 60.0;
  else return -1;
  x *= scale;
  if (x > (double)(1L << 30) / 1000.0) return -1;
  *seconds = x;
  return 0;
}

/* Prints a command's usage on out. */
void cli_print_command_help(const cli_command_t *cmd, FILE *out) {
  fprintf(out, "usage: stcli [global options] %s\n\n%s\n", cmd->synopsis, cmd->summary);
  if (cmd->details && *cmd->details) fprintf(out, "\n%s", cmd->details);
  fprintf(out, "\n%s", cli_global_help);
}

/* "stcli: USAGE: ..." on stderr. Returns CLI_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "stcli: USAGE: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  if (cmd)
    fprintf(stderr, " (see 'stcli help %s')\n", cmd);
  else
    fprintf(stderr, " (see 'stcli --help')\n");
  return CLI_USAGE;
}

/* Parses a decimal integer in [0, max]. 0 on success, -1 otherwise. */
int cli_parse_count(const char *s, long max, long *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < 0 || v > max) return -1;
  *out = v;
  return 0;
}

/* One --readers entry e[0..n): "uid:N" or "gid:N", N a number or a
 * name of this host (getpwnam, getgrnam). CLI_OK or a usage error. */
static int reader_entry(const char *cmd, const char *e, size_t n, cli_readers_t *r) {
  char word[256];
  if (n >= sizeof word)
    return cli_usage(cmd, "--readers entry '%.32s...' is longer than %zu bytes", e,
                     sizeof word - 1);
  memcpy(word, e, n);
  word[n] = '\0';
  int is_uid = strncmp(word, "uid:", 4) == 0, is_gid = strncmp(word, "gid:", 4) == 0;
  const char *id = word + 4;
  if ((!is_uid && !is_gid) || !*id)
    return cli_usage(cmd, "--readers entry '%s' is not uid:N or gid:N (e.g. "
                          "--readers uid:1000,gid:27)", word);
  long v;
  if (cli_parse_count(id, 4294967294L, &v) != 0) {
    if (*id >= '0' && *id <= '9')
      return cli_usage(cmd, "--readers entry '%s': %s is not a %s (0 to 4294967294)", word, id,
                       is_uid ? "uid" : "gid");
    struct passwd *pw = is_uid ? getpwnam(id) : NULL;
    struct group *gr = is_gid ? getgrnam(id) : NULL;
    if (!pw && !gr)
      return cli_usage(cmd, "--readers entry '%s': no %s named '%s' on this host", word,
                       is_uid ? "user" : "group", id);
    v = pw ? (long)pw->pw_uid : (long)gr->gr_gid;
  }
  uint32_t *ids = is_uid ? r->uids : r->gids;
  size_t *nids = is_uid ? &r->nuids : &r->ngids;
  for (size_t i = 0; i < *nids; i++)
    if (ids[i] == (uint32_t)v) return CLI_OK;
  if (*nids == CLI_READERS_MAX)
    return cli_usage(cmd, "--readers grants at most %d %s", CLI_READERS_MAX,
                     is_uid ? "uids" : "gids");
  ids[(*nids)++] = (uint32_t)v;
  return CLI_OK;
}

/* See cli.h. */
int cli_parse_readers(const char *cmd, const char *v, cli_readers_t *r) {
  if (!v || !*v)
    return cli_usage(cmd, "--readers needs uid:N and gid:N entries joined by commas (e.g. "
                          "--readers uid:1000,gid:27)");
  r->given = 1;
  for (;;) {
    size_t n = strcspn(v, ",");
    int code = reader_entry(cmd, v, n, r);
    if (code != CLI_OK) return code;
    if (!v[n]) return CLI_OK;
    v += n + 1;
  }
}

/* See cli.h. */
const st_readers_t *cli_readers_of(const cli_readers_t *r, st_readers_t *out) {
  if (!r->given) return NULL;
  out->uids = r->uids;
  out->nuids = r->nuids;
  out->gids = r->gids;
  out->ngids = r->ngids;
  return out;
}

/* See cli.h. */
int cli_option(const char *opt, int argc, char **argv, int *i, const char **value) {
  size_t n = strlen(opt);
  const char *a = argv[*i];
  *value = NULL;
  if (strncmp(a, opt, n) != 0 || (a[n] != '=' && a[n] != '\0')) return 0;
  if (a[n] == '=') *value = a + n + 1;
  else if (*i + 1 < argc) *value = argv[++*i];
  return 1;
}

/* See cli.h. */
int cli_global_option(cli_t *g, int argc, char **argv, int *i) {
  const char *a = argv[*i];
  const char *v;
  if (strcmp(a, "--json") == 0) {
    g->json = 1;
    return 1;
  }
  if (cli_option("--socket", argc, argv, i, &v)) {
    if (!v) return cli_usage(NULL, "--socket needs a path"), -1;
    g->socket = v;
    return 1;
  }
  if (cli_option("--base-path", argc, argv, i, &v)) {
    if (!v) return cli_usage(NULL, "--base-path needs a path"), -1;
    g->base = v;
    return 1;
  }
  if (cli_option("--device", argc, argv, i, &v)) {
    long d;
    if (!v) return cli_usage(NULL, "--device needs a device index"), -1;
    if (cli_parse_count(v, 1 << 20, &d) != 0)
      return cli_usage(NULL, "--device needs a device index, not '%s'", v), -1;
    g->device = (int)d;
    return 1;
  }
  if (cli_option("--timeout", argc, argv, i, &v)) {
    double s;
    if (cli_parse_duration(v, &s) != 0)
      return cli_usage(NULL, "--timeout needs a duration (5, 2.5s, 500ms, 1m), not '%s'",
                       v ? v : ""), -1;
    g->timeout_ms = s > 0 && s < 0.001 ? 1 : (int)(s * 1000.0 + 0.5);
    return 1;
  }
  if (cli_option("--server-uid", argc, argv, i, &v)) {
    long uid;
    if (!v) return cli_usage(NULL, "--server-uid needs a uid"), -1;
    if (cli_parse_count(v, 4294967294L, &uid) != 0)
      return cli_usage(NULL, "--server-uid needs a uid (a number), not '%s'", v), -1;
    g->server_uid = uid;
    return 1;
  }
  return 0;
}

/* See cli.h. */
int cli_exit_code(int rc) {
  if (rc == ST_OK) return CLI_OK;
  if (rc == ST_ERR_TIMEOUT) return CLI_TIMEOUT;
  if (rc == ST_ERR_IO) return CLI_NO_CONNECTION;
  return CLI_SERVER_ERROR;
}

/* See cli.h. */
int cli_fail(st_client_t *c, int rc) {
  const char *name = c ? st_client_error_name(c) : "";
  const char *msg = c ? st_client_error(c) : "";
  if (!name || !*name) name = st_err_name(rc);
  if (!msg || !*msg) msg = st_strerror(rc);
  fprintf(stderr, "stcli: %s: %s\n", name, msg);
  return cli_exit_code(rc);
}

/* See cli.h. */
int cli_connect(const cli_t *g, st_client_t **out) {
  char err[1024] = "";
  st_client_options_t o;
  st_client_options_init(&o);
  o.server_uid = g->server_uid;
  o.timeout_ms = g->timeout_ms;
  int rc = g->socket ? st_client_connect_opts(g->socket, &o, out, err, sizeof err)
                     : st_client_connect_device_opts(g->base, g->device, &o, out, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "stcli: %s: %s\n", st_err_name(rc), err[0] ? err : st_strerror(rc));
    return rc == ST_ERR_TIMEOUT ? CLI_TIMEOUT
           : rc == ST_ERR_INVALID_ARGUMENT ? CLI_USAGE
                                           : CLI_NO_CONNECTION;
  }
  return CLI_OK;
}

/* See cli.h. */
int cli_fetch(const cli_t *g, int (*method)(st_client_t *, st_result_t **), st_result_t **out) {
  st_client_t *c;
  int code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  int rc = method(c, out);
  if (rc != ST_OK) code = cli_fail(c, rc);
  st_client_close(c);
  return code;
}

/* See cli.h. */
int cli_print_result_json(st_result_t *r) {
  int code = cli_print_json_owned(st_value_json(st_result_value(r), 1));
  st_result_free(r);
  return code;
}
