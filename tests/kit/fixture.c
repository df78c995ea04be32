/* Integration-test fixture: a real stserver in a private temp directory.
 * See fixture.h for the contract. Test-only code: setup failures abort the
 * test program with a message (a broken fixture is not a test result). */
#include "fixture.h"

#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fixture: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(99);
}

double stt_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void stt_write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) die("cannot write %s: %s", path, strerror(errno));
  fputs(text, f);
  if (fclose(f) != 0) die("cannot write %s: %s", path, strerror(errno));
}

void stt_server_init(stt_server_t *s) {
  memset(s, 0, sizeof *s);
  s->pid = -1;
  snprintf(s->dir, sizeof s->dir, "/tmp/stt-XXXXXX");
  if (!mkdtemp(s->dir)) die("mkdtemp: %s", strerror(errno));
  snprintf(s->base, sizeof s->base, "%s/st", s->dir);
  snprintf(s->socket, sizeof s->socket, "%s-0.sock", s->base);
  snprintf(s->config, sizeof s->config, "%s/config.lua", s->dir);
  snprintf(s->log, sizeof s->log, "%s/server.log", s->dir);
  const char *src = getenv("ST_SOURCE_DIR");
  if (!src) die("ST_SOURCE_DIR is not set (run the tests through ctest)");
  snprintf(s->endpoints, sizeof s->endpoints, "%s/endpoints", src);
}

void stt_server_config(stt_server_t *s, const char *lua_fields) {
  size_t used = strlen(s->extra_config);
  if (used + strlen(lua_fields) + 2 >= sizeof s->extra_config) die("extra config too long");
  strcat(s->extra_config, lua_fields);
  strcat(s->extra_config, "\n");
}

void stt_write_endpoint(stt_server_t *s, const char *name, const char *text) {
  if (!s->own_endpoints) {
    snprintf(s->endpoints, sizeof s->endpoints, "%s/endpoints", s->dir);
    if (mkdir(s->endpoints, 0700) != 0 && errno != EEXIST) die("mkdir: %s", strerror(errno));
    s->own_endpoints = 1;
  }
  char path[600];
  snprintf(path, sizeof path, "%s/%s", s->endpoints, name);
  stt_write_file(path, text);
}

int stt_connect(const char *path) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(path) >= sizeof sa.sun_path) return -1;
  strcpy(sa.sun_path, path);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int stt_send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Reads from fd until one whole msgpack object is buffered. Bytes that
 * arrive after it are not expected in these tests (one request at a time);
 * pipelining tests use their own readers. */
int stt_recv_message(int fd, char **buf, size_t *len, int *fds, int maxfds, int *nfds,
                     int timeout_ms) {
  size_t cap = 4096, used = 0;
  char *data = malloc(cap);
  if (nfds) *nfds = 0;
  double deadline = stt_now_ms() + timeout_ms;
  for (;;) {
    if (used > 0) {
      size_t off = 0;
      msgpack_unpacked u;
      msgpack_unpacked_init(&u);
      msgpack_unpack_return r = msgpack_unpack_next(&u, data, used, &off);
      msgpack_unpacked_destroy(&u);
      if (r == MSGPACK_UNPACK_SUCCESS) {
        *buf = data;
        *len = off;
        return 1;
      }
      if (r != MSGPACK_UNPACK_CONTINUE) {
        free(data);
        return -1;
      }
    }
    int left = (int)(deadline - stt_now_ms());
    if (left <= 0) break;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int pr = poll(&p, 1, left);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) break;
    if (used == cap) data = realloc(data, cap *= 2);
    char cbuf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
    struct iovec iov = {.iov_base = data + used, .iov_len = cap - used};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                        .msg_controllen = sizeof cbuf};
    ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      int *got = (int *)CMSG_DATA(c);
      for (int i = 0; i < k; i++) {
        if (fds && nfds && *nfds < maxfds) fds[(*nfds)++] = got[i];
        else close(got[i]);
      }
    }
    if (n == 0) {
      free(data);
      return 0;
    }
    if (n < 0) {
      free(data);
      return -1;
    }
    used += (size_t)n;
  }
  free(data);
  return -1;
}

