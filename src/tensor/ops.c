/* src/tensor/ops.c: operations on elements (see ops.h), each dispatched
 * once through the backend of the tensor's device (backend.h). Copies
 * between devices move one contiguous buffer: a strided source is
 * gathered first, on its own device, and a cast or a strided destination
 * is finished on the destination's side. Runs on the thread that owns the
 * context. */
#include <string.h>

#include "tensor/backend.h"
#include "tensor/ops.h"

/* The backend of t's device into `be`, or return the failure. */
#define BACKEND_OR_FAIL(c, dev, be, what, err, errlen)                                     \
  do {                                                                                     \
    int rc_ = st__tensor_backend_for((c), (dev), (what), &(be), (err), (errlen));          \
    if (rc_ != ST_OK) return rc_;                                                          \
  } while (0)

int st__tensor_fill(st__tensor_ctx_t *c, const st__tensor_t *t, double v, const char *what,
                    char *err, size_t errlen) {
  if (st__geom_numel(&t->geom) == 0) return ST_OK;
  const st__tensor_backend_t *be;
  BACKEND_OR_FAIL(c, st__tensor_device(t), be, what, err, errlen);
  return be->fill(c, t, v, what, err, errlen);
}

int st__tensor_affine(st__tensor_ctx_t *c, const st__tensor_t *t, double mul, double add,
                      const char *what, char *err, size_t errlen) {
  if (st__geom_numel(&t->geom) == 0) return ST_OK;
  const st__tensor_backend_t *be;
  BACKEND_OR_FAIL(c, st__tensor_device(t), be, what, err, errlen);
  return be->affine(c, t, mul, add, what, err, errlen);
}

int st__tensor_generate(st__tensor_ctx_t *c, const st__tensor_t *t, const st__gen_t *g,
                        const char *what, char *err, size_t errlen) {
  if (!st__geom_is_contiguous(&t->geom))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "%s: generators fill contiguous tensors only", what);
  if (st__geom_numel(&t->geom) == 0) return ST_OK;
  const st__tensor_backend_t *be;
  BACKEND_OR_FAIL(c, st__tensor_device(t), be, what, err, errlen);
  return be->generate(c, t, g, what, err, errlen);
}

/* Copies `bytes` between two addresses of the same or different devices
 * (ST__DEV_CPU: host memory; N: a device address of cuda:N), in order
 * with the call's earlier work. A copy that involves host memory returns
 * once the destination holds the bytes; a copy within one CUDA device is
 * queued on its stream; two CUDA devices go through host memory. */
static int transfer(st__tensor_ctx_t *c, void *dst, int dst_device, const void *src,
                    int src_device, uint64_t bytes, const char *what, char *err, size_t errlen) {
  if (bytes == 0) return ST_OK;
  const st__tensor_backend_t *db, *sb;
  BACKEND_OR_FAIL(c, dst_device, db, what, err, errlen);
  BACKEND_OR_FAIL(c, src_device, sb, what, err, errlen);
  int rc;
  if (dst_device == src_device)               /* in order on that device */
    return db->copy_bytes(c, dst_device, dst, src, bytes, what, err, errlen);
  if (src_device == ST__DEV_CPU) {            /* the source may go on return */
    rc = db->copy_bytes(c, dst_device, dst, src, bytes, what, err, errlen);
    return rc == ST_OK ? db->sync(c, dst_device, what, err, errlen) : rc;
  }
  if (dst_device == ST__DEV_CPU) {
    rc = sb->copy_bytes(c, src_device, dst, src, bytes, what, err, errlen);
    return rc == ST_OK ? sb->sync(c, src_device, what, err, errlen) : rc;
  }
  /* Two devices: through a host buffer (a CPU arena), so that neither
   * needs access to the other's allocation. */
  st__tensor_t h;
  int64_t n = (int64_t)bytes;
  rc = st__tensor_new(c, &h, ST__DEV_CPU, ST_DTYPE_UINT8, 1, &n, ST__INIT_WRITTEN, err, errlen);
  if (rc != ST_OK) return rc;
  void *host = st__tensor_data(&h);
  rc = sb->copy_bytes(c, src_device, host, src, bytes, what, err, errlen);
  if (rc == ST_OK) rc = sb->sync(c, src_device, what, err, errlen);
  if (rc == ST_OK) rc = db->copy_bytes(c, dst_device, dst, host, bytes, what, err, errlen);
  if (rc == ST_OK) rc = db->sync(c, dst_device, what, err, errlen);
  st__tensor_release(&h);
  return rc;
}

