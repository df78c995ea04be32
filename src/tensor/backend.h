/* src/tensor/backend.h: the operations of one device kind, as a table
 * (the core's own interface: nothing outside src/tensor includes this).
 *
 * Every operation that touches elements is dispatched once per call
 * through st__tensor_backend(device)->op(...), never per element and never
 * with a CPU/CUDA branch at the call site. A table is written with
 * ST__TENSOR_BACKEND(prefix), which names prefix_fill, prefix_affine, ...
 * for every slot: a backend that lacks an operation does not compile.
 *
 * Contract of the slots (each returns ST_OK or an ST_ERR_* with the whole
 * message in err, recorded in the context when it fails the call, see
 * tensor.h; `what` names the operation in messages):
 *   fill        every element of t (any strides) := v
 *   affine      every element x of t := x * mul + add, in double (a product
 *               then a sum, no fused multiply-add), stored back
 *   copy        dst := src element by element, casting, any strides; both
 *               on this backend's device, elements not overlapping
 *   generate    every element i of the contiguous t := the generator's
 *               value (common/generators.h)
 *   copy_bytes  `bytes` from src to dst on `device`'s side: within its
 *               memory or between it and host memory, in order with the
 *               call's earlier work on that device
 *   sync        waits until the work queued on `device` is done
 *   quiesce     the same, for a release: never fails, records nothing
 * The CPU backend works synchronously; the CUDA backend queues kernels on
 * the calling thread's stream for the device (st__tensor_stream).
 */
#ifndef ST_TENSOR_BACKEND_H
#define ST_TENSOR_BACKEND_H

#include "common/generators.h"
#include "tensor/tensor.h"

typedef struct st__tensor_backend {
  const char *name;
  int (*fill)(st__tensor_ctx_t *c, const st__tensor_t *t, double v, const char *what,
              char *err, size_t errlen);
  int (*affine)(st__tensor_ctx_t *c, const st__tensor_t *t, double mul, double add,
                const char *what, char *err, size_t errlen);
  int (*copy)(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
              const char *what, char *err, size_t errlen);
  int (*generate)(st__tensor_ctx_t *c, const st__tensor_t *t, const st__gen_t *g,
                  const char *what, char *err, size_t errlen);
  int (*copy_bytes)(st__tensor_ctx_t *c, int device, void *dst, const void *src, uint64_t bytes,
                    const char *what, char *err, size_t errlen);
  int (*sync)(st__tensor_ctx_t *c, int device, const char *what, char *err, size_t errlen);
  void (*quiesce)(int device);
} st__tensor_backend_t;

#define ST__TENSOR_BACKEND(p)                                                              \
  {                                                                                        \
    .name = #p, .fill = p##_fill, .affine = p##_affine, .copy = p##_copy,                  \
    .generate = p##_generate, .copy_bytes = p##_copy_bytes, .sync = p##_sync,              \
    .quiesce = p##_quiesce                                                                 \
  }

/* The backends (cpu.c, cuda.c). st__tensor_cuda_backend is NULL in a
 * build without CUDA. The lookups below are in alloc.c. */
extern const st__tensor_backend_t st__tensor_cpu_backend;
extern const st__tensor_backend_t *const st__tensor_cuda_backend;

/* The backend of `device`, or NULL (a negative number other than the CPU,
 * an ordinal past ST__DEV_MAX, CUDA in a build without it). */
const st__tensor_backend_t *st__tensor_backend(int device);

/* st__tensor_backend, or an error: CAPABILITY (recorded) for a CUDA
 * ordinal without CUDA support, INVALID_ARGUMENT "what: no tensor backend
 * for device N" otherwise. */
int st__tensor_backend_for(st__tensor_ctx_t *c, int device, const char *what,
                           const st__tensor_backend_t **out, char *err, size_t errlen);

#endif
