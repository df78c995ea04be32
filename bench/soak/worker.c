/* bench/soak: one client process of the soak (see soak.h). Each thread owns
 * one connection and loops over a random mix of operations with a random
 * pause, counting every request it sends and every reply it gets into the
 * process's shared slot. A request whose connection breaks (IO, PROTOCOL,
 * or the client's own TIMEOUT) is lost: this process is alive, so its
 * reply should have come. The thread then reconnects. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "soak.h"
#include "st/client.h"
#include "worker.h"

/* A reply must come within this long, or the request counts as lost. */
#define SK_REPLY_TIMEOUT_MS 60000

int sk_hist_bucket(double us) {
  int b = us <= 1 ? 0 : (int)(8 * log2(us));
  return b < 0 ? 0 : b >= SK_NHIST ? SK_NHIST - 1 : b;
}

double sk_hist_upper(int bucket) { return pow(2, (bucket + 1) / 8.0); }

void sk_close_handles(th_t *t) {
  sk_close_live(t);
  sk_close_buffers(t);
  sk_close_handoff(t);
}

/* Closes the thread's handles and connections after a lost request. */
static void drop_connections(th_t *t) {
  sk_close_handles(t);
  st_client_close(t->c2);
  st_client_close(t->c);
  t->c = t->c2 = NULL;
}

int sk_count_reply(th_t *t, st_client_t *c, int rc) {
  sk_slot_t *s = t->slot;
  if (rc == ST_ERR_IO || rc == ST_ERR_PROTOCOL || rc == ST_ERR_TIMEOUT) {
    long n = atomic_fetch_add(&s->lost, 1);
    if (n < 5)
      fprintf(stderr, "soak: pid %d thread %d: request lost: %s: %s\n", (int)getpid(), t->index,
              c ? st_client_error_name(c) : "", c ? st_client_error(c) : "");
    if (t->c) drop_connections(t);
    return rc;
  }
  atomic_fetch_add(&s->answered, 1);
  if (rc < 0 && -rc < SK_NERR && atomic_fetch_add(&s->errors[-rc], 1) < 3)
    fprintf(stderr, "soak: pid %d thread %d: error reply %s: %s\n", (int)getpid(), t->index,
            c ? st_client_error_name(c) : "", c ? st_client_error(c) : "");
  return rc;
}

void sk_wrong(th_t *t, const char *what) {
  if (atomic_fetch_add(&t->slot->wrong, 1) < 5)
    fprintf(stderr, "soak: pid %d thread %d: wrong reply: %s\n", (int)getpid(), t->index, what);
}

/* Args {k = k, n = n (when n > 0)}; owned by the caller. */
static st_args_t *kn(int64_t k, int64_t n) {
  st_args_t *a = st_args_new();
  st_args_int(a, "k", k);
  if (n > 0) st_args_int(a, "n", n);
  return a;
}

/* The first element of tensor `name` of r ("" = the whole result) is want. */
static void expect_first(th_t *t, const st_result_t *r, const char *name, double want) {
  const st_tensor_t *x = st_result_find(r, name);
  if (!x || x->numel < 1 || st_tensor_get(x, 0) != want) sk_wrong(t, name[0] ? name : "tensor");
}

/* A fresh (pooled) result; one call in four seen through a view, a
 * window of its last 8 elements. */
static void op_fresh(th_t *t) {
  int64_t n = 16 + sk_rnd(t, 1024), k = sk_rnd(t, 100);
  int view = sk_rnd(t, 4) == 0;
  char spec[64];
  snprintf(spec, sizeof spec, "slice(0,%lld,%lld)", (long long)n - 8, (long long)n);
  st_args_t *a = kn(k, n);
  st_result_t *r = NULL;
  if (REQ(t, view ? st_client_call_view(t->c, "soak_fresh", a, 0, spec, &r)
                  : st_client_call(t->c, "soak_fresh", a, &r)) == ST_OK) {
    const st_tensor_t *x = st_result_tensor(r, 0);
    int64_t m = view ? 8 : n;
    if (!x || x->numel != m || st_tensor_get(x, m - 1) != (double)(n - 1 + k)) sk_wrong(t, "fresh");
  }
  st_result_free(r);
  st_args_free(a);
}

/* Calls `endpoint` with {k, n (if > 0)} and checks that tensor `name`
 * starts with k. */
