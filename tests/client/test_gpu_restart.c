/* Published CUDA keys across a crash of the server under a service
 * manager (docs/lifecycle.md, "Restarts"; the CPU test is
 * test_restart.c, which this one follows): the test plays systemd's part
 * (tests/kit/svcmgr.h). A key of one CUDA allocation of each size in
 * $ST_GPU_RESTART_GIB (GiB, comma-separated; default 1: the GPU host's
 * run sets "1,16") and a small key of three versions are put, the server
 * is SIGKILLed and started again with the stored descriptors:
 *   - every version is back and its bytes equal what was put (the whole
 *     allocation compared, 64 MiB at a time);
 *   - the memory is the same (no copy): the device's free memory does not
 *     drop by the key's size across the restart, and a write into the
 *     publisher's own allocation after the restart is what a new get
 *     maps;
 *   - the time from the new process's start to a client's first get of
 *     the big key is printed ("restart to serving").
 * Exit 77 without a CUDA device. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client_kit.h"
#include "fixture.h"
#include "svcmgr.h"

#include "../server/gpu_kit.h"

#ifdef ST_HAVE_CUDA

#define CHUNK ((uint64_t)64 << 20)

static stt_server_t S;
static stt_svcmgr_t M;

/* The float every element of chunk k holds. */
static float chunk_value(uint64_t k) { return (float)(k % 1000) + 0.5f; }

/* A CUDA float32 tensor of `bytes`, chunk k all chunk_value(k). */
static st_result_t *device_filled(uint64_t bytes) {
  int64_t n = (int64_t)(bytes / 4);
  st_result_t *r = NULL;
  char err[256];
  if (st_tensor_alloc("cuda:0", ST_DTYPE_FLOAT32, 1, &n, &r, err, sizeof err) != ST_OK) {
    fprintf(stderr, "   st_tensor_alloc of %" PRIu64 " bytes: %s\n", bytes, err);
    return NULL;
  }
  float *h = malloc(CHUNK);
  const st_tensor_t *t = st_result_tensor(r, 0);
  for (uint64_t off = 0, k = 0; h && off < bytes; off += CHUNK, k++) {
    uint64_t len = bytes - off < CHUNK ? bytes - off : CHUNK;
    for (uint64_t i = 0; i < len / 4; i++) h[i] = chunk_value(k);
    if (st__cuda_copy_to_device((uint64_t)(uintptr_t)t->data + off, h, len, 0, err,
                                sizeof err) != ST_OK) {
      fprintf(stderr, "   fill: %s\n", err);
      free(h);
      st_result_free(r);
      return NULL;
    }
  }
  free(h);
  return r;
}

/* Whether device tensor t holds the pattern of device_filled. */
static int device_equal(const st_tensor_t *t, uint64_t bytes) {
  float *h = malloc(CHUNK);
  char err[256];
  int ok = h != NULL && t && (uint64_t)t->nbytes == bytes;
  for (uint64_t off = 0, k = 0; ok && off < bytes; off += CHUNK, k++) {
    uint64_t len = bytes - off < CHUNK ? bytes - off : CHUNK;
    if (st__cuda_copy_to_host(h, (uint64_t)(uintptr_t)t->data + off, len, 0, err, sizeof err) !=
        ST_OK) {
      fprintf(stderr, "   read back: %s\n", err);
      ok = 0;
      break;
    }
    for (uint64_t i = 0; ok && i < len / 4; i++) ok = h[i] == chunk_value(k);
    if (!ok) fprintf(stderr, "   chunk %" PRIu64 " differs\n", k);
  }
  free(h);
  return ok;
}

static int put_one(st_client_t *c, const char *key, st_result_t *t, uint64_t *v) {
  st_args_t *a = st_args_new();
  int rc = st_args_tensor(a, "w", st_result_tensor(t, 0), NULL, 0);
  if (rc == ST_OK) rc = stt_client_report(c, key, st_client_put(c, key, a, ST_KEY_PINNED, 0, v));
  st_args_free(a);
  return rc;
}

static int start_managed(void) {
  stt_svcmgr_attach(&M, &S);
  return stt_server_start(&S);
}

/* One round: a key of `gib` GiB and a small key of three versions,
 * SIGKILL, restart, checks. */
