/* stcli pull (docs/cli.md, "pull, replicate") against two stservers on
 * loopback that are peers (tests/peer/remote_kit.h): the final line and
 * the exit code of a pull, --json, --no-wait with `stcli wait`, the
 * refusals (not exported, not a peer with a "did you mean", usage), the
 * progress while no byte can move (a bar on a terminal, lines elsewhere),
 * Ctrl-C cancelling the pull and --timeout leaving it running; pull
 * --live of a live key, `stcli replicas` on both servers and `stcli
 * unsubscribe`. */
#include <inttypes.h>

#include "../peer/remote_kit.h"
#include "cli_run.h"

#define SOCK "--socket", BETA.socket

TEST(help) {
  check_command_help("pull");
  CHECK_CONTAINS(R.out, "--from PEER");
  CHECK_CONTAINS(R.out, "--no-wait");
}

TEST(a_pull_prints_what_arrived) {
  CHECK(rk_put(ALPHA.socket, "w/model", 1) == 1);
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--from", "alpha"), 0);
  CHECK_CONTAINS(R.out, "w/model version 1 <- alpha:w/model version 1: ");
  CHECK_CONTAINS(R.out, " bytes) in ");
  CHECK_CONTAINS(R.out, " GB/s\n");
  CHECK_EQ_INT(stt_count_lines(R.out), 1);
  CHECK(rk_holds(BETA.socket, "w/model", 0, 1));
  /* --json: the task's result; --as names the copy. */
  CHECK_EQ_INT(STCLI(SOCK, "--json", "pull", "w/model", "--from=alpha", "--as", "copy/m"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"key\": \"copy/m\"");
  CHECK_CONTAINS(R.out, "\"peer\": \"alpha\"");
  CHECK_CONTAINS(R.out, "\"seconds\"");
  CHECK(rk_holds(BETA.socket, "copy/m", 0, 1));
  /* keys shows where each copy came from. */
  CHECK_EQ_INT(STCLI(SOCK, "keys"), 0);
  CHECK_CONTAINS_ALL(R.out, "ORIGIN", "alpha:w/model@1");
  /* --no-wait: the task id; stcli wait follows it to its result. */
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--from", "alpha", "--no-wait"), 0);
  uint64_t id = strtoull(R.out, NULL, 10);
  CHECK(id > 0);
  char ids[32];
  snprintf(ids, sizeof ids, "%" PRIu64, id);
  CHECK_EQ_INT(STCLI(SOCK, "wait", ids), 0);
  CHECK_CONTAINS(R.out, "origin");
  CHECK_EQ_INT(STCLI(SOCK, "delete", "w/model"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "delete", "copy/m"), 0);
}

/* Puts live key `name` on alpha: one float32 tensor x of 64 elements. */
static int put_live(const char *name) {
  st_client_t *c;
  char err[256];
  if (st_client_connect(ALPHA.socket, &c, err, sizeof err) != ST_OK) return 0;
  st_result_t *t = NULL;
  int64_t n = 64;
  st_args_t *a = st_args_new();
  uint64_t v = 0;
  int ok = st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &t, err, sizeof err) == ST_OK &&
           st_args_tensor(a, "x", st_result_tensor(t, 0), err, sizeof err) == ST_OK &&
           st_client_put(c, name, a, ST_KEY_PINNED, ST_PUT_LIVE, &v) == ST_OK;
  st_args_free(a);
  st_result_free(t);
  st_client_close(c);
  return ok && v == 1;
}

TEST(a_live_pull_follows_and_unsubscribe_ends_it) {
  CHECK(put_live("w/lv"));
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/lv", "--from", "alpha", "--live"), 0);
  CHECK_CONTAINS(R.out, "w/lv version 1 <- alpha:w/lv version 1: ");
  CHECK_CONTAINS(R.out, "; live: it follows the peer's key (stcli replicas shows it)\n");
  CHECK_EQ_INT(STCLI(SOCK, "replicas", "w/lv"), 0);
  CHECK_CONTAINS(R.out, "w/lv follows alpha:w/lv, at version 1 (0 updates brought, 0 overwritten "
                 "while read)\n");
  CHECK_CONTAINS(R.out, "no peer follows w/lv\n");
  CHECK_EQ_INT(STCLI("--socket", ALPHA.socket, "replicas", "w/lv"), 0);
  CHECK_CONTAINS(R.out, "w/lv follows no peer's key\n");
  CHECK_CONTAINS(R.out, "beta follows it: told of version 1\n");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "replicas", "w/lv"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"peer\": \"alpha\"");
  CHECK_EQ_INT(STCLI(SOCK, "unsubscribe", "w/lv"), 0);
  CHECK_CONTAINS(R.out, "w/lv no longer follows its peer's key; it keeps version 1\n");
  CHECK_EQ_INT(STCLI(SOCK, "unsubscribe", "w/lv"), 1);
  CHECK_CONTAINS(R.err, "NOT_FOUND");
  CHECK_EQ_INT(STCLI(SOCK, "replicas", "w/nothing"), 1);
  CHECK_CONTAINS(R.err, "NOT_FOUND");
}

