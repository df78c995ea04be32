/* stcli buffers, buffer-create and buffer-unlink against a real stserver
 * (docs/streams.md): a buffer made from the shell is listed, opened by a
 * client, refused twice, unlinked, and the usage errors are clear;
 * buffer-create --readers grants read to another uid (a child that
 * becomes uid 65534: needs root, skipped otherwise) and no more. */
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "cli_run.h"
#include "client_kit.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

TEST(create_list_open_unlink) {
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_STR_EQ(R.out, "(no buffers)\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "cam", "uint8", "48x64x3", "4"), 0);
  CHECK_STR_EQ(R.out, "buffer 'cam': 4 slots of 9216 bytes on cpu\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_CONTAINS_ALL(R.out, "NAME", "DEVICE", "DTYPE", "SHAPE", "SLOTS", "BYTES", "HANDLES",
                     "cam", "uint8", "48x64x3", "36.0 KiB");
  CHECK_EQ_INT(STCLI(SOCK, "--json", "buffers"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"frame_bytes\": 9216");
  /* it outlives stcli: a client opens it */
  OPEN_CLIENT(c, srv.socket);
  st_buffer_t *b = NULL;
  CHECK_RC(st_buffer_open(c, "cam", 1, &b), ST_OK, c);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "cam", "uint8", "4"), 1);
  CHECK_CONTAINS(R.err, "stcli: INVALID_ARGUMENT: buffer_create: a buffer named 'cam' exists");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink", "cam"), 0);
  CHECK_STR_EQ(R.out, "buffer 'cam' unlinked\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffers"), 0);
  CHECK_STR_EQ(R.out, "(no buffers)\n");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink", "cam"), 1);
  CHECK_CONTAINS(R.err, "stcli: NOT_FOUND: buffer_unlink: no buffer named 'cam'");
  CHECK_RC(st_buffer_close(b), ST_OK, c);
  st_client_close(c);
}

TEST(usage_errors_and_help) {
  check_command_help("buffers");
  check_command_help("buffer-create");
  check_command_help("buffer-unlink");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8"), 2);
  CHECK_CONTAINS(R.err, "buffer-create needs NAME DTYPE SHAPE");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4x0"), 2);
  CHECK_CONTAINS(R.err, "SHAPE is sizes >= 1 joined by x");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "nope", "4"), 2);
  CHECK_CONTAINS(R.err, "'nope' is not a dtype");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4", "0"), 2);
  CHECK_CONTAINS(R.err, "SLOTS is 1 to 1024");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "a/b", "uint8", "4"), 1);
  CHECK_CONTAINS(R.err, "a buffer name is 1 to 64 characters");
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink"), 2);
}

#define NOBODY 65534

/* In a child that became uid and gid 65534: buffer_open of `name`
 * read-only must give `ro`, read-write `rw`. 0, or the failed step. */
static int nobody_opens(const char *name, int ro, int rw) {
  st_client_t *c = NULL;
  char err[256];
  if (st_client_connect(srv.socket, &c, err, sizeof err) != ST_OK) return 10;
  int step = 0, want[2] = {ro, rw};
  for (int readonly = 1; readonly >= 0; readonly--) {
    step++;
    st_buffer_t *b = NULL;
    int rc = st_buffer_open(c, name, readonly, &b);
    if (b) st_buffer_close(b);
    if (rc != want[1 - readonly]) {
      fprintf(stderr, "   uid %d: buffer_open('%s', readonly %d): %s (%s), want %s\n", NOBODY,
              name, readonly, st_err_name(rc), st_client_error(c), st_err_name(want[1 - readonly]));
      return step;
    }
  }
  st_client_close(c);
  return 0;
}

/* Runs nobody_opens in a child of uid and gid 65534; its result. */
static int as_nobody(const char *name, int ro, int rw) {
  pid_t pid = fork();
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
      _exit(100);
    _exit(nobody_opens(name, ro, rw));
  }
  int status = -1;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 101;
  return WEXITSTATUS(status);
}

