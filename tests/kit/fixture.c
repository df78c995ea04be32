/* Integration-test fixture: a real stserver in a private temp directory.
 * See fixture.h for the contract. Test-only code: setup failures abort the
 * test program with a message (a broken fixture is not a test result). */
#include "fixture.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <msgpack.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
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

void stt_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ log tails */

/* The logs of the servers between init and cleanup, copied (a server
 * struct may go out of scope before its cleanup when a check returns),
 * with how much of each was already printed. */
#define MAX_LOGS 16
static struct {
  char path[300];
  long shown;
} logs[MAX_LOGS];

static void print_tail(const char *path, long *shown, const char *why) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  if (size <= 0 || size <= *shown) {
    fclose(f);
    if (size > 0) fprintf(stderr, "--- %s: nothing new in %s\n", why, path);
    return;
  }
  char *text = malloc((size_t)size + 1);
  fseek(f, 0, SEEK_SET);
  size_t n = fread(text, 1, (size_t)size, f);
  fclose(f);
  text[n] = '\0';
  /* Back from the end to the start of the last STT_LOG_TAIL_LINES lines,
   * or to the end of what an earlier failure printed. */
  long start = (long)n, lines = 0;
  while (start > *shown) {
    start--;
    if (text[start] == '\n' && start + 1 < (long)n && ++lines == STT_LOG_TAIL_LINES) {
      start++;
      break;
    }
  }
  fprintf(stderr, "--- %s: %s%s\n%s", why, path,
          start > *shown ? " (last lines)" : "", text + start);
  if (n > 0 && text[n - 1] != '\n') fputc('\n', stderr);
  fprintf(stderr, "--- end of %s\n", path);
  *shown = (long)n;
  free(text);
}

static void print_all_tails(void) {
  for (int i = 0; i < MAX_LOGS; i++)
    if (logs[i].path[0]) print_tail(logs[i].path, &logs[i].shown, "stserver log");
}

static void track_log(const char *path, int on) {
  int slot = -1;
  for (int i = 0; i < MAX_LOGS; i++) {
    if (strcmp(logs[i].path, on ? "" : path) == 0) {
      slot = i;
      break;
    }
  }
  if (on && slot < 0) slot = 0; /* all taken: reuse the oldest */
  if (slot < 0) return;
  snprintf(logs[slot].path, sizeof logs[slot].path, "%s", on ? path : "");
  logs[slot].shown = 0;
  stt_fail_hook = print_all_tails;
}

void stt_server_print_log_tail(const stt_server_t *s, const char *why) {
  for (int i = 0; i < MAX_LOGS; i++)
    if (strcmp(logs[i].path, s->log) == 0) {
      print_tail(logs[i].path, &logs[i].shown, why);
      return;
    }
  long shown = 0;
  print_tail(s->log, &shown, why);
}

/* ------------------------------------------------------------ servers */

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
  track_log(s->log, 1);
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

void stt_write_endpoint_per_device(stt_server_t *s, const char *stem, const char *text) {
  static const char *const devices[] = {"cuda", "cpu"};
  for (int d = 0; d < 2; d++) {
    char name[200], out[8192];
    size_t used = 0;
    for (const char *p = text; *p && used + 8 < sizeof out;) {
      if (strncmp(p, "$DEVICE", 7) == 0) {
        used += (size_t)snprintf(out + used, sizeof out - used, "%s", devices[d]);
        p += 7;
      } else {
        out[used++] = *p++;
      }
    }
    out[used] = '\0';
    snprintf(name, sizeof name, "%s_%s.lua", stem, devices[d]);
    stt_write_endpoint(s, name, out);
  }
}

