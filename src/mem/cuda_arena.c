/* src/mem/cuda_arena.c: CUDA arenas, exported VMM allocations (docs/design.md,
 * section 3, decision 1; see arena.h and cuda.h).
 *
 * One arena is one cuMemCreate allocation of pinned device memory whose
 * handle type is CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (FABRIC is never
 * requested: it needs IMEX daemons and is not what a same-host server
 * wants). The server keeps the allocation handle, not a descriptor: each
 * reply exports a new one (st__cuda_alloc_export; its cost, with
 * millisecond outliers: docs/benchmarks.md, "Driver and socket costs"), so that objects held in the cache take no slot of
 * the descriptor table however many there are (docs/cuda.md). The server maps the allocation read-write on its device so
 * that kernels fill it, and zero-fills it so that "zeros" needs no kernel.
 *
 * Lifetime: the driver counts handles, descriptors and mappings of the
 * physical memory across processes. The last server unref unmaps, frees
 * the address range and releases the handle; a client that imported an
 * export keeps its mapping, and the memory, even after the server exits or
 * is killed.
 *
 * Contracts of the non-static functions: their comments in arena.h and
 * cuda.h.
 */
#include "mem/arena.h"
#include "common/fail.h"
#include "mem/cuda.h"
#include "mem/ledger.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ST_HAVE_CUDA

struct st__cuda_alloc {
  int ordinal;
  char uuid[ST_CUDA_UUID_LEN];
  CUmemGenericAllocationHandle handle;
  int have_handle;
  CUdeviceptr va;              /* reserved range, 0 when none */
  int mapped;
  uint64_t size;
};

/* Undoes whatever part of the allocation exists. */
static void alloc_teardown(const st__cuda_api_t *a, st__cuda_alloc_t *c) {
  if (c->mapped) a->cuMemUnmap(c->va, (size_t)c->size);
  if (c->va) a->cuMemAddressFree(c->va, (size_t)c->size);
  if (c->have_handle) a->cuMemRelease(c->handle);
  c->mapped = 0;
  c->va = 0;
  c->have_handle = 0;
}

/* See cuda.h. */
int st__cuda_alloc_error(CUresult r, const char *call, int ordinal, const char *uuid,
                         uint64_t bytes, uint64_t size, const char *how, char *err,
                         size_t errlen) {
  uint64_t free_b = 0, total_b = 0;
  st__cuda_mem_info(ordinal, &free_b, &total_b, NULL, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY || size > free_b)
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen,
                    "out of device memory on cuda:%d (%s): requested %llu bytes (%llu %s), "
                    "%llu bytes free of %llu",
                    ordinal, uuid, (unsigned long long)bytes, (unsigned long long)size, how,
                    (unsigned long long)free_b, (unsigned long long)total_b);
  return st__cuda_error(r, call, err, errlen);
}

/* See cuda.h. */
int st__cuda_arena_prepare(int ordinal, uint64_t bytes, size_t holder_bytes,
                           st__cuda_arena_start_t *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  int rc = st__arena_check_limit(bytes, err, errlen);
  if (rc != ST_OK) return rc;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  uint64_t g;
  rc = st__cuda_granularity(ordinal, &g, err, errlen);
  if (rc != ST_OK) return rc;
  if (bytes > UINT64_MAX - g || bytes > (uint64_t)(SIZE_MAX / 2))
    return st__fail(ST_ERR_LIMIT, err, errlen, "object of %llu bytes is too large",
                    (unsigned long long)bytes);
  uint64_t n = bytes ? (bytes + g - 1) / g * g : g;
  rc = st__ledger_charge(ordinal, n, 0, err, errlen);
  if (rc != ST_OK) return rc;
  s->api = a;
  s->gran = g;
  s->size = n;
  rc = st__cuda_device_uuid(ordinal, s->uuid, err, errlen);
  if (rc == ST_OK && !(s->holder = calloc(1, holder_bytes)))
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  if (rc != ST_OK) st__cuda_arena_unprepare(ordinal, s);
  return rc;
}

/* See cuda.h. */
void st__cuda_arena_unprepare(int ordinal, st__cuda_arena_start_t *s) {
  free(s->holder);
  s->holder = NULL;
  st__ledger_discharge(ordinal, s->size, 0);
}

