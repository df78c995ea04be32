/* src/mem/cuda_legacy.c: legacy CUDA IPC arenas, for endpoints declared
 * with ipc = "legacy" (docs/design.md, section 3, decision 1, and section 7;
 * docs/cuda.md, "Legacy CUDA IPC"; docs/security.md).
 *
 * A legacy arena is one dedicated cuMemAlloc allocation on its device,
 * rounded up to the VMM allocation granularity (2 MiB on current GPUs) so
 * that it never shares a driver page with another allocation: the handle a
 * consumer opens maps this object's memory and nothing else. Its
 * cudaIpcMemHandle_t (cuIpcGetMemHandle of the base; the same 64 bytes the
 * runtime's cudaIpcGetMemHandle returns) is taken once at creation and
 * sent in every reply that carries the arena; no descriptor travels.
 *
 * Why it is opt-in: a legacy handle is a bearer token. Any process of the
 * host that learns the 64 bytes can open the memory with
 * cudaIpcOpenMemHandle; the socket's SO_PEERCRED check protects nothing
 * once a handle leaked. It exists for consumers that must go through
 * PyTorch's torch.multiprocessing.reductions.rebuild_cuda_tensor.
 *
 * Lifetime: unlike VMM memory, a legacy allocation is not kept alive by
 * the consumers that opened it; freeing it while a consumer uses it is
 * undefined in CUDA. The last server unref frees it with cuMemFree, so the
 * objects of a legacy endpoint should be managed (the consumer's lease
 * keeps the server's reference).
 *
 * Construction kernels fill it as they fill a VMM arena: st__arena_base is
 * a device address in the device's primary context.
 *
 * Contracts of the non-static functions: their comments in arena.h and
 * cuda.h.
 */
#include "mem/arena.h"
#include "common/fail.h"
#include "mem/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ST_HAVE_CUDA

struct st__cuda_legacy {
  int ordinal;
  char uuid[ST_CUDA_UUID_LEN];
  CUdeviceptr dptr;            /* 0 when not allocated */
  uint64_t size;
  unsigned char handle[ST_CUDA_IPC_HANDLE_LEN];
};

/* Frees the device memory of l, if any; its context is current. */
static void legacy_teardown(const st__cuda_api_t *a, st__cuda_legacy_t *l) {
  if (l->dptr) a->cuMemFree(l->dptr);
  l->dptr = 0;
}

/* See arena.h. Any thread. */
int st__arena_new_cuda_legacy(int ordinal, uint64_t bytes, st__arena_t **out, char *err,
                              size_t errlen) {
  *out = NULL;
  st__cuda_arena_start_t s;
  int rc = st__cuda_arena_prepare(ordinal, bytes, sizeof(st__cuda_legacy_t), &s, err, errlen);
  if (rc != ST_OK) return rc;
  const st__cuda_api_t *a = s.api;
  st__cuda_legacy_t *l = s.holder;
  l->ordinal = ordinal;
  l->size = s.size;
  memcpy(l->uuid, s.uuid, sizeof l->uuid);

  CUresult r = a->cuMemAlloc(&l->dptr, (size_t)l->size);
  if (r != CUDA_SUCCESS) {
    l->dptr = 0;
    rc = st__cuda_alloc_error(r, "cuMemAlloc", ordinal, l->uuid, bytes, l->size,
                              "allocated for a legacy IPC arena", err, errlen);
    goto fail;
  }
  CUipcMemHandle h;
  memset(&h, 0, sizeof h);
  rc = st__cuda_error(a->cuIpcGetMemHandle(&h, l->dptr), "cuIpcGetMemHandle", err, errlen);
  if (rc != ST_OK) goto fail;
  _Static_assert(sizeof h.reserved == ST_CUDA_IPC_HANDLE_LEN, "CUipcMemHandle is 64 bytes");
  memcpy(l->handle, h.reserved, ST_CUDA_IPC_HANDLE_LEN);
  rc = st__cuda_zero_sync(l->dptr, l->size, err, errlen);
  if (rc != ST_OK) goto fail;

  st__arena_t *arena =
      st__arena_adopt_cuda_legacy(l, bytes, l->size, (void *)(uintptr_t)l->dptr);
  if (!arena) {
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    goto fail;
  }
  *out = arena;
  return ST_OK;

fail:
  legacy_teardown(a, l);
  st__cuda_arena_unprepare(ordinal, &s);
  return rc;
}

/* See cuda.h. Any thread (the device's context becomes current). */
void st__cuda_legacy_free(st__cuda_legacy_t *l) {
  if (!l) return;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  if (a && st__cuda_ctx_enter(l->ordinal, NULL, 0) == ST_OK) legacy_teardown(a, l);
  free(l);
}

/* See cuda.h. */
const char *st__cuda_legacy_uuid(const st__cuda_legacy_t *l) { return l->uuid; }
/* See cuda.h. Any thread. */
int st__cuda_legacy_ordinal(const st__cuda_legacy_t *l) { return l->ordinal; }
/* See cuda.h. Any thread. */
const unsigned char *st__cuda_legacy_handle(const st__cuda_legacy_t *l) { return l->handle; }

#else /* !ST_HAVE_CUDA */

struct st__cuda_legacy {
  unsigned char handle[ST_CUDA_IPC_HANDLE_LEN];
};

/* See arena.h: always ST_ERR_CAPABILITY in a build without CUDA. */
int st__arena_new_cuda_legacy(int ordinal, uint64_t bytes, st__arena_t **out, char *err,
                              size_t errlen) {
  *out = NULL;
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

/* See cuda.h; never reached without legacy arenas. */
void st__cuda_legacy_free(st__cuda_legacy_t *l) { free(l); }
/* See cuda.h. */
const char *st__cuda_legacy_uuid(const st__cuda_legacy_t *l) { return ""; }
/* See cuda.h. Any thread. */
int st__cuda_legacy_ordinal(const st__cuda_legacy_t *l) { return -1; }
/* See cuda.h. Any thread. */
const unsigned char *st__cuda_legacy_handle(const st__cuda_legacy_t *l) { return l->handle; }

#endif
