/* src/cudadrv/driver.c: the driver entry-point table, device naming by
 * UUID, primary contexts and small synchronous helpers (see driver.h).
 *
 * Only the CUDA runtime is linked (statically). The runtime loads the
 * driver library itself when it is there; cudaGetDeviceCount tells why it
 * is not ("CUDA driver version is insufficient for CUDA runtime version" on
 * a host without a driver). Entry points are requested by the ABI of CUDA
 * 12.0, so a newer driver hands back the functions this table was typed
 * for.
 *
 * Contracts of the non-static functions: their comments in driver.h.
 */
#include "cudadrv/driver.h"

#include <ctype.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifdef ST_HAVE_CUDA

#include <cuda_runtime_api.h>

#if CUDART_VERSION < 12050
#error "the CUDA backend needs CUDA 12.5 or newer (cudaGetDriverEntryPointByVersion); configure with -DST_CUDA=OFF"
#endif

/* The ABI generation whose function types st__cuda_api_t uses. */
#define ENTRY_POINT_VERSION 12000
/* Contexts are kept per ordinal up to this many devices. */
#define MAX_DEVICES 64

static pthread_once_t api_once = PTHREAD_ONCE_INIT;
static st__cuda_api_t api;
static int api_ok;
static char api_reason[256];

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext ctx_of[MAX_DEVICES];

/* Looks one entry point up; 0 and a reason in api_reason when missing. */
static int load_symbol(const char *name, void **slot) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, ENTRY_POINT_VERSION,
                                                   cudaEnableDefault, &q);
  if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && fn) {
    *slot = fn;
    return 1;
  }
  const char *why = e != cudaSuccess ? cudaGetErrorString(e)
                    : q == cudaDriverEntryPointVersionNotSufficent
                        ? "the driver is older than CUDA 12.0"
                        : "symbol not found";
  snprintf(api_reason, sizeof api_reason, "driver entry point %s unavailable: %s", name, why);
  return 0;
}

/* Function pointers and data pointers have the same representation on
 * every platform CUDA supports; memcpy keeps the conversion explicit. */
#define LOAD(field)                                              \
  do {                                                           \
    void *p_ = NULL;                                             \
    if (!load_symbol(#field, &p_)) return;                       \
    memcpy(&api.field, &p_, sizeof p_);                          \
  } while (0)

/* pthread_once body: fills `api` or leaves api_reason. */
static void load_api(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(api_reason, sizeof api_reason, "%s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return;
  }
  if (n <= 0) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(api_reason, sizeof api_reason, "no device is visible (CUDA_VISIBLE_DEVICES=%s)",
             vis ? vis : "unset");
    return;
  }
  LOAD(cuInit);
  LOAD(cuDeviceGet);
  LOAD(cuDeviceGetCount);
  LOAD(cuDeviceGetUuid);
  LOAD(cuDeviceGetAttribute);
  LOAD(cuDevicePrimaryCtxRetain);
  LOAD(cuDevicePrimaryCtxRelease);
  LOAD(cuCtxSetCurrent);
  LOAD(cuCtxGetCurrent);
  LOAD(cuMemGetAllocationGranularity);
  LOAD(cuMemCreate);
  LOAD(cuMemRelease);
  LOAD(cuMemExportToShareableHandle);
  LOAD(cuMemImportFromShareableHandle);
  LOAD(cuMemGetAllocationPropertiesFromHandle);
  LOAD(cuMemRetainAllocationHandle);
  LOAD(cuMemAddressReserve);
  LOAD(cuMemAddressFree);
  LOAD(cuMemMap);
  LOAD(cuMemUnmap);
  LOAD(cuMemSetAccess);
  LOAD(cuMemGetInfo);
  LOAD(cuGetErrorName);
  LOAD(cuGetErrorString);
  LOAD(cuStreamCreate);
  LOAD(cuStreamSynchronize);
  LOAD(cuCtxSynchronize);
  LOAD(cuStreamDestroy);
  LOAD(cuMemcpyHtoDAsync);
  LOAD(cuMemcpyDtoH);
  LOAD(cuMemcpyDtoD);
  LOAD(cuMemcpyAsync);
  LOAD(cuMemGetAddressRange);
  LOAD(cuMemsetD8Async);
  LOAD(cuEventCreate);
  LOAD(cuEventRecord);
  LOAD(cuEventQuery);
  LOAD(cuEventSynchronize);
  LOAD(cuEventDestroy);
  LOAD(cuModuleLoadData);
  LOAD(cuModuleGetFunction);
  LOAD(cuLaunchKernel);
  LOAD(cuPointerGetAttributes);
  LOAD(cuMemAlloc);
  LOAD(cuMemFree);
  LOAD(cuIpcGetMemHandle);
  CUresult r = api.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char *name = NULL;
    api.cuGetErrorName(r, &name);
    snprintf(api_reason, sizeof api_reason, "cuInit failed: %s", name ? name : "unknown error");
    return;
  }
  api_ok = 1;
}

