/* src/client: DLPack export of mapped tensors (include/st/dlpack.h).
 *
 * One allocation per exported tensor holds the managed tensor, the result
 * it keeps alive and the shape/strides copies; its deleter frees it and
 * drops the result reference, marking the result as one whose CUDA pool
 * regions a device may still read (result.h). The PyCapsule destructor lives here too, in
 * C: a destructor written in Python (ctypes) can run while the interpreter
 * is being torn down and crash it.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "client/result.h"
#include "st/dlpack.h"

/* The manager context of one exported tensor: `managed` or `versioned` is
 * used, as chosen at export. */
typedef struct export {
  union {
    DLManagedTensor managed;
    DLManagedTensorVersioned versioned;
  } u;
  st_result_t *result;     /* one reference, dropped by the deleter */
  int64_t dims[];          /* shape, then strides: 2 * ndim entries  */
} export_t;

static void free_export(export_t *e) {
  /* The consumer let its tensor go, maybe with kernels on it still
   * queued (torch drops a tensor with its last Python reference, before
   * the work it launched ran): the result's CUDA pool regions go back to
   * the server once that work is done. */
  st__client_result_after_device(e->result);
  st_result_free(e->result);
  free(e);
}

static void delete_managed(DLManagedTensor *self) {
  if (self) free_export((export_t *)self->manager_ctx);
}

static void delete_versioned(DLManagedTensorVersioned *self) {
  if (self) free_export((export_t *)self->manager_ctx);
}

/* See dlpack.h. Any thread while r lives. */
ST_API void *st_tensor_dlpack(st_result_t *r, const st_tensor_t *t, int versioned) {
  if (!r || !t || t->ndim < 0 || (t->ndim > 0 && (!t->shape || !t->strides))) return NULL;
  uint8_t code = 0, bits = 0;
  st_dtype_dlpack(t->dtype, &code, &bits);
  if (bits == 0) return NULL;
  size_t n = (size_t)t->ndim;
  export_t *e = calloc(1, offsetof(export_t, dims) + sizeof(int64_t) * 2 * (n ? n : 1));
  if (!e) return NULL;
  if (n) {
    memcpy(e->dims, t->shape, sizeof(int64_t) * n);
    memcpy(e->dims + n, t->strides, sizeof(int64_t) * n);
  }
  DLTensor dl;
  memset(&dl, 0, sizeof dl);
  dl.data = t->data;
  dl.byte_offset = 0;
  if (t->device == ST_DEVICE_CUDA) {
    dl.device.device_type = kDLCUDA;
    dl.device.device_id = t->device_index;
  } else {
    dl.device.device_type = kDLCPU;
    dl.device.device_id = 0;
  }
  dl.ndim = t->ndim;
  dl.dtype.code = code;
  dl.dtype.bits = bits;
  dl.dtype.lanes = 1;
  dl.shape = e->dims;
  dl.strides = e->dims + n;
  st_result_ref(r);
  e->result = r;
  if (versioned) {
    DLManagedTensorVersioned *v = &e->u.versioned;
    v->version.major = DLPACK_MAJOR_VERSION;
    v->version.minor = DLPACK_MINOR_VERSION;
    v->manager_ctx = e;
    v->deleter = delete_versioned;
    v->flags = 0;
    v->dl_tensor = dl;
    return v;
  }
  DLManagedTensor *m = &e->u.managed;
  m->dl_tensor = dl;
  m->manager_ctx = e;
  m->deleter = delete_managed;
  return m;
}

/* See client.h. Any thread while r lives. */
ST_API size_t st_result_dlpack_all(st_result_t *r, int versioned, void **out, size_t n) {
  size_t count = st_result_tensor_count(r);
  if (!out) return 0;
  if (n > count) n = count;
  for (size_t i = 0; i < n; i++) out[i] = st_tensor_dlpack(r, st_result_tensor(r, i), versioned);
  return n;
}

/* CPython's capsule functions, found in the running process. */
typedef int (*capsule_is_valid_fn)(void *capsule, const char *name);
typedef void *(*capsule_get_pointer_fn)(void *capsule, const char *name);

static pthread_once_t python_once = PTHREAD_ONCE_INIT;
static capsule_is_valid_fn capsule_is_valid;
static capsule_get_pointer_fn capsule_get_pointer;

static void find_python(void) {
  /* dlsym returns void *; converting through memcpy keeps -Wpedantic quiet
   * about object-to-function pointer casts. */
  void *p = dlsym(RTLD_DEFAULT, "PyCapsule_IsValid");
  void *q = dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer");
  if (!p || !q) return;
  memcpy(&capsule_is_valid, &p, sizeof p);
  memcpy(&capsule_get_pointer, &q, sizeof q);
}

/* See dlpack.h. Called by CPython, GIL held. */
ST_API void st_dlpack_capsule_destructor(void *capsule) {
  if (!capsule) return;
  pthread_once(&python_once, find_python);
  if (!capsule_is_valid || !capsule_get_pointer) return;
  /* PyCapsule_IsValid sets no exception, unlike PyCapsule_GetPointer with
   * a wrong name: ask it first. A consumed capsule was renamed. */
  if (capsule_is_valid(capsule, "dltensor_versioned")) {
    DLManagedTensorVersioned *v = capsule_get_pointer(capsule, "dltensor_versioned");
    if (v && v->deleter) v->deleter(v);
  } else if (capsule_is_valid(capsule, "dltensor")) {
    DLManagedTensor *m = capsule_get_pointer(capsule, "dltensor");
    if (m && m->deleter) m->deleter(m);
  }
}