/* A contiguous temporary with t's shape on `device` with `dtype`; every
 * caller copies a whole tensor into it. */
static int temp_like(st__tensor_ctx_t *c, st__tensor_t *out, const st__tensor_t *t, int device,
                     st_dtype_t dtype, char *err, size_t errlen) {
  return st__tensor_new(c, out, device, dtype, t->geom.ndim, t->geom.shape, ST__INIT_WRITTEN,
                        err, errlen);
}

/* dst := src across two devices; temporaries go to tmp[0..2] (released
 * by the caller). */
static int copy_across(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
                       st__tensor_t *tmp, const char *what, char *err, size_t errlen) {
  int dd = st__tensor_device(dst), sd = st__tensor_device(src);
  const st__tensor_backend_t *db, *sb, *host = st__tensor_backend(ST__DEV_CPU);
  BACKEND_OR_FAIL(c, dd, db, what, err, errlen);
  BACKEND_OR_FAIL(c, sd, sb, what, err, errlen);
  const st__tensor_t *s = src;
  int rc;
  if (!st__geom_is_contiguous(&src->geom)) {  /* gather on the source's side */
    if ((rc = temp_like(c, &tmp[0], src, sd, src->geom.dtype, err, errlen)) != ST_OK ||
        (rc = sb->copy(c, &tmp[0], src, what, err, errlen)) != ST_OK)
      return rc;
    s = &tmp[0];
  }
  int64_t n = st__geom_numel(&dst->geom);
  uint64_t bytes = (uint64_t)n * st_dtype_size(s->geom.dtype);
  if (st__geom_is_contiguous(&dst->geom) && dst->geom.dtype == s->geom.dtype)
    return transfer(c, st__tensor_data(dst), dd, st__tensor_data(s), sd, bytes, what,
                               err, errlen);
  if (dd == ST__DEV_CPU) {                    /* download, then cast and scatter on the host */
    if ((rc = temp_like(c, &tmp[1], s, ST__DEV_CPU, s->geom.dtype, err, errlen)) != ST_OK ||
        (rc = transfer(c, st__tensor_data(&tmp[1]), ST__DEV_CPU, st__tensor_data(s),
                                  sd, bytes, what, err, errlen)) != ST_OK)
      return rc;
    return host->copy(c, dst, &tmp[1], what, err, errlen);
  }
  if (sd == ST__DEV_CPU) {
    /* Cast on the host (the kernels store the same bytes), then upload. */
    if ((rc = temp_like(c, &tmp[1], s, ST__DEV_CPU, dst->geom.dtype, err, errlen)) != ST_OK ||
        (rc = host->copy(c, &tmp[1], s, what, err, errlen)) != ST_OK)
      return rc;
    uint64_t hbytes = (uint64_t)n * st_dtype_size(dst->geom.dtype);
    if (st__geom_is_contiguous(&dst->geom))
      return transfer(c, st__tensor_data(dst), dd, st__tensor_data(&tmp[1]),
                                 ST__DEV_CPU, hbytes, what, err, errlen);
    if ((rc = temp_like(c, &tmp[2], s, dd, dst->geom.dtype, err, errlen)) != ST_OK ||
        (rc = transfer(c, st__tensor_data(&tmp[2]), dd, st__tensor_data(&tmp[1]),
                                  ST__DEV_CPU, hbytes, what, err, errlen)) != ST_OK)
      return rc;
    return db->copy(c, dst, &tmp[2], what, err, errlen);
  }
  /* CUDA to CUDA: move the buffer, then cast and scatter on the destination. */
  if ((rc = temp_like(c, &tmp[2], s, dd, s->geom.dtype, err, errlen)) != ST_OK ||
      (rc = transfer(c, st__tensor_data(&tmp[2]), dd, st__tensor_data(s), sd, bytes,
                                what, err, errlen)) != ST_OK)
    return rc;
  return db->copy(c, dst, &tmp[2], what, err, errlen);
}

