/* stcli handoffs, handoff-delete: the hand-offs of this server, with the
 * peers that follow them and what a mirror follows (docs/pool.md, section
 * 5; docs/multihost.md, "Hand-offs across servers"), through the public
 * client API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* --------------------------------------------------------------- handoffs */

static char *text_cell(const st_value_t *v) {
  const char *s = cli_value_str(v);
  return strdup(s && *s ? s : "-");
}

static double num(const st_value_t *e, const char *k) {
  double d = 0;
  cli_value_number(st_value_get(e, k), &d);
  return d;
}

/* "16 x 2.0 MiB" */
static char *chunks_cell(const st_value_t *e) {
  char b[32];
  cli_format_bytes(num(e, "chunk_bytes"), b, sizeof b);
  return cli_strdupf("%.0f x %s", num(e, "chunks"), b);
}

/* The peers that follow it ("beta, gamma"), or what a mirror follows
 * ("mirror of alpha: live, 352 chunks in"; "mirror of alpha: lost: why"). */
static char *peers_cell(const st_value_t *e) {
  const st_value_t *m = st_value_get(e, "mirror");
  if (m && m->kind == ST_VALUE_MAP) {
    const char *peer = cli_value_str(st_value_get(m, "peer"));
    const char *state = cli_value_str(st_value_get(m, "state"));
    const char *why = cli_value_str(st_value_get(m, "why"));
    char in[32];
    cli_format_bytes(num(m, "bytes_in"), in, sizeof in);
    if (why && *why) return cli_strdupf("mirror of %s: %s: %s", peer ? peer : "?", state, why);
    return cli_strdupf("mirror of %s over %s: %s, %.0f chunks (%s) in, %.0f queued",
                       peer ? peer : "?", cli_value_str(st_value_get(m, "engine")),
                       state ? state : "?", num(m, "chunks_in"), in, num(m, "queued"));
  }
  const st_value_t *f = st_value_get(e, "followers");
  size_t n = f && f->kind == ST_VALUE_ARRAY ? f->as.array.len : 0;
  if (!n) return strdup("-");
  char buf[512] = "followed by ";
  size_t len = strlen(buf);
  for (size_t i = 0; i < n && len < sizeof buf - 80; i++) {
    const char *p = cli_value_str(st_value_get(&f->as.array.items[i], "peer"));
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", i ? ", " : "", p ? p : "?");
  }
  return strdup(buf);
}

/* handoffs --all: rows carry an OWNER column. */
static int owner_column;

static void handoff_row(const st_value_t *e, double now, char **row) {
  (void)now;
  const st_value_t *prod = st_value_get(e, "producer");
  row[0] = text_cell(st_value_get(e, "name"));
  row[1] = text_cell(st_value_get(e, "device"));
  row[2] = chunks_cell(e);
  row[3] = cli_strdupf("%.0f/%.0f", num(e, "open"), num(e, "consumers"));
  row[4] = cli_strdupf("%.0f", num(e, "pending"));
  row[5] = strdup(prod && prod->kind == ST_VALUE_BOOL && prod->as.boolean ? "yes" : "no");
  row[6] = peers_cell(e);
  if (owner_column) row[7] = cli_strdupf("%.0f", num(e, "uid"));
}

static int list(st_client_t *c, int all, st_result_t **r) {
  st_args_t *a = st_args_new();
  if (!a) return ST_ERR_OUT_OF_MEMORY;
  int rc = all ? st_args_bool(a, "all", 1) : ST_OK;
  if (rc == ST_OK) rc = st_client_rpc(c, "handoffs", a, r);
  st_args_free(a);
  return rc;
}

static int run_handoffs(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int names = cli_take_flag(&argc, argv, "--names");
  int all = cli_take_flag(&argc, argv, "--all");
  int code = cli_parse_plain(g, &cli_handoffs_command, argc, argv, 0, 0, "", pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  if ((code = cli_connect(g, &c)) != CLI_OK) return code;
  st_result_t *r = NULL;
  int rc = list(c, all, &r);
  if (rc != ST_OK) code = cli_fail(c, rc);
  st_client_close(c);
  if (rc != ST_OK) return code;
  if (names) return cli_print_members(g, r, "name");
  static const char *const heads[] = {"NAME",    "DEVICE",   "CHUNKS", "SLOTS",
                                      "PENDING", "PRODUCER", "PEERS",  "OWNER"};
  owner_column = all;
  return cli_print_listing(g, r, all ? 8 : 7, heads, handoff_row, "(no hand-offs)\n");
}

const cli_command_t cli_handoffs_command = {
    "handoffs",
    "handoffs [--all] [--names]",
    "List your hand-offs, the peers that follow them, what a mirror follows.",
    "Columns: NAME, DEVICE, CHUNKS (count x size), SLOTS (consumer slots\n"
    "open now / all), PENDING (chunks published and not yet acknowledged by\n"
    "every slot), PRODUCER (whether it is connected), PEERS (\"followed by\n"
    "beta\": the peers whose mirrors hold a slot; for a mirror NAME@PEER,\n"
    "its source, engine, state and what came in, or why it was lost).\n"
    "With --json, prints the server's array of hand-off maps\n"
    "(docs/protocol.md, \"handoffs\").\n\n"
    "Options:\n"
    "  --all          every owner's hand-offs (root and the server's uid)\n"
    "  --names        only the names, one per line (with --json, an array)\n",
    run_handoffs,
    "--all --names",
};

/* --------------------------------------------------------- handoff-delete */

/* handoff_delete {name, force: true}: root's removal of another uid's. */
static int delete_forced(st_client_t *c, const char *name) {
  st_args_t *a = st_args_new();
  if (!a) return ST_ERR_OUT_OF_MEMORY;
  st_result_t *r = NULL;
  int rc = st_args_string(a, "name", name);
  if (rc == ST_OK) rc = st_args_bool(a, "force", 1);
  if (rc == ST_OK) rc = st_client_rpc(c, "handoff_delete", a, &r);
  st_args_free(a);
  st_result_free(r);
  return rc;
}

static int run_handoff_delete(cli_t *g, int argc, char **argv) {
  const char *pos[1] = {NULL};
  int done;
  int force = cli_take_flag(&argc, argv, "--force");
  int code = cli_parse_plain(g, &cli_handoff_delete_command, argc, argv, 1, 1, "a hand-off name",
                             pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  if ((code = cli_connect(g, &c)) != CLI_OK) return code;
  int rc = force ? delete_forced(c, pos[0]) : st_handoff_delete(c, pos[0]);
  if (rc != ST_OK) code = cli_fail(c, rc);
  else printf("hand-off '%s' deleted\n", pos[0]);
  st_client_close(c);
  return code;
}

const cli_command_t cli_handoff_delete_command = {
    "handoff-delete",
    "handoff-delete NAME [--force]",
    "Delete a hand-off: waits on it fail, its memory goes.",
    "Only the uid that created it may, or root and the server's uid with\n"
    "--force. Open handles stay mapped until they close; their waits fail\n"
    "with STALE_HANDLE. Deleting a mirror NAME@PEER here ends its\n"
    "subscription to the peer's hand-off (docs/multihost.md).\n\n"
    "Options:\n"
    "  --force        another uid's hand-off (root and the server's uid)\n",
    run_handoff_delete,
    "--force",
};
