/* bench/soak: buffers. A writer opens (or creates) one of SK_BUFFERS
 * buffers of float32 [SK_BUF_NUMEL] in 4 slots and writes frames whose
 * elements all hold one value; a reader keeps a read-only handle and
 * waits for each write newer than its last read (read_new): every frame
 * it gets must hold one value (a torn copy is read again by the library,
 * never returned). Now and then a writer unlinks its buffer (open handles
 * keep working; the next writer creates it again) and handles are closed
 * and opened again. A writer SIGKILLed while it holds the writer lock
 * gives it back with its connection. */
#include <stdio.h>
#include <string.h>

#include "worker.h"

static void close_counted(th_t *t, st_buffer_t **b) {
  st_buffer_t *h = *b;
  *b = NULL;
  REQ(t, st_buffer_close(h));
}

void sk_close_buffers(th_t *t) {
  st_buffer_close(t->buf_w);
  st_buffer_close(t->buf_r);
  t->buf_w = t->buf_r = NULL;
}

void sk_op_buf_write(th_t *t) {
  if (!t->buf_w) {
    snprintf(t->buf_w_name, sizeof t->buf_w_name, "soak.buf.%d", sk_name_index(t, SK_BUFFERS));
    /* Open, else create (the warm-up, on a fresh server, creates). */
    int rc = t->sh->opts.warmup ? ST_ERR_NOT_FOUND
                                : REQ(t, st_buffer_open(t->c, t->buf_w_name, 0, &t->buf_w));
    if (rc == ST_ERR_NOT_FOUND) {
      int64_t shape[1] = {SK_BUF_NUMEL};
      /* INVALID_ARGUMENT: another connection created it meanwhile. */
      rc = REQ(t, st_buffer_create(t->c, t->buf_w_name, "cpu", ST_DTYPE_FLOAT32, 1, shape, 4,
                                   &t->buf_w));
    }
    if (rc != ST_OK) {
      t->buf_w = NULL;
      return;
    }
  }
  float frame[SK_BUF_NUMEL];
  for (int i = 0; i < SK_BUF_NUMEL; i++) frame[i] = t->buf_next;
  t->buf_next += 1;
  sk_local(t);
  int rc = st_buffer_write(t->buf_w, frame, sizeof frame, SK_WAIT_MS, NULL);
  if (rc != ST_OK && rc != ST_ERR_TIMEOUT) sk_wrong(t, st_buffer_error(t->buf_w));
  int x = t->sh->opts.warmup ? 2 : sk_rnd(t, 32);
  if (x == 0 && t->c) REQ(t, st_buffer_unlink(t->c, t->buf_w_name));
  if (x < 2 && t->buf_w) close_counted(t, &t->buf_w);
}

void sk_op_buf_read(th_t *t) {
  if (!t->buf_r) {
    char name[32];
    snprintf(name, sizeof name, "soak.buf.%d", sk_name_index(t, SK_BUFFERS));
    if (REQ(t, st_buffer_open(t->c, name, 1, &t->buf_r)) != ST_OK) {
      t->buf_r = NULL;
      return;
    }
  }
  float frame[SK_BUF_NUMEL];
  sk_local(t);
  int rc = st_buffer_read_new(t->buf_r, frame, sizeof frame, SK_WAIT_MS, NULL, NULL);
  if (rc == ST_OK) {
    for (int i = 1; i < SK_BUF_NUMEL; i++)
      if (frame[i] != frame[0]) {
        sk_wrong(t, "buffer: a frame of read_new holds two writes");
        break;
      }
  } else if (rc != ST_ERR_TIMEOUT) {
    sk_wrong(t, st_buffer_error(t->buf_r));
  }
  /* A reader of an unlinked buffer waits in vain: move on now and then. */
  if (t->buf_r && sk_chance(t, rc == ST_ERR_TIMEOUT ? 4 : 32))
    close_counted(t, &t->buf_r);
}
