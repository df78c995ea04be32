/* stcli keys, get, delete: published keys (docs/keys.md; docs/cli.md,
 * "keys, get, delete"). Putting is for programs (their memory is what a
 * key adopts), so stcli lists, reads and drops. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ------------------------------------------------------------------ keys */

static char *text_cell(const st_value_t *v) {
  const char *s = cli_value_str(v);
  return strdup(s && *s ? s : "-");
}

static char *versions_cell(const st_value_t *v) {
  if (!v || v->kind != ST_VALUE_ARRAY || v->as.array.len == 0) return strdup("-");
  double lo, hi;
  cli_value_number(&v->as.array.items[0], &lo);
  cli_value_number(&v->as.array.items[v->as.array.len - 1], &hi);
  return lo == hi ? cli_strdupf("%.0f", lo) : cli_strdupf("%.0f..%.0f", lo, hi);
}

/* A replica's origin as PEER:KEY@VERSION, "-" for a key put here. */
static char *origin_cell(const st_value_t *o) {
  if (!o || o->kind != ST_VALUE_MAP) return strdup("-");
  double v = 0;
  cli_value_number(st_value_get(o, "version"), &v);
  const char *peer = cli_value_str(st_value_get(o, "peer")), *key = cli_value_str(st_value_get(o, "key"));
  return cli_strdupf("%s:%s@%.0f", peer ? peer : "?", key ? key : "?", v);
}

/* keys --all: rows carry an OWNER column. */
static int owner_column;

static void key_row(const st_value_t *e, double now, char **row) {
  (void)now;
  double d = 0;
  char bytes[32];
  cli_value_number(st_value_get(e, "bytes"), &d);
  cli_format_bytes(d, bytes, sizeof bytes);
  row[0] = text_cell(st_value_get(e, "key"));
  row[1] = versions_cell(st_value_get(e, "versions"));
  row[2] = strdup(bytes);
  row[3] = text_cell(st_value_get(e, "policy"));
  row[4] = text_cell(st_value_get(e, "device"));
  const st_value_t *ro = st_value_get(e, "readonly");
  row[5] = strdup(ro && ro->kind == ST_VALUE_BOOL && ro->as.boolean ? "yes" : "no");
  row[6] = text_cell(st_value_get(e, "state"));
  row[7] = origin_cell(st_value_get(e, "origin"));
  if (owner_column) row[8] = text_cell(st_value_get(e, "uid"));
}

/* keys {prefix?, all: true}: every owner's keys (root and the server's
 * uid). */
static int keys_all(st_client_t *c, const char *prefix, st_result_t **r) {
  st_args_t *a = st_args_new();
  if (!a) return ST_ERR_OUT_OF_MEMORY;
  int rc = st_args_bool(a, "all", 1);
  if (rc == ST_OK && prefix) rc = st_args_string(a, "prefix", prefix);
  if (rc == ST_OK) rc = st_client_rpc(c, "keys", a, r);
  st_args_free(a);
  return rc;
}