int stt_ping(int fd, uint32_t id) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  st__pack_request_head(&pk, id, "ping");
  msgpack_pack_array(&pk, 0);
  int rc = stt_send_all(fd, sb.data, sb.size);
  msgpack_sbuffer_destroy(&sb);
  if (rc != 0) return -1;
  char *buf;
  size_t len;
  if (stt_recv_message(fd, &buf, &len, NULL, 0, NULL, 5000) != 1) return -1;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int ok = msgpack_unpack_next(&u, buf, len, &off) == MSGPACK_UNPACK_SUCCESS &&
           u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size == 4 &&
           u.data.via.array.ptr[1].via.u64 == id &&
           u.data.via.array.ptr[2].type == MSGPACK_OBJECT_NIL &&
           st__str_eq(&u.data.via.array.ptr[3], "pong");
  msgpack_unpacked_destroy(&u);
  free(buf);
  return ok ? 0 : -1;
}

char *stt_server_log(const stt_server_t *s) {
  FILE *f = fopen(s->log, "r");
  if (!f) return strdup("");
  size_t cap = 1 << 16, used = 0;
  char *text = malloc(cap);
  size_t n;
  while ((n = fread(text + used, 1, cap - used - 1, f)) > 0) {
    used += n;
    if (cap - used < 2) text = realloc(text, cap *= 2);
  }
  fclose(f);
  text[used] = '\0';
  return text;
}

static void write_config(stt_server_t *s) {
  char text[8192];
  snprintf(text, sizeof text,
           "-- written by the test fixture\n"
           "return {\n"
           "  base_path = \"%s\",\n"
           "  endpoints = \"%s\",\n"
           "  workers = 2,\n"
           "  log_level = \"debug\",\n"
           "  -- Tests build on the CPU unless an endpoint names a device, so the\n"
           "  -- same tests mean the same thing on hosts with and without a GPU.\n"
           "  default_device = \"cpu\",\n"
           "%s"
           "}\n",
           s->base, s->endpoints, s->extra_config);
  stt_write_file(s->config, text);
}

int stt_server_start(stt_server_t *s) {
  const char *bin = getenv("ST_SERVER_BIN");
  if (!bin) die("ST_SERVER_BIN is not set (run the tests through ctest)");
  write_config(s);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", strerror(errno));
  if (pid == 0) {
    int logfd = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (logfd >= 0) {
      dup2(logfd, 2);
      dup2(logfd, 1);
      close(logfd);
    }
    const char *argv[24];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--config";
    argv[n++] = s->config;
    for (int i = 0; i < 16 && s->extra_args[i]; i++) argv[n++] = s->extra_args[i];
    argv[n] = NULL;
    execv(bin, (char *const *)argv);
    fprintf(stderr, "fixture: exec %s: %s\n", bin, strerror(errno));
    _exit(127);
  }
  s->pid = pid;
  double deadline = stt_now_ms() + 10000;
  while (stt_now_ms() < deadline) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      s->pid = -1;
      char *log = stt_server_log(s);
      fprintf(stderr, "fixture: stserver exited during start (status %d); log:\n%s\n",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, log);
      free(log);
      return -1;
    }
    int fd = stt_connect(s->socket);
    if (fd >= 0) {
      int ok = stt_ping(fd, 1);
      close(fd);
      if (ok == 0) return 0;
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  char *log = stt_server_log(s);
  fprintf(stderr, "fixture: stserver did not answer ping within 10 s; log:\n%s\n", log);
  free(log);
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  s->pid = -1;
  return -1;
}

int stt_server_stop(stt_server_t *s) {
  if (s->pid <= 0) return -1;
  kill(s->pid, SIGTERM);
  double deadline = stt_now_ms() + 10000;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(s->pid, &status, WNOHANG);
    if (r == s->pid) break;
    if (stt_now_ms() > deadline) {
      fprintf(stderr, "fixture: stserver ignored SIGTERM for 10 s; killing it\n");
      kill(s->pid, SIGKILL);
      waitpid(s->pid, NULL, 0);
      s->pid = -1;
      return -1;
    }
    struct timespec ts = {0, 2 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  s->pid = -1;
  if (access(s->socket, F_OK) == 0) {
    fprintf(stderr, "fixture: socket %s still exists after exit\n", s->socket);
    return -1;
  }
  if (!WIFEXITED(status)) {
    char *log = stt_server_log(s);
    fprintf(stderr, "fixture: stserver died by signal %d; log:\n%s\n", WTERMSIG(status), log);
    free(log);
    return -1;
  }
  return WEXITSTATUS(status);
}

static void remove_tree(const char *path) {
  char cmd[700];
  /* Paths come from mkdtemp under /tmp: no quoting problems. */
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "fixture: could not remove %s\n", path);
}

void stt_server_cleanup(stt_server_t *s) {
  if (s->pid > 0) {
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = -1;
  }
  if (s->dir[0] && !getenv("STT_KEEP")) remove_tree(s->dir);
}
