/* Live keys of CUDA memory (docs/views.md, section 3) through libstclient
 * against a real stserver, readers and publishers in processes of their
 * own (this program run again with --child: a fork cannot use the
 * parent's CUDA):
 *   - updates in place (st_key_update from device memory, and begin,
 *     a device write, end) are seen by a reader process at the same
 *     device address, after st_key_wait_version;
 *   - a reader process verifies consistent reads (a device-to-host copy
 *     between st_key_read_begin and st_key_read_end) while the publisher
 *     updates: every consistent read holds one version;
 *   - a reader's mapping is read-only: its device write fails (or kills
 *     it), the key is unharmed;
 *   - the publisher SIGKILLed between begin and end: the key is TORN until
 *     a live put of the uid copies new device values in.
 * (The CPU path: test_live.c.) Exit 77 without a CUDA device. */
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

#define N (1 << 20)   /* float32: 4 MiB */
#define READS 200

static stt_server_t srv;
static st_client_t *cli;
static float host[N];

/* A cuda:0 float32 tensor of N elements all `v` (NULL on failure). */
static st_result_t *filled(float v) {
  int64_t n = N;
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc: %s\n", err);
    return NULL;
  }
  for (int i = 0; i < N; i++) host[i] = v;
  const st_tensor_t *t = st_result_tensor(r, 0);
  if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data, host, t->nbytes, 0, err,
                              sizeof err) != ST_OK) {
    fprintf(stderr, "   fill: %s\n", err);
    st_result_free(r);
    return NULL;
  }
  return r;
}

/* 1 when every element of device tensor t is the same; *v gets it. */
static int uniform(const st_tensor_t *t, float *v) {
  if (st_tensor_copy_to_host(t, host, sizeof host) != ST_OK) return 0;
  for (int i = 1; i < N; i++)
    if (host[i] != host[0]) return 0;
  *v = host[0];
  return 1;
}

static int put_live(st_client_t *c, const char *key, const st_tensor_t *t) {
  st_args_t *a = st_args_new();
  char err[256];
  int rc = st_args_tensor(a, "w", t, err, sizeof err);
  if (rc == ST_OK) rc = st_client_put(c, key, a, ST_KEY_PINNED, ST_PUT_LIVE, NULL);
  if (rc != ST_OK) fprintf(stderr, "   put %s: %s %s\n", key, err, st_client_error(c));
  st_args_free(a);
  return rc;
}

/* One update of the key to all `v` from a fresh device tensor. */
static int update_to(st_key_t *k, float v) {
  st_result_t *src = filled(v);
  if (!src) return -1;
  st_tensor_t t = *st_result_tensor(src, 0);
  t.name = "w";
  const st_tensor_t *list[1] = {&t};
  int rc = st_key_update(k, list, 1);
  st_result_free(src);
  return rc;
}

/* --child MODE SOCKET; exit 0 when it did what MODE says. */
static int child(const char *mode, const char *sock) {
  st_client_t *c = stt_client_open(sock);
  st_key_t *k = NULL;
  if (!c) return 90;
  if (strcmp(mode, "die_mid_update") == 0) {
    st_result_t *a = filled(1.0f);
    if (!a || put_live(c, "torn", st_result_tensor(a, 0)) != ST_OK) return 91;
    if (st_key_open(c, "torn", 0, &k) != ST_OK || st_key_begin_update(k) != ST_OK) return 92;
    kill(getpid(), SIGKILL);
  }
  if (st_key_open(c, "g", 0, &k) != ST_OK) return 93;
  const st_tensor_t *w = st_result_find(st_key_result(k), "w");
  void *before = w->data;
  if (strcmp(mode, "write_ro") == 0) {
    float v = 42.0f;
    char err[256];
    return st__cuda_copy_to_device((uint64_t)(uintptr_t)w->data, &v, sizeof v, 0, err,
                                   sizeof err) == ST_OK ? 94 : 0;
  }
  /* "read": wait for version 2 (all 2.0), then READS consistent reads */
  if (st_key_wait_version(k, 2, 30000, NULL) != ST_OK) return 95;
  int consistent = 0, torn_checked = 0;
  for (int i = 0; i < READS; i++) {
    uint64_t seq;
    int ok = 0;
    float v;
    if (st_key_read_begin(k, 30000, &seq) != ST_OK) return 96;
    int one = uniform(w, &v);
    if (st_key_read_end(k, seq, NULL, &ok) != ST_OK) return 97;
    if (!ok) continue;
    consistent++;
    if (!one || v != (float)(seq / 2)) torn_checked++;
  }
  if (w->data != before) return 98;
  fprintf(stderr, "   reader: %d consistent reads of %d, %d wrong\n", consistent, READS,
          torn_checked);
  return consistent > 0 && torn_checked == 0 ? 0 : 99;
}

