/* src/mem/cuda.h: the CUDA driver API as this project uses it, without
 * linking libcuda (DESIGN §3, decisions 1, 6 and 7).
 *
 * The binaries link only the CUDA runtime. Driver functions (the VMM calls
 * cuMemCreate, cuMemExportToShareableHandle, ...) are looked up once per
 * process with cudaGetDriverEntryPointByVersion and kept in a table. On a
 * host without an NVIDIA driver the lookup fails, every function below
 * returns ST_ERR_CAPABILITY with "no CUDA device: <reason>", and the
 * process carries on. In a build without CUDA (ST_HAVE_CUDA undefined) the
 * same functions exist and say "no CUDA device: built without CUDA
 * support".
 *
 * Devices are named by UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
 * the form nvidia-smi prints) on the wire; an ordinal is local to a process
 * and depends on its CUDA_VISIBLE_DEVICES.
 *
 * Contexts: each device's primary context is retained the first time a
 * thread enters it (st__cuda_ctx_enter) and kept for the life of the
 * process. Functions that talk to a device make its primary context current
 * on the calling thread themselves.
 *
 * This header and cuda_driver.c / cuda_import.c depend on nothing else of
 * the project but include/st/errors.h, so the client library can link them.
 */
#ifndef ST_MEM_CUDA_H
#define ST_MEM_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "st/errors.h"

#ifdef ST_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

/* Bytes of a legacy cudaIpcMemHandle_t / CUipcMemHandle. */
#define ST_CUDA_IPC_HANDLE_LEN 64

/* "GPU-" + 32 hex digits + 4 dashes + NUL fits in 48 (st__arena_desc_t). */
#define ST_CUDA_UUID_LEN 48

#ifdef ST_HAVE_CUDA
/* Driver entry points, by the ABI version of CUDA 12.0 (the _v2 functions
 * where a _v2 exists). Filled once; read-only afterwards. */
typedef struct st__cuda_api {
  PFN_cuInit_v2000 cuInit;
  PFN_cuDeviceGet_v2000 cuDeviceGet;
  PFN_cuDeviceGetCount_v2000 cuDeviceGetCount;
  PFN_cuDeviceGetUuid_v11040 cuDeviceGetUuid;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent;
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
  PFN_cuMemCreate_v10020 cuMemCreate;
  PFN_cuMemRelease_v10020 cuMemRelease;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree;
  PFN_cuMemMap_v10020 cuMemMap;
  PFN_cuMemUnmap_v10020 cuMemUnmap;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess;
  PFN_cuMemGetInfo_v3020 cuMemGetInfo;
  PFN_cuGetErrorName_v6000 cuGetErrorName;
  PFN_cuGetErrorString_v6000 cuGetErrorString;
  PFN_cuStreamCreate_v2000 cuStreamCreate;
  PFN_cuStreamSynchronize_v2000 cuStreamSynchronize;
  PFN_cuCtxSynchronize_v2000 cuCtxSynchronize;
  PFN_cuStreamDestroy_v4000 cuStreamDestroy;
  PFN_cuMemcpyHtoDAsync_v3020 cuMemcpyHtoDAsync;
  PFN_cuMemcpyDtoH_v3020 cuMemcpyDtoH;
  PFN_cuMemcpyDtoD_v3020 cuMemcpyDtoD;
  PFN_cuMemcpyAsync_v4000 cuMemcpyAsync;
  PFN_cuMemGetAddressRange_v3020 cuMemGetAddressRange;
  PFN_cuMemsetD8Async_v3020 cuMemsetD8Async;
  /* Events: libstclient defers the free of a pooled CUDA region until
   * the device work queued before it is done (src/client/device.c). */
  PFN_cuEventCreate_v2000 cuEventCreate;
  PFN_cuEventRecord_v2000 cuEventRecord;
  PFN_cuEventQuery_v2000 cuEventQuery;
  PFN_cuEventSynchronize_v2000 cuEventSynchronize;
  PFN_cuEventDestroy_v4000 cuEventDestroy;
  /* libstclient's batched copy kernel (src/client/copies.c), and the
   * check that both sides of a range are memory of the device. */
  PFN_cuModuleLoadData_v2000 cuModuleLoadData;
  PFN_cuModuleGetFunction_v2000 cuModuleGetFunction;
  PFN_cuLaunchKernel_v4000 cuLaunchKernel;
  PFN_cuPointerGetAttributes_v7000 cuPointerGetAttributes;
  /* Legacy CUDA IPC (cuda_legacy.c): ipc = "legacy" endpoints only. */
  PFN_cuMemAlloc_v3020 cuMemAlloc;
  PFN_cuMemFree_v3020 cuMemFree;
  PFN_cuIpcGetMemHandle_v4010 cuIpcGetMemHandle;
} st__cuda_api_t;

/* The driver table, loaded on the first call (pthread_once): the runtime's
 * cudaGetDeviceCount must succeed, every entry point must resolve and
 * cuInit(0) must succeed. Returns the table (static, never freed) or NULL
 * with "no CUDA device: <reason>" in err. Any thread. */
const st__cuda_api_t *st__cuda_api(char *err, size_t errlen);

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

