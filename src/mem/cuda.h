/* src/mem/cuda.h: the server's CUDA arenas: VMM allocations made and
 * exported by the server (cuda_arena.c) and legacy CUDA IPC allocations
 * (cuda_legacy.c), and the steps both start with. The driver table and
 * the import side they build on are src/cudadrv (included here).
 */
#ifndef ST_MEM_CUDA_H
#define ST_MEM_CUDA_H

#include <stdint.h>

#include "cudadrv/driver.h"
#include "cudadrv/import.h"

#ifdef ST_HAVE_CUDA
/* What st__cuda_arena_prepare gives the arena it starts. */
typedef struct st__cuda_arena_start {
  const st__cuda_api_t *api;
  uint64_t gran;                   /* the device's allocation granularity */
  uint64_t size;                   /* bytes rounded up to it, charged to the ledger */
  char uuid[ST_CUDA_UUID_LEN];     /* the device's */
  void *holder;                    /* the arena's own record, zeroed */
} st__cuda_arena_start_t;

/* The steps every CUDA arena starts with (cuda_arena.c, cuda_legacy.c):
 * the object size limit, the driver, the device's context made current,
 * its allocation granularity, size = bytes rounded up to it (one granule
 * for 0 bytes), a ledger charge of size on `ordinal` (mem/ledger.h), the
 * device's UUID and a zeroed record of holder_bytes for the caller to
 * fill. The caller hands the charge and the record to the arena, or gives
 * them back with st__cuda_arena_unprepare when it fails later. ST_OK, or
 * LIMIT / OUT_OF_MEMORY (the budget, or the record) / CAPABILITY / a
 * driver error with a message; nothing is charged or allocated then. Any
 * thread. */
int st__cuda_arena_prepare(int ordinal, uint64_t bytes, size_t holder_bytes,
                           st__cuda_arena_start_t *s, char *err, size_t errlen);

/* Frees s->holder and discharges s->size from `ordinal`'s ledger. */
void st__cuda_arena_unprepare(int ordinal, st__cuda_arena_start_t *s);

/* The error of a failed allocation call `call` (cuMemCreate, cuMemAlloc)
 * of `size` bytes for `bytes` requested on `ordinal` (device `uuid`):
 * OUT_OF_MEMORY with the requested and free bytes ("(<size> <how>)"
 * names the rounding), else the driver's error. Any thread. */
int st__cuda_alloc_error(CUresult r, const char *call, int ordinal, const char *uuid,
                         uint64_t bytes, uint64_t size, const char *how, char *err,
                         size_t errlen);
#endif

/* --------------------------------------------------- server side (arenas) */

/* One exported VMM allocation, mapped in the server (cuda_arena.c). Owned
 * by a CUDA arena; freed by st__cuda_alloc_free on its last unref. */
typedef struct st__cuda_alloc st__cuda_alloc_t;

/* Unmaps, frees the address range, releases the allocation handle and
 * frees *c. Clients' mappings keep the memory. NULL is a no-op. Any
 * thread. */
void st__cuda_alloc_free(st__cuda_alloc_t *c);

/* Exports the allocation to a new POSIX descriptor (close-on-exec, owned
 * by the caller), one per reply: the server keeps none of its own.
 * Returns the fd, or ST_ERR_LIMIT (out of descriptors), ST_ERR_CAPABILITY,
 * another ST_ERR_* for a driver failure, with the reason in err (may be
 * NULL). Any thread (the device's primary context becomes current). */
int st__cuda_alloc_export(st__cuda_alloc_t *c, char *err, size_t errlen);

/* UUID string of the allocation's device (borrowed, static for the life of
 * c) and its ordinal in this process. */
const char *st__cuda_alloc_uuid(const st__cuda_alloc_t *c);
int st__cuda_alloc_ordinal(const st__cuda_alloc_t *c);

/* ------------------------------------- server side (legacy CUDA IPC arenas) */

/* One dedicated cuMemAlloc allocation exported with cuIpcGetMemHandle
 * (cuda_legacy.c): the backing of an arena of an endpoint declared with
 * ipc = "legacy" (docs/design.md, section 3, decision 1). Owned by its arena; freed by
 * st__cuda_legacy_free on the arena's last unref. */
typedef struct st__cuda_legacy st__cuda_legacy_t;

/* Frees the allocation (cuMemFree in its device's primary context, which
 * becomes current on the calling thread) and *l. A consumer that still has
 * the handle open must not use it afterwards (CUDA leaves that undefined):
 * legacy objects are meant to be managed, so that the consumer's lease
 * keeps the allocation. NULL is a no-op. Any thread. */
void st__cuda_legacy_free(st__cuda_legacy_t *l);

/* UUID string of the allocation's device (borrowed, valid for the life of
 * l), its ordinal in this process, and the ST_CUDA_IPC_HANDLE_LEN bytes of
 * the cudaIpcMemHandle_t of the allocation base (borrowed). */
const char *st__cuda_legacy_uuid(const st__cuda_legacy_t *l);
int st__cuda_legacy_ordinal(const st__cuda_legacy_t *l);
const unsigned char *st__cuda_legacy_handle(const st__cuda_legacy_t *l);

#endif
