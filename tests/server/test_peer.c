/* Peer admission (SO_PEERCRED): a process of another uid is refused with
 * AUTH and closed while a normal client keeps working; allow_uids and
 * allow_gids (primary or supplementary groups) admit it. Needs root (to become uid 65534); skipped
 * otherwise. */
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "check.h"
#include "wire.h"

#define NOBODY 65534

static const char PING_EP[] =
    "return st.endpoint{ name = \"one\", build = function() return 1 end }\n";

/* A supplementary group of the child in allow_gids_admits_a_supplementary_group. */
#define EXTRA_GID 4242

/* In a child running as NOBODY (primary gid NOBODY, and EXTRA_GID as its
 * one supplementary group when `extra`): connects and either expects AUTH
 * then EOF (want_auth) or a working ping. Returns the child's exit status
 * (0 when it saw what it expected). */
static int as_nobody_in(const char *socket, int want_auth, int extra) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    gid_t g = EXTRA_GID;
    if (setgroups(extra ? 1 : 0, extra ? &g : NULL) != 0 ||
        setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
        setresuid(NOBODY, NOBODY, NOBODY) != 0)
      _exit(10);
    rc_t c;
    if (rc_open(&c, socket) != 0) _exit(11);
    if (!want_auth) _exit(stt_ping(c.fd, 1) == 0 ? 0 : 12);
    /* Even a client that talks first gets the refusal, not a reset. */
    (void)rc_sendf(&c, "[0, 1, 'ping', []]");
    msg_t m;
    if (rc_next(&c, &m, 5000) != 1) _exit(13);
    char why[600];
    int ok = m.id == 0 && reply_is(&m, ST_ERR_AUTH, NULL, why, sizeof why);
    msg_free(&m);
    if (!ok) _exit(14);
    if (rc_next(&c, &m, 5000) != 0) _exit(15);
    _exit(0);
  }
  int status;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

static int as_nobody(const char *socket, int want_auth) {
  return as_nobody_in(socket, want_auth, 0);
}

/* Lets uid NOBODY reach the socket through the file system (the server's
 * own checks are what is tested). */
static void open_up(stt_server_t *s) {
  chmod(s->dir, 0711);
  chmod(s->socket, 0666);
}

static stt_server_t S;

static void refused_body(stt_server_t *s) {
  open_up(s);
  OPEN_RC(good, s->socket);
  CHECK(stt_ping(good.fd, 1) == 0);
  CHECK_EQ_INT(as_nobody(s->socket, 1), 0);
  CHECK_EQ_INT(as_nobody(s->socket, 1), 0);
  CHECK(stt_ping(good.fd, 2) == 0);
  CHECK_EQ_INT(rc_info_int(&good, "counters.auth_refused"), 2);
  rc_close(&good);
  char *log = stt_server_log(s);
  CHECK_CONTAINS(log, "uid 65534");
  free(log);
}

/* A server serving one endpoint, `config_line` in its config, running
 * body. 0 when it started and stopped cleanly. */
static int with_server(const char *config_line, void (*body)(stt_server_t *s)) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "one.lua", PING_EP);
  stt_server_config(&S, config_line);
  int rc = stt_server_run(&S, body);
  stt_server_cleanup(&S);
  return rc;
}

TEST(other_uid_is_refused) {
  CHECK_EQ_INT(with_server("", refused_body), 0);
}

static int child = -1;

static void admitted_body(stt_server_t *s) {
  open_up(s);
  child = as_nobody(s->socket, 0);
}

static void admitted(const char *config_line) {
  child = -1;
  CHECK_EQ_INT(with_server(config_line, admitted_body), 0);
  CHECK_EQ_INT(child, 0);
}

TEST(allow_uids_admits) {
  admitted("allow_uids = { 65534 },");
}

TEST(allow_gids_admits) {
  admitted("allow_gids = { 65534 },");
}

/* allow_gids counts supplementary groups too, not only the primary gid;
 * a group the peer is not in still refuses it. */
static void supplementary_body(stt_server_t *s) {
  open_up(s);
  child = as_nobody_in(s->socket, 0, 1);
  CHECK_EQ_INT(as_nobody_in(s->socket, 1, 0), 0);
}

TEST(allow_gids_admits_a_supplementary_group) {
  child = -1;
  CHECK_EQ_INT(with_server("allow_gids = { 4242 },", supplementary_body), 0);
  CHECK_EQ_INT(child, 0);
}

int main(void) {
  if (geteuid() != 0) stt_skip("needs root to run a client as another uid");
  signal(SIGPIPE, SIG_IGN);
  RUN(other_uid_is_refused);
  RUN(allow_uids_admits);
  RUN(allow_gids_admits);
  RUN(allow_gids_admits_a_supplementary_group);
  return stt_summary();
}
