/* Running the stcli binary from a test: run_env() forks and execs
 * ST_CLI_BIN (cli_bin, set by the test's main) with arguments, captures
 * stdout and stderr into R and returns the exit code; STCLI(...) is the
 * same with no environment change; run_prog() runs another program
 * (kit/proc.h).
 * json_ok() checks output is strict JSON. Header-only: each test program
 * includes it once.
 */
#ifndef STT_CLI_RUN_H
#define STT_CLI_RUN_H

#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "proc.h"

static const char *cli_bin;

/* The last run: status, out, err. */
static stt_proc_t R;

/* Runs the program `prog` with args (NULL-terminated), env "NAME=value"
 * (or NULL), capturing both streams. Returns the exit code. */
static inline int run_prog(const char *prog, const char *env, const char *const *args) {
  return stt_run(&R, prog, args, env, 0);
}

/* Runs stcli (cli_bin) as run_prog does. */
static inline int run_env(const char *env, const char *const *args) {
  return run_prog(cli_bin, env, args);
}

/* The start of a test's main: cli_bin from ST_CLI_BIN; skips (exit 77)
 * when it is not set. */
static inline void cli_require_bin(void) {
  cli_bin = getenv("ST_CLI_BIN");
  if (!cli_bin) stt_skip("ST_CLI_BIN is not set (run through ctest)");
}

/* cli_require_bin(), then a server with `config` and `eps` for the test
 * (stt_server_setup: exits when it does not start). */
static inline void cli_setup(stt_server_t *s, const char *config, const stt_endpoint_t *eps) {
  cli_require_bin();
  stt_server_setup(s, config, eps);
}

#define STCLI(...) run_env(NULL, (const char *const[]){__VA_ARGS__, NULL})

/* `stcli CMD --help` and `stcli help CMD` both print CMD's usage line on
 * stdout, nothing on stderr, and exit 0. (A check: fails the test.) */
static inline void check_command_help(const char *cmd) {
  char want[80];
  snprintf(want, sizeof want, "usage: stcli [global options] %s", cmd);
  CHECK_EQ_INT(STCLI(cmd, "--help"), 0);
  CHECK_CONTAINS(R.out, want);
  CHECK_STR_EQ(R.err, "");
  CHECK_EQ_INT(STCLI("help", cmd), 0);
  CHECK_CONTAINS(R.out, want);
}

/* Strict JSON check with the library's parser (it takes objects). */
static inline int json_ok(const char *text) {
  size_t n = strlen(text);
  char *wrapped = malloc(n + 16);
  snprintf(wrapped, n + 16, "{\"v\": %s}", text);
  st_args_t *a = st_args_new();
  char err[200];
  int rc = st_args_parse_json(a, wrapped, err, sizeof err);
  if (rc != ST_OK) fprintf(stderr, "bad JSON (%s):\n%s\n", err, text);
  st_args_free(a);
  free(wrapped);
  return rc == ST_OK;
}

#endif
