/* src/tensor/tensor.h: the tensor core, free of Lua (docs/architecture.md,
 * "Tensors").
 *
 * A tensor is a view into an arena (src/mem/arena.h): one reference on
 * the arena plus a geometry (common/geometry.h: byte offset, dtype, shape,
 * strides in elements). Views share the arena and each hold their own
 * reference. The core makes tensors (new, the constructors of
 * constructors.h), views of them (narrow, slice, view, reshape, permute,
 * transpose), and runs the operations that touch elements (ops.h: fill,
 * affine, copy with casts, to-device, element access) on whichever device
 * the data lives, through one table of operations per backend
 * (backend.h: cpu, cuda).
 *
 * A call's context (st__tensor_ctx_t) is a plain struct the caller owns:
 * the Lua binding embeds it in its state's context, a C caller fills one
 * with st__tensor_ctx_init. It says where constructors build by default,
 * which CUDA device "cuda" names, whether CUDA arenas are legacy IPC
 * ones, which CUDA streams the call used (synchronized by
 * st__tensor_sync_used before the call completes: docs/design.md,
 * section 3, decision 5),
 * and the last failure that must fail the whole call with its own code.
 *
 * Errors: every function that can fail returns ST_OK or a negative
 * ST_ERR_* with a message in the caller's buffer (err, errlen; err may be
 * NULL), and never raises. Failures of the call's resources (an arena
 * that cannot be made: OUT_OF_MEMORY, LIMIT; a CUDA device this process
 * cannot use: CAPABILITY; a failed kernel, copy or stream: INTERNAL and
 * others) are also recorded in the context (err_code, err_msg), so that a
 * binding that turns the message into an exception can still fail the
 * call with that code. `what` names the operation in messages ("copy_",
 * "zeros"), as the caller's user knows it.
 *
 * Threads: a context and its tensors are used by one thread at a time;
 * CUDA work runs on that thread's own stream per device (backend.h).
 * Arena references are atomic, so a tensor's arena may outlive it on
 * another thread.
 */
#ifndef ST_TENSOR_TENSOR_H
#define ST_TENSOR_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "mem/arena.h"
#include "proto/proto.h"
#include "st/dtype.h"
#include "common/fail.h"
#include "st/errors.h"
#include "common/geometry.h"

/* The CPU, as a device number; CUDA devices are their ordinals (>= 0). */
#define ST__DEV_CPU (-1)
/* CUDA ordinals a call may use (bits of cuda_used). */
#define ST__DEV_MAX 64

typedef struct st__tensor_ctx {
  int in_call;                     /* a call runs: CUDA devices may be used */
  int device;                      /* where constructors build by default:
                                      ST__DEV_CPU or a CUDA ordinal */
  int cuda_device;                 /* what "cuda" names (the socket's CUDA
                                      device); -1: none */
  int cuda_legacy;                 /* CUDA arenas are legacy IPC ones (an
                                      endpoint with ipc = "legacy") */
  uint64_t cuda_used;              /* bit N: the call queued work on this
                                      thread's cuda:N stream */
  int err_code;                    /* last failure of the call's resources
                                      (0: none); see above */
  char err_msg[256];               /* its message, as err received it */
} st__tensor_ctx_t;

typedef struct st__tensor {
  st__arena_t *arena;              /* owned reference; NULL: no tensor */
  st__geom_t geom;
} st__tensor_t;

/* A context for the CPU outside a call: default device the CPU, "cuda"
 * naming cuda:0, nothing used, no failure recorded. */
void st__tensor_ctx_init(st__tensor_ctx_t *c);

/* Forgets the recorded failure (at the start of a call). */
void st__tensor_ctx_clear_error(st__tensor_ctx_t *c);

/* st__fail (common/fail.h: formats a message into err, returns rc), and
 * records the failure in c (err_code, err_msg): the call then fails with
 * rc. */
