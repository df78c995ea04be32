/* What stcli prints, the real binary (ST_CLI_BIN) against a real stserver:
 * the command list's columns fit the longest name, --json output is
 * indented at every level (stats, call --values), `get` of a key holding a
 * lone tensor (the map {"__tensor__": t} Python's put sends) describes the
 * tensor as `call` does, and the server's debug line of a finished build
 * names its status OK. */
#include <st/client.h>
#include <stdlib.h>

#include "check.h"
#include "cli_run.h"
#include "client_kit.h"
#include "fixture.h"

static stt_server_t srv;
static st_client_t *cli;
#define SOCK "--socket", srv.socket

/* The column where the summary of the command list's line for `name`
 * starts, or -1. */
static int summary_column(const char *help, const char *name) {
  char want[64];
  snprintf(want, sizeof want, "\n  %s ", name);
  const char *p = strstr(help, want);
  if (!p) return -1;
  p++; /* the line */
  const char *q = p + 2 + strlen(name);
  while (*q == ' ') q++;
  return (int)(q - p);
}

TEST(help_columns_fit_the_longest_name) {
  CHECK_EQ_INT(STCLI("--help"), 0);
  int col = summary_column(R.out, "ping");
  CHECK(col > 0);
  const char *names[] = {"buffer-create", "handoff-delete", "completion", "help", "get"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    CHECK_EQ_INT(summary_column(R.out, names[i]), col);
  /* Two spaces at least after the longest. */
  CHECK_CONTAINS(R.out, "\n  handoff-delete  Delete a hand-off");
}

/* No line of a --json output starts at column 0 but its braces. */
static void check_indented(const char *out) {
  CHECK(json_ok(out));
  for (const char *p = strchr(out, '\n'); p && p[1]; p = strchr(p + 1, '\n'))
    if (p[1] != '}' && p[1] != ']' && p[1] != ' ') {
      fprintf(stderr, "   a line not indented: %.40s\n", p + 1);
      CHECK(0);
      return;
    }
}

TEST(stats_json_is_indented) {
  CHECK_EQ_INT(STCLI(SOCK, "--json", "stats"), 0);
  CHECK_CONTAINS(R.out, "{\n  \"counters\": {\n    \"requests\": ");
  check_indented(R.out);
  CHECK_EQ_INT(STCLI(SOCK, "--json", "call", "make_tensor", "--values=2"), 0);
  CHECK_CONTAINS(R.out, "{\n  \"value\": {\n    \"tensor\": ");
  CHECK_CONTAINS(R.out, "\n  \"tensors\": [\n    {\"name\": \"\", \"values\": [");
  check_indented(R.out);
}

/* Puts key as Python's put does for a lone tensor: {"__tensor__": t},
 * float32 [n] of i. */
static int put_lone(const char *key, int64_t n) {
  st_result_t *a = NULL;
  char err[200];
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &a, err, sizeof err) != ST_OK) return -1;
  float *p = st_result_tensor(a, 0)->data;
  for (int64_t i = 0; i < n; i++) p[i] = (float)i;
  st_args_t *args = st_args_new();
  int rc = st_args_tensor(args, "__tensor__", st_result_tensor(a, 0), err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(cli, key, args, ST_KEY_EVICTABLE, 0, NULL);
  st_args_free(args);
  st_result_free(a);
  return rc;
}

TEST(get_of_a_lone_tensor_describes_it) {
  CHECK_EQ_INT(put_lone("lone", 4), ST_OK);
  CHECK_EQ_INT(STCLI(SOCK, "get", "lone", "--values"), 0);
  CHECK_CONTAINS_ALL(R.out, "key lone version 1\n(tensor)  float32  [4]  cpu  16 bytes\n",
                     "values: 0 1 2 3");
  CHECK(strstr(R.out, "__tensor__") == NULL);
  CHECK(strstr(R.out, "{") == NULL);   /* no JSON blob */
  /* As `call` prints a lone tensor. */
  CHECK_EQ_INT(STCLI(SOCK, "--json", "get", "lone"), 0);
  CHECK(json_ok(R.out));
  CHECK(strncmp(R.out, "{\n  \"tensor\": {", 15) == 0);
  CHECK(strstr(R.out, "__tensor__") == NULL);
  CHECK_EQ_INT(STCLI(SOCK, "--json", "get", "lone", "--values=2"), 0);
  CHECK_CONTAINS(R.out, "{\"name\": \"\", \"values\": [0, 1]");
  CHECK_RC(st_client_delete(cli, "lone"), ST_OK, cli);
}

TEST(build_done_log_says_ok) {
  CHECK_EQ_INT(STCLI(SOCK, "call", "make_tensor", "rows=3"), 0);
  /* The line is written before the reply goes out. */
  char *log = stt_server_log(&srv);
  const char *line = strstr(log, "call: make_tensor done in ");
  CHECK(line != NULL);
  if (line) {
    const char *end = strchr(line, '\n');
    CHECK(end != NULL);
    const char *ok = strstr(line, " ms: OK, ");
    CHECK(ok != NULL && (!end || ok < end));
  }
  CHECK(strstr(log, "UNKNOWN") == NULL);
  free(log);
}

int main(void) {
  cli_require_bin();
  cli = stt_serve_client(&srv, "workers = 2,", NULL);
  RUN(help_columns_fit_the_longest_name);
  RUN(stats_json_is_indented);
  RUN(get_of_a_lone_tensor_describes_it);
  RUN(build_done_log_says_ok);
  return stt_client_finish(cli, &srv);
}
