/* src/cli: `stcli peers`: the configured peers and their links (the
 * `peers` method; docs/multihost.md, "Peers and the channel"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum { ID, ADDR, STATE, SINCE, RTT, ENGINES, ERROR_, NCOL };

/* "nccl 2.28.9", "ucx 1.13.1 (unusable)" ... joined by ", "; "-" for none. */
static char *engines_cell(const st_value_t *list) {
  if (!list || list->kind != ST_VALUE_ARRAY || list->as.array.len == 0) return strdup("-");
  char buf[512];
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < list->as.array.len && used < sizeof buf; i++) {
    const st_value_t *e = &list->as.array.items[i];
    const char *name = cli_value_str(st_value_get(e, "name"));
    const char *local = cli_value_str(st_value_get(e, "local"));
    const st_value_t *usable = st_value_get(e, "usable");
    int ok = usable && usable->kind == ST_VALUE_BOOL && usable->as.boolean;
    int n = snprintf(buf + used, sizeof buf - used, "%s%s %s%s", i ? ", " : "",
                     name ? name : "?", local ? local : "-", ok ? "" : " (unusable)");
    if (n < 0) break;
    used += (size_t)n;
  }
  return strdup(buf);
}

static void fill(const st_value_t *e, double now, char **row) {
  const char *addr = cli_value_str(st_value_get(e, "addr"));
  const char *err = cli_value_str(st_value_get(e, "last_error"));
  double since = 0, rtt = 0;
  char buf[64];
  row[ID] = cli_value_text(st_value_get(e, "id"));
  row[ADDR] = strdup(addr ? addr : "(accept-only)");
  row[STATE] = cli_value_text(st_value_get(e, "state"));
  if (cli_value_number(st_value_get(e, "since"), &since) && since > 0) {
    cli_format_duration(now - since > 0 ? now - since : 0, buf, sizeof buf);
    row[SINCE] = cli_strdupf("%s ago", buf);
  } else {
    row[SINCE] = strdup("-");
  }
  if (cli_value_number(st_value_get(e, "rtt_us"), &rtt))
    row[RTT] = cli_strdupf("%.0f us", rtt);
  else
    row[RTT] = strdup("-");
  row[ENGINES] = engines_cell(st_value_get(e, "engines"));
  row[ERROR_] = strdup(err ? err : "-");
}

static int run_peers(cli_t *g, int argc, char **argv) {
  st_result_t *r;
  int code = cli_fetch_plain(g, &cli_peers_command, argc, argv, st_client_peers, &r);
  if (code != CLI_OK || !r) return code;
  static const char *const heads[NCOL] = {"ID",  "ADDRESS", "STATE",     "SINCE",
                                          "RTT", "ENGINES", "LAST ERROR"};
  return cli_print_listing(g, r, NCOL, heads, fill,
                           "(no peers: config.lua's peer.peers is empty)\n");
}

const cli_command_t cli_peers_command = {
    "peers",
    "peers",
    "List the peers config.lua names and the state of their links.",
    "Columns: ID, ADDRESS (host:port it is dialled at; accept-only peers dial\n"
    "us), STATE (connecting, handshake, up, refused, down), SINCE (when the\n"
    "state last changed), RTT (the last peer_ping's round trip), ENGINES (each\n"
    "engine's local version; \"unusable\" when the peer lacks it or its version\n"
    "differs: --json says why), LAST ERROR (why the last attempt failed).\n"
    "With --json, prints the server's whole reply.\n",
    run_peers,
    "",
};
