/* src/client: CUDA for libstclient. Wraps the driver primitives of
 * src/mem/cuda.h (compiled into the library) with what a client needs:
 *
 *   - client errors: a descriptor naming a device this process cannot use
 *     is ST_ERR_CAPABILITY "no CUDA device: <reason>" naming the arena and
 *     its UUID; a descriptor that disagrees with its allocation is
 *     ST_ERR_PROTOCOL, as for CPU arenas;
 *   - contexts: the primitives make the device's primary context current
 *     on the calling thread. A library must not change its caller's thread
 *     state, so each function here puts back the context that was current
 *     before (cuCtxGetCurrent is looked up once, like the table's entries);
 *   - fork: CUDA cannot be used in a child forked without exec. A mapping
 *     remembers the process that made it; another process only forgets it;
 *   - events: recorded on a device's legacy default stream to give a pooled
 *     region back once the device work queued before its free is done
 *     (pool.c); kept on a free list per device and reused.
 *
 * Threads: any. The event free list has its own lock; nothing else here
 * takes one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "common/fail.h"

#ifdef ST_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <pthread.h>

static pthread_once_t get_once = PTHREAD_ONCE_INIT;
static PFN_cuCtxGetCurrent_v4000 get_current;

static void load_get_current(void) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess && fn)
    memcpy(&get_current, &fn, sizeof fn);
}

/* See client_internal.h. */
CUcontext st__client_ctx_save(void) {
  pthread_once(&get_once, load_get_current);
  CUcontext c = NULL;
  if (get_current && get_current(&c) != CUDA_SUCCESS) c = NULL;
  return c;
}

/* See client_internal.h. */
void st__client_ctx_restore(const st__cuda_api_t *a, CUcontext c) { a->cuCtxSetCurrent(c); }

/* See client_internal.h. Any thread. */
int st__client_cuda_device(const st__arena_desc_t *d, int *ordinal, char *err, size_t errlen) {
  *ordinal = -1;
  char why[300];
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a)
    return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s (arena %llu is on %s)", why,
                    (unsigned long long)d->id, d->uuid[0] ? d->uuid : "an unnamed device");
  CUcontext saved = st__client_ctx_save();
  int rc = st__cuda_device_by_uuid(d->uuid, ordinal, why, sizeof why);
  if (rc == ST_ERR_INVALID_ARGUMENT) {
    rc = st__fail(ST_ERR_PROTOCOL, err, errlen, "arena %llu: %s", (unsigned long long)d->id, why);
  } else if (rc == ST_ERR_NOT_FOUND || rc == ST_ERR_CAPABILITY) {
    /* Another CUDA_VISIBLE_DEVICES hides the device: this process cannot
     * map the memory, which is a capability it lacks. */
    rc = st__fail(ST_ERR_CAPABILITY, err, errlen, "%s%s (arena %llu is on %s)",
                  strncmp(why, "no CUDA device", 14) == 0 ? "" : "no CUDA device: ", why,
                  (unsigned long long)d->id, d->uuid);
  } else if (rc == ST_OK) {
    /* Creating the primary context (the slow step of a first import:
     * docs/benchmarks.md, "Driver and socket costs") happens here,
     * outside the open-cache lock. */
    rc = st__cuda_ctx_enter(*ordinal, why, sizeof why);
    if (rc != ST_OK)
      rc = st__fail(rc == ST_ERR_INVALID_ARGUMENT ? ST_ERR_CAPABILITY : rc, err, errlen,
                    "no CUDA device: %s (arena %llu is on %s)", why, (unsigned long long)d->id,
                    d->uuid);
  } else {
    rc = st__fail(rc, err, errlen, "arena %llu: %s", (unsigned long long)d->id, why);
  }
  st__client_ctx_restore(a, saved);
  if (rc != ST_OK) *ordinal = -1;
  return rc;
}

