/* src/tensor/cuda.c: the CUDA backend (backend.h) and the calling
 * thread's streams.
 *
 * CUDA work runs on the calling thread's own stream per device, created
 * the first time the thread needs it and kept until the thread exits (a
 * pthread key destroys the streams then). Every stream a call used is
 * marked in its context and synchronized by st__tensor_sync_used before
 * the call completes (docs/design.md, section 3, decision 5); an arena is
 * released only after the thread's stream on its device is idle
 * (quiesce). Kernels are those of src/cuda/kernels.h. In a build without CUDA there is no CUDA
 * backend (st__tensor_cuda_backend is NULL): st__tensor_device_check
 * refuses every CUDA device before any of this could be reached. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda.h"
#include "tensor/backend.h"

#ifdef ST_HAVE_CUDA
#include "cuda/kernels.h"

/* ------------------------------------------------------------ streams */

typedef struct thread_streams {
  CUstream s[ST__DEV_MAX];
} thread_streams_t;

static pthread_key_t streams_key;
static pthread_once_t streams_once = PTHREAD_ONCE_INIT;

/* Thread exit: every stream of the thread goes (after its work). */
static void streams_free(void *p) {
  thread_streams_t *t = p;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  for (int i = 0; a && i < ST__DEV_MAX; i++) {
    if (!t->s[i]) continue;
    if (st__cuda_ctx_enter(i, NULL, 0) == ST_OK) {
      a->cuStreamSynchronize(t->s[i]);
      a->cuStreamDestroy(t->s[i]);
    }
  }
  free(t);
}

static void streams_init(void) {
  pthread_key_create(&streams_key, streams_free);
}

static thread_streams_t *my_streams(int create) {
  pthread_once(&streams_once, streams_init);
  thread_streams_t *t = pthread_getspecific(streams_key);
  if (!t && create) {
    t = calloc(1, sizeof *t);
    if (t && pthread_setspecific(streams_key, t) != 0) {
      free(t);
      t = NULL;
    }
  }
  return t;
}

int st__tensor_stream(st__tensor_ctx_t *c, int ordinal, void **stream, char *err,
                      size_t errlen) {
  int rc = st__tensor_device_check(c, ordinal, "cuda", err, errlen);  /* context current */
  if (rc != ST_OK) return rc;
  if (ordinal < 0) return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "cuda: not a CUDA device");
  thread_streams_t *t = my_streams(1);
  if (!t) return st__tensor_fail_call(c, ST_ERR_OUT_OF_MEMORY, err, errlen, "cuda: out of memory");
  if (!t->s[ordinal]) {
    const st__cuda_api_t *a = st__cuda_api(NULL, 0);
    char why[256];
    rc = st__cuda_error(a->cuStreamCreate(&t->s[ordinal], CU_STREAM_NON_BLOCKING),
                        "cuStreamCreate", why, sizeof why);
    if (rc != ST_OK) {
      t->s[ordinal] = NULL;
      return st__tensor_fail_call(c, rc, err, errlen, "cuda: %s", why);
    }
  }
  c->cuda_used |= UINT64_C(1) << ordinal;
  *stream = t->s[ordinal];
  return ST_OK;
}

/* Waits for the thread's stream on `ordinal`; ST_OK when it has none. */
static int sync_stream(int ordinal, char *err, size_t errlen) {
  thread_streams_t *t = my_streams(0);
  if (!t || !t->s[ordinal]) return ST_OK;
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  char why[256];
  rc = st__cuda_error(a->cuStreamSynchronize(t->s[ordinal]), "cuStreamSynchronize", why,
                      sizeof why);
  if (rc != ST_OK && err && errlen)
    snprintf(err, errlen, "work queued on cuda:%d failed: %s", ordinal, why);
  return rc;
}

int st__tensor_sync_used(st__tensor_ctx_t *c, char *err, size_t errlen) {
  int first = ST_OK;
  for (int i = 0; i < ST__DEV_MAX && c->cuda_used; i++) {
    if (!(c->cuda_used & (UINT64_C(1) << i))) continue;
    c->cuda_used &= ~(UINT64_C(1) << i);
    char why[512];
    int rc = sync_stream(i, why, sizeof why);
    if (rc != ST_OK && first == ST_OK) {
      first = rc;
      if (err && errlen) snprintf(err, errlen, "%s", why);
    }
  }
  return first;
}

/* ------------------------------------------------------------ operations */

/* The stream of t's device into *s, or the failure (recorded). */
#define STREAM_OR_FAIL(c, dev, s, err, errlen)                                             \
  do {                                                                                     \
    void *p_;                                                                              \
    int rc_ = st__tensor_stream((c), (dev), &p_, (err), (errlen));                         \
    if (rc_ != ST_OK) return rc_;                                                          \
    (s) = (CUstream)p_;                                                                    \
  } while (0)