/* Formats a failed driver call as "<what>: CUDA_ERROR_X (text)" into err
 * and returns the matching ST_ERR_*: OUT_OF_MEMORY for
 * CUDA_ERROR_OUT_OF_MEMORY, INVALID_ARGUMENT for invalid values and
 * handles, CAPABILITY for missing devices or features, INTERNAL otherwise.
 * ST_OK for CUDA_SUCCESS (err untouched). Any thread. */
int st__cuda_error(CUresult r, const char *what, char *err, size_t errlen);

/* The allocation properties every VMM allocation of this project uses:
 * pinned device memory on `ordinal`, exportable as a POSIX descriptor
 * (never FABRIC). Fills *prop. Any thread. */
void st__cuda_alloc_prop(int ordinal, CUmemAllocationProp *prop);
#endif

/* ST_OK when the driver loaded and at least one device is visible;
 * otherwise ST_ERR_CAPABILITY and "no CUDA device: <reason>". Any thread. */
int st__cuda_available(char *err, size_t errlen);

/* Number of devices visible to this process (after CUDA_VISIBLE_DEVICES).
 * ST_OK or ST_ERR_CAPABILITY. Any thread. */
int st__cuda_device_count(int *count, char *err, size_t errlen);

/* UUID string of device `ordinal` into out (ST_CUDA_UUID_LEN bytes,
 * caller's buffer). ST_OK, ST_ERR_INVALID_ARGUMENT for a bad ordinal, or
 * ST_ERR_CAPABILITY. Any thread. */
int st__cuda_device_uuid(int ordinal, char *out, char *err, size_t errlen);

/* Ordinal in this process of the device whose UUID is `uuid` ("GPU-..." or
 * the bare 32 hex digits with dashes; case-insensitive). ST_ERR_NOT_FOUND
 * when no visible device has it (another CUDA_VISIBLE_DEVICES hides it),
 * ST_ERR_CAPABILITY without a driver. Any thread. */
int st__cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen);

/* Makes the primary context of device `ordinal` current on the calling
 * thread, retaining it the first time (kept until the process exits).
 * Kernels launched through the runtime afterwards run on that device.
 * ST_OK, ST_ERR_INVALID_ARGUMENT or ST_ERR_CAPABILITY. Any thread. */
int st__cuda_ctx_enter(int ordinal, char *err, size_t errlen);

/* Nonzero when this process already retained the primary context of
 * device `ordinal` (st__cuda_ctx_enter ran for it on some thread), so that
 * entering it again is cheap. Any thread. */
int st__cuda_ctx_ready(int ordinal);

/* Free and total memory of device `ordinal` in bytes (cuMemGetInfo); makes
 * its context current. Any thread. */
int st__cuda_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes,
                      char *err, size_t errlen);

/* VMM allocation granularity of device `ordinal` (the minimum; 2 MiB on
 * current GPUs). Any thread. */
int st__cuda_granularity(int ordinal, uint64_t *gran, char *err, size_t errlen);

/* Copies between host memory and a device address of a mapping
 * (synchronous; for tests, checks and small metadata). Any thread. */
int st__cuda_copy_to_host(void *dst, uint64_t src_dptr, uint64_t bytes, int ordinal,
                          char *err, size_t errlen);
int st__cuda_copy_to_device(uint64_t dst_dptr, const void *src, uint64_t bytes, int ordinal,
                            char *err, size_t errlen);

/* Zero-fills `bytes` at a device address of the CURRENT context on the
 * legacy default stream and waits for it: a new allocation is never handed
 * out with another process's old data. Any thread with the context current. */
int st__cuda_zero_sync(uint64_t dptr, uint64_t bytes, char *err, size_t errlen);

/* Zero-fills `bytes` at device address `dptr` of device `ordinal` (its
 * context becomes current): queued on `stream` (a CUstream of that
 * device, not waited for: the caller synchronizes it before the memory is
 * read elsewhere), or on the legacy default stream and waited for when
 * `stream` is NULL. Any thread. */
int st__cuda_zero(uint64_t dptr, uint64_t bytes, int ordinal, void *stream, char *err,
                  size_t errlen);

/* Copies `bytes` from device address `src` to `dst` on device `ordinal`
 * (its context becomes current) and waits for the copy. Any thread. */
int st__cuda_copy_dtod(uint64_t dst, uint64_t src, uint64_t bytes, int ordinal, char *err,
                       size_t errlen);

/* Queues a copy of `bytes` from `src` to `dst` on `stream` (a CUstream of
 * the CURRENT context; NULL: its legacy default stream), host or device
 * addresses either side (unified addressing: the driver infers the kind).
 * Waits for nothing: st__cuda_stream_sync does. Any thread with the
 * context current. */
int st__cuda_copy_async(uint64_t dst, uint64_t src, uint64_t bytes, void *stream, char *err,
                        size_t errlen);

/* Waits for `stream` (NULL: the legacy default stream) of the CURRENT
 * context. Any thread with the context current. */
int st__cuda_stream_sync(void *stream, char *err, size_t errlen);

