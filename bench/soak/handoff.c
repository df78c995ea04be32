/* bench/soak: hand-offs. A thread is the producer of its own hand-off
 * (soak.ho.PID.THREAD, 4 chunks of SK_HO_BYTES, 1 consumer) on its
 * connection and its consumer on a second connection: per operation it
 * acquires 1 to 4 chunks, fills each with one byte value, publishes, and
 * the consumer reads (checking every byte and the size) and
 * acknowledges. One operation in eight leaves the hand-off (producer or
 * consumer first, or a delete); the next creates it again. A SIGKILLed
 * process leaves its hand-offs to the server, which drops each with the
 * last connection using it. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "worker.h"

void sk_close_handoff(th_t *t) {
  st_handoff_close(t->ho_c);
  st_handoff_close(t->ho_p);
  t->ho_c = t->ho_p = NULL;
}

/* Closes one handle, counted; on a lost request the other handles and
 * the connections are closed already (sk_count_reply). */
static void close_one(th_t *t, st_handoff_t **hp, st_client_t *c) {
  st_handoff_t *h = *hp;
  *hp = NULL;
  REQ_ON(t, c, st_handoff_close(h));
}

/* Leaves the hand-off: the consumer or the producer first, or a delete
 * first (the closes then answer NOT_FOUND: the delete detached both). */
static void leave(th_t *t) {
  int how = sk_rnd(t, 3);
  if (how == 2 && (REQ(t, st_handoff_delete(t->c, t->ho_name)), !t->c)) return;
  if (how == 1) close_one(t, &t->ho_p, t->c);
  else close_one(t, &t->ho_c, t->c2);
  if (!t->c) return;
  if (how == 1) close_one(t, &t->ho_c, t->c2);
  else close_one(t, &t->ho_p, t->c);
}

static int join(th_t *t) {
  if (!t->c2) {
    char err[256];
    if (st_client_connect(t->sh->opts.socket, &t->c2, err, sizeof err) != ST_OK) {
      fprintf(stderr, "soak: pid %d thread %d: connect: %s\n", (int)getpid(), t->index, err);
      return -1;
    }
    st_client_set_timeout(t->c2, 60000);
  }
  snprintf(t->ho_name, sizeof t->ho_name, "soak.ho.%d.%d", (int)getpid(), t->index);
  if (REQ(t, st_handoff_create(t->c, t->ho_name, "cpu", SK_HO_BYTES, 4, 1, &t->ho_p)) != ST_OK) {
    t->ho_p = NULL;
    return -1;
  }
  if (REQ_ON(t, t->c2, st_handoff_open(t->c2, t->ho_name, &t->ho_c)) != ST_OK) {
    t->ho_c = NULL;
    if (t->ho_p) {
      st_handoff_t *p = t->ho_p;
      t->ho_p = NULL;
      REQ(t, st_handoff_close(p));
    }
    return -1;
  }
  return 0;
}

void sk_op_handoff(th_t *t) {
  if (!t->ho_p && join(t) != 0) return;
  int rounds = 1 + sk_rnd(t, 4);
  for (int r = 0; r < rounds; r++) {
    int chunk = -1;
    void *data = NULL, *got = NULL;
    uint64_t seq = 0, bytes = 0, n = 1 + (uint64_t)sk_rnd(t, SK_HO_BYTES);
    unsigned char v = t->ho_next++;
    sk_local(t);
    if (st_handoff_acquire(t->ho_p, 1000, &chunk, &data) != ST_OK) {
      sk_wrong(t, st_handoff_error(t->ho_p));
      break;
    }
    memset(data, v, n);
    if (st_handoff_publish(t->ho_p, chunk, n, &seq) != ST_OK) {
      sk_wrong(t, st_handoff_error(t->ho_p));
      break;
    }
    if (st_handoff_read(t->ho_c, chunk, seq, 1000, &got, &bytes) != ST_OK) {
      sk_wrong(t, st_handoff_error(t->ho_c));
      break;
    }
    const unsigned char *b = got;
    uint64_t same = 0;
    while (same < bytes && b[same] == v) same++;
    if (bytes != n || same != n) sk_wrong(t, "hand-off: the chunk read is not the one published");
    if (st_handoff_ack(t->ho_c, chunk, seq) != ST_OK) sk_wrong(t, st_handoff_error(t->ho_c));
  }
  if (sk_chance(t, 8)) leave(t);
}