/* A kernel's or copy's verdict: ST_OK, or the failure recorded as "what: why". */
static int done(st__tensor_ctx_t *c, int rc, const char *what, const char *why, char *err,
                size_t errlen) {
  if (rc == ST_OK) return ST_OK;
  return st__tensor_fail_call(c, rc, err, errlen, "%s: %s", what, why);
}

static int cuda_fill(st__tensor_ctx_t *c, const st__tensor_t *t, double v, const char *what,
                     char *err, size_t errlen) {
  const st__geom_t *g = &t->geom;
  CUstream s;
  STREAM_OR_FAIL(c, st__tensor_device(t), s, err, errlen);
  char why[256];
  int rc = st__geom_is_contiguous(g)
               ? st__cuda_fill(st__tensor_data(t), g->dtype, st__geom_numel(g), v, s, why,
                               sizeof why)
               : st__cuda_fill_strided(st__tensor_data(t), g->dtype, g->strides, g->ndim,
                                       g->shape, v, s, why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static int cuda_affine(st__tensor_ctx_t *c, const st__tensor_t *t, double mul, double add,
                       const char *what, char *err, size_t errlen) {
  const st__geom_t *g = &t->geom;
  CUstream s;
  STREAM_OR_FAIL(c, st__tensor_device(t), s, err, errlen);
  char why[256];
  int rc = st__cuda_affine_strided(st__tensor_data(t), g->dtype, g->strides, g->ndim, g->shape,
                                   mul, add, s, why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static int cuda_copy(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
                     const char *what, char *err, size_t errlen) {
  const st__geom_t *dg = &dst->geom, *sg = &src->geom;
  CUstream s;
  STREAM_OR_FAIL(c, st__tensor_device(dst), s, err, errlen);
  char why[256];
  int rc;
  if (st__geom_is_contiguous(dg) && st__geom_is_contiguous(sg))
    rc = st__cuda_cast(st__tensor_data(dst), dg->dtype, st__tensor_data(src), sg->dtype,
                       st__geom_numel(dg), s, why, sizeof why);
  else
    rc = st__cuda_copy_strided(st__tensor_data(dst), dg->dtype, dg->strides,
                               st__tensor_data(src), sg->dtype, sg->strides, dg->ndim,
                               dg->shape, s, why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static int cuda_generate(st__tensor_ctx_t *c, const st__tensor_t *t, const st__gen_t *g,
                         const char *what, char *err, size_t errlen) {
  CUstream s;
  STREAM_OR_FAIL(c, st__tensor_device(t), s, err, errlen);
  char why[256];
  int rc = st__cuda_generate(st__tensor_data(t), t->geom.dtype, st__geom_numel(&t->geom), g, s,
                             why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static int cuda_copy_bytes(st__tensor_ctx_t *c, int device, void *dst, const void *src,
                           uint64_t bytes, const char *what, char *err, size_t errlen) {
  CUstream s;
  STREAM_OR_FAIL(c, device, s, err, errlen);
  char why[256];
  int rc = st__cuda_memcpy(dst, src, bytes, s, why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static int cuda_sync(st__tensor_ctx_t *c, int device, const char *what, char *err,
                     size_t errlen) {
  char why[512];
  int rc = sync_stream(device, why, sizeof why);
  return done(c, rc, what, why, err, errlen);
}

static void cuda_quiesce(int device) {
  if (device >= 0 && device < ST__DEV_MAX) sync_stream(device, NULL, 0);
}

static const st__tensor_backend_t cuda_backend = ST__TENSOR_BACKEND(cuda);
const st__tensor_backend_t *const st__tensor_cuda_backend = &cuda_backend;

#else /* !ST_HAVE_CUDA: no CUDA backend; st__tensor_device_check refuses CUDA */

const st__tensor_backend_t *const st__tensor_cuda_backend = NULL;

int st__tensor_stream(st__tensor_ctx_t *c, int ordinal, void **stream, char *err,
                      size_t errlen) {
  int rc = st__tensor_device_check(c, ordinal, "cuda", err, errlen);
  if (rc != ST_OK) return rc;
  return st__tensor_fail_call(c, ST_ERR_CAPABILITY, err, errlen,
                              "no CUDA device: cuda:%d is unavailable: built without CUDA support",
                              ordinal);
}

int st__tensor_sync_used(st__tensor_ctx_t *c, char *err, size_t errlen) {
  c->cuda_used = 0;
  return ST_OK;
}

#endif