/* Starts this program with --child MODE. */
static pid_t start_child(const char *mode) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    execl("/proc/self/exe", "test_gpu_live", "--child", mode, srv.socket, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Its exit code, or -signal. */
static int end_child(pid_t pid) {
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1000;
  return WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
}

TEST(device_updates_in_place_and_consistent_reads) {
  st_result_t *a = filled(1.0f);
  CHECK(a);
  CHECK_EQ_INT(put_live(cli, "g", st_result_tensor(a, 0)), ST_OK);
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(cli, "g", 0, &k), ST_OK, cli);
  CHECK(st_key_is_publisher(k));
  pid_t r = start_child("read");
  CHECK_EQ_INT(update_to(k, 2.0f), ST_OK);
  /* updates meanwhile: version v holds all v (device writes, then end) */
  for (int v = 3; v < 300; v++) CHECK_EQ_INT(update_to(k, (float)v), ST_OK);
  CHECK_EQ_INT(end_child(r), 0);
  float v = 0;
  CHECK(uniform(st_result_tensor(a, 0), &v) && v == 299.0f);   /* in place */
  CHECK_EQ_INT(st_key_version(k), 299);
  int wr = end_child(start_child("write_ro"));
  CHECK(wr == 0 || wr < 0);   /* the write failed, or the reader died of it */
  CHECK(uniform(st_result_tensor(a, 0), &v) && v == 299.0f);   /* unharmed */
  st_key_close(k);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "g"), ST_OK, cli);
}

TEST(a_device_publisher_killed_mid_update_tears_the_key) {
  CHECK_EQ_INT(end_child(start_child("die_mid_update")), -SIGKILL);
  st_result_t *r = NULL;
  int rc = ST_OK;
  for (int i = 0; i < 5000 && (rc = st_client_get(cli, "torn", 0, 0, &r, NULL)) == ST_OK; i++) {
    st_result_free(r);
    r = NULL;
    usleep(2000);
  }
  CHECK_EQ_INT(rc, ST_ERR_STALE_HANDLE);
  st_result_t *b = filled(7.0f);
  CHECK(b);
  CHECK_EQ_INT(put_live(cli, "torn", st_result_tensor(b, 0)), ST_OK);
  CHECK_RC(st_client_get(cli, "torn", 0, 0, &r, NULL), ST_OK, cli);
  float v = 0;
  CHECK(uniform(st_result_find(r, "w"), &v) && v == 7.0f);
  st_result_free(r);
  st_result_free(b);
  CHECK_RC(st_client_delete(cli, "torn"), ST_OK, cli);
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
  stt_server_setup(&srv, "workers = 1,", NULL);
  cli = stt_client_open(srv.socket);
  if (!cli) return 1;
  st_client_set_timeout(cli, 60000);
  RUN(device_updates_in_place_and_consistent_reads);
  RUN(a_device_publisher_killed_mid_update_tears_the_key);
  st_client_close(cli);
  return stt_server_finish(&srv);
#else
  return 77;
#endif
}