int st__tensor_copy(st__tensor_ctx_t *c, const st__tensor_t *dst, const st__tensor_t *src,
                    const char *what, char *err, size_t errlen) {
  int same = dst->geom.ndim == src->geom.ndim;
  for (int i = 0; same && i < dst->geom.ndim; i++) same = dst->geom.shape[i] == src->geom.shape[i];
  if (!same)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                           "%s: source and destination shapes differ", what);
  if (st__geom_numel(&dst->geom) == 0) return ST_OK;
  st__tensor_t tmp[3] = {{0}};
  int rc, dd = st__tensor_device(dst), sd = st__tensor_device(src);
  if (dd == sd) {
    const st__tensor_backend_t *be;
    BACKEND_OR_FAIL(c, dd, be, what, err, errlen);
    if (dst->arena != src->arena) return be->copy(c, dst, src, what, err, errlen);
    /* May overlap: through a private contiguous copy. */
    rc = temp_like(c, &tmp[0], src, sd, src->geom.dtype, err, errlen);
    if (rc == ST_OK) rc = be->copy(c, &tmp[0], src, what, err, errlen);
    if (rc == ST_OK) rc = be->copy(c, dst, &tmp[0], what, err, errlen);
  } else {
    rc = copy_across(c, dst, src, tmp, what, err, errlen);
  }
  for (int i = 0; i < 3; i++) st__tensor_release(&tmp[i]);
  return rc;
}

int st__tensor_to(st__tensor_ctx_t *c, st__tensor_t *out, const st__tensor_t *t, int device,
                  st_dtype_t dtype, const char *what, char *err, size_t errlen) {
  /* The copy writes every element of the contiguous result. */
  int rc = st__tensor_new(c, out, device, dtype, t->geom.ndim, t->geom.shape, ST__INIT_WRITTEN,
                          err, errlen);
  if (rc == ST_OK) rc = st__tensor_copy(c, out, t, what, err, errlen);
  if (rc != ST_OK) st__tensor_release(out);
  return rc;
}

int st__tensor_get(st__tensor_ctx_t *c, const st__tensor_t *t, int64_t off, double *v,
                   const char *what, char *err, size_t errlen) {
  _Alignas(8) unsigned char buf[8];
  size_t es = st_dtype_size(t->geom.dtype);
  int rc = transfer(c, buf, ST__DEV_CPU, st__tensor_data(t) + off * (int64_t)es,
                               st__tensor_device(t), es, what, err, errlen);
  if (rc == ST_OK) *v = st_dtype_load(t->geom.dtype, buf, 0);
  return rc;
}

int st__tensor_set(st__tensor_ctx_t *c, const st__tensor_t *t, int64_t off, double v,
                   const char *what, char *err, size_t errlen) {
  _Alignas(8) unsigned char buf[8];
  size_t es = st_dtype_size(t->geom.dtype);
  st_dtype_store(t->geom.dtype, buf, 0, v);
  return transfer(c, st__tensor_data(t) + off * (int64_t)es, st__tensor_device(t), buf,
                             ST__DEV_CPU, es, what, err, errlen);
}

int st__tensor_reshape(st__tensor_ctx_t *c, st__tensor_t *out, const st__tensor_t *t, int ndim,
                       const int64_t *shape, const char *what, char *err, size_t errlen) {
  if (st__geom_is_contiguous(&t->geom)) return st__tensor_view(out, t, ndim, shape, err, errlen);
  st__geom_t g = t->geom;
  g.offset = 0;                               /* the copy's layout, then its shape */
  st__geom_set_contiguous(&g);
  int rc = st__geom_view(&g, ndim, shape, err, errlen);
  if (rc != ST_OK) return rc;
  rc = st__tensor_to(c, out, t, st__tensor_device(t), t->geom.dtype, what, err, errlen);
  if (rc == ST_OK) out->geom = g;
  return rc;
}