/* See client_internal.h. Any thread. */
int st__client_cuda_import(const st__arena_desc_t *d, int fd, st__cuda_mapping_t *out,
                           char *err, size_t errlen) {
  char why[300];
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a) {
    memset(out, 0, sizeof *out);
    out->ordinal = -1;
    return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s (arena %llu is on %s)", why,
                    (unsigned long long)d->id, d->uuid);
  }
  CUcontext saved = st__client_ctx_save();
  int rc = st__cuda_import(fd, d->bytes, d->uuid, out, why, sizeof why);
  /* A read-only arena: kernels of this process may read it, a write
   * faults here (docs/keys.md, "Read-only mappings"). */
  if (rc == ST_OK && d->readonly && (rc = st__cuda_set_readonly(out, why, sizeof why)) != ST_OK)
    st__cuda_unmap(out);
  st__client_ctx_restore(a, saved);
  if (rc == ST_OK) return ST_OK;
  /* A size that is no multiple of the granularity or larger than the
   * allocation, or a descriptor that is no exported allocation: the reply
   * and its descriptor disagree. */
  if (rc == ST_ERR_INVALID_ARGUMENT) rc = ST_ERR_PROTOCOL;
  if (rc == ST_ERR_NOT_FOUND) rc = ST_ERR_CAPABILITY;
  return st__fail(rc, err, errlen, "arena %llu on %s: %s", (unsigned long long)d->id, d->uuid,
                  why);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_alloc(int ordinal, uint64_t bytes, int *fd, st__cuda_mapping_t *out,
                          char *uuid, char *err, size_t errlen) {
  char why[300];
  *fd = -1;
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a) return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s", why);
  CUcontext saved = st__client_ctx_save();
  uint64_t size = 0;
  int rc = st__cuda_create_fd(ordinal, bytes, fd, &size, why, sizeof why);
  if (rc == ST_OK) rc = st__cuda_device_uuid(ordinal, uuid, why, sizeof why);
  if (rc == ST_OK) rc = st__cuda_import(*fd, size, uuid, out, why, sizeof why);
  if (rc == ST_OK) rc = st__cuda_zero_sync(out->dptr, out->bytes, why, sizeof why);
  if (rc != ST_OK) {
    st__cuda_unmap(out);
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  st__client_ctx_restore(a, saved);
  if (rc != ST_OK) return st__fail(rc, err, errlen, "cuda:%d: %s", ordinal, why);
  return ST_OK;
}

/* See client_internal.h. Any thread. */
void st__client_cuda_unmap(st__cuda_mapping_t *m) {
  if (!m || !m->dptr) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return;
  CUcontext saved = st__client_ctx_save();
  st__cuda_unmap(m);
  st__client_ctx_restore(a, saved);
}

typedef enum { TO_HOST, TO_DEVICE, DEVICE_TO_DEVICE } copy_kind_t;

/* A synchronous copy of device `ordinal`: device to host, host to device
 * or device to device, the caller's context kept. */
static int copy_sync(void *dst, const void *src, size_t bytes, int ordinal, copy_kind_t kind) {
  if (bytes == 0) return ST_OK;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return ST_ERR_CAPABILITY;
  CUcontext saved = st__client_ctx_save();
  uint64_t ddst = (uint64_t)(uintptr_t)dst, dsrc = (uint64_t)(uintptr_t)src;
  int rc = kind == TO_HOST     ? st__cuda_copy_to_host(dst, dsrc, bytes, ordinal, NULL, 0)
           : kind == TO_DEVICE ? st__cuda_copy_to_device(ddst, src, bytes, ordinal, NULL, 0)
                               : st__cuda_copy_dtod(ddst, dsrc, bytes, ordinal, NULL, 0);
  st__client_ctx_restore(a, saved);
  return rc;
}

