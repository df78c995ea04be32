/* src/cudadrv/driver.h: the CUDA driver API as this project uses it, without
 * linking libcuda (docs/design.md, section 3, decisions 1, 6 and 7).
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
 * src/cudadrv (driver.c, import.c) depends on nothing of the project but
 * include/st/errors.h: the server (src/mem, src/tensor) and the client
 * library both link it (st_cudadrv). Importing and mapping an exported
 * allocation is cudadrv/import.h; the server's arenas are mem/cuda.h.
 */
#ifndef ST_CUDADRV_DRIVER_H
#define ST_CUDADRV_DRIVER_H
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
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute;
  PFN_cuDevicePrimaryCtxRetain_v7000 cuDevicePrimaryCtxRetain;
  PFN_cuDevicePrimaryCtxRelease_v11000 cuDevicePrimaryCtxRelease;
  PFN_cuCtxSetCurrent_v4000 cuCtxSetCurrent;
  PFN_cuCtxGetCurrent_v4000 cuCtxGetCurrent;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity;
  PFN_cuMemCreate_v10020 cuMemCreate;
  PFN_cuMemRelease_v10020 cuMemRelease;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 cuMemGetAllocationPropertiesFromHandle;
  PFN_cuMemRetainAllocationHandle_v11000 cuMemRetainAllocationHandle;
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

/* Formats a failed driver call as "<what>: CUDA_ERROR_X (text)" into err
 * and returns the matching ST_ERR_*: OUT_OF_MEMORY for
 * CUDA_ERROR_OUT_OF_MEMORY, INVALID_ARGUMENT for invalid values and
 * handles, CAPABILITY for missing devices or features, INTERNAL otherwise.
 * ST_OK for CUDA_SUCCESS (err untouched). Any thread. */
int st__cuda_error(CUresult r, const char *what, char *err, size_t errlen);

/* The allocation properties every VMM allocation of this project uses:
 * pinned device memory on `ordinal`, exportable as a POSIX descriptor
 * (never FABRIC), and GPUDirect-RDMA capable where the device supports
 * that for VMM allocations (st__cuda_gpudirect_rdma), so that a NIC can
 * read and write it directly when peers move it (docs/multihost.md).
 * Fills *prop. Any thread. */
void st__cuda_alloc_prop(int ordinal, CUmemAllocationProp *prop);

/* 1 when device `ordinal` supports the GPUDirect-RDMA flag on VMM
 * allocations (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED),
 * else 0 (no device, no driver, or not supported). Asked of the driver
 * once per device. Any thread. */
int st__cuda_gpudirect_rdma(int ordinal);
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

#endif