#undef LOAD

/* See driver.h. Any thread. */
const st__cuda_api_t *st__cuda_api(char *err, size_t errlen) {
  pthread_once(&api_once, load_api);
  if (api_ok) return &api;
  if (err && errlen) snprintf(err, errlen, "no CUDA device: %s", api_reason);
  return NULL;
}

/* See driver.h. Any thread. */
int st__cuda_error(CUresult r, const char *what, char *err, size_t errlen) {
  if (r == CUDA_SUCCESS) return ST_OK;
  const char *name = NULL, *text = NULL;
  if (api_ok) {
    api.cuGetErrorName(r, &name);
    api.cuGetErrorString(r, &text);
  }
  if (err && errlen)
    snprintf(err, errlen, "%s: %s (%s)", what, name ? name : "CUDA error",
             text ? text : "no description");
  switch (r) {
  case CUDA_ERROR_OUT_OF_MEMORY:
    return ST_ERR_OUT_OF_MEMORY;
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_HANDLE:
  case CUDA_ERROR_INVALID_DEVICE:
    return ST_ERR_INVALID_ARGUMENT;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_NOT_INITIALIZED:
  case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    return ST_ERR_CAPABILITY;
  default:
    return ST_ERR_INTERNAL;
  }
}

/* See driver.h. Any thread. */
int st__cuda_available(char *err, size_t errlen) {
  return st__cuda_api(err, errlen) ? ST_OK : ST_ERR_CAPABILITY;
}

/* See driver.h. Any thread. */
int st__cuda_device_count(int *count, char *err, size_t errlen) {
  *count = 0;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  int n = 0;
  int rc = st__cuda_error(a->cuDeviceGetCount(&n), "cuDeviceGetCount", err, errlen);
  if (rc == ST_OK) *count = n;
  return rc;
}

/* The driver device for an ordinal, checking its range. */
static int get_device(const st__cuda_api_t *a, int ordinal, CUdevice *dev, char *err,
                      size_t errlen) {
  int n = 0;
  int rc = st__cuda_error(a->cuDeviceGetCount(&n), "cuDeviceGetCount", err, errlen);
  if (rc != ST_OK) return rc;
  if (ordinal < 0 || ordinal >= n || ordinal >= MAX_DEVICES) {
    if (err && errlen)
      snprintf(err, errlen, "no CUDA device cuda:%d in this process (%d visible)", ordinal, n);
    return ST_ERR_INVALID_ARGUMENT;
  }
  return st__cuda_error(a->cuDeviceGet(dev, ordinal), "cuDeviceGet", err, errlen);
}

static void format_uuid(const CUuuid *u, char *out) {
  const unsigned char *b = (const unsigned char *)u->bytes;
  snprintf(out, ST_CUDA_UUID_LEN,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
           b[13], b[14], b[15]);
}