/* See arena.h. Any thread. */
int st__arena_new_cuda(int ordinal, uint64_t bytes, st__arena_t **out, char *err, size_t errlen) {
  *out = NULL;
  st__cuda_arena_start_t s;
  int rc = st__cuda_arena_prepare(ordinal, bytes, sizeof(st__cuda_alloc_t), &s, err, errlen);
  if (rc != ST_OK) return rc;
  const st__cuda_api_t *a = s.api;
  uint64_t size = s.size;
  st__cuda_alloc_t *c = s.holder;
  c->ordinal = ordinal;
  c->size = size;
  memcpy(c->uuid, s.uuid, sizeof c->uuid);

  CUmemAllocationProp prop;
  st__cuda_alloc_prop(ordinal, &prop);
  CUresult r = a->cuMemCreate(&c->handle, (size_t)size, &prop, 0);
  if (r != CUDA_SUCCESS) {
    rc = st__cuda_alloc_error(r, "cuMemCreate", ordinal, c->uuid, bytes, size,
                              "allocated in granules", err, errlen);
    goto fail;
  }
  c->have_handle = 1;

  rc = st__cuda_error(a->cuMemAddressReserve(&c->va, (size_t)size, (size_t)s.gran, 0, 0),
                      "cuMemAddressReserve", err, errlen);
  if (rc != ST_OK) goto fail;
  rc = st__cuda_error(a->cuMemMap(c->va, (size_t)size, 0, c->handle, 0), "cuMemMap", err, errlen);
  if (rc != ST_OK) goto fail;
  c->mapped = 1;
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = ordinal;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  rc = st__cuda_error(a->cuMemSetAccess(c->va, (size_t)size, &acc, 1), "cuMemSetAccess", err,
                      errlen);
  if (rc != ST_OK) goto fail;
  rc = st__cuda_zero_sync(c->va, size, err, errlen);
  if (rc != ST_OK) goto fail;

  st__arena_t *arena = st__arena_adopt_cuda(c, bytes, size, (void *)(uintptr_t)c->va);
  if (!arena) {
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    goto fail;
  }
  *out = arena;
  return ST_OK;

fail:
  alloc_teardown(a, c);
  st__cuda_arena_unprepare(ordinal, &s);
  return rc;
}

/* See cuda.h. Any thread (the device's context becomes current). */
int st__cuda_alloc_export(st__cuda_alloc_t *c, char *err, size_t errlen) {
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  if (!c->have_handle) {
    if (err && errlen) snprintf(err, errlen, "the allocation has no handle to export");
    return ST_ERR_INVALID_ARGUMENT;
  }
  if (st__cuda_ctx_enter(c->ordinal, err, errlen) != ST_OK) return ST_ERR_CAPABILITY;
  int fd = -1;
  CUresult r =
      a->cuMemExportToShareableHandle(&fd, c->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS || fd < 0) {
    int rc = st__cuda_error(r == CUDA_SUCCESS ? CUDA_ERROR_UNKNOWN : r,
                            "cuMemExportToShareableHandle", err, errlen);
    /* Out of descriptors is the one failure a healthy allocation has. */
    if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_OPERATING_SYSTEM) return ST_ERR_LIMIT;
    return rc;
  }
  /* Workers may fork helpers; the descriptor must not leak into them. */
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

/* See cuda.h. Any thread (the device's context becomes current). */
void st__cuda_alloc_free(st__cuda_alloc_t *c) {
  if (!c) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (a) {
    st__cuda_ctx_enter(c->ordinal, NULL, 0);
    alloc_teardown(a, c);
  }
  free(c);
}

/* See cuda.h. */
const char *st__cuda_alloc_uuid(const st__cuda_alloc_t *c) { return c->uuid; }
/* See cuda.h. Any thread. */
int st__cuda_alloc_ordinal(const st__cuda_alloc_t *c) { return c->ordinal; }

#else /* !ST_HAVE_CUDA */

struct st__cuda_alloc {
  int unused;
};

/* See arena.h: always ST_ERR_CAPABILITY in a build without CUDA. */
int st__arena_new_cuda(int ordinal, uint64_t bytes, st__arena_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

/* See cuda.h; never reached without CUDA arenas. */
void st__cuda_alloc_free(st__cuda_alloc_t *c) { free(c); }
/* See cuda.h; never reached without CUDA arenas. */
int st__cuda_alloc_export(st__cuda_alloc_t *c, char *err, size_t errlen) {
  (void)c;
  if (err && errlen) snprintf(err, errlen, "no CUDA support in this build");
  return ST_ERR_CAPABILITY;
}
/* See cuda.h. Any thread. */
const char *st__cuda_alloc_uuid(const st__cuda_alloc_t *c) { return ""; }
/* See cuda.h. Any thread. */
int st__cuda_alloc_ordinal(const st__cuda_alloc_t *c) { return -1; }

#endif