/* See client_internal.h. Any thread. */
int st__client_cuda_to_host(void *dst, const void *src, size_t bytes, int ordinal) {
  return copy_sync(dst, src, bytes, ordinal, TO_HOST);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_from_host(void *dst, const void *src, size_t bytes, int ordinal) {
  return copy_sync(dst, src, bytes, ordinal, TO_DEVICE);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_dtod(void *dst, const void *src, size_t bytes, int ordinal) {
  return copy_sync(dst, src, bytes, ordinal, DEVICE_TO_DEVICE);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_sync(int ordinal, void *stream, char *err, size_t errlen) {
  char why[300];
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a) return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s", why);
  CUcontext saved = st__client_ctx_save();
  int rc = st__cuda_ctx_enter(ordinal, why, sizeof why);
  if (rc == ST_OK && stream)
    rc = st__cuda_error(a->cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize", why,
                        sizeof why);
  else if (rc == ST_OK)
    rc = st__cuda_error(a->cuCtxSynchronize(), "cuCtxSynchronize", why, sizeof why);
  st__client_ctx_restore(a, saved);
  if (rc != ST_OK) return st__fail(rc, err, errlen, "cuda:%d: %s", ordinal, why);
  return ST_OK;
}

/* ------------------------------------------------------------ events */

/* Events kept for reuse per device ordinal, beyond which a returned one
 * is destroyed. */
#define EVENT_DEVICES 64
#define EVENT_KEEP 256

struct st__client_event {
  CUevent ev;
  int ordinal;
  st__client_event_t *next;   /* on its device's free list */
};

static pthread_mutex_t event_lock = PTHREAD_MUTEX_INITIALIZER;
static st__client_event_t *event_free[EVENT_DEVICES];
static size_t event_nfree[EVENT_DEVICES];

/* See client_internal.h. Any thread. */
int st__client_event_record(int ordinal, st__client_event_t **out) {
  *out = NULL;
  if (ordinal < 0 || ordinal >= EVENT_DEVICES) return ST_ERR_INVALID_ARGUMENT;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return ST_ERR_CAPABILITY;
  pthread_mutex_lock(&event_lock);
  st__client_event_t *e = event_free[ordinal];
  if (e) {
    event_free[ordinal] = e->next;
    event_nfree[ordinal]--;
  }
  pthread_mutex_unlock(&event_lock);
  CUcontext saved = st__client_ctx_save();
  int rc = st__cuda_ctx_enter(ordinal, NULL, 0);
  if (rc == ST_OK && !e) {
    e = calloc(1, sizeof *e);
    if (!e) {
      rc = ST_ERR_OUT_OF_MEMORY;
    } else if ((rc = st__cuda_error(a->cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING),
                                    "cuEventCreate", NULL, 0)) != ST_OK) {
      free(e);
      e = NULL;
    } else {
      e->ordinal = ordinal;
    }
  }
  /* The legacy default stream waits for every blocking stream of the
   * context and is the stream torch uses unless told otherwise. */
  if (rc == ST_OK)
    rc = st__cuda_error(a->cuEventRecord(e->ev, CU_STREAM_LEGACY), "cuEventRecord", NULL, 0);
  st__client_ctx_restore(a, saved);
  if (rc != ST_OK) {
    st__client_event_put(e);
    return rc;
  }
  *out = e;
  return ST_OK;
}

/* See client_internal.h. Any thread. */
int st__client_event_done(st__client_event_t *e) {
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  /* cuEventQuery needs no current context. An error other than "not
   * ready" is the context's sticky error (its work was abandoned) or the
   * driver shutting down: nothing of this process reads the memory any
   * more. */
  return !a || a->cuEventQuery(e->ev) != CUDA_ERROR_NOT_READY;
}

/* See client_internal.h. Any thread. */
void st__client_event_wait(st__client_event_t *e) {
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return;
  CUcontext saved = st__client_ctx_save();
  if (st__cuda_ctx_enter(e->ordinal, NULL, 0) == ST_OK) a->cuEventSynchronize(e->ev);
  st__client_ctx_restore(a, saved);
}

/* See client_internal.h. Any thread. */
void st__client_event_put(st__client_event_t *e) {
  if (!e) return;
  pthread_mutex_lock(&event_lock);
  int keep = event_nfree[e->ordinal] < EVENT_KEEP;
  if (keep) {
    e->next = event_free[e->ordinal];
    event_free[e->ordinal] = e;
    event_nfree[e->ordinal]++;
  }
  pthread_mutex_unlock(&event_lock);
  if (keep) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (a) a->cuEventDestroy(e->ev);
  free(e);
}

#else /* !ST_HAVE_CUDA */

/* See client_internal.h: a build without CUDA maps no CUDA arena. */
int st__client_cuda_device(const st__arena_desc_t *d, int *ordinal, char *err, size_t errlen) {
  *ordinal = -1;
  return st__fail(ST_ERR_CAPABILITY, err, errlen,
                  "no CUDA device: built without CUDA support (arena %llu is on %s)",
                  (unsigned long long)d->id, d->uuid[0] ? d->uuid : "an unnamed device");
}

/* See client_internal.h. */
int st__client_cuda_import(const st__arena_desc_t *d, int fd, st__cuda_mapping_t *out,
                           char *err, size_t errlen) {
  int ordinal;
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  return st__client_cuda_device(d, &ordinal, err, errlen);
}

/* See client_internal.h. */
void st__client_cuda_unmap(st__cuda_mapping_t *m) {
  if (m) memset(m, 0, sizeof *m);
}

/* See client_internal.h: no CUDA memory without CUDA. */
int st__client_cuda_alloc(int ordinal, uint64_t bytes, int *fd, st__cuda_mapping_t *out,
                          char *uuid, char *err, size_t errlen) {
  (void)bytes;
  *fd = -1;
  uuid[0] = '\0';
  memset(out, 0, sizeof *out);
  out->ordinal = -1;
  return st__fail(ST_ERR_CAPABILITY, err, errlen,
                  "no CUDA device: built without CUDA support (cuda:%d)", ordinal);
}

/* See client_internal.h. */
int st__client_cuda_to_host(void *dst, const void *src, size_t bytes, int ordinal) {
  return bytes ? ST_ERR_CAPABILITY : ST_OK;
}

/* See client_internal.h. */
int st__client_cuda_from_host(void *dst, const void *src, size_t bytes, int ordinal) {
  return bytes ? ST_ERR_CAPABILITY : ST_OK;
}

int st__client_cuda_dtod(void *dst, const void *src, size_t bytes, int ordinal) {
  (void)dst;
  (void)src;
  (void)ordinal;
  return bytes ? ST_ERR_CAPABILITY : ST_OK;
}

/* See client_internal.h: no CUDA work without CUDA. */
int st__client_cuda_sync(int ordinal, void *stream, char *err, size_t errlen) {
  (void)stream;
  return st__fail(ST_ERR_CAPABILITY, err, errlen,
                  "no CUDA device: built without CUDA support (cuda:%d)", ordinal);
}

/* See client_internal.h: no CUDA region exists without CUDA. */
int st__client_event_record(int ordinal, st__client_event_t **out) {
  (void)ordinal;
  *out = NULL;
  return ST_ERR_CAPABILITY;
}
int st__client_event_done(st__client_event_t *e) { return e != NULL; }
void st__client_event_wait(st__client_event_t *e) { (void)e; }
void st__client_event_put(st__client_event_t *e) { (void)e; }

#endif
