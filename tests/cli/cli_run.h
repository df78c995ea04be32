/* Running the stcli binary from a test: run_env() forks and execs
 * ST_CLI_BIN (cli_bin, set by the test's main) with arguments, captures
 * stdout and stderr into R and returns the exit code; STCLI(...) is the
 * same with no environment change; run_prog() runs another program.
 * json_ok() checks output is strict JSON. Header-only: each test program
 * includes it once.
 */
#ifndef STT_CLI_RUN_H
#define STT_CLI_RUN_H

#include <poll.h>
#include <signal.h>
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fixture.h"

static const char *cli_bin;

typedef struct run {
  int status;          /* exit code, or 128 + signal */
  char out[16384];
  char err[4096];
} run_t;

static run_t R;

/* Runs the program `prog` with args (NULL-terminated), env "NAME=value"
 * (or NULL), capturing both streams. Returns the exit code. */
static inline int run_prog(const char *prog, const char *env, const char *const *args) {
  memset(&R, 0, sizeof R);
  int po[2], pe[2];
  if (pipe(po) != 0 || pipe(pe) != 0) abort();
  pid_t pid = fork();
  if (pid < 0) abort();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    unsetenv(ST_ENV_BASE_PATH);
    if (env) putenv((char *)env);
    const char *argv[40];
    int n = 0;
    argv[n++] = prog;
    for (int i = 0; args[i] && n < 39; i++) argv[n++] = args[i];
    argv[n] = NULL;
    execv(prog, (char *const *)argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  size_t no = 0, ne = 0;
  int open_o = 1, open_e = 1;
  double deadline = stt_now_ms() + 30000;
  while ((open_o || open_e) && stt_now_ms() < deadline) {
    struct pollfd p[2] = {{.fd = open_o ? po[0] : -1, .events = POLLIN},
                          {.fd = open_e ? pe[0] : -1, .events = POLLIN}};
    if (poll(p, 2, 1000) < 0) continue;
    if (open_o && p[0].revents) {
      ssize_t k = no < sizeof R.out - 1 ? read(po[0], R.out + no, sizeof R.out - 1 - no) : 0;
      if (k <= 0) open_o = 0;   /* EOF, error, or the buffer is full */
      else no += (size_t)k;
    }
    if (open_e && p[1].revents) {
      ssize_t k = ne < sizeof R.err - 1 ? read(pe[0], R.err + ne, sizeof R.err - 1 - ne) : 0;
      if (k <= 0) open_e = 0;   /* EOF, error, or the buffer is full */
      else ne += (size_t)k;
    }
  }
  if (open_o || open_e) kill(pid, SIGKILL);
  close(po[0]);
  close(pe[0]);
  int st;
  waitpid(pid, &st, 0);
  R.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  if (getenv("STT_VERBOSE"))
    fprintf(stderr, "[exit %d]\n--stdout--\n%s--stderr--\n%s", R.status, R.out, R.err);
  return R.status;
}

/* Runs stcli (cli_bin) as run_prog does. */
static inline int run_env(const char *env, const char *const *args) {
  return run_prog(cli_bin, env, args);
}

#define STCLI(...) run_env(NULL, (const char *const[]){__VA_ARGS__, NULL})

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