TEST(readers_grant_read_to_another_uid) {
  if (geteuid() != 0) {
    printf("   (skipped: needs root to run a client as another uid)\n");
    return;
  }
  chmod(srv.dir, 0711);
  chmod(srv.socket, 0666);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "byuid", "uint8", "4", "--readers", "uid:65534"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "--readers=gid:65534,uid:1", "bygid", "uint8", "4"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "other", "uint8", "4", "--readers", "uid:1,gid:2"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "private", "uint8", "4"), 0);
  /* a grant is read: read-only opens, nothing more */
  CHECK_EQ_INT(as_nobody("byuid", ST_OK, ST_ERR_AUTH), 0);
  CHECK_EQ_INT(as_nobody("bygid", ST_OK, ST_ERR_AUTH), 0);
  /* no grant to it: the name does not exist for uid 65534 */
  CHECK_EQ_INT(as_nobody("other", ST_ERR_NOT_FOUND, ST_ERR_NOT_FOUND), 0);
  CHECK_EQ_INT(as_nobody("private", ST_ERR_NOT_FOUND, ST_ERR_NOT_FOUND), 0);
  /* names resolve on this host: nobody is 65534 here */
  if (getpwnam("nobody") && getpwnam("nobody")->pw_uid == NOBODY) {
    CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "byname", "uint8", "4", "--readers", "uid:nobody"),
                 0);
    CHECK_EQ_INT(as_nobody("byname", ST_OK, ST_ERR_AUTH), 0);
  }
  const char *names[] = {"byuid", "bygid", "other", "private", "byname"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    STCLI(SOCK, "buffer-unlink", names[i]);
}

TEST(readers_usage_errors) {
  static const struct {
    const char *arg, *want;
  } bad[] = {
      {"--readers", "--readers needs uid:N and gid:N entries joined by commas"},
      {"--readers=", "--readers needs uid:N and gid:N entries joined by commas"},
      {"--readers=1000", "--readers entry '1000' is not uid:N or gid:N"},
      {"--readers=user:1000", "--readers entry 'user:1000' is not uid:N or gid:N"},
      {"--readers=uid:", "--readers entry 'uid:' is not uid:N or gid:N"},
      {"--readers=uid:1,", "--readers entry '' is not uid:N or gid:N"},
      {"--readers=uid:-1", "--readers entry 'uid:-1': no user named '-1'"},
      {"--readers=gid:4294967295", "'gid:4294967295': 4294967295 is not a gid"},
      {"--readers=uid:no-such-user-here", "no user named 'no-such-user-here' on this host"},
      {"--readers=gid:no-such-group-here", "no group named 'no-such-group-here' on this host"},
      {"--readers=uid:1,uid:2,uid:3,uid:4,uid:5,uid:6,uid:7,uid:8,uid:9,uid:10,uid:11,uid:12,"
       "uid:13,uid:14,uid:15,uid:16,uid:17",
       "--readers grants at most 16 uids"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4", bad[i].arg), 2);
    CHECK_CONTAINS(R.err, bad[i].want);
    CHECK_CONTAINS(R.err, "(see 'stcli help buffer-create')");
  }
  /* one uid given twice is one grant; a repeated --readers adds up */
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "dup", "uint8", "4", "--readers", "uid:5,uid:5",
                     "--readers", "gid:6"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-unlink", "dup"), 0);
  CHECK_EQ_INT(STCLI(SOCK, "buffer-create", "x", "uint8", "4", "--reader=uid:1"), 2);
  CHECK_CONTAINS(R.err, "unknown option '--reader=uid:1'; did you mean '--readers'?");
  CHECK_EQ_INT(STCLI("help", "buffer-create"), 0);
  CHECK_CONTAINS_ALL(R.out, "[--readers LIST]", "uid:1000,gid:27");
}

int main(void) {
  cli_setup(&srv, "memory_budget = { cpu = 16 * 1024 * 1024 }, allow_uids = { 65534 },", NULL);
  RUN(create_list_open_unlink);
  RUN(usage_errors_and_help);
  RUN(readers_grant_read_to_another_uid);
  RUN(readers_usage_errors);
  return stt_server_finish(&srv);
}