int st__tensor_fail_call(st__tensor_ctx_t *c, int rc, char *err, size_t errlen,
                         const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* ------------------------------------------------------------ devices (device.c) */

/* "cpu" or "cuda:N" into buf. Returns buf. */
const char *st__tensor_device_name(int device, char *buf, size_t len);

/* Nonzero when s is a device name ("cpu", "cuda", "cuda:N"). */
int st__tensor_is_device_name(const char *s);

/* Parses a device name: "cpu" gives ST__DEV_CPU, "cuda" the context's
 * CUDA device, "cuda:N" N; then checks it as st__tensor_device_check.
 * Errors: INVALID_ARGUMENT "what: unknown device '<name>' (...)";
 * CAPABILITY (recorded) for "cuda" without a CUDA device and for a device
 * this process cannot use. */
int st__tensor_device_parse(st__tensor_ctx_t *c, const char *name, const char *what,
                            int *device, char *err, size_t errlen);

/* ST_OK when `device` is the CPU, or a CUDA device this process can use
 * inside the running call (its primary context becomes current). Errors:
 * INVALID_ARGUMENT "what: CUDA tensors can only be built inside a build
 * body (cuda:N)" outside a call; CAPABILITY (recorded) "no CUDA device:
 * cuda:N is unavailable: <reason>". */
int st__tensor_device_check(st__tensor_ctx_t *c, int device, const char *what, char *err,
                            size_t errlen);

/* CAPABILITY (recorded) "no CUDA device: cuda:N is unavailable: <why>";
 * a "no CUDA device: " prefix of why is not repeated. */
int st__tensor_no_device(st__tensor_ctx_t *c, int device, const char *why, char *err,
                         size_t errlen);

/* ------------------------------------------------------------ streams (cuda.c) */

/* The calling thread's stream on CUDA device `ordinal` (a CUstream,
 * created the first time and kept for the life of the thread), with the
 * device's primary context made current, and the device marked as used by
 * the call (c->cuda_used). Errors (recorded): as st__tensor_device_check
 * ("cuda"), OUT_OF_MEMORY, and the driver's for a stream that cannot be
 * made. */
int st__tensor_stream(st__tensor_ctx_t *c, int ordinal, void **stream, char *err, size_t errlen);

/* Waits for every stream the call used (c->cuda_used), then clears the
 * mask. ST_OK, or the first failure ("work queued on cuda:N failed: ...")
 * in err (not recorded: the caller decides). */
int st__tensor_sync_used(st__tensor_ctx_t *c, char *err, size_t errlen);

/* ------------------------------------------------------------ arenas (alloc.c) */

/* How a new arena's bytes start. A pool region (mem/pool.h) that is
 * recycled is zero-filled only for ST__INIT_ZEROS: a maker that writes
 * every byte says ST__INIT_WRITTEN, and st.empty, which promises no
 * contents, says ST__INIT_ANY; both save the fill. A recycled region only
 * ever holds earlier results of its pool's own connection (docs/pool.md).
 * A new allocation of its own is zero-filled whatever the init. */
typedef enum {
  ST__INIT_ZEROS = 0,     /* reads as zeros (zeros, partial writers)        */
  ST__INIT_WRITTEN = 1,   /* the maker writes every byte before anything reads them */
  ST__INIT_ANY = 2        /* contents unspecified (empty)                   */
} st__tensor_init_t;

/* An arena of `bytes` on `device` after st__tensor_device_check
 * ("tensor"): a region of the thread's pool, else a CPU memfd, CUDA VMM
 * or, with c->cuda_legacy, legacy CUDA IPC (st__arena_new), starting as
 * `init` says. A CUDA zero fill of a recycled region is queued on this
 * thread's stream of the device (st__tensor_stream: the call's
 * synchronization covers it). Failures are recorded. The caller owns
 * *out. */
int st__tensor_arena_new(st__tensor_ctx_t *c, int device, uint64_t bytes,
                         st__tensor_init_t init, st__arena_t **out, char *err, size_t errlen);

/* Drops an arena reference: waits first for this thread's stream on the
 * arena's device, so that memory a queued kernel still writes is never
 * unmapped under it. NULL is a no-op. */
void st__tensor_arena_release(st__arena_t *a);

/* ------------------------------------------------------------ tensors */

/* tensor.c, except st__tensor_new and st__tensor_release (alloc.c). */

/* A new contiguous tensor of `dtype` and `shape` in its own arena on
 * `device` (st__geom_init, then st__tensor_arena_new with `init`: zero-
 * filled, or for a maker that writes every element). On failure
 * out->arena is NULL. The caller owns out's reference. */
int st__tensor_new(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                   int ndim, const int64_t *shape, st__tensor_init_t init, char *err,
                   size_t errlen);

/* Drops t's reference (st__tensor_arena_release) and clears t->arena. */
void st__tensor_release(st__tensor_t *t);

/* out = t seen through `g` (a geometry of t's arena): one more reference. */
void st__tensor_share(st__tensor_t *out, const st__tensor_t *t, const st__geom_t *g);

/* Device of the tensor's arena (ST__DEV_CPU or a CUDA ordinal) and the
 * address of element 0 (a device address for a CUDA tensor; the arena is
 * mapped: st__tensor_from_desc). Counts and sizes are the geometry's:
 * st__geom_numel(&t->geom). */
int st__tensor_device(const st__tensor_t *t);
char *st__tensor_data(const st__tensor_t *t);

/* Views: out shares t's arena (a new reference) with the geometry of
 * geometry.h's function of the same name applied to t's. On failure out
 * is untouched. out must not be t. */
int st__tensor_narrow(st__tensor_t *out, const st__tensor_t *t, int64_t dim, int64_t start,
                      int64_t length, char *err, size_t errlen);
int st__tensor_slice(st__tensor_t *out, const st__tensor_t *t, int64_t dim, int64_t start,
                     int64_t stop, int64_t step, char *err, size_t errlen);
int st__tensor_permute(st__tensor_t *out, const st__tensor_t *t, int n, const int64_t *dims,
                       char *err, size_t errlen);
int st__tensor_transpose(st__tensor_t *out, const st__tensor_t *t, int64_t d0, int64_t d1,
                         char *err, size_t errlen);
int st__tensor_view(st__tensor_t *out, const st__tensor_t *t, int ndim, const int64_t *shape,
                    char *err, size_t errlen);

/* A view of arena `a` (borrowed; out takes a reference) as the wire
 * descriptor d describes it, after checking that every element lies in
 * the arena (INVALID_ARGUMENT otherwise) and mapping the arena in the
 * server when it is not yet (st__arena_map: an imported CUDA allocation
 * is mapped on first need; its failure is returned with the reason in
 * err, and out is untouched). This is how every tensor of an arena the
 * tensor core did not make comes to be, so st__tensor_data never sees an
 * unmapped arena. */
int st__tensor_from_desc(st__tensor_t *out, st__arena_t *a, const st__tensor_desc_t *d,
                         char *err, size_t errlen);

/* The wire descriptor of t, naming arena index `arena` of a message. */
void st__tensor_describe(const st__tensor_t *t, uint32_t arena, st__tensor_desc_t *d);

#endif