TEST(refusals_exit_with_the_reason) {
  CHECK(rk_put(ALPHA.socket, "secret", 1) == 1);
  CHECK_EQ_INT(STCLI(SOCK, "pull", "secret", "--from", "alpha"), 1);
  CHECK_CONTAINS(R.err, "stcli: AUTH: ");
  CHECK_CONTAINS(R.err, "key 'secret' is not exported to peers");
  CHECK_STR_EQ(R.out, "");
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--from", "alpah"), 1);
  CHECK_CONTAINS(R.err, "stcli: NOT_FOUND: ");
  CHECK_CONTAINS(R.err, "did you mean 'alpha'?");
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model"), 2);
  CHECK_CONTAINS(R.err, "--from PEER is required");
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--form", "alpha"), 2);
  CHECK_CONTAINS(R.err, "did you mean '--from'");
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--from", "alpha", "--version", "0"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/model", "--from", "alpha", "--policy", "sticky"), 2);
  CHECK_EQ_INT(STCLI(SOCK, "pul", "w/model"), 2);
  CHECK_CONTAINS(R.err, "did you mean 'pull'");
}

/* The task id in "task N" of text, or 0. */
static uint64_t task_in(const char *text) {
  const char *p = strstr(text, "task ");
  return p ? strtoull(p + 5, NULL, 10) : 0;
}

TEST(progress_while_no_byte_moves) {
  CHECK(rk_put(ALPHA.socket, "w/slow", 2) >= 1);
  pid_t helper = (pid_t)server_info_int(&ALPHA, "transfers.helper_pid");
  CHECK(helper > 0 && kill(helper, SIGSTOP) == 0);
  /* Not a terminal: a progress line a second; --timeout gives up (exit
   * 4) and leaves the pull running. */
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/slow", "--from", "alpha", "--timeout", "2.5"), 4);
  CHECK_CONTAINS(R.err, "pull w/slow from alpha: running");
  CHECK_CONTAINS(R.err, "stcli: TIMEOUT: task ");
  uint64_t id = task_in(strstr(R.err, "TIMEOUT") ? strstr(R.err, "TIMEOUT") : "");
  CHECK(id > 0);
  char ids[32];
  snprintf(ids, sizeof ids, "%" PRIu64, id);
  CHECK_EQ_INT(STCLI(SOCK, "status", ids), 0);
  CHECK_CONTAINS(R.out, "running");
  CHECK_EQ_INT(STCLI(SOCK, "cancel", ids), 0);
  CHECK(server_wait_info(&BETA, "transfers.pulls", 0));
  /* On a terminal: a bar; Ctrl-C cancels the pull, which leaves nothing. */
  stt_proc_t p;
  const char *args[] = {"--socket", BETA.socket, "pull", "w/slow", "--from", "alpha", NULL};
  CHECK(stt_proc_start(&p, cli_bin, args, NULL, STT_PTY_ERR) == 0);
  double end = stt_now_ms() + 20000;
  while (stt_now_ms() < end && !strstr(p.err, "pull w/slow from alpha ["))
    stt_proc_read(&p, 100);
  CHECK_CONTAINS(p.err, "pull w/slow from alpha [");
  kill(p.pid, SIGINT);
  CHECK_EQ_INT(stt_proc_finish(&p, 20000), 1);
  CHECK_CONTAINS(p.err, "stcli: CANCELLED: ");
  if (helper > 0) kill(helper, SIGCONT);
  CHECK_EQ_INT(STCLI(SOCK, "get", "w/slow"), 1);
  CHECK_CONTAINS(R.err, "NOT_FOUND");
  CHECK(server_wait_info(&BETA, "transfers.pulls", 0));
  CHECK(server_wait_info(&ALPHA, "transfers.lends", 0));
  /* With the helper back, the same pull completes. */
  CHECK_EQ_INT(STCLI(SOCK, "pull", "w/slow", "--from", "alpha"), 0);
  CHECK(rk_holds(BETA.socket, "w/slow", 0, 2));
}

int main(void) {
  cli_require_bin();
  rk_main_start();
  RUN(help);
  RUN(a_pull_prints_what_arrived);
  RUN(a_live_pull_follows_and_unsubscribe_ends_it);
  RUN(refusals_exit_with_the_reason);
  RUN(progress_while_no_byte_moves);
  return rk_main_end();
}
