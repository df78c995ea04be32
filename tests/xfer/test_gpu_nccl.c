/* The NCCL engine (src/xfer/nccl.c) between two transfer helpers, one
 * per GPU, as two hosts' servers would run it: three VMM arenas (4 KiB,
 * 3 MiB, 64 MiB) made in this process on device 0 and device 1, moved
 * with ncclSend/ncclRecv and compared byte by byte; then an open whose
 * receiver never joins ends at its deadline with the reason. Skips without
 * two CUDA devices or without NCCL (label gpu). */
#include <ev.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "xfer_kit.h"
#include "common/clock.h"
#include "cudadrv/import.h"
#include "st/errors.h"
#include "xfer/nccl_api.h"
#include "xfer/supervisor.h"

/* Runs the loop until *flag is nonzero, within a bound. */
static int wait_for(const int *flag) { return wait_for_s(flag, 120); }

typedef struct garena {
  int fd;
  uint64_t size;
  st__cuda_mapping_t m;
  char uuid[64];
} garena_t;

static int garena_new(int ordinal, uint64_t bytes, garena_t *g, char *err, size_t errlen) {
  memset(g, 0, sizeof *g);
  int rc = st__cuda_create_fd(ordinal, bytes, &g->fd, &g->size, err, errlen);
  if (rc == ST_OK) rc = st__cuda_device_uuid(ordinal, g->uuid, err, errlen);
  if (rc == ST_OK) rc = st__cuda_import(g->fd, g->size, g->uuid, &g->m, err, errlen);
  return rc;
}

static st__xfer_sup_t *sup_new(void) {
  st__xfer_sup_config_t cfg = {.exe = server_bin, .kill_grace = 5, .log_level = -1};
  st__xfer_sup_t *s = NULL;
  char err[256];
  if (st__xfer_sup_new(loop, &cfg, &s, err, sizeof err) != ST_OK) abort();
  return s;
}

TEST(nccl_send_recv_every_byte) {
  char err[256];
  const uint64_t want[3] = {4096, 3u << 20, 64u << 20};
  garena_t src[3], dst[3];
  for (int i = 0; i < 3; i++) {
    CHECK_ERR_MSG(garena_new(0, want[i], &src[i], err, sizeof err), ST_OK, err);
    CHECK_ERR_MSG(garena_new(1, want[i], &dst[i], err, sizeof err), ST_OK, err);
    uint8_t *h = malloc(src[i].size);
    for (uint64_t k = 0; k < src[i].size; k++) h[k] = (uint8_t)(k * 131 + (uint64_t)i * 7 + 1);
    CHECK_ERR_MSG(st__cuda_copy_to_device(src[i].m.dptr, h, src[i].size, 0, err, sizeof err),
                  ST_OK, err);
    free(h);
  }
  st__xfer_sup_t *a = sup_new(), *b = sup_new();
  side_t s = {0}, r = {0};
  uint64_t xs, xr;
  CHECK_ERR_MSG(st__xfer_sup_open(a, "nccl", ST_XFER_SEND, 2, 0, 60000, &cbs, &s, &xs, err,
                                  sizeof err), ST_OK, err);
  CHECK_ERR_MSG(st__xfer_sup_open(b, "nccl", ST_XFER_RECV, 2, 1, 60000, &cbs, &r, &xr, err,
                                  sizeof err), ST_OK, err);
  CHECK(wait_for(&s.opened) && wait_for(&r.opened));
  CHECK_EQ_INT(s.blob_len, 5 + ST_NCCL_UNIQUE_ID_BYTES);
  st__xfer_sup_arena_t sa[3], ra[3];
  for (int i = 0; i < 3; i++) {
    sa[i] = (st__xfer_sup_arena_t){.fd = src[i].fd, .bytes = src[i].size, .cuda = 1, .uuid = src[i].uuid};
    ra[i] = (st__xfer_sup_arena_t){.fd = dst[i].fd, .bytes = dst[i].size, .cuda = 1, .uuid = dst[i].uuid};
  }
  CHECK_ERR_MSG(st__xfer_sup_start(b, xr, s.blob, s.blob_len, ra, 3, err, sizeof err), ST_OK, err);
  CHECK_ERR_MSG(st__xfer_sup_start(a, xs, r.blob, r.blob_len, sa, 3, err, sizeof err), ST_OK, err);
  CHECK(wait_for(&s.done) && wait_for(&r.done));
  fprintf(stderr, "sender: %s\nreceiver: %s\n", s.error, r.error);
  CHECK(s.ok && r.ok);
  for (int i = 0; i < 3; i++) {
    uint8_t *x = malloc(src[i].size), *y = malloc(src[i].size);
    CHECK_ERR(st__cuda_copy_to_host(x, src[i].m.dptr, src[i].size, 0, err, sizeof err), ST_OK);
    CHECK_ERR(st__cuda_copy_to_host(y, dst[i].m.dptr, dst[i].size, 1, err, sizeof err), ST_OK);
    CHECK(memcmp(x, y, src[i].size) == 0);
    free(x);
    free(y);
  }
  /* A receiver that never joins: the sender's init ends at its deadline. */
  memset(&s, 0, sizeof s);
  CHECK_ERR(st__xfer_sup_open(a, "nccl", ST_XFER_SEND, 2, 0, 3000, &cbs, &s, &xs, err, sizeof err),
            ST_OK);
  CHECK(wait_for(&s.opened));
  static const uint8_t recv_blob[5] = {'S', 'T', 'N', '1', 1};
  CHECK_ERR(st__xfer_sup_start(a, xs, recv_blob, 5, sa, 1, err, sizeof err), ST_OK);
  CHECK(wait_for(&s.done));
  fprintf(stderr, "lonely sender: %s\n", s.error);
  CHECK(!s.ok);
  CHECK_CONTAINS(s.error, "deadline");
  for (int i = 0; i < 3; i++) {
    st__cuda_unmap(&src[i].m);
    st__cuda_unmap(&dst[i].m);
    close(src[i].fd);
    close(dst[i].fd);
  }
  st__xfer_sup_free(a);
  st__xfer_sup_free(b);
}

int main(void) {
  server_bin = getenv("ST_SERVER_BIN");
  if (!server_bin) stt_skip("ST_SERVER_BIN is not set");
  char err[256];
  int n = 0;
  if (st__cuda_device_count(&n, err, sizeof err) != ST_OK) stt_skip(err);
  if (n < 2) stt_skip("the NCCL engine's test needs two CUDA devices");
  st__xfer_probe_t p;
  if (st__nccl_probe(NULL, &p) != ST_OK) stt_skip(p.reason);
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  loop = ev_default_loop(0);
  RUN(nccl_send_recv_every_byte);
  return stt_summary();
}
