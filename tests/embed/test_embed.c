/* libstembed from outside, as a host program uses it (include/st/embed.h):
 * an in-process server started, called with libstclient and stopped,
 * three times in one process, leaving no descriptor, thread or directory
 * behind;
 * a stop while a call runs lets it finish; a server the host forgot is
 * stopped at exit; endpoint errors come back as file:line; the foreground
 * server answers, reloads on SIGHUP and exits 0 on SIGTERM.
 *
 * TMPDIR points at a private directory, so every socket directory the
 * library makes is checked there. Never sleeps blindly: polls with
 * deadlines. */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "st/client.h"
#include "st/embed.h"

static char tmp[256];        /* TMPDIR of this test: where embeds make dirs */
static char work[300];       /* endpoint files */

/* A zero-branch script: what lua/st/zerobranch.lua hands the library. */
static const char *const SCRIPT =
    "local app = require('st.zerobranch').app()\n"
    "app:endpoint { name = 'ones', params = { n = 4 }, cache = true,\n"
    "               build = function(a) return st.ones { a.n } end }\n"
    "app:endpoint { name = 'slow', params = { s = 0.3 },\n"
    "               build = function(a) st.sleep(a.s) return 'done' end }\n"
    "app:main(function(c) error('the server never runs main') end)\n";

/* Entries of a /proc/self directory, skipping those `skip` says to. */
static int count_entries(const char *dir, int (*skip)(const char *dir, const char *name)) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.' && !(skip && skip(dir, e->d_name))) n++;
  closedir(d);
  return n;
}

/* Descriptors a GPU driver keeps for the life of the process are not
 * leaks of ours. */
static int driver_fd(const char *dir, const char *name) {
  char path[512], target[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n < 0) return 1;   /* the opendir fd itself, gone by now */
  target[n] = '\0';
  return strncmp(target, "/dev/nvidia", 11) == 0;
}

static int open_fds(void) {
  return count_entries("/proc/self/fd", driver_fd);
}

static int threads(void) {
  return count_entries("/proc/self/task", NULL);
}

/* Waits until the thread count is `want` (joined threads leave the task
 * list at once; this only absorbs the kernel's bookkeeping). */
static int threads_settle(int want) {
  double end = stt_now_ms() + 2000;
  int n = threads();
  while (n != want && stt_now_ms() < end) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    n = threads();
  }
  return n;
}

static int exists(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0;
}

static void write_file(const char *name, const char *text) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", work, name);
  stt_write_file(path, text);
}

static void options(st_embed_options_t *o, const char *file, char *path, size_t len) {
  memset(o, 0, sizeof *o);
  snprintf(path, len, "%s/%s", work, file);
  o->endpoints = path;
  o->device = -1;
  o->workers = 2;
}

/* The directory of a socket path, into out. */
static void dir_of(const char *path, char *out, size_t len) {
  snprintf(out, len, "%s", path);
  char *slash = strrchr(out, '/');
  if (slash) *slash = '\0';
}

/* On a GPU host the first start initializes CUDA in this process, whose
 * driver keeps threads and descriptors until exit: then only the later
 * rounds must come back to the counts of the end of the first. */
static int gpu_host(void) {
  return access("/dev/nvidiactl", F_OK) == 0;
}

TEST(start_call_stop_repeatedly) {
  write_file("app.lua", SCRIPT);
  int fds0 = open_fds(), threads0 = threads();
  for (int round = 0; round < 3; round++) {
    st_embed_options_t o;
    char file[600], err[1024] = "";
    options(&o, "app.lua", file, sizeof file);
    st_embed_t *e = NULL;
    CHECK_ERR_MSG(st_embed_start(&o, &e, err, sizeof err), ST_OK, err);
    CHECK(e != NULL);
    const char *path = st_embed_socket_path(e);
    char dir[512];
    dir_of(path, dir, sizeof dir);
    CHECK(strncmp(dir, tmp, strlen(tmp)) == 0);   /* under $TMPDIR */
    struct stat st;
    CHECK(stat(dir, &st) == 0);
    CHECK_EQ_INT(st.st_mode & 0777, 0700);
    CHECK(exists(path));
    CHECK(threads() > threads0);                  /* the loop and 2 workers */

    st_client_t *c;
    CHECK_ERR_MSG(st_client_connect(path, &c, err, sizeof err), ST_OK, err);
    CHECK_EQ_INT(st_client_server_pid(c), getpid());   /* this process */
    st_args_t *a = st_args_new();
    st_args_int(a, "n", 3);
    st_result_t *r;
    CHECK_RC(st_client_call(c, "ones", a, &r), ST_OK, c);
    st_args_free(a);
    CHECK_EQ_INT(st_result_tensor_count(r), 1);
    const st_tensor_t *t = st_result_tensor(r, 0);
    CHECK_EQ_INT(t->numel, 3);
    CHECK(st_tensor_get(t, 2) == 1.0);
    st_result_free(r);
    CHECK_RC(st_client_call(c, "nope", NULL, &r), ST_ERR_UNKNOWN_ENDPOINT, c);
    st_client_close(c);

    CHECK_ERR(st_embed_stop(e), ST_OK);
    CHECK(!exists(path));
    CHECK(!exists(dir));
    if (round == 0 && gpu_host()) {
      threads0 = threads();
      fds0 = open_fds();
      continue;
    }
    CHECK_EQ_INT(threads_settle(threads0), threads0);
    CHECK_EQ_INT(open_fds(), fds0);
  }
  CHECK_ERR(st_embed_stop(NULL), ST_OK);
}