static void round_of(uint64_t gib) {
  uint64_t bytes = gib << 30;
  char key[32];
  snprintf(key, sizeof key, "weights-%" PRIu64 "g", gib);
  st_client_t *p = stt_client_open(S.socket);
  CHECK(p);
  if (!p) return;
  st_client_set_timeout(p, 120000);
  st_result_t *big = device_filled(bytes), *small[3] = {0};
  CHECK(big);
  if (!big) return;
  uint64_t v = 0;
  CHECK_EQ_INT(put_one(p, key, big, &v), ST_OK);
  for (int i = 0; i < 3; i++) {
    small[i] = device_filled(2 << 20);
    CHECK(small[i]);
    if (small[i]) CHECK_EQ_INT(put_one(p, "small", small[i], &v), ST_OK);
  }
  uint64_t free_before = gk_free();
  kill(S.pid, SIGKILL);
  waitpid(S.pid, NULL, 0);
  S.pid = -1;
  stt_svcmgr_sync(&M);
  double t0 = stt_now_ms();
  CHECK_EQ_INT(start_managed(), 0);
  st_client_t *c = stt_client_open(S.socket);
  CHECK(c);
  if (c) {
    st_client_set_timeout(c, 120000);
    st_result_t *r = NULL;
    uint64_t got = 0;
    CHECK_EQ_INT(st_client_get(c, key, 0, 0, &r, &got), ST_OK);
    double served = stt_now_ms() - t0;
    fprintf(stderr, "   restart to serving a %" PRIu64 " GiB key: %.1f ms (process start, "
            "restore, connect, get and map)\n", gib, served);
    if (r) CHECK(device_equal(st_result_find(r, "w"), bytes));
    /* No copy: the device's free memory did not drop by the key. */
    uint64_t free_after = gk_free();
    CHECK(free_after + bytes / 2 > free_before);
    /* The publisher's write after the restart is what a new get maps. */
    const st_tensor_t *mine = st_result_tensor(big, 0);
    float marker = 4242.0f;
    char err[256];
    CHECK_EQ_INT(st__cuda_copy_to_device((uint64_t)(uintptr_t)mine->data + 40, &marker, 4, 0,
                                         err, sizeof err), ST_OK);
    st_result_t *r2 = NULL;
    CHECK_EQ_INT(st_client_get(c, key, 0, 0, &r2, NULL), ST_OK);
    float seen = 0;
    if (r2)
      CHECK_EQ_INT(st__cuda_copy_to_host(&seen, (uint64_t)(uintptr_t)st_result_find(r2, "w")->data
                                         + 40, 4, 0, err, sizeof err), ST_OK);
    CHECK(seen == marker);
    st_result_free(r2);
    st_result_free(r);
    for (uint64_t ver = 1; ver <= 3; ver++) {
      st_result_t *s = NULL;
      CHECK_EQ_INT(st_client_get(c, "small", ver, 0, &s, NULL), ST_OK);
      if (s) CHECK(device_equal(st_result_find(s, "w"), 2 << 20));
      st_result_free(s);
    }
    CHECK_EQ_INT(st_client_delete(c, key), ST_OK);
    CHECK_EQ_INT(st_client_delete(c, "small"), ST_OK);
    st_client_close(c);
  }
  st_client_close(p);
  st_result_free(big);
  for (int i = 0; i < 3; i++) st_result_free(small[i]);
}

TEST(cuda_keys_survive_a_crash_with_no_copy) {
  const char *sizes = getenv("ST_GPU_RESTART_GIB");
  char list[64];
  snprintf(list, sizeof list, "%s", sizes && *sizes ? sizes : "1");
  for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
    uint64_t gib = strtoull(tok, NULL, 10);
    if (gib == 0 || gib > 1024) STT_FAIL("ST_GPU_RESTART_GIB: '%s' is no size in GiB", tok);
    round_of(gib);
  }
}

#endif

int main(void) {
  gk_require_device();
#ifdef ST_HAVE_CUDA
  stt_server_prepare(&S, "workers = 1, keys = { max_versions = 4 },\n", NULL);
  stt_svcmgr_start(&M, S.dir, 4096);
  if (start_managed() != 0) {
    stt_svcmgr_stop(&M);
    stt_server_cleanup(&S);
    return 1;
  }
  RUN(cuda_keys_survive_a_crash_with_no_copy);
  int status = S.pid > 0 ? stt_server_stop(&S) : 0;
  stt_svcmgr_stop(&M);
  return stt_server_end(&S, status);
#else
  return 77;
#endif
}