void stt_write_endpoints(stt_server_t *s, const stt_endpoint_t *eps) {
  for (; eps && eps->name; eps++) stt_write_endpoint(s, eps->name, eps->text);
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

int stt_send_fds(int fd, const void *buf, size_t len, const int *fds, int nfds) {
  if (nfds <= 0) return stt_send_all(fd, buf, len);
  union {
    char buf[CMSG_SPACE(sizeof(int) * ST_MAX_FDS_PER_MESSAGE)];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                      .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
  memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
  ssize_t n;
  do n = sendmsg(fd, &mh, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0 || (n == 0 && len > 0)) return -1;
  return stt_send_all(fd, (const char *)buf + n, len - (size_t)n);
}

/* Ends the probe connection fd as a client leaving does (its write side
 * shut) and waits (2 s at most) for the server to close its side, so that
 * the server holds no descriptor of it when the test starts counting
 * them. */
static void await_close(int fd) {
  shutdown(fd, SHUT_WR);
  double end = stt_now_ms() + 2000;
  char buf[256];
  while (stt_now_ms() < end) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 50) < 0 && errno != EINTR) return;
    if (p.revents && read(fd, buf, sizeof buf) <= 0) return;
  }
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
  /* STT_LOOP_THREADS=N runs every fixture server on N loop threads (the
   * suite is run so with 1 and 4); a test's own setting comes later in
   * the table and wins. */
  char loops[64] = "";
  const char *nl = getenv("STT_LOOP_THREADS");
  if (nl && nl[0]) snprintf(loops, sizeof loops, "  loop_threads = %d,\n", atoi(nl));
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
           "%s%s"
           "}\n",
           s->base, s->endpoints, loops, s->extra_config);
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
    if (s->netns[0]) {   /* a network namespace of the test's (ip netns add) */
      char ns[128];
      snprintf(ns, sizeof ns, "/var/run/netns/%s", s->netns);
      int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
      if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "fixture: network namespace %s: %s\n", ns, strerror(errno));
        _exit(127);
      }
      close(nsfd);
      /* As `ip netns exec` does: a /sys of this namespace's devices (UCX
       * finds interfaces there), in a mount namespace of the server's. */
      if (unshare(CLONE_NEWNS) != 0 || mount("", "/", NULL, MS_SLAVE | MS_REC, NULL) != 0 ||
          umount2("/sys", MNT_DETACH) != 0 || mount(s->netns, "/sys", "sysfs", 0, NULL) != 0) {
        fprintf(stderr, "fixture: /sys of network namespace %s: %s\n", ns, strerror(errno));
        _exit(127);
      }
    }
    const char *argv[24];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "--config";
    argv[n++] = s->config;
    for (int i = 0; i < 16 && s->extra_args[i]; i++) argv[n++] = s->extra_args[i];
    argv[n] = NULL;
    if (s->before_exec) s->before_exec(s->before_exec_ud);
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
      fprintf(stderr, "fixture: stserver exited during start (status %d)\n",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      stt_server_print_log_tail(s, "stserver log");
      return -1;
    }
    int fd = stt_connect(s->socket);
    if (fd >= 0) {
      int ok = stt_ping(fd, 1);
      if (ok == 0) await_close(fd);
      close(fd);
      if (ok == 0) return 0;
    }
    stt_sleep_ms(5);
  }
  fprintf(stderr, "fixture: stserver did not answer ping within 10 s\n");
  stt_server_print_log_tail(s, "stserver log");
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
    stt_sleep_ms(2);
  }
  s->pid = -1;
  if (access(s->socket, F_OK) == 0) {
    fprintf(stderr, "fixture: socket %s still exists after exit\n", s->socket);
    return -1;
  }
  if (!WIFEXITED(status)) {
    fprintf(stderr, "fixture: stserver died by signal %d\n", WTERMSIG(status));
    stt_server_print_log_tail(s, "stserver log");
    return -1;
  }
  if (WEXITSTATUS(status) != 0) {
    fprintf(stderr, "fixture: stserver exited with status %d\n", WEXITSTATUS(status));
    stt_server_print_log_tail(s, "stserver log");
  }
  return WEXITSTATUS(status);
}

int stt_server_wait_exit(stt_server_t *s, int timeout_ms) {
  double end = stt_now_ms() + timeout_ms;
  while (s->pid > 0 && stt_now_ms() < end) {
    int st;
    if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
      s->pid = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    }
    stt_sleep_ms(2);
  }
  return -1;
}

int stt_server_run(stt_server_t *s, void (*body)(stt_server_t *s)) {
  if (stt_server_start(s) != 0) return -1;
  body(s);
  int status = stt_server_stop(s);
  if (status != 0) fprintf(stderr, "fixture: stserver stopped with status %d\n", status);
  return status == 0 ? 0 : -1;
}

void stt_server_prepare(stt_server_t *s, const char *lua_fields, const stt_endpoint_t *eps) {
  stt_server_init(s);
  if (lua_fields) stt_server_config(s, lua_fields);
  stt_write_endpoints(s, eps);
}

void stt_server_setup(stt_server_t *s, const char *lua_fields, const stt_endpoint_t *eps) {
  stt_server_prepare(s, lua_fields, eps);
  stt_server_start_or_exit(s);
}

void stt_server_start_or_exit(stt_server_t *s) {
  if (stt_server_start(s) == 0) return;
  stt_server_cleanup(s);
  exit(1);
}

int stt_server_finish(stt_server_t *s) {
  return stt_server_end(s, stt_server_stop(s));
}

int stt_server_end(stt_server_t *s, int status) {
  if (status != 0) stt_fail_main(__FILE__, __LINE__, "stserver exit status %d", status);
  stt_server_cleanup(s);
  return stt_summary();
}

void stt_remove_tree(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) stt_remove_tree(p);
    else unlink(p);
  }
  if (d) closedir(d);
  rmdir(dir);
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
  track_log(s->log, 0);
  if (s->dir[0] && !getenv("STT_KEEP")) remove_tree(s->dir);
}