/* See driver.h. Any thread. */
int st__cuda_device_uuid(int ordinal, char *out, char *err, size_t errlen) {
  out[0] = '\0';
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  CUdevice dev;
  int rc = get_device(a, ordinal, &dev, err, errlen);
  if (rc != ST_OK) return rc;
  CUuuid u;
  rc = st__cuda_error(a->cuDeviceGetUuid(&u, dev), "cuDeviceGetUuid", err, errlen);
  if (rc == ST_OK) format_uuid(&u, out);
  return rc;
}

static int hex_value(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  c = tolower(c);
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Parses "GPU-<32 hex digits with optional dashes>" or the bare form into
 * 16 bytes. 0 on a malformed string. */
static int parse_uuid(const char *s, unsigned char out[16]) {
  if (strncasecmp(s, "GPU-", 4) == 0) s += 4;
  int nibbles = 0;
  for (; *s; s++) {
    if (*s == '-') continue;
    int v = hex_value((unsigned char)*s);
    if (v < 0 || nibbles >= 32) return 0;
    if (nibbles % 2 == 0) out[nibbles / 2] = (unsigned char)(v << 4);
    else out[nibbles / 2] |= (unsigned char)v;
    nibbles++;
  }
  return nibbles == 32;
}

/* See driver.h. Any thread. */
int st__cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen) {
  *ordinal = -1;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  unsigned char want[16];
  if (!uuid || !parse_uuid(uuid, want)) {
    if (err && errlen)
      snprintf(err, errlen, "malformed device UUID \"%s\" (want GPU-xxxxxxxx-xxxx-...)",
               uuid ? uuid : "(null)");
    return ST_ERR_INVALID_ARGUMENT;
  }
  int n = 0;
  int rc = st__cuda_error(a->cuDeviceGetCount(&n), "cuDeviceGetCount", err, errlen);
  if (rc != ST_OK) return rc;
  for (int i = 0; i < n; i++) {
    CUdevice dev;
    CUuuid u;
    if (a->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    if (a->cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS) continue;
    if (memcmp(u.bytes, want, 16) == 0) {
      *ordinal = i;
      return ST_OK;
    }
  }
  if (err && errlen) {
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(err, errlen, "no visible CUDA device has UUID %s (%d visible, CUDA_VISIBLE_DEVICES=%s)",
             uuid, n, vis ? vis : "unset");
  }
  return ST_ERR_NOT_FOUND;
}

/* See driver.h. Any thread. */
int st__cuda_ctx_enter(int ordinal, char *err, size_t errlen) {
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  /* Retained before (so the ordinal is valid): nothing to do when it is
   * this thread's current context already, the common case of a worker's
   * CUDA calls. ctx_of entries are set once and never cleared. */
  CUcontext known = NULL, now = NULL;
  if (ordinal >= 0 && ordinal < MAX_DEVICES) {
    pthread_mutex_lock(&ctx_lock);
    known = ctx_of[ordinal];
    pthread_mutex_unlock(&ctx_lock);
  }
  if (known) {
    if (a->cuCtxGetCurrent(&now) == CUDA_SUCCESS && now == known) return ST_OK;
    return st__cuda_error(a->cuCtxSetCurrent(known), "cuCtxSetCurrent", err, errlen);
  }
  CUdevice dev;
  int rc = get_device(a, ordinal, &dev, err, errlen);
  if (rc != ST_OK) return rc;
  pthread_mutex_lock(&ctx_lock);
  CUcontext c = ctx_of[ordinal];
  if (!c) {
    rc = st__cuda_error(a->cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain", err,
                        errlen);
    if (rc == ST_OK) ctx_of[ordinal] = c;
  }
  pthread_mutex_unlock(&ctx_lock);
  if (rc != ST_OK) return rc;
  return st__cuda_error(a->cuCtxSetCurrent(c), "cuCtxSetCurrent", err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_ctx_ready(int ordinal) {
  if (ordinal < 0 || ordinal >= MAX_DEVICES) return 0;
  pthread_mutex_lock(&ctx_lock);
  int ready = ctx_of[ordinal] != NULL;
  pthread_mutex_unlock(&ctx_lock);
  return ready;
}

/* See driver.h. Any thread. */
int st__cuda_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes, char *err,
                      size_t errlen) {
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  size_t f = 0, t = 0;
  rc = st__cuda_error(api.cuMemGetInfo(&f, &t), "cuMemGetInfo", err, errlen);
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return rc;
}

/* Per device: 0 not asked yet, 1 no, 2 yes (st__cuda_gpudirect_rdma). */
static _Atomic int gdr_of[MAX_DEVICES];

/* See driver.h. Any thread; two threads asking at once both ask the
 * driver and store the same answer. */
int st__cuda_gpudirect_rdma(int ordinal) {
  if (ordinal < 0 || ordinal >= MAX_DEVICES) return 0;
  int known = atomic_load(&gdr_of[ordinal]);
  if (known) return known == 2;
  const st__cuda_api_t *a = st__cuda_api(NULL, 0);
  CUdevice dev;
  int v = 0;
  if (!a || get_device(a, ordinal, &dev, NULL, 0) != ST_OK ||
      a->cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                              dev) != CUDA_SUCCESS)
    v = 0;
  atomic_store(&gdr_of[ordinal], v ? 2 : 1);
  return v != 0;
}

/* See driver.h. Any thread. */
void st__cuda_alloc_prop(int ordinal, CUmemAllocationProp *prop) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = ordinal;
  prop->allocFlags.gpuDirectRDMACapable = (unsigned char)st__cuda_gpudirect_rdma(ordinal);
}

