/* What the transfer tests share (tests/xfer): the loop the supervisors
 * run on, one side of a transfer as its callbacks record it, and a wait
 * on one of its flags. Each test program includes it once. */
#ifndef ST_TESTS_XFER_KIT_H
#define ST_TESTS_XFER_KIT_H

#include <ev.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "xfer/supervisor.h"

static struct ev_loop *loop;
static const char *server_bin;

/* One side of a transfer: what its callbacks said. */
typedef struct side {
  int opened;
  uint8_t blob[ST_XFER_BLOB_MAX];
  size_t blob_len;
  int done;
  int ok;
  uint64_t bytes;
  int code;
  char error[400];
  int progress_calls;
} side_t;

static inline void cb_opened(void *ud, uint64_t xfer, const uint8_t *blob, size_t len) {
  side_t *s = ud;
  (void)xfer;
  s->opened = 1;
  memcpy(s->blob, blob, len);
  s->blob_len = len;
}

static inline void cb_progress(void *ud, uint64_t xfer, uint64_t bytes, uint64_t total) {
  (void)xfer, (void)bytes, (void)total;
  ((side_t *)ud)->progress_calls++;
}

static inline void cb_done(void *ud, uint64_t xfer, int ok, uint64_t bytes, int code,
                           const char *error) {
  side_t *s = ud;
  (void)xfer;
  s->done++;
  s->ok = ok;
  s->bytes = bytes;
  s->code = code;
  snprintf(s->error, sizeof s->error, "%s", error ? error : "");
}

static const st__xfer_sup_cbs_t cbs = {cb_opened, cb_progress, cb_done};

/* Runs the loop until *flag is nonzero; 0 when `seconds` passed first
 * (the test then fails: nothing here asserts how long it took). */
static inline int wait_for_s(const int *flag, double seconds) {
  double end = st__now_mono() + seconds;
  while (!*flag && st__now_mono() < end) ev_run(loop, EVRUN_ONCE);
  return *flag != 0;
}

#endif