static int run_keys(cli_t *g, int argc, char **argv) {
  const char *pos[1] = {NULL};
  int done;
  int names = cli_take_flag(&argc, argv, "--names");
  int all = cli_take_flag(&argc, argv, "--all");
  int code = cli_parse_plain(g, &cli_keys_command, argc, argv, 0, 1, "a prefix", pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_result_t *r = NULL;
  int rc = all ? keys_all(c, pos[0], &r) : st_client_keys(c, pos[0], &r);
  if (rc != ST_OK) code = cli_fail(c, rc);
  st_client_close(c);
  if (rc != ST_OK) return code;
  if (names) return cli_print_members(g, r, "key");
  static const char *const heads[] = {"KEY",      "VERSIONS", "BYTES",  "POLICY", "DEVICE",
                                      "READONLY", "STATE",    "ORIGIN", "OWNER"};
  owner_column = all;
  return cli_print_listing(g, r, all ? 9 : 8, heads, key_row, "(no keys%s%s)\n", pos[0] ? " under " : "",
                           pos[0] ? pos[0] : "");
}

const cli_command_t cli_keys_command = {
    "keys",
    "keys [PREFIX] [--all] [--names]",
    "List the published keys of this uid and those granted to it (optionally\n"
    "under PREFIX).",
    "Columns: KEY, VERSIONS (the kept ones, oldest..latest), BYTES (all kept\n"
    "versions), POLICY (pinned or evictable), DEVICE, READONLY (readers other\n"
    "than the publisher map it read-only), STATE (put: a key of versions;\n"
    "live: updated in place; updating: an update runs; torn: its publisher\n"
    "left in the middle of an update), ORIGIN (a copy pulled from a peer:\n"
    "PEER:KEY@VERSION there; - for a key put here). --all (root and the\n"
    "server's uid):\n"
    "every owner's keys, with an OWNER column (the uid). With --json, prints\n"
    "the server's array of key maps.\n\n"
    "Options:\n"
    "  --all          every owner's keys (root and the server's uid)\n"
    "  --names        only the keys, one per line (with --json, an array);\n"
    "                 shell completion uses it\n",
    run_keys,
    "--all --names",
};

/* ------------------------------------------------------------------- get */

static int run_get(cli_t *g, int argc, char **argv) {
  const char *key = NULL, *v, *view = NULL;
  uint64_t version = 0;
  int flags = 0;
  long nvalues = -1;
  for (int i = 1; i < argc; i++) {
    int r = cli_global_option(g, argc, argv, &i);
    if (r < 0) return CLI_USAGE;
    if (r > 0) continue;
    if (strcmp(argv[i], "--help") == 0) {
      cli_print_command_help(&cli_get_command, stdout);
      return CLI_OK;
    } else if (cli_option("--version", argc, argv, &i, &v)) {
      if (!v || cli_parse_id("get", "version", v, &version) != CLI_OK || version == 0)
        return cli_usage("get", "--version takes a version >= 1");
    } else if (strcmp(argv[i], "--readonly") == 0) {
      flags |= ST_GET_READONLY;
    } else if (cli_option("--view", argc, argv, &i, &v)) {
      if (!v) return cli_usage("get", "--view needs a view spec");
      view = v;
    } else if (strncmp(argv[i], "--values", 8) == 0 && (argv[i][8] == 0 || argv[i][8] == '=')) {
      nvalues = CLI_DEFAULT_VALUES;
      if (argv[i][8] == '=' && cli_parse_count(argv[i] + 9, 1000000, &nvalues) != 0)
        return cli_usage("get", "--values=N takes a count");
    } else if (argv[i][0] == '-' && argv[i][1]) {
      return cli_usage_unknown(&cli_get_command, argv[i]);
    } else if (key) {
      return cli_usage("get", "one key only ('%s' is extra)", argv[i]);
    } else {
      key = argv[i];
    }
  }
  if (!key) return cli_usage("get", "a key is required");
  st_client_t *c;
  int code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_result_t *r = NULL;
  uint64_t got = 0;
  int rc = st_client_get_view(c, key, version, flags, view, &r, &got);
  if (rc != ST_OK) code = cli_fail(c, rc);
  st_client_close(c);   /* the result outlives the connection */
  if (rc != ST_OK) return code;
  if (!g->json) printf("key %s version %" PRIu64 "%s\n", key, got,
                       flags & ST_GET_READONLY ? " (read-only)" : "");
  code = cli_print_result(g, r, nvalues);
  st_result_free(r);
  return code;
}

const cli_command_t cli_get_command = {
    "get",
    "get KEY [--version N] [--readonly] [--view SPEC] [--values[=N]]",
    "Map a published key and describe its tensors and values.",
    "Prints \"key KEY version N\", then the value as `call` prints a result:\n"
    "each tensor as name  dtype  [shape]  device  bytes, other values as JSON\n"
    "(a key holding one tensor, as Python's put(key, tensor) makes, is shown\n"
    "as that tensor).\n\n"
    "Options:\n"
    "  --version N    that version (default: the latest)\n"
    "  --readonly     map it read-only\n"
    "  --view SPEC    the value seen through a view spec (docs/views.md), e.g.\n"
    "                 '*.q_proj.weight:shard(0,1,4)'; tensors keep their names\n"
    "  --values[=N]   also print the first N values (default 8), their sum and\n"
    "                 an FNV-1a 64 hash, as `call --values` does\n"
    "  --json         print the value as JSON (see `call`)\n",
    run_get,
    "--version= --view= --readonly --values",
};

/* ---------------------------------------------------------------- delete */

/* method {<param>: name, force: true}: root's removal of another uid's
 * name. */
static int force_remove(st_client_t *c, const char *method, const char *param,
                        const char *name) {
  st_args_t *a = st_args_new();
  if (!a) return ST_ERR_OUT_OF_MEMORY;
  st_result_t *r = NULL;
  int rc = st_args_string(a, param, name);
  if (rc == ST_OK) rc = st_args_bool(a, "force", 1);
  if (rc == ST_OK) rc = st_client_rpc(c, method, a, &r);
  st_args_free(a);
  st_result_free(r);
  return rc;
}

static int run_delete(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int force = cli_take_flag(&argc, argv, "--force");
  int code = cli_parse_plain(g, &cli_delete_command, argc, argv, 1, 1, "a key", pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  int rc = force ? force_remove(c, "delete", "key", pos[0]) : st_client_delete(c, pos[0]);
  if (rc != ST_OK) code = cli_fail(c, rc);
  else if (g->json) printf("true\n");
  else printf("key %s deleted\n", pos[0]);
  st_client_close(c);
  return code;
}

const cli_command_t cli_delete_command = {
    "delete",
    "delete KEY [--force]",
    "Drop every version of a published key.",
    "The server's memory and budget charge go; processes that mapped it keep\n"
    "their mappings. Exit code 1 (NOT_FOUND) when there is no such key.\n"
    "--force (root and the server's uid): delete another uid's key.\n",
    run_delete,
    "",
};
