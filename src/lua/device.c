/* src/lua: devices of a call (docs/endpoints.md, "Devices"; docs/cuda.md).
 *
 * A call builds on its default device (ctx->device: the CPU or cuda:N,
 * resolved by the server from the endpoint's `device` option and
 * default_device); constructors and :to() may name another. CUDA work runs
 * on the calling worker thread's own stream per device, created the first
 * time the thread needs it and kept until the thread exits (a pthread key
 * destroys the streams then). Every stream a call used is synchronized
 * before st__vm_build returns, so a client may use a tensor as soon as it
 * holds the descriptor (DESIGN §3, decision 5).
 *
 * Everything CUDA-specific of the Lua module lives here, behind
 * ST_HAVE_CUDA: a build without CUDA compiles the same functions, and
 * st__lua_device_check refuses every CUDA device before any of the others
 * can be reached.
 *
 * The contract of each non-static function is its comment in lua_int.h;
 * all of them run on the thread that owns the lua_State they are given.
 */
#include "lua/lua_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA
#include "cuda/kernels.h"
#endif

/* ------------------------------------------------------------ names */

const char *st__lua_device_name(int device, char *buf, size_t len) {
  if (device < 0) snprintf(buf, len, "cpu");
  else snprintf(buf, len, "cuda:%d", device);
  return buf;
}

/* 1 and *out for "cpu", "cuda" (*out = -2: the socket's) and "cuda:N";
 * 0 for anything else. */
static int parse_name(const char *s, int *out) {
  if (strcmp(s, "cpu") == 0) {
    *out = ST__DEV_CPU;
    return 1;
  }
  if (strncmp(s, "cuda", 4) != 0) return 0;
  if (s[4] == '\0') {
    *out = -2;
    return 1;
  }
  size_t n = strlen(s + 5);
  if (s[4] != ':' || n == 0 || n > 4 || strspn(s + 5, "0123456789") != n) return 0;
  *out = atoi(s + 5);
  return 1;
}

int st__lua_is_device_name(const char *s) {
  int d;
  return s && parse_name(s, &d);
}

int st__lua_cuda_fail(lua_State *L, int rc, const char *fn, const char *msg) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  c->alloc_err = rc;
  snprintf(c->alloc_msg, sizeof c->alloc_msg, "%s: %s", fn, msg);
  st__lua_raise(L, "%s", c->alloc_msg);
}

/* Raises CAPABILITY "no CUDA device: cuda:N is unavailable: <reason>". `why` may carry
 * the driver layer's own "no CUDA device: " prefix; it is not repeated. */
static int no_device(lua_State *L, int device, const char *why) __attribute__((noreturn));
static int no_device(lua_State *L, int device, const char *why) {
  static const char prefix[] = "no CUDA device: ";
  if (strncmp(why, prefix, sizeof prefix - 1) == 0) why += sizeof prefix - 1;
  st__lua_ctx_t *c = st__lua_ctx(L);
  c->alloc_err = ST_ERR_CAPABILITY;
  snprintf(c->alloc_msg, sizeof c->alloc_msg, "%scuda:%d is unavailable: %s", prefix, device,
           why);
  st__lua_raise(L, "%s", c->alloc_msg);
}

void st__lua_device_check(lua_State *L, int device, const char *fn) {
  if (device == ST__DEV_CPU) return;
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (!c->in_call)
    st__lua_raise(L, "%s: CUDA tensors can only be built inside a build body (cuda:%d)", fn,
                  device);
  if (device < 0 || device >= ST__DEV_MAX)
    no_device(L, device, "no such device in this process");
  char err[256];
  if (st__cuda_ctx_enter(device, err, sizeof err) != ST_OK) no_device(L, device, err);
}

