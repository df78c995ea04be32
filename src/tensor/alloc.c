/* src/tensor/alloc.c: the backend of a device, and making and releasing
 * arenas and tensors (contracts in backend.h and tensor.h). Runs on the
 * thread that owns the context. */
#include "tensor/backend.h"

/* ------------------------------------------------------------ backends */

const st__tensor_backend_t *st__tensor_backend(int device) {
  if (device == ST__DEV_CPU) return &st__tensor_cpu_backend;
  if (device >= 0 && device < ST__DEV_MAX) return st__tensor_cuda_backend;
  return NULL;
}

int st__tensor_backend_for(st__tensor_ctx_t *c, int device, const char *what,
                           const st__tensor_backend_t **out, char *err, size_t errlen) {
  *out = st__tensor_backend(device);
  if (*out) return ST_OK;
  if (device >= 0 && device < ST__DEV_MAX)
    return st__tensor_no_device(c, device, "built without CUDA support", err, errlen);
  return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                         "%s: no tensor backend for device %d", what, device);
}

/* ------------------------------------------------------------ arenas */

int st__tensor_arena_new(st__tensor_ctx_t *c, int device, uint64_t bytes,
                         st__tensor_init_t init, st__arena_t **out, char *err, size_t errlen) {
  *out = NULL;
  int rc = st__tensor_device_check(c, device, "tensor", err, errlen);
  if (rc != ST_OK) return rc;
  st__arena_spec_t spec = {.device = device, .bytes = bytes,
                           .no_zero_fill = init != ST__INIT_ZEROS,
                           .ipc = c->cuda_legacy ? ST__CUDA_IPC_LEGACY : ST__CUDA_IPC_VMM};
  /* A recycled CUDA region's zero fill goes on this thread's stream,
   * ahead of the kernels that will write the tensor. */
  if (device >= 0 && !spec.no_zero_fill) {
    rc = st__tensor_stream(c, device, &spec.stream, err, errlen);
    if (rc != ST_OK) return rc;
  }
  char why[256];
  rc = st__arena_new(&spec, out, why, sizeof why);
  if (rc != ST_OK) return st__tensor_fail_call(c, rc, err, errlen, "%s", why);
  return ST_OK;
}

void st__tensor_arena_release(st__arena_t *a) {
  if (!a) return;
  const st__tensor_backend_t *be = st__tensor_backend(st__arena_device(a));
  if (be) be->quiesce(st__arena_device(a));
  st__arena_unref(a);
}

/* ------------------------------------------------------------ tensors */

int st__tensor_new(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                   int ndim, const int64_t *shape, st__tensor_init_t init, char *err,
                   size_t errlen) {
  out->arena = NULL;
  int rc = st__geom_init(&out->geom, dtype, ndim, shape, err, errlen);
  if (rc != ST_OK) return rc;
  return st__tensor_arena_new(c, device, st__geom_nbytes(&out->geom), init, &out->arena, err,
                              errlen);
}

void st__tensor_release(st__tensor_t *t) {
  st__tensor_arena_release(t->arena);
  t->arena = NULL;
}
