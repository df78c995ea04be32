/* stcli keys, get and delete, the real binary (ST_CLI_BIN) against a real
 * stserver, with keys a libstclient client published: the listing, a
 * version's tensors and values, --readonly, --json, delete, get and call
 * --view, the state of live keys, and the exit codes of a missing key and
 * of usage errors. */
#include <st/client.h>
#include <stdlib.h>

#include "check.h"
#include "cli_run.h"
#include "client_kit.h"
#include "fixture.h"

static stt_server_t srv;
static st_client_t *cli;
#define SOCK "--socket", srv.socket

/* Puts {w: float32 [n] of i * scale, step: 7} under key: evictable, or
 * a live key (pinned) when `live`. */
static int publish_as(const char *key, int64_t n, float scale, int live) {
  st_result_t *a = NULL;
  char err[200];
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &a, err, sizeof err) != ST_OK) return -1;
  float *p = st_result_tensor(a, 0)->data;
  for (int64_t i = 0; i < n; i++) p[i] = (float)i * scale;
  st_args_t *args = st_args_new();
  int rc = st_args_tensor(args, "w", st_result_tensor(a, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_args_int(args, "step", 7);
  if (rc == ST_OK)
    rc = st_client_put(cli, key, args, live ? ST_KEY_PINNED : ST_KEY_EVICTABLE,
                       live ? ST_PUT_LIVE : 0, NULL);
  st_args_free(args);
  st_result_free(a);
  return rc;
}

static int publish(const char *key, int64_t n, float scale) {
  return publish_as(key, n, scale, 0);
}

TEST(help_for_every_command) {
  check_command_help("keys");
  check_command_help("get");
  check_command_help("delete");
}

TEST(keys_get_delete) {
  CHECK_EQ_INT(STCLI(SOCK, "keys"), 0);
  CHECK_CONTAINS(R.out, "(no keys)");
  CHECK_EQ_INT(publish("m/a", 4, 1.0f), ST_OK);
  CHECK_EQ_INT(publish("m/a", 4, 2.0f), ST_OK);
  CHECK_EQ_INT(publish("other", 2, 1.0f), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "keys", "m/"), 0);
  CHECK_CONTAINS_ALL(R.out, "KEY", "VERSIONS", "m/a", "1..2", "evictable", "cpu");
  CHECK(!strstr(R.out, "other"));
  CHECK_EQ_INT(STCLI(SOCK, "--json", "keys"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS_ALL(R.out, "\"key\": \"m/a\"", "\"key\": \"other\"");
  CHECK_EQ_INT(STCLI(SOCK, "get", "m/a", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "key m/a version 2", "w  float32  [4]  cpu", "values: 0 2 4 6",
                     "\"step\": 7");
  CHECK_EQ_INT(STCLI(SOCK, "get", "m/a", "--version", "1", "--readonly", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "key m/a version 1 (read-only)", "values: 0 1 2 3");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "get", "m/a"), 0);
  CHECK(json_ok(R.out));
  CHECK_EQ_INT(STCLI(SOCK, "delete", "m/a"), 0);
  CHECK_CONTAINS(R.out, "key m/a deleted");
  CHECK_EQ_INT(STCLI(SOCK, "get", "m/a"), 1);
  CHECK_CONTAINS_ALL(R.err, "NOT_FOUND", "no key 'm/a'");
  CHECK_EQ_INT(STCLI(SOCK, "delete", "m/a"), 1);
  CHECK_EQ_INT(STCLI(SOCK, "get", "other", "--version", "9"), 1);
  CHECK_CONTAINS(R.err, "key 'other' has no version 9");
  CHECK_EQ_INT(STCLI(SOCK, "delete", "other"), 0);
}

TEST(get_and_call_with_a_view) {
  CHECK_EQ_INT(publish("v", 8, 1.0f), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "get", "v", "--view", "w:slice(0,1,8,3)", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "key v version 1", "w  float32  [3]  cpu", "values: 1 4 7");
  CHECK_EQ_INT(STCLI(SOCK, "get", "v", "--view=w:shard(0,3,4)|contiguous", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "w  float32  [2]  cpu", "values: 6 7");
  CHECK_EQ_INT(STCLI(SOCK, "get", "v", "--view", "w:shard(0,5,4)"), 1);
  CHECK_CONTAINS_ALL(R.err, "INVALID_ARGUMENT", "shard(0,5,4): rank 5 is not below world 4 "
                     "(tensor 'w')");
  CHECK_EQ_INT(STCLI(SOCK, "get", "v", "--view"), 2);
  CHECK_CONTAINS(R.err, "--view needs a view spec");
  CHECK_EQ_INT(STCLI(SOCK, "call", "make_tensor", "rows=4", "cols=6", "--view",
                     "*:transpose(0,1)", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "float32  [6, 4]", "values: 0 6 12 18 1 7 13 19");
  CHECK_EQ_INT(STCLI(SOCK, "call", "make_tensor", "--view", "x:narrow(0,0,1)"), 1);
  CHECK_CONTAINS(R.err, "view: rule 1 ('x') selects no tensor");
  CHECK_EQ_INT(STCLI(SOCK, "delete", "v"), 0);
}

TEST(keys_shows_the_state_of_live_keys) {
  CHECK_EQ_INT(publish("plain", 4, 1.0f), ST_OK);
  CHECK_EQ_INT(publish_as("live", 4, 1.0f, 1), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "keys"), 0);
  CHECK_CONTAINS_ALL(R.out, "STATE", "live ", "put");
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(cli, "live", 0, &k), ST_OK, cli);
  CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "keys", "live"), 0);
  CHECK_CONTAINS(R.out, "updating");
  CHECK_EQ_INT(st_key_end_update(k, NULL), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "get", "live"), 0);
  CHECK_CONTAINS(R.out, "key live version 2");
  st_key_close(k);
  CHECK_RC(st_client_delete(cli, "live"), ST_OK, cli);
  CHECK_RC(st_client_delete(cli, "plain"), ST_OK, cli);
}

TEST(usage_errors) {
  CHECK_EQ_INT(STCLI(SOCK, "get"), 2);
  CHECK_CONTAINS(R.err, "a key is required");
  CHECK_EQ_INT(STCLI(SOCK, "get", "a", "b"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "get", "a", "--version", "x"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "get", "a", "--bogus"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "delete"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "keys", "a", "b"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "get", "bad name"), 1);
  CHECK_CONTAINS(R.err, "INVALID_ARGUMENT");
}

int main(void) {
  cli_require_bin();
  cli = stt_serve_client(&srv, "workers = 2,", NULL);
  RUN(help_for_every_command);
  RUN(keys_get_delete);
  RUN(get_and_call_with_a_view);
  RUN(keys_shows_the_state_of_live_keys);
  RUN(usage_errors);
  return stt_client_finish(cli, &srv);
}