int st__lua_device_arg(lua_State *L, int idx, const char *fn) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  int device;
  if (lua_isnoneornil(L, idx)) {
    device = c->device;
  } else {
    const char *s = lua_type(L, idx) == LUA_TSTRING ? lua_tostring(L, idx) : NULL;
    if (!s || !parse_name(s, &device))
      st__lua_raise(L, "%s: unknown device '%s' (expected \"cpu\", \"cuda\" or \"cuda:N\")", fn,
                    s ? s : luaL_typename(L, idx));
    if (device == -2) {
      if (c->cuda_device < 0) {
        c->alloc_err = ST_ERR_CAPABILITY;
        snprintf(c->alloc_msg, sizeof c->alloc_msg,
                 "no CUDA device: \"cuda\" names the CUDA device of the call's socket, and "
                 "this call has none; name one, e.g. \"cuda:0\"");
        st__lua_raise(L, "%s: %s", fn, c->alloc_msg);
      }
      device = c->cuda_device;
    }
  }
  st__lua_device_check(L, device, fn);
  return device;
}

/* ------------------------------------------------------------ streams */

#ifdef ST_HAVE_CUDA

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

void *st__lua_cuda_stream(lua_State *L, int ordinal) {
  st__lua_device_check(L, ordinal, "cuda");     /* makes its context current */
  thread_streams_t *t = my_streams(1);
  if (!t) st__lua_cuda_fail(L, ST_ERR_OUT_OF_MEMORY, "cuda", "out of memory");
  if (!t->s[ordinal]) {
    const st__cuda_api_t *a = st__cuda_api(NULL, 0);
    char err[256];
    int rc = st__cuda_error(a->cuStreamCreate(&t->s[ordinal], CU_STREAM_NON_BLOCKING),
                            "cuStreamCreate", err, sizeof err);
    if (rc != ST_OK) {
      t->s[ordinal] = NULL;
      st__lua_cuda_fail(L, rc, "cuda", err);
    }
  }
  st__lua_ctx(L)->cuda_used |= UINT64_C(1) << ordinal;
  return t->s[ordinal];
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

int st__lua_cuda_sync_used(lua_State *L, char *err, size_t errlen) {
  st__lua_ctx_t *c = st__lua_ctx(L);
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

void st__lua_cuda_quiesce(int ordinal) {
  if (ordinal >= 0 && ordinal < ST__DEV_MAX) sync_stream(ordinal, NULL, 0);
}

/* Waits for the stream of a copy that ends in host memory. */
static void sync_or_raise(lua_State *L, int ordinal, const char *fn) {
  char err[512];
  int rc = sync_stream(ordinal, err, sizeof err);
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

/* One copy on the stream of `ordinal`. */
static void memcpy_on(lua_State *L, int ordinal, void *dst, const void *src, uint64_t bytes,
                      const char *fn) {
  void *s = st__lua_cuda_stream(L, ordinal);
  char err[256];
  int rc = st__cuda_memcpy(dst, src, bytes, (CUstream)s, err, sizeof err);
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

void st__lua_transfer(lua_State *L, void *dst, int dst_dev, const void *src, int src_dev,
                      uint64_t bytes, const char *fn) {
  if (bytes == 0) return;
  if (dst_dev == ST__DEV_CPU && src_dev == ST__DEV_CPU) {
    memcpy(dst, src, (size_t)bytes);
  } else if (dst_dev == src_dev) {
    memcpy_on(L, dst_dev, dst, src, bytes, fn);          /* in stream order */
  } else if (src_dev == ST__DEV_CPU) {
    memcpy_on(L, dst_dev, dst, src, bytes, fn);
    sync_or_raise(L, dst_dev, fn);                       /* the source may go */
  } else if (dst_dev == ST__DEV_CPU) {
    memcpy_on(L, src_dev, dst, src, bytes, fn);
    sync_or_raise(L, src_dev, fn);
  } else {
    /* Two devices: through a host buffer (a CPU arena the GC collects),
     * so that neither needs access to the other's allocation. */
    int64_t n = (int64_t)bytes;
    st__ltensor_t *h = st__lua_new_tensor_on(L, ST__DEV_CPU, ST_DTYPE_UINT8, 1, &n);
    void *host = st__ltensor_data(h);
    memcpy_on(L, src_dev, host, src, bytes, fn);
    sync_or_raise(L, src_dev, fn);
    memcpy_on(L, dst_dev, dst, host, bytes, fn);
    sync_or_raise(L, dst_dev, fn);
    lua_pop(L, 1);
  }
}

/* ------------------------------------------------------------ kernels */

void st__lua_cuda_generate(lua_State *L, const st__ltensor_t *t, st__lua_gen_t kind, double a,
                           double b, uint64_t seed, const char *fn) {
  int dev = st__ltensor_device(t);
  CUstream s = (CUstream)st__lua_cuda_stream(L, dev);
  void *d = st__ltensor_data(t);
  int64_t n = st__ltensor_numel(t);
  char err[256];
  int rc;
  switch (kind) {
  case ST__GEN_FILL: rc = st__cuda_fill(d, t->dtype, n, a, s, err, sizeof err); break;
  case ST__GEN_ARANGE: rc = st__cuda_arange(d, t->dtype, n, a, b, s, err, sizeof err); break;
  case ST__GEN_RAND: rc = st__cuda_rand(d, t->dtype, n, seed, s, err, sizeof err); break;
  default: rc = st__cuda_randn(d, t->dtype, n, seed, s, err, sizeof err); break;
  }
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

void st__lua_cuda_fill(lua_State *L, const st__ltensor_t *t, double v, const char *fn) {
  if (st__ltensor_is_contiguous(t)) {
    st__lua_cuda_generate(L, t, ST__GEN_FILL, v, 0, 0, fn);
    return;
  }
  CUstream s = (CUstream)st__lua_cuda_stream(L, st__ltensor_device(t));
  char err[256];
  int rc = st__cuda_fill_strided(st__ltensor_data(t), t->dtype, t->strides, t->ndim, t->shape,
                                 v, s, err, sizeof err);
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

void st__lua_cuda_affine(lua_State *L, const st__ltensor_t *t, double mul, double add,
                         const char *fn) {
  CUstream s = (CUstream)st__lua_cuda_stream(L, st__ltensor_device(t));
  char err[256];
  int rc = st__cuda_affine_strided(st__ltensor_data(t), t->dtype, t->strides, t->ndim, t->shape,
                                   mul, add, s, err, sizeof err);
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

void st__lua_cuda_copy(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                       const char *fn) {
  CUstream s = (CUstream)st__lua_cuda_stream(L, st__ltensor_device(dst));
  char err[256];
  int rc;
  if (st__ltensor_is_contiguous(dst) && st__ltensor_is_contiguous(src))
    rc = st__cuda_cast(st__ltensor_data(dst), dst->dtype, st__ltensor_data(src), src->dtype,
                       st__ltensor_numel(dst), s, err, sizeof err);
  else
    rc = st__cuda_copy_strided(st__ltensor_data(dst), dst->dtype, dst->strides,
                               st__ltensor_data(src), src->dtype, src->strides, dst->ndim,
                               dst->shape, s, err, sizeof err);
  if (rc != ST_OK) st__lua_cuda_fail(L, rc, fn, err);
}

#else /* !ST_HAVE_CUDA: st__lua_device_check refuses CUDA before these run */

static int unreachable(lua_State *L, const char *fn) __attribute__((noreturn));
static int unreachable(lua_State *L, const char *fn) {
  no_device(L, 0, "built without CUDA support");
}

void *st__lua_cuda_stream(lua_State *L, int ordinal) {
  unreachable(L, "cuda");
}

int st__lua_cuda_sync_used(lua_State *L, char *err, size_t errlen) {
  st__lua_ctx(L)->cuda_used = 0;
  return ST_OK;
}

void st__lua_cuda_quiesce(int ordinal) {}

void st__lua_transfer(lua_State *L, void *dst, int dst_dev, const void *src, int src_dev,
                      uint64_t bytes, const char *fn) {
  if (dst_dev != ST__DEV_CPU || src_dev != ST__DEV_CPU) unreachable(L, fn);
  if (bytes) memcpy(dst, src, (size_t)bytes);
}

void st__lua_cuda_generate(lua_State *L, const st__ltensor_t *t, st__lua_gen_t kind, double a,
                           double b, uint64_t seed, const char *fn) {
  unreachable(L, fn);
}

void st__lua_cuda_fill(lua_State *L, const st__ltensor_t *t, double v, const char *fn) {
  unreachable(L, fn);
}

void st__lua_cuda_copy(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                       const char *fn) {
  unreachable(L, fn);
}

void st__lua_cuda_affine(lua_State *L, const st__ltensor_t *t, double mul, double add,
                         const char *fn) {
  unreachable(L, fn);
}

#endif