static void call_k(th_t *t, const char *endpoint, int64_t k, int64_t n, const char *name) {
  st_args_t *a = kn(k, n);
  st_result_t *r = NULL;
  if (REQ(t, st_client_call(t->c, endpoint, a, &r)) == ST_OK) expect_first(t, r, name, (double)k);
  st_result_free(r);
  st_args_free(a);
}

static void op_cached(th_t *t) { call_k(t, "soak_cached", sk_rnd(t, 32), 0, "t"); }

/* A lease: call the managed endpoint, check, release. */
static void op_lease(th_t *t) {
  int64_t k = sk_rnd(t, 8);
  st_args_t *a = kn(k, 0);
  st_result_t *r = NULL;
  if (REQ(t, st_client_call(t->c, "soak_managed", a, &r)) == ST_OK) {
    expect_first(t, r, "w", (double)k);
    st_object_info_t o;
    if (st_result_object(r, &o) != ST_OK || !o.lease) sk_wrong(t, "lease: no object");
    else REQ(t, st_client_release(t->c, o.id, NULL, NULL, NULL));
  }
  st_result_free(r);
  st_args_free(a);
}

/* A tensor argument scaled in place by the server. The same allocation
 * goes again and again (the server's argument cache keeps it by arg_id);
 * one call in eight takes a new one (a new entry, the old one dropped). */
static void op_targ(th_t *t, int cuda) {
  st_result_t **keep = cuda ? &t->targ_cuda : &t->targ;
  int64_t n = 256;
  char err[256];
  if (*keep && sk_rnd(t, 8) == 0) {
    st_result_free(*keep);
    *keep = NULL;
  }
  if (!*keep && st_tensor_alloc(cuda ? "cuda:0" : "cpu", ST_DTYPE_FLOAT32, 1, &n, keep, err,
                                sizeof err) != ST_OK) {
    sk_wrong(t, err);
    return;
  }
  const st_tensor_t *x = st_result_tensor(*keep, 0);
  if (!cuda)
    for (int64_t i = 0; i < n; i++) ((float *)x->data)[i] = (float)i;
  st_args_t *a = st_args_new();
  st_args_int(a, "k", 2);
  st_result_t *r = NULL;
  if (st_args_tensor(a, "x", x, err, sizeof err) != ST_OK) sk_wrong(t, err);
  else if (REQ(t, st_client_call(t->c, "soak_scale", a, &r)) == ST_OK) {
    /* CUDA memory stays zero (0 * 2): the call checks the import path. */
    if (st_tensor_get(x, n - 1) != (cuda ? 0.0 : 2.0 * (double)(n - 1))) sk_wrong(t, "scale");
  }
  st_result_free(r);
  st_args_free(a);
}

/* submit, wait, result. */
static void op_task(th_t *t) {
  int64_t k = sk_rnd(t, 1000);
  st_args_t *a = kn(k, 32);
  uint64_t id = 0;
  st_result_t *r = NULL;
  if (REQ(t, st_client_submit(t->c, "soak_task", a, &id)) == ST_OK && t->c &&
      REQ(t, st_client_task_wait(t->c, id, 30, &r)) == ST_OK && t->c) {
    st_result_free(r);
    r = NULL;
    if (REQ(t, st_client_task_result(t->c, id, &r)) == ST_OK) expect_first(t, r, "", (double)k);
  }
  st_result_free(r);
  st_args_free(a);
}

/* Mostly one cache entry, sometimes the endpoint's whole cache. */
static void op_invalidate(th_t *t) {
  if (sk_rnd(t, 10) == 0) {
    REQ(t, st_client_invalidate_endpoint(t->c, "soak_cached", NULL));
    return;
  }
  st_args_t *a = kn(sk_rnd(t, 32), 0);
  REQ(t, st_client_invalidate_call(t->c, "soak_cached", a, NULL));
  st_args_free(a);
}

static void op_cuda(th_t *t) { call_k(t, "soak_cuda", sk_rnd(t, 100), 1024, ""); }

static void op_ping(th_t *t) {
  double t0 = stt_now_ms();
  if (REQ(t, st_client_ping(t->c, NULL)) == ST_OK)
    atomic_fetch_add(&t->slot->ping_hist[sk_hist_bucket((stt_now_ms() - t0) * 1e3)], 1);
}