typedef struct slow_call {
  const char *path;
  int rc;
  char value[64];
} slow_call_t;

static void *call_slow(void *arg) {
  slow_call_t *s = arg;
  char err[256];
  st_client_t *c;
  s->rc = st_client_connect(s->path, &c, err, sizeof err);
  if (s->rc != ST_OK) return NULL;
  st_result_t *r;
  s->rc = st_client_call(c, "slow", NULL, &r);
  if (s->rc == ST_OK) {
    const st_value_t *v = st_result_value(r);
    if (v->kind == ST_VALUE_STRING) snprintf(s->value, sizeof s->value, "%s", v->as.str.ptr);
    st_result_free(r);
  }
  st_client_close(c);
  return NULL;
}

/* Number `key` of the info map, or -1. */
static long long info_int(st_client_t *c, const char *key) {
  st_result_t *r;
  if (st_client_info(c, &r) != ST_OK) return -1;
  const st_value_t *v = st_value_get(st_result_value(r), key);
  long long n = v && v->kind == ST_VALUE_INT ? (long long)v->as.integer : -1;
  st_result_free(r);
  return n;
}

TEST(stop_lets_a_running_call_finish) {
  write_file("app.lua", SCRIPT);
  st_embed_options_t o;
  char file[600], err[1024] = "";
  options(&o, "app.lua", file, sizeof file);
  st_embed_t *e;
  CHECK_ERR_MSG(st_embed_start(&o, &e, err, sizeof err), ST_OK, err);
  slow_call_t s = {.path = st_embed_socket_path(e), .rc = 1};
  st_client_t *c;
  CHECK_ERR_MSG(st_client_connect(s.path, &c, err, sizeof err), ST_OK, err);
  pthread_t th;
  CHECK_EQ_INT(pthread_create(&th, NULL, call_slow, &s), 0);
  double end = stt_now_ms() + 5000;
  while (info_int(c, "inflight") < 1 && stt_now_ms() < end) {
  }
  CHECK_EQ_INT(info_int(c, "inflight"), 1);
  st_client_close(c);
  CHECK_ERR(st_embed_stop(e), ST_OK);   /* drains: returns after the call */
  pthread_join(th, NULL);
  CHECK_ERR(s.rc, ST_OK);
  CHECK_STR_EQ(s.value, "done");
}

