/* bench/soak: what the operations of a client thread share (worker.c and
 * one file per kind of shared state: keys.c, live.c, buffers.c,
 * handoff.c). A thread owns its connection(s) and the handles it keeps
 * open across operations; everything it counts goes to its process's
 * slot (soak.h). */
#ifndef ST_SOAK_WORKER_H
#define ST_SOAK_WORKER_H

#include <stdatomic.h>
#include <stdlib.h>

#include "soak.h"
#include "st/client.h"

/* Names of the shared state: a bounded set per kind, shared by every
 * client process (readers of one process read what another wrote), so
 * that what killed clients leave named (keys, buffers) stays bounded; the
 * driver removes them all when the server settles (snapshot.c). */
#define SK_PUT_KEYS 32       /* soak.key.0 .. 31: put, get, delete     */
#define SK_LIVE_KEYS 8       /* soak.live.0 .. 7: live keys            */
#define SK_BUFFERS 8         /* soak.buf.0 .. 7: buffers               */
#define SK_LIVE_NUMEL 64     /* float32 elements of a live key's 'w'   */
#define SK_BUF_NUMEL 256     /* float32 elements of a buffer's frame   */
#define SK_HO_BYTES 4096     /* bytes of a hand-off chunk               */

/* Waits of the shared pages (no request: a timeout is no loss). */
#define SK_WAIT_MS 100

typedef struct th {
  sk_shared_t *sh;
  sk_slot_t *slot;
  int index;
  int cuda;                    /* this thread may run the CUDA operations */
  unsigned seed;
  st_client_t *c;
  st_client_t *c2;             /* the consumer's connection of a hand-off */
  st_result_t *targ;           /* a CPU tensor argument, reused */
  st_result_t *targ_cuda;      /* a CUDA one, reused */
  st_key_t *live_pub;          /* a live key this connection publishes */
  st_key_t *live_rd;           /* a live key it reads (read-only) */
  float live_next;             /* the value of the next update */
  st_buffer_t *buf_w, *buf_r;  /* a buffer it writes, one it reads */
  char buf_w_name[32];
  float buf_next;
  st_handoff_t *ho_p, *ho_c;   /* producer (on c), consumer (on c2) */
  char ho_name[48];
  unsigned char ho_next;
} th_t;

static inline int sk_rnd(th_t *t, int n) { return (int)(rand_r(&t->seed) % (unsigned)n); }

/* A name's index among n: random, but 0 in the warm-up (one thread runs
 * each kind once, and its readers must find what its writers made). */
static inline int sk_name_index(th_t *t, int n) { return t->sh->opts.warmup ? 0 : sk_rnd(t, n); }

/* 1 with a chance of 1 in n: the "now and then" of a kind (a delete, a
 * handle closed); never in the warm-up, whose every request must succeed. */
static inline int sk_chance(th_t *t, int n) { return !t->sh->opts.warmup && sk_rnd(t, n) == 0; }

/* Counts the outcome of one request on connection *cp (already counted as
 * sent): a broken connection (IO, PROTOCOL, TIMEOUT) is a lost request,
 * and the thread's connections and handles are closed, to be reopened;
 * any other reply is answered (an error reply by its code). Returns rc. */
int sk_count_reply(th_t *t, st_client_t *c, int rc);
#define REQ_ON(t, cl, expr) \
  (atomic_fetch_add(&(t)->slot->sent, 1), sk_count_reply((t), (cl), (expr)))
#define REQ(t, expr) REQ_ON((t), (t)->c, (expr))

/* A reply (or a read of shared memory) that was not what was asked. */
void sk_wrong(th_t *t, const char *what);

/* One operation of shared memory that is no request (a wait, a read or a
 * write of a page): counted apart, never lost. */
static inline void sk_local(th_t *t) { atomic_fetch_add(&t->slot->local, 1); }

/* Closes every handle of the thread (before its connections). */
void sk_close_handles(th_t *t);

/* The kinds of shared state, one file each. */
void sk_op_put(th_t *t);          /* keys.c: put a key (or delete one) */
void sk_op_get(th_t *t);          /* keys.c: get one through a view */
void sk_op_live_pub(th_t *t);     /* live.c: publish / update a live key */
void sk_op_live_read(th_t *t);    /* live.c: wait for a version, read it */
void sk_op_buf_write(th_t *t);    /* buffers.c: write a frame */
void sk_op_buf_read(th_t *t);     /* buffers.c: read_new */
void sk_op_handoff(th_t *t);      /* handoff.c: produce, consume, ack */
void sk_close_live(th_t *t);
void sk_close_buffers(th_t *t);
void sk_close_handoff(th_t *t);

#endif