/* Picks an operation: weights out of 100 (CUDA ones only where allowed). */
static sk_op_t pick(th_t *t) {
  static const struct { sk_op_t op; int w; } mix[] = {
      {SK_PING, 12},     {SK_FRESH, 10},     {SK_CACHED, 10},   {SK_LEASE, 6},
      {SK_TARG, 8},      {SK_TASK, 5},       {SK_INVALIDATE, 5}, {SK_PUT, 6},
      {SK_GET, 8},       {SK_LIVE_PUB, 5},   {SK_LIVE_READ, 7}, {SK_BUF_WRITE, 5},
      {SK_BUF_READ, 7},  {SK_HANDOFF, 6},    {SK_CUDA, 10},     {SK_TARG_CUDA, 5}};
  int total = t->cuda ? 115 : 100, x = sk_rnd(t, total);
  for (size_t i = 0; i < sizeof mix / sizeof mix[0]; i++) {
    if (x < mix[i].w) return mix[i].op;
    x -= mix[i].w;
  }
  return SK_PING;
}

static void *thread_main(void *arg) {
  th_t *t = arg;
  const sk_opts_t *o = &t->sh->opts;
  int counted = 0, warm = 0;
  while (!atomic_load(&t->sh->stop) && warm < SK_NOPS) {
    if (!t->c) {
      char err[256];
      if (st_client_connect(o->socket, &t->c, err, sizeof err) != ST_OK) {
        fprintf(stderr, "soak: pid %d thread %d: connect: %s\n", (int)getpid(), t->index, err);
        stt_sleep_ms(100);
        continue;
      }
      st_client_set_timeout(t->c, SK_REPLY_TIMEOUT_MS);
      if (!counted++) atomic_fetch_add(&t->slot->threads_up, 1);
    }
    sk_op_t op = o->warmup ? (sk_op_t)warm++ : pick(t);
    if ((op == SK_CUDA || op == SK_TARG_CUDA) && !t->cuda) continue;
    atomic_fetch_add(&t->slot->ops[op], 1);
    switch (op) {
    case SK_PING: op_ping(t); break;
    case SK_FRESH: op_fresh(t); break;
    case SK_CACHED: op_cached(t); break;
    case SK_LEASE: op_lease(t); break;
    case SK_TARG: op_targ(t, 0); break;
    case SK_TASK: op_task(t); break;
    case SK_INVALIDATE: op_invalidate(t); break;
    case SK_PUT: sk_op_put(t); break;
    case SK_GET: sk_op_get(t); break;
    case SK_LIVE_PUB: sk_op_live_pub(t); break;
    case SK_LIVE_READ: sk_op_live_read(t); break;
    case SK_BUF_WRITE: sk_op_buf_write(t); break;
    case SK_BUF_READ: sk_op_buf_read(t); break;
    case SK_HANDOFF: sk_op_handoff(t); break;
    case SK_CUDA: op_cuda(t); break;
    case SK_TARG_CUDA: op_targ(t, 1); break;
    case SK_NOPS: break;
    }
    if (o->think_ms > 0 && !o->warmup) {
      int ms = sk_rnd(t, 2 * o->think_ms + 1);
      struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  st_result_free(t->targ);
  st_result_free(t->targ_cuda);
  sk_close_handles(t);
  st_client_close(t->c2);
  st_client_close(t->c);
  return NULL;
}

void sk_worker_main(sk_shared_t *sh, int slot) {
  const sk_opts_t *o = &sh->opts;
  sk_slot_t *s = &sh->slots[slot];
  int n = o->warmup ? 1 : o->conns_per_proc;
  th_t *ths = calloc((size_t)n, sizeof *ths);
  pthread_t *ids = calloc((size_t)n, sizeof *ids);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 512 * 1024);
  for (int i = 0; i < n; i++) {
    ths[i] = (th_t){.sh = sh, .slot = s, .index = i,
                    .cuda = o->cuda && s->use_cuda,
                    .seed = (unsigned)(getpid() * 7919 + i)};
    if (pthread_create(&ids[i], &attr, thread_main, &ths[i]) != 0) {
      fprintf(stderr, "soak: pthread_create failed at thread %d\n", i);
      _exit(1);
    }
  }
  for (int i = 0; i < n; i++) pthread_join(ids[i], NULL);
  atomic_store(&s->state, SK_EXITED);
  /* The warm-up runs each kind once and must see each succeed. */
  long errors = 0;
  for (int k = 0; k < SK_NERR; k++) errors += atomic_load(&s->errors[k]);
  _exit(o->warmup && (atomic_load(&s->wrong) || atomic_load(&s->lost) || errors) ? 1 : 0);
}
