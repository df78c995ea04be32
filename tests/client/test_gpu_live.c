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
#include <sys/resource.h>

#include "buffer_kit.h"
#include "handoff_kit.h"
#include "live_kit.h"

#ifdef ST_HAVE_CUDA

#define N (1 << 20)   /* float32: 4 MiB */
#define READS 200

static stt_server_t srv;
static st_client_t *cli;
static float host[N];

/* A cuda:0 float32 tensor of N elements all `v` (NULL on failure). */
static st_result_t *filled(float v) {
  for (int i = 0; i < N; i++) host[i] = v;
  int64_t n = N;
  st_result_t *r = NULL;
  char err[256] = "";
  int rc = st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err);
  if (rc == ST_OK)
    rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)st_result_tensor(r, 0)->data, host,
                                 sizeof host, 0, err, sizeof err);
  if (rc == ST_OK) return r;
  fprintf(stderr, "   a cuda:0 tensor: %s\n", err);
  st_result_free(r);
  return NULL;
}

/* 1 when every element of device tensor t is the same; *v gets it. */
static int uniform(const st_tensor_t *t, float *v) {
  if (st_tensor_copy_to_host(t, host, sizeof host) != ST_OK) return 0;
  for (int i = 1; i < N; i++)
    if (host[i] != host[0]) return 0;
  *v = host[0];
  return 1;
}

/* One update of the key to all `v` from a fresh device tensor. */
static int update_to(st_key_t *k, float v) { return lk_update(k, filled(v)); }

enum { READ, WRITE_RO, DIE_MID_UPDATE };

/* What a child does (this program run again: bk_spawn_exec); its exit
 * code: 0 when it did what `mode` says. */
static int child(long mode, const char *sock) {
  st_client_t *c = stt_client_open(sock);
  st_key_t *k = NULL;
  if (!c) return 90;
  struct rlimit none = {0, 0};
  setrlimit(RLIMIT_CORE, &none);
  if (mode == DIE_MID_UPDATE) {
    st_result_t *a = filled(1.0f);
    if (!a || lk_put_live(c, "torn", st_result_tensor(a, 0), ST_KEY_PINNED, NULL) != ST_OK)
      return 91;
    if (st_key_open(c, "torn", 0, &k) != ST_OK || st_key_begin_update(k) != ST_OK) return 92;
    kill(getpid(), SIGKILL);
  }
  if (st_key_open(c, "g", 0, &k) != ST_OK) return 93;
  const st_tensor_t *w = st_result_find(st_key_result(k), "w");
  void *before = w->data;
  if (mode == WRITE_RO) {
    float v = 42.0f;
    char err[256];
    uint64_t to = (uint64_t)(uintptr_t)w->data;
    return st__cuda_copy_to_device(to, &v, sizeof v, 0, err, sizeof err) == ST_OK ? 94 : 0;
  }
  /* READ: wait for version 2 (all 2.0), then READS consistent reads */
  if (st_key_wait_version(k, 2, 30000, NULL) != ST_OK) return 95;
  int consistent = 0, wrong = 0;
  for (int i = 0; i < READS; i++) {
    uint64_t seq;
    int ok = 0;
    float v;
    if (st_key_read_begin(k, 30000, &seq) != ST_OK) return 96;
    int one = uniform(w, &v);
    if (st_key_read_end(k, seq, NULL, &ok) != ST_OK) return 97;
    consistent += ok;
    wrong += ok && (!one || v != (float)(seq / 2));
  }
  fprintf(stderr, "   reader: %d consistent reads of %d, %d wrong\n", consistent, READS, wrong);
  if (w->data != before) return 98;
  return consistent > 0 && wrong == 0 ? 0 : 99;
}

static const char *self;

/* Starts a child doing `mode`. */
static void start(bk_child_t *k, long mode) {
  if (bk_spawn_exec(k, self, srv.socket, "-", mode) != 0) k->pid = -1;
}

/* Its exit code, or -signal. */
static int end_child(bk_child_t *k) {
  int st = bk_end(k, 0);
  return WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st);
}

TEST(device_updates_in_place_and_consistent_reads) {
  st_result_t *a = filled(1.0f);
  CHECK(a);
  CHECK_EQ_INT(lk_put_live(cli, "g", st_result_tensor(a, 0), ST_KEY_PINNED, NULL), ST_OK);
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(cli, "g", 0, &k), ST_OK, cli);
  CHECK(st_key_is_publisher(k));
  bk_child_t r, w;
  start(&r, READ);
  CHECK_EQ_INT(update_to(k, 2.0f), ST_OK);
  /* updates meanwhile: version v holds all v (device writes, then end).
   * A 5 ms pause after each leaves the reader windows with no update: a
   * read that takes longer than the gap between two updates (a 4 MiB copy
   * to the host and its synchronize) overlaps one and is (rightly)
   * inconsistent, so with short gaps every read could be. */
  for (int v = 3; v < 300; v++) {
    CHECK_EQ_INT(update_to(k, (float)v), ST_OK);
    usleep(5000);
  }
  CHECK_EQ_INT(end_child(&r), 0);
  float v = 0;
  CHECK(uniform(st_result_tensor(a, 0), &v) && v == 299.0f);   /* in place */
  CHECK_EQ_INT(st_key_version(k), 299);
  start(&w, WRITE_RO);
  int wr = end_child(&w);
  CHECK(wr == 0 || wr < 0);   /* the write failed, or the reader died of it */
  CHECK(uniform(st_result_tensor(a, 0), &v) && v == 299.0f);   /* unharmed */
  st_key_close(k);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "g"), ST_OK, cli);
}

TEST(a_device_publisher_killed_mid_update_tears_the_key) {
  bk_child_t p;
  start(&p, DIE_MID_UPDATE);
  CHECK_EQ_INT(end_child(&p), -SIGKILL);
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
  CHECK_EQ_INT(lk_put_live(cli, "torn", st_result_tensor(b, 0), ST_KEY_PINNED, NULL), ST_OK);
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
  /* --child MODE SOCKET NAME FD */
  if (argc == 6 && strcmp(argv[1], "--child") == 0) return child(atol(argv[2]), argv[3]);
  self = argv[0];
  cli = hk_gpu_start(&srv);
  if (!cli) return 1;
  RUN(device_updates_in_place_and_consistent_reads);
  RUN(a_device_publisher_killed_mid_update_tears_the_key);
  return stt_client_finish(cli, &srv);
#else
  (void)argc;
  (void)argv;
  return 77;
#endif
}