/* The end (one past the last byte) of the device allocation or mapping
 * that holds device address `ptr`, into *end: 1, or 0 when `ptr` is not
 * in one (host memory, a bad address). One copy must stay inside one
 * allocation: the driver refuses a range that runs into the next, even
 * when their addresses follow each other. Any thread with a context
 * current. */
int st__cuda_alloc_end(uint64_t ptr, uint64_t *end);

/* ------------------------------------------------------ client side import */

/* One allocation mapped into this process from an exported descriptor. */
typedef struct st__cuda_mapping {
  uint64_t dptr;     /* device address in this process (0: not mapped) */
  uint64_t bytes;    /* mapped size (the arena's allocated size)       */
  int ordinal;       /* device ordinal in this process                 */
} st__cuda_mapping_t;

/* Makes mapping m read-only on its device (cuMemSetAccess with
 * CU_MEM_ACCESS_FLAGS_PROT_READ): a kernel that writes it faults in this
 * process (docs/keys.md, "Read-only mappings"). ST_OK or the driver's
 * failure. Any thread; leaves m's device context current. */
int st__cuda_set_readonly(const st__cuda_mapping_t *m, char *err, size_t errlen);

/* What kind of file a st_mode names, for messages: "a regular file",
 * "a pipe", "a socket", "a character device", ... Any thread. */
const char *st__file_kind(unsigned mode);

/* Checks, without the driver, that `fd` can be an exported VMM allocation
 * (cuda_import.c): on Linux such a descriptor is a file of the NVIDIA
 * control device, a character device with the device number of
 * /dev/nvidiactl (stat'ed once per process; when it cannot be, major 195).
 * The driver checks the rest (that it is an allocation, its size) when it
 * imports. ST_OK, or ST_ERR_INVALID_ARGUMENT with "the descriptor is a
 * pipe, not an exported CUDA allocation" (a memfd, a file, a socket, ...)
 * or "the descriptor is the character device M:m, not an exported CUDA
 * allocation (a file of the NVIDIA control device, /dev/nvidiactl)" in
 * err (may be NULL). One fstat; any thread; in builds without CUDA too. */
int st__cuda_fd_check(int fd, char *err, size_t errlen);

/* Checks an allocation's description before anything imports it: the
 * device whose UUID is `uuid` is visible here (*ordinal) and `bytes` is a
 * positive multiple of its allocation granularity (*gran). Driver queries
 * only (no import, no context made current). ST_OK, ST_ERR_NOT_FOUND (no
 * visible device has that UUID), ST_ERR_INVALID_ARGUMENT (bad size or
 * UUID), ST_ERR_CAPABILITY (no driver), with the reason in err. Any
 * thread. */
int st__cuda_import_check(uint64_t bytes, const char *uuid, int *ordinal, uint64_t *gran,
                          char *err, size_t errlen);

/* Maps an allocation received as a POSIX descriptor (cuda_import.c), so
 * that the mapping alone keeps the memory: finds the device whose UUID
 * is `uuid` (st__cuda_import_check), imports `fd` (borrowed: the caller
 * closes it afterwards, the mapping does not need it), reserves `bytes`
 * of address space (a multiple of the allocation granularity, as the
 * server sends it), maps the whole allocation read-write on that device
 * and releases the imported handle. On success *out is filled; undo with
 * st__cuda_unmap. Errors: ST_ERR_NOT_FOUND (no visible device has that
 * UUID), ST_ERR_INVALID_ARGUMENT (bad fd or size; not an exported CUDA
 * allocation: "cuMemImportFromShareableHandle ..."; a size claim larger
 * than the allocation: "cuMemMap ..."), ST_ERR_OUT_OF_MEMORY (no address
 * space), ST_ERR_CAPABILITY (no driver), with the reason in err. Any thread; the device's primary
 * context is current on the calling thread afterwards. */
int st__cuda_import(int fd, uint64_t bytes, const char *uuid, st__cuda_mapping_t *out,
                    char *err, size_t errlen);

/* Creates a VMM allocation of `bytes` (rounded up to the granularity; one
 * granule for 0) on device `ordinal`, exportable as a POSIX descriptor
 * (st__cuda_alloc_prop), exports it and releases the handle: *fd (owned by
 * the caller, close-on-exec) then names the memory alone, and *size is the
 * allocated size to import it with (st__cuda_import). A client makes the
 * tensors it passes as arguments this way. ST_ERR_OUT_OF_MEMORY (with the
 * free bytes), ST_ERR_INVALID_ARGUMENT (bad ordinal), ST_ERR_CAPABILITY.
 * Any thread; the device's primary context is current afterwards. */
int st__cuda_create_fd(int ordinal, uint64_t bytes, int *fd, uint64_t *size, char *err,
                       size_t errlen);

/* Unmaps and frees the address range of a mapping filled by
 * st__cuda_import and clears it; the driver frees the memory once no
 * process maps it and no descriptor or handle remains. NULL or an
 * unmapped struct is a no-op. Any thread. */
void st__cuda_unmap(st__cuda_mapping_t *m);

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
 * ipc = "legacy" (DESIGN §3, decision 1). Owned by its arena; freed by
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