TEST(bad_endpoint_file_gives_file_line) {
  write_file("syntax.lua", "local app = require('st.zerobranch').app()\n"
                           "app:endpoint { name = 'x' build = 1 }\n");
  write_file("option.lua", "local app = require('st.zerobranch').app()\n"
                           "app:endpoint { name = 'x', build = function() end }\n"
                           "app:endpoint { name = 'y', timout = 2, build = function() end }\n");
  write_file("main.lua", "local app = require('st.zerobranch').app()\n"
                         "app:endpoint { name = 'x', build = function() end }\n"
                         "app:main(42)\n");
  write_file("empty.lua", "local app = require('st.zerobranch').app()\n");
  static const struct {
    const char *file, *want;
  } cases[] = {
      {"syntax.lua", "syntax.lua:2: '}' expected near 'build'"},
      {"option.lua", "option.lua:3: unknown option 'timout'"},
      {"main.lua", "main.lua:3: app:main expects a function, got number"},
      {"empty.lua", "empty.lua: the script makes an app but declares no endpoint"},
      {"missing.lua", "missing.lua: cannot open the endpoints directory or file"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    st_embed_options_t o;
    char file[600], err[2048] = "";
    options(&o, cases[i].file, file, sizeof file);
    st_embed_t *e = (st_embed_t *)&o;
    CHECK_ERR_MSG(st_embed_start(&o, &e, err, sizeof err), ST_ERR_CONFIGURATION, err);
    CHECK(e == NULL);
    CHECK_CONTAINS(err, cases[i].want);
  }
  st_embed_options_t o;
  memset(&o, 0, sizeof o);
  char err[256];
  st_embed_t *e;
  CHECK_ERR_MSG(st_embed_start(&o, &e, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "endpoints");
  CHECK_ERR_MSG(st_embed_serve(&o, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  /* Nothing was left in $TMPDIR by the failed starts. */
  CHECK_EQ_INT(count_entries(tmp, NULL), 0);
}

TEST(atexit_stops_a_forgotten_server) {
  write_file("app.lua", SCRIPT);
  int pipefd[2];
  CHECK(pipe(pipefd) == 0);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    close(pipefd[0]);
    st_embed_options_t o;
    char file[600], err[1024];
    options(&o, "app.lua", file, sizeof file);
    st_embed_t *e;
    if (st_embed_start(&o, &e, err, sizeof err) != ST_OK) _exit(2);
    const char *path = st_embed_socket_path(e);
    if (write(pipefd[1], path, strlen(path) + 1) < 0) _exit(3);
    exit(0);   /* no st_embed_stop: the atexit handler stops it */
  }
  close(pipefd[1]);
  char path[512] = "";
  ssize_t n = read(pipefd[0], path, sizeof path - 1);
  close(pipefd[0]);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);
  CHECK(n > 0);
  char dir[512];
  dir_of(path, dir, sizeof dir);
  CHECK(!exists(path));
  CHECK(!exists(dir));
}

TEST(serve_in_the_foreground) {
  write_file("served.lua", "local app = require('st.zerobranch').app()\n"
                           "app:endpoint { name = 'v', build = function() return 1 end }\n");
  char base[512];
  snprintf(base, sizeof base, "%s/fg", work);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    st_embed_options_t o;
    char file[600], err[1024];
    options(&o, "served.lua", file, sizeof file);
    o.base_path = base;
    o.log_level = "warn";
    _exit(st_embed_serve(&o, err, sizeof err) == ST_OK ? 0 : 1);
  }
  char sock[600], err[512];
  snprintf(sock, sizeof sock, "%s-0.sock", base);
  st_client_t *c = NULL;
  double end = stt_now_ms() + 10000;
  while (st_client_connect(sock, &c, err, sizeof err) != ST_OK && stt_now_ms() < end) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
  }
  CHECK(c != NULL);
  CHECK_EQ_INT(st_client_server_pid(c), pid);
  st_result_t *r;
  CHECK_RC(st_client_call(c, "v", NULL, &r), ST_OK, c);
  st_result_free(r);
  /* SIGHUP reloads the file: 'w' appears. */
  write_file("served.lua", "local app = require('st.zerobranch').app()\n"
                           "app:endpoint { name = 'v', build = function() return 1 end }\n"
                           "app:endpoint { name = 'w', build = function() return 2 end }\n");
  CHECK(kill(pid, SIGHUP) == 0);
  int rc = ST_ERR_UNKNOWN_ENDPOINT;
  end = stt_now_ms() + 10000;
  while (rc == ST_ERR_UNKNOWN_ENDPOINT && stt_now_ms() < end) {
    rc = st_client_call(c, "w", NULL, &r);
    if (rc == ST_OK) st_result_free(r);
  }
  CHECK_RC(rc, ST_OK, c);
  st_client_close(c);
  CHECK(kill(pid, SIGTERM) == 0);
  int status;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK_EQ_INT(WEXITSTATUS(status), 0);
  CHECK(!exists(sock));
}

int main(void) {
  snprintf(tmp, sizeof tmp, "/tmp/stt-embed-XXXXXX");
  if (!mkdtemp(tmp)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(work, sizeof work, "%s-work", tmp);
  if (mkdir(work, 0700) != 0) {
    perror("mkdir");
    return 1;
  }
  setenv("TMPDIR", tmp, 1);
  RUN(start_call_stop_repeatedly);
  RUN(stop_lets_a_running_call_finish);
  RUN(bad_endpoint_file_gives_file_line);
  RUN(atexit_stops_a_forgotten_server);
  RUN(serve_in_the_foreground);
  int leftover = count_entries(tmp, NULL);
  if (leftover != 0) {
    fprintf(stderr, "%d entries left in %s\n", leftover, tmp);
    stt_failed++;
  }
  char cmd[700];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", tmp, work);
  if (!getenv("STT_KEEP") && system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmp);
  return stt_summary();
}