/* See driver.h. Any thread. */
int st__cuda_granularity(int ordinal, uint64_t *gran, char *err, size_t errlen) {
  *gran = 0;
  const st__cuda_api_t *a = st__cuda_api(err, errlen);
  if (!a) return ST_ERR_CAPABILITY;
  CUdevice dev;
  int rc = get_device(a, ordinal, &dev, err, errlen);
  if (rc != ST_OK) return rc;
  CUmemAllocationProp prop;
  st__cuda_alloc_prop(ordinal, &prop);
  size_t g = 0;
  rc = st__cuda_error(a->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                      "cuMemGetAllocationGranularity", err, errlen);
  if (rc == ST_OK) *gran = g;
  return rc;
}

/* See driver.h. Any thread. */
int st__cuda_copy_to_host(void *dst, uint64_t src_dptr, uint64_t bytes, int ordinal, char *err,
                          size_t errlen) {
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  return st__cuda_error(api.cuMemcpyDtoH(dst, (CUdeviceptr)src_dptr, (size_t)bytes),
                        "cuMemcpyDtoH", err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_to_device(uint64_t dst_dptr, const void *src, uint64_t bytes, int ordinal,
                            char *err, size_t errlen) {
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  rc = st__cuda_error(api.cuMemcpyHtoDAsync((CUdeviceptr)dst_dptr, src, (size_t)bytes, NULL),
                      "cuMemcpyHtoDAsync", err, errlen);
  if (rc != ST_OK) return rc;
  return st__cuda_error(api.cuStreamSynchronize(NULL), "cuStreamSynchronize", err, errlen);
}

/* See driver.h. Any thread with the context current. */
int st__cuda_zero_sync(uint64_t dptr, uint64_t bytes, char *err, size_t errlen) {
  int rc = st__cuda_error(api.cuMemsetD8Async((CUdeviceptr)dptr, 0, (size_t)bytes, NULL),
                          "cuMemsetD8Async", err, errlen);
  if (rc != ST_OK) return rc;
  return st__cuda_error(api.cuStreamSynchronize(NULL), "cuStreamSynchronize", err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_zero(uint64_t dptr, uint64_t bytes, int ordinal, void *stream, char *err,
                  size_t errlen) {
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  if (!stream) return st__cuda_zero_sync(dptr, bytes, err, errlen);
  return st__cuda_error(api.cuMemsetD8Async((CUdeviceptr)dptr, 0, (size_t)bytes, (CUstream)stream),
                        "cuMemsetD8Async", err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_dtod(uint64_t dst, uint64_t src, uint64_t bytes, int ordinal, char *err,
                       size_t errlen) {
  int rc = st__cuda_ctx_enter(ordinal, err, errlen);
  if (rc != ST_OK) return rc;
  rc = st__cuda_error(api.cuMemcpyDtoD((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)bytes),
                      "cuMemcpyDtoD", err, errlen);
  if (rc != ST_OK) return rc;
  return st__cuda_error(api.cuStreamSynchronize(NULL), "cuStreamSynchronize", err, errlen);
}

/* See driver.h. Any thread with the context current. */
int st__cuda_copy_async(uint64_t dst, uint64_t src, uint64_t bytes, void *stream, char *err,
                        size_t errlen) {
  return st__cuda_error(
      api.cuMemcpyAsync((CUdeviceptr)dst, (CUdeviceptr)src, (size_t)bytes, (CUstream)stream),
      "cuMemcpyAsync", err, errlen);
}

/* See driver.h. Any thread with the context current. */
int st__cuda_stream_sync(void *stream, char *err, size_t errlen) {
  return st__cuda_error(api.cuStreamSynchronize((CUstream)stream), "cuStreamSynchronize", err,
                        errlen);
}

/* See driver.h. Any thread with a context current. */
int st__cuda_alloc_end(uint64_t ptr, uint64_t *end) {
  CUdeviceptr base = 0;
  size_t size = 0;
  if (api.cuMemGetAddressRange(&base, &size, (CUdeviceptr)ptr) != CUDA_SUCCESS || !size) return 0;
  *end = (uint64_t)base + size;
  return 1;
}

#else /* !ST_HAVE_CUDA */

static int no_cuda(char *err, size_t errlen) {
  if (err && errlen) snprintf(err, errlen, "no CUDA device: built without CUDA support");
  return ST_ERR_CAPABILITY;
}

/* See driver.h. Any thread. */
int st__cuda_available(char *err, size_t errlen) { return no_cuda(err, errlen); }

/* See driver.h. Any thread. */
int st__cuda_device_count(int *count, char *err, size_t errlen) {
  *count = 0;
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_device_uuid(int ordinal, char *out, char *err, size_t errlen) {
  out[0] = '\0';
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_device_by_uuid(const char *uuid, int *ordinal, char *err, size_t errlen) {
  *ordinal = -1;
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_ctx_enter(int ordinal, char *err, size_t errlen) { return no_cuda(err, errlen); }

/* See driver.h. Any thread. */
int st__cuda_ctx_ready(int ordinal) { return 0; }

/* See driver.h. Any thread. */
int st__cuda_mem_info(int ordinal, uint64_t *free_bytes, uint64_t *total_bytes, char *err,
                      size_t errlen) {
  if (free_bytes) *free_bytes = 0;
  if (total_bytes) *total_bytes = 0;
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_granularity(int ordinal, uint64_t *gran, char *err, size_t errlen) {
  *gran = 0;
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_to_host(void *dst, uint64_t src_dptr, uint64_t bytes, int ordinal, char *err,
                          size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_to_device(uint64_t dst_dptr, const void *src, uint64_t bytes, int ordinal,
                            char *err, size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_zero_sync(uint64_t dptr, uint64_t bytes, char *err, size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_zero(uint64_t dptr, uint64_t bytes, int ordinal, void *stream, char *err,
                  size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_dtod(uint64_t dst, uint64_t src, uint64_t bytes, int ordinal, char *err,
                       size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_copy_async(uint64_t dst, uint64_t src, uint64_t bytes, void *stream, char *err,
                        size_t errlen) {
  return no_cuda(err, errlen);
}

/* See driver.h. Any thread. */
int st__cuda_stream_sync(void *stream, char *err, size_t errlen) { return no_cuda(err, errlen); }

#endif
