/* Published keys of CUDA memory (docs/keys.md) through libstclient against
 * a real stserver, readers and publishers in processes of their own (this
 * program run again with --child: a fork cannot use the parent's CUDA):
 *   - a put of st_tensor_alloc("cuda:0") memory is that memory: a reader
 *     in another process reads it and its write shows in the publisher's
 *     allocation;
 *   - the publisher SIGKILLed: its device memory stays readable;
 *   - a read-only get maps with read access only: the reader's write
 *     fails (or kills the reader), the data and the server are unharmed.
 * (The CPU path: test_keys.c.) Exit 77 without a CUDA device. */
#include <signal.h>
#include <st/client.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "mem/cuda.h"

#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define N 4096

static stt_server_t srv;
static st_client_t *cli;

/* A cuda:0 float32 tensor of N elements i * scale (NULL on failure). */
static st_result_t *counting(float scale) {
  int64_t n = N;
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  static float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)i * scale;
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, h, t->nbytes, 0, err, sizeof err) !=
      ST_OK) {
    fprintf(stderr, "   fill: %s\n", err);
    st_result_free(r);
    return NULL;
  }
  return r;
}

static float elem(const st_tensor_t *t, int i) {
  static float h[N];
  return st_tensor_copy_to_host(t, h, sizeof h) == ST_OK ? h[i] : -1.0f;
}

static int put(st_client_t *c, const char *key, const st_tensor_t *t) {
  st_args_t *a = st_args_new();
  char err[256];
  int rc = st_args_tensor(a, "w", t, err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, a, ST_KEY_PINNED, 0, NULL);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s %s\n", key, err, st_client_error(c));
  st_args_free(a);
  return rc;
}

/* --child MODE SOCKET: one reader or publisher; exit 0 when it did what
 * MODE says (a read-only write that fails exits 0 too). */
static int child(const char *mode, const char *sock) {
  st_client_t *c = stt_client_open(sock);
  if (!c) return 90;
  st_result_t *r = NULL;
  if (strcmp(mode, "publish_and_die") == 0) {
    st_result_t *a = counting(3.0f);
    if (!a || put(c, "orphan", st_result_tensor(a, 0)) != ST_OK) return 91;
    kill(getpid(), SIGKILL);
  }
  int ro = strcmp(mode, "write_ro") == 0;
  if (st_client_get(c, "g", 0, ro ? ST_GET_READONLY : 0, &r, NULL) != ST_OK) return 92;
  const st_tensor_t *w = st_result_find(r, "w");
  if (!w || elem(w, 7) != 7.0f) return 93;
  float v = 42.0f;
  char err[256];
  int rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)w->data + 5 * sizeof v, &v, sizeof v, 0,
                                   err, sizeof err);
  if (ro) return rc == ST_OK ? 94 : 0;   /* a write through read access fails */
  return rc == ST_OK ? 0 : 95;
}

/* Runs this program with --child MODE; its exit code, or -signal. */
static int run_child(const char *mode) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    execl("/proc/self/exe", "test_gpu_keys", "--child", mode, srv.socket, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1000;
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

TEST(a_put_of_device_memory_is_that_memory) {
  st_result_t *a = counting(1.0f);
  CHECK(a);
  CHECK_EQ_INT(put(cli, "g", st_result_tensor(a, 0)), ST_OK);
  CHECK_EQ_INT(run_child("write"), 0);
  CHECK(elem(st_result_tensor(a, 0), 5) == 42.0f);   /* the reader wrote our memory */
  st_result_free(a);   /* the key keeps it */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "g", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 5) == 42.0f);
  st_result_free(r);
}

TEST(a_readonly_get_refuses_device_writes) {
  int rc = run_child("write_ro");
  CHECK(rc == 0 || rc < 0);   /* the write failed, or the reader died of it */
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "g", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 5) == 42.0f);   /* unchanged */
  CHECK(elem(st_result_find(r, "w"), 6) == 6.0f);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "g"), ST_OK, cli);
}

TEST(device_state_outlives_a_publisher_killed) {
  CHECK_EQ_INT(run_child("publish_and_die"), -SIGKILL);
  st_result_t *r = NULL;
  CHECK_RC(st_client_get(cli, "orphan", 0, 0, &r, NULL), ST_OK, cli);
  CHECK(elem(st_result_find(r, "w"), 4095) == 4095.0f * 3.0f);
  st_result_free(r);
  CHECK_RC(st_client_delete(cli, "orphan"), ST_OK, cli);
}

#endif

int main(int argc, char **argv) {
#ifdef ST_HAVE_CUDA
  if (argc == 4 && strcmp(argv[1], "--child") == 0) return child(argv[2], argv[3]);
#else
  (void)argc;
  (void)argv;
#endif
  gk_require_device();
#ifdef ST_HAVE_CUDA
  cli = stt_one_worker_client(&srv);
  if (!cli) return 1;
  RUN(a_put_of_device_memory_is_that_memory);
  RUN(a_readonly_get_refuses_device_writes);
  RUN(device_state_outlives_a_publisher_killed);
  st_client_close(cli);
  return stt_server_finish(&srv);
#else
  return 77;
#endif
}
