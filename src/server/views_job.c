/* src/server: the copies `contiguous` asks for, made on a worker
 * (views.h, "views_job.c"): windows of a source's arenas gathered into
 * one new arena per device with the tensor core's copy (tensor/ops.h:
 * CPU loops, a gather kernel on the worker's CUDA stream). */
#include <stdlib.h>
#include <string.h>

#include "common/fail.h"
#include "server/views.h"
#include "tensor/ops.h"

/* Each copy starts on a 256-byte boundary, as CUDA allocations do. */
#define COPY_ALIGN 256

/* See views.h. Any thread. */
void st__views_gather_free(void *ud) {
  st__views_gather_t *g = ud;
  if (!g) return;
  for (size_t i = 0; i < g->narenas; i++)
    if (g->arenas[i]) st__arena_unref(g->arenas[i]);
  free(g->arenas);
  free(g->windows);
  free(g);
}

/* The copies of the windows on `device` into the new arena `dst` (arena
 * index `index` of the result), packed as tensors at *at (in order of
 * the windows; `place` receives each one's descriptor). */
static int copy_device(st__tensor_ctx_t *ctx, const st__views_gather_t *g, int device,
                       st__arena_t *dst, uint32_t index, st__tensor_desc_t *place, char *err,
                       size_t errlen) {
  uint64_t at = 0;
  for (size_t i = 0; i < g->n; i++) {
    const st__tensor_desc_t *w = &g->windows[i];
    if (st__arena_device(g->arenas[w->arena]) != device) continue;
    st__tensor_desc_t d = *w;
    d.arena = index;
    d.offset = at;
    st__geom_row_major(d.ndim, d.shape, d.strides);
    st__tensor_t src = {0}, out = {0};
    int rc = st__tensor_from_desc(&src, g->arenas[w->arena], w, err, errlen);
    if (rc == ST_OK) rc = st__tensor_from_desc(&out, dst, &d, err, errlen);
    if (rc == ST_OK) rc = st__tensor_copy(ctx, &out, &src, "contiguous", err, errlen);
    st__tensor_release(&src);
    st__tensor_release(&out);
    if (rc != ST_OK) return rc;
    place[i] = d;
    uint64_t n = (uint64_t)st__geom_numel_of(d.ndim, d.shape) * st_dtype_size(d.dtype);
    at += (n + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN;
  }
  return ST_OK;
}

/* See views.h. Worker thread. */
int st__views_gather(st__job_t *job, char *err, size_t errlen) {
  const st__views_gather_t *g = job->ud;
  st__tensor_ctx_t ctx;
  st__tensor_ctx_init(&ctx);
  ctx.in_call = 1;
  st__tensor_desc_t *place = calloc(g->n ? g->n : 1, sizeof *place);
  int *devices = calloc(g->n ? g->n : 1, sizeof *devices);
  st__build_result_t *res = &job->result;
  res->arenas = calloc(g->n ? g->n : 1, sizeof *res->arenas);
  if (!place || !devices || !res->arenas) {
    free(place);
    free(devices);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  int rc = ST_OK;
  for (size_t i = 0; i < g->n && rc == ST_OK; i++) {
    int device = st__arena_device(g->arenas[g->windows[i].arena]);
    size_t k = 0;
    while (k < res->narenas && devices[k] != device) k++;
    if (k < res->narenas) continue;
    /* A new device: one arena for all of its copies. */
    uint64_t bytes = 0;
    for (size_t j = i; j < g->n; j++) {
      const st__tensor_desc_t *w = &g->windows[j];
      if (st__arena_device(g->arenas[w->arena]) != device) continue;
      uint64_t n = (uint64_t)st__geom_numel_of(w->ndim, w->shape) * st_dtype_size(w->dtype);
      bytes += (n + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN;
    }
    ctx.device = device;
    if (device >= 0) ctx.cuda_device = device;
    st__arena_t *a = NULL;
    rc = st__tensor_arena_new(&ctx, device, bytes ? bytes : 1, ST__INIT_WRITTEN, &a, err, errlen);
    if (rc != ST_OK) break;
    devices[res->narenas] = device;
    res->arenas[res->narenas++] = a;
    res->bytes += st__arena_bytes(a);
    rc = copy_device(&ctx, g, device, a, (uint32_t)k, place, err, errlen);
  }
  char why[256] = "";
  int synced = st__tensor_sync_used(&ctx, why, sizeof why);
  if (rc == ST_OK && synced != ST_OK) rc = st__fail(synced, err, errlen, "%s", why);
  if (rc == ST_OK) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, &res->value, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, g->n);
    for (size_t i = 0; i < g->n; i++) st__pack_tensor(&pk, &place[i]);
  }
  free(place);
  free(devices);
  return rc;
}
