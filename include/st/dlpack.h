/* sharedtensor: DLPack export of mapped tensors (libstclient).
 *
 * Hands a tensor of a result to a framework (PyTorch, NumPy, CuPy, JAX)
 * through DLPack, without copying: the DLPack tensor points into the same
 * mapping and keeps the result alive until the framework calls its
 * deleter. Python bindings need no compiled extension: they wrap the
 * returned pointer in a PyCapsule (ctypes.pythonapi.PyCapsule_New) whose
 * destructor is st_dlpack_capsule_destructor below.
 *
 * The DLPack 1.0 ABI structs are declared here unless a dlpack.h of the
 * same ABI was included first (it defines DLPACK_MAJOR_VERSION).
 */
#ifndef ST_DLPACK_H
#define ST_DLPACK_H

#include "st/api.h"

#include <stdint.h>

#include "st/client.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef DLPACK_MAJOR_VERSION
#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0

/* Bit of DLManagedTensorVersioned.flags: the consumer must not write. */
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)

typedef struct {
  uint32_t major;
  uint32_t minor;
} DLPackVersion;

typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12
} DLDataTypeCode;

typedef struct {
  uint8_t code;    /* a DLDataTypeCode */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;      /* in elements; NULL means compact row-major */
  uint64_t byte_offset;
} DLTensor;

typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;
#endif /* DLPACK_MAJOR_VERSION */

/* A DLPack view of tensor `t`, which must belong to result `r`:
 * `versioned` 0 gives a DLManagedTensor* (legacy capsules, "dltensor"),
 * nonzero a DLManagedTensorVersioned* (DLPack 1.0, "dltensor_versioned",
 * flags 0: writable). No element is copied.
 *
 *   - data points at the tensor's first element (the mapping's base plus
 *     the tensor's offset; a device address for CUDA) and byte_offset is
 *     0: every consumer honours that, while some ignore byte_offset;
 *   - device: kDLCPU (id 0) or kDLCUDA with device_id = t->device_index,
 *     the ordinal of the GPU in this process;
 *   - dtype through st_dtype_dlpack: bool is kDLBool, bfloat16 kDLBfloat,
 *     float8_e4m3fn and float8_e5m2 the DLPack codes 10 and 12, lanes 1;
 *   - shape and strides (in elements) are copies owned by the returned
 *     tensor.
 *
 * Returns an owned pointer: the consumer calls its `deleter` exactly once,
 * which frees the copies and drops the reference on `r` taken here
 * (st_result_ref), so the mapping lives until both the caller's
 * st_result_free and every deleter ran. NULL for NULL arguments, an
 * invalid dtype or out of memory. Any thread while r lives; the deleter
 * may run on any thread, and marks `r` as a result whose CUDA pool
 * regions a device may still read (their return to the server then waits
 * for the device: st_result_free in client.h). */
ST_API void *st_tensor_dlpack(st_result_t *r, const st_tensor_t *t, int versioned);

/* A PyCapsule destructor (PyCapsule_Destructor) for capsules made around
 * st_tensor_dlpack's pointer. When the capsule is still named "dltensor"
 * or "dltensor_versioned" (no consumer took it: a consumer renames it to
 * "used_dltensor..."), it calls the managed tensor's deleter; otherwise
 * it does nothing. The CPython functions it needs (PyCapsule_IsValid,
 * PyCapsule_GetPointer) are looked up in the running process at the first
 * call, so the library does not link libpython; where they cannot be
 * found the managed tensor is left alone (leaked, never freed twice).
 * Called by CPython with the GIL held. */
ST_API void st_dlpack_capsule_destructor(void *capsule);

#ifdef __cplusplus
}
#endif
#endif
