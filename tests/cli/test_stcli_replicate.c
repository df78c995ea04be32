/* stcli replicate (docs/cli.md, "pull, replicate") against two stservers
 * on loopback that are peers (tests/peer/remote_kit.h): a push to beta,
 * which takes alpha's pushes (one line per peer, exit 0, every byte on
 * beta), --json; a push to alpha, which takes none (exit 1 naming the
 * peer); usage errors. */
#include "../peer/remote_kit.h"
#include "cli_run.h"

TEST(replicate_pushes_and_reports_each_peer) {
  check_command_help("replicate");
  CHECK(rk_put(ALPHA.socket, "w/r", 4) == 1);
  CHECK_EQ_INT(STCLI("--socket", ALPHA.socket, "replicate", "w/r", "--to", "beta"), 0);
  CHECK_CONTAINS(R.out, "w/r version 1 to 1 peer\n");
  CHECK_CONTAINS(R.out, "beta");
  CHECK_CONTAINS(R.out, "ok, version 1");
  CHECK(rk_holds(BETA.socket, "w/r", 0, 4));
  CHECK_EQ_INT(STCLI("--socket", ALPHA.socket, "--json", "replicate", "w/r", "--to=beta",
                     "--as", "w/r2"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"beta\"");
  CHECK(rk_holds(BETA.socket, "w/r2", 0, 4));
  /* alpha takes no pushes. */
  CHECK(rk_put(BETA.socket, "w/b", 3) == 1);
  CHECK_EQ_INT(STCLI("--socket", BETA.socket, "replicate", "w/b", "--to", "alpha"), 1);
  CHECK_CONTAINS(R.err, "stcli: AUTH: ");
  CHECK_CONTAINS(R.err, "1 of 1 peers failed");
  CHECK_EQ_INT(STCLI("--socket", BETA.socket, "replicate", "w/b", "--to", "alpah"), 1);
  CHECK_CONTAINS(R.err, "did you mean 'alpha'?");
  CHECK_EQ_INT(STCLI("--socket", BETA.socket, "replicate", "w/b"), 2);
  CHECK_CONTAINS(R.err, "--to PEER[,PEER...] is required");
  CHECK_EQ_INT(STCLI("--socket", BETA.socket, "replicate", "w/b", "--to", ","), 2);
}

int main(void) {
  cli_require_bin();
  rk_main_start();
  RUN(replicate_pushes_and_reports_each_peer);
  return rk_main_end();
}
