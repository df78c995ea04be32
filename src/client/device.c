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
 *     remembers the process that made it; another process only forgets it.
 *
 * Threads: any. The functions take no lock of their own.
 */
#include <stdio.h>
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

/* The caller's current context (NULL: none), to put back afterwards. Call
 * only once st__cuda_api() succeeded. */
static CUcontext ctx_save(void) {
  pthread_once(&get_once, load_get_current);
  CUcontext c = NULL;
  if (get_current && get_current(&c) != CUDA_SUCCESS) c = NULL;
  return c;
}

static void ctx_restore(const st__cuda_api_t *a, CUcontext c) { a->cuCtxSetCurrent(c); }

/* See client_internal.h. Any thread. */
int st__client_cuda_device(const st__arena_desc_t *d, int *ordinal, char *err, size_t errlen) {
  *ordinal = -1;
  char why[300];
  const st__cuda_api_t *a = st__cuda_api(why, sizeof why);
  if (!a)
    return st__fail(ST_ERR_CAPABILITY, err, errlen, "%s (arena %llu is on %s)", why,
                    (unsigned long long)d->id, d->uuid[0] ? d->uuid : "an unnamed device");
  CUcontext saved = ctx_save();
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
    /* Creating the primary context (100 ms or more) happens here, outside
     * the open-cache lock. */
    rc = st__cuda_ctx_enter(*ordinal, why, sizeof why);
    if (rc != ST_OK)
      rc = st__fail(rc == ST_ERR_INVALID_ARGUMENT ? ST_ERR_CAPABILITY : rc, err, errlen,
                    "no CUDA device: %s (arena %llu is on %s)", why, (unsigned long long)d->id,
                    d->uuid);
  } else {
    rc = st__fail(rc, err, errlen, "arena %llu: %s", (unsigned long long)d->id, why);
  }
  ctx_restore(a, saved);
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
  CUcontext saved = ctx_save();
  int rc = st__cuda_import(fd, d->bytes, d->uuid, out, why, sizeof why);
  ctx_restore(a, saved);
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
  CUcontext saved = ctx_save();
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
  ctx_restore(a, saved);
  if (rc != ST_OK) return st__fail(rc, err, errlen, "cuda:%d: %s", ordinal, why);
  return ST_OK;
}

/* See client_internal.h. Any thread. */
void st__client_cuda_unmap(st__cuda_mapping_t *m) {
  if (!m || !m->dptr) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return;
  CUcontext saved = ctx_save();
  st__cuda_unmap(m);
  ctx_restore(a, saved);
}

/* See client_internal.h. Any thread. */
int st__client_cuda_to_host(void *dst, const void *src, size_t bytes, int ordinal) {
  if (bytes == 0) return ST_OK;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (!a) return ST_ERR_CAPABILITY;
  CUcontext saved = ctx_save();
  int rc = st__cuda_copy_to_host(dst, (uint64_t)(uintptr_t)src, bytes, ordinal, NULL, 0);
  ctx_restore(a, saved);
  return rc;
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

#endif
