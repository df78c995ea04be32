/* stcli objects, release, invalidate: the server's objects (results of
 * managed, cached and singleflight endpoints), leases and cache entries
 * (docs/protocol.md, "Objects, leases and caching"). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* --------------------------------------------------------------- objects */

static char *number_cell(const st_value_t *v) {
  double d;
  return cli_value_number(v, &d) ? cli_strdupf("%.0f", d) : strdup("-");
}

static char *string_cell(const st_value_t *v) {
  const char *s = cli_value_str(v);
  return strdup(s && *s ? s : "-");
}

/* One row of the objects table. */
static void object_row(const st_value_t *e, double now, char **row) {
  row[0] = number_cell(st_value_get(e, "id"));
  row[1] = string_cell(st_value_get(e, "endpoint"));
  row[2] = string_cell(st_value_get(e, "cache_key"));
  row[3] = number_cell(st_value_get(e, "refcount"));
  row[4] = number_cell(st_value_get(e, "bytes"));
  row[5] = string_cell(st_value_get(e, "device"));
  row[6] = cli_age_cell(e, now);
}

static int run_objects(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int ids = cli_take_flag(&argc, argv, "--ids");
  int code = cli_parse_plain(g, &cli_objects_command, argc, argv, 0, 0, "", pos, &done);
  if (code != CLI_OK || done) return code;
  st_result_t *r;
  if ((code = cli_fetch(g, st_client_objects, &r)) != CLI_OK) return code;
  if (ids) return cli_print_members(g, r, "id");
  static const char *const heads[] = {"ID",    "ENDPOINT", "CACHE KEY", "REFCOUNT",
                                      "BYTES", "DEVICE",   "AGE"};
  return cli_print_listing(g, r, 7, heads, object_row, "(no objects)\n");
}

const cli_command_t cli_objects_command = {
    "objects",
    "objects [--ids]",
    "List the server's objects: cached and leased results.",
    "Columns: ID, ENDPOINT, CACHE KEY (- when the endpoint does not cache),\n"
    "REFCOUNT (leases held, all connections), BYTES, DEVICE, AGE (since it was\n"
    "built). With --json, prints the server's array of object info maps.\n\n"
    "Options:\n"
    "  --ids          only the ids, one per line (with --json, an array);\n"
    "                 shell completion uses it\n",
    run_objects,
    "--ids",
};

/* --------------------------------------------------------------- release */

static int run_release(cli_t *g, int argc, char **argv) {
  const char *pos[1];
  int done;
  int code =
      cli_parse_plain(g, &cli_release_command, argc, argv, 1, 1, "an object id", pos, &done);
  if (code != CLI_OK || done) return code;
  uint64_t id;
  code = cli_parse_id("release", "object", pos[0], &id);
  if (code != CLI_OK) return code;
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) return code;
  int released, destroyed;
  int64_t refcount;
  int rc = st_client_release(c, id, &released, &destroyed, &refcount);
  if (rc != ST_OK) {
    code = cli_fail(c, rc);
  } else if (g->json) {
    printf("{\"released\": %s, \"destroyed\": %s, \"refcount\": %" PRId64 "}\n",
           released ? "true" : "false", destroyed ? "true" : "false", refcount);
  } else {
    if (released)
      printf("object %" PRIu64 ": released, refcount %" PRId64 "%s\n", id, refcount,
             destroyed ? ", destroyed" : "");
    else if (destroyed)
      printf("object %" PRIu64 ": no lease of this connection to release (the object is "
             "gone)\n", id);
    else
      printf("object %" PRIu64 ": no lease of this connection to release, refcount %" PRId64
             "\n", id, refcount);
  }
  st_client_close(c);
  return code;
}

const cli_command_t cli_release_command = {
    "release",
    "release ID",
    "Give back a lease on an object (idempotent).",
    "Leases belong to the connection that received them and end when it\n"
    "closes, so a lease taken by another process is not stcli's to give back:\n"
    "then it prints \"no lease of this connection to release\" and the object's\n"
    "refcount (exit 0), or that the object is gone. A lease it does hold is\n"
    "given back: \"released, refcount N\", and \"destroyed\" when that was the\n"
    "last hold on the object.\n"
    "With --json, prints {\"released\", \"destroyed\", \"refcount\"}.\n",
    run_release,
    "",
};

/* ------------------------------------------------------------ invalidate */

static int run_invalidate(cli_t *g, int argc, char **argv) {
  cli_call_args_t ca;
  int code = cli_parse_call_args(g, &cli_invalidate_command, argc, argv, CLI_ARGS_ALL, &ca);
  if (code != CLI_OK || ca.help) {
    st_args_free(ca.args);
    return code;
  }
  if (ca.all && ca.nargs > 0) {
    st_args_free(ca.args);
    return cli_usage("invalidate", "--all drops every entry: give no arguments with it");
  }
  st_client_t *c;
  code = cli_connect(g, &c);
  if (code != CLI_OK) {
    st_args_free(ca.args);
    return code;
  }
  int rc;
  if (ca.all) {
    int64_t count = 0;
    rc = st_client_invalidate_endpoint(c, ca.endpoint, &count);
    if (rc == ST_OK && g->json)
      printf("{\"count\": %" PRId64 "}\n", count);
    else if (rc == ST_OK)
      printf("%s: dropped %" PRId64 " cache entr%s\n", ca.endpoint, count,
             count == 1 ? "y" : "ies");
  } else {
    int dropped = 0;
    rc = st_client_invalidate_call(c, ca.endpoint, ca.args, &dropped);
    if (rc == ST_OK && g->json)
      printf("{\"dropped\": %s}\n", dropped ? "true" : "false");
    else if (rc == ST_OK)
      printf("%s: %s\n", ca.endpoint,
             dropped ? "dropped the cache entry" : "no cache entry for these arguments");
  }
  st_args_free(ca.args);
  if (rc != ST_OK) code = cli_fail_endpoint(c, rc, ca.endpoint);
  st_client_close(c);
  return code;
}

const cli_command_t cli_invalidate_command = {
    "invalidate",
    "invalidate NAME [key=value ...] [--args-json JSON] | invalidate NAME --all",
    "Drop a cached result of an endpoint, or all of them.",
    "With arguments (given as for `call`; defaults are filled in as a call\n"
    "would), drops the cache entry of that call: \"dropped the cache entry\" or\n"
    "\"no cache entry for these arguments\". With --all, drops every entry of\n"
    "the endpoint and prints how many. An object still leased lives on until\n"
    "its last lease is released; mappings clients hold stay valid.\n\n"
    "Options:\n"
    "  --all          every cache entry of NAME\n"
    "  --json         print {\"dropped\": bool} or {\"count\": N}\n",
    run_invalidate,
    "--args-json= --all",
};
