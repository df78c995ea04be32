/* Service-manager notifications ($NOTIFY_SOCKET, systemd's Type=notify):
 * READY=1 once the socket serves, RELOADING=1 ... READY=1 around a reload,
 * STOPPING=1 at SIGTERM; a path socket and
 * an abstract one; nothing is sent (and nothing fails) without the variable. */
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "wire.h"

static const char ONE_EP[] =
    "return st.endpoint{ name = \"one\", build = function() return 1 end }\n";

/* A datagram socket bound at `name` ("@x": abstract). -1 on failure. */
static int listen_dgram(const char *name) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  size_t n = strlen(name);
  memcpy(a.sun_path, name, n);
  if (name[0] == '@') a.sun_path[0] = '\0';
  if (bind(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n))) {
    close(fd);
    return -1;
  }
  return fd;
}

/* The next datagram within timeout_ms into buf (NUL-terminated); its
 * length, or -1. */
static int next_dgram(int fd, char *buf, size_t cap, int timeout_ms) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) != 1) return -1;
  ssize_t n = recv(fd, buf, cap - 1, 0);
  if (n < 0) return -1;
  buf[n] = '\0';
  return (int)n;
}

/* Starts s serving ONE_EP with NOTIFY_SOCKET=name in its environment. */
static int start_notifying(stt_server_t *s, const char *name) {
  setenv("NOTIFY_SOCKET", name, 1);
  stt_server_init(s);
  stt_write_endpoint(s, "one.lua", ONE_EP);
  int started = stt_server_start(s);
  unsetenv("NOTIFY_SOCKET");
  return started;
}

static void ready_then_stopping(const char *name) {
  int fd = listen_dgram(name);
  CHECK(fd >= 0);
  if (fd < 0) return;
  stt_server_t s;
  int started = start_notifying(&s, name);
  CHECK_EQ_INT(started, 0);
  char msg[512] = "";
  CHECK(next_dgram(fd, msg, sizeof msg, 5000) > 0);
  CHECK_CONTAINS_ALL(msg, "READY=1\n", "STATUS=serving 1 endpoints", "MAINPID=");
  if (started == 0) {
    rc_t c;
    CHECK(rc_open(&c, s.socket) == 0);   /* READY=1 came when it serves */
    CHECK(stt_ping(c.fd, 1) == 0);
    rc_close(&c);
    /* SIGHUP: RELOADING=1, then READY=1 with the new generation */
    CHECK(kill(s.pid, SIGHUP) == 0);
    CHECK(next_dgram(fd, msg, sizeof msg, 5000) > 0);
    CHECK_CONTAINS(msg, "RELOADING=1\n");
    CHECK(next_dgram(fd, msg, sizeof msg, 10000) > 0);
    CHECK_CONTAINS(msg, "READY=1\n");
    CHECK_CONTAINS(msg, "STATUS=serving 1 endpoints (generation 2)");
    CHECK_EQ_INT(stt_server_stop(&s), 0);
    CHECK(next_dgram(fd, msg, sizeof msg, 5000) > 0);
    CHECK_CONTAINS(msg, "STOPPING=1\n");
    CHECK_CONTAINS(msg, "SIGTERM");
  }
  stt_server_cleanup(&s);
  close(fd);
}

TEST(path_socket) {
  char name[200];
  snprintf(name, sizeof name, "/tmp/stt-notify-%d.sock", (int)getpid());
  unlink(name);
  ready_then_stopping(name);
  unlink(name);
}

TEST(abstract_socket) {
  char name[100];
  snprintf(name, sizeof name, "@stt-notify-%d", (int)getpid());
  ready_then_stopping(name);
}

TEST(a_bad_variable_is_only_a_warning) {
  stt_server_t s;
  int started = start_notifying(&s, "relative/path");
  CHECK_EQ_INT(started, 0);
  if (started == 0) CHECK_EQ_INT(stt_server_stop(&s), 0);
  char *log = stt_server_log(&s);
  CHECK_CONTAINS(log, "NOTIFY_SOCKET 'relative/path' is not a socket path");
  free(log);
  stt_server_cleanup(&s);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(path_socket);
  RUN(abstract_socket);
  RUN(a_bad_variable_is_only_a_warning);
  return stt_summary();
}
