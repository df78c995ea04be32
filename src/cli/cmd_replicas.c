/* src/cli: replicas, unsubscribe: live keys followed across servers
 * (docs/cli.md; docs/multihost.md, "Live replication"). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

/* ------------------------------------------------------------- replicas */

/* "KEY follows PEER:KEY at version N (U updates, T torn)" or "... lost:
 * WHY"; then one line per subscriber. */
static void print_replicas(const st_value_t *v) {
  const char *key = cli_value_str(st_value_get(v, "key"));
  const st_value_t *src = st_value_get(v, "source");
  if (src && src->kind == ST_VALUE_MAP) {
    double version = 0, updates = 0, torn = 0;
    cli_value_number(st_value_get(src, "version"), &version);
    cli_value_number(st_value_get(src, "updates"), &updates);
    cli_value_number(st_value_get(src, "torn"), &torn);
    const st_value_t *lost = st_value_get(src, "lost");
    const char *peer = cli_value_str(st_value_get(src, "peer"));
    const char *okey = cli_value_str(st_value_get(src, "key"));
    printf("%s follows %s:%s, at version %.0f (%.0f updates brought, %.0f overwritten while "
           "read)", key ? key : "?", peer ? peer : "?", okey ? okey : "?", version, updates, torn);
    if (lost && lost->kind == ST_VALUE_BOOL && lost->as.boolean) {
      const char *why = cli_value_str(st_value_get(src, "why"));
      printf("; its source is lost: %s", why ? why : "no reason given");
    }
    printf("\n");
  } else {
    printf("%s follows no peer's key\n", key ? key : "?");
  }
  const st_value_t *subs = st_value_get(v, "subscribers");
  size_t n = subs && subs->kind == ST_VALUE_ARRAY ? subs->as.array.len : 0;
  if (!n) printf("no peer follows %s\n", key ? key : "?");
  for (size_t i = 0; i < n; i++) {
    const st_value_t *s = &subs->as.array.items[i];
    const char *peer = cli_value_str(st_value_get(s, "peer"));
    double version = 0;
    cli_value_number(st_value_get(s, "version"), &version);
    printf("%s follows it: told of version %.0f\n", peer ? peer : "?", version);
  }
}

static int run_replicas(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int code = cli_parse_plain(g, &cli_replicas_command, argc, argv, 1, 1, "a key", pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  st_result_t *r = NULL;
  int rc = st_client_replicas(c, pos[0], &r);
  if (rc != ST_OK) code = cli_fail(c, rc);
  else if (g->json) code = cli_print_json_owned(st_value_json(st_result_value(r), 1));
  else print_replicas(st_result_value(r));
  st_result_free(r);
  st_client_close(c);
  return code;
}

const cli_command_t cli_replicas_command = {
    "replicas",
    "replicas KEY",
    "Show which peers follow a live key of this server, and what a live key\n"
    "here follows.",
    "A live key pulled with `stcli pull --live` follows the peer's key: each\n"
    "version its publisher completes is brought here in place, under the same\n"
    "number (docs/multihost.md, \"Live replication\"). Prints:\n"
    "  w/policy follows alpha:w/policy, at version 812 (811 updates brought, 0 overwritten while read)\n"
    "  no peer follows w/policy\n"
    "\"Its source is lost\" when the peer's key or the link to it went away:\n"
    "the key keeps its last version. With --json, prints {key, subscribers:\n"
    "[{peer, version, since}], source: {peer, key, version, updates, torn,\n"
    "lost, why} or null}.\n",
    run_replicas,
    "",
};

/* ---------------------------------------------------------- unsubscribe */

static int run_unsubscribe(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int code = cli_parse_plain(g, &cli_unsubscribe_command, argc, argv, 1, 1, "a key", pos, &done);
  if (code != CLI_OK || done) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  uint64_t version = 0;
  int rc = st_client_unsubscribe(c, pos[0], &version);
  if (rc != ST_OK) code = cli_fail(c, rc);
  else if (g->json) printf("{\"key\": \"%s\", \"version\": %" PRIu64 "}\n", pos[0], version);
  else printf("%s no longer follows its peer's key; it keeps version %" PRIu64 "\n", pos[0],
              version);
  st_client_close(c);
  return code;
}

const cli_command_t cli_unsubscribe_command = {
    "unsubscribe",
    "unsubscribe KEY",
    "Stop a live key pulled with --live from following its peer's key.",
    "The key stays, as a live key of no publisher, with the version it holds\n"
    "(printed). Exit code 1 (NOT_FOUND) when KEY follows no peer's key.\n",
    run_unsubscribe,
    "",
};
