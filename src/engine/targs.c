/* src/engine: tensor arguments (targs.h). */
#include "engine/targs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "st/errors.h"

/* See targs.h. Loop thread; takes the descriptors. */
int st__targs_take(st__targs_t *t, const msgpack_object *list, int *fds, size_t nfds, char *err,
                   size_t errlen) {
  memset(t, 0, sizeof *t);
  int rc = ST_OK;
  if (nfds == 0) return ST_OK;
  t->descs = calloc(nfds, sizeof *t->descs);
  t->fds = malloc(nfds * sizeof *t->fds);
  if (!t->descs || !t->fds) {
    free(t->descs);
    free(t->fds);
    t->descs = NULL;
    t->fds = NULL;
    for (size_t i = 0; i < nfds; i++) close(fds[i]);
    return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  t->n = nfds;
  memcpy(t->fds, fds, nfds * sizeof *fds);
  for (size_t i = 0; i < nfds && rc == ST_OK; i++) {
    char why[256];
    st__arena_desc_t *d = &t->descs[i];
    if (st__parse_arena(&list->via.array.ptr[i], d, why, sizeof why) != ST_OK)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arenas[%zu]: %s", i, why);
    else if (d->legacy || strcmp(d->backend, d->cuda ? "vmm" : "memfd") != 0)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "arenas[%zu]: backend \"%s\" cannot carry an argument (memfd for cpu, vmm "
                    "for cuda)",
                    i, d->backend);
    else if (d->fd != i)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "arenas[%zu]: fd must be %zu (descriptors go in the order of the arenas)",
                    i, i);
  }
  if (rc != ST_OK) st__targs_clear(t);
  return rc;
}

static const char *device_name(st__tensor_device_t d) {
  return d == ST_TDEV_CUDA ? "cuda" : d == ST_TDEV_CPU ? "cpu" : "any device";
}

/* Checks one tensor ext value; `top` is set for the argument's own value. */
static int check_tensor(const st__targs_t *t, const st__param_t *p, const msgpack_object *v,
                        int top, char *err, size_t errlen) {
  st__tensor_desc_t d;
  char why[256];
  size_t n = t ? t->n : 0;
  if (st__parse_tensor(v, &d, why, sizeof why) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "argument '%s' (tensor): %s", p->name,
                    why);
  if (d.arena >= n) {
    if (n == 0)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "argument '%s' is a tensor but the request carries no arenas (allocate "
                      "it with st_tensor_alloc and pass it with st_args_tensor)",
                      p->name);
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s' (tensor): arena %u is not in this request (it lists %zu)",
                    p->name, (unsigned)d.arena, n);
  }
  const st__arena_desc_t *a = &t->descs[d.arena];
  uint64_t lo, hi;
  if (st__tensor_extent(&d, &lo, &hi) != ST_OK || hi > a->bytes)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s' (tensor): its elements reach past the end of arena %u "
                    "(%llu bytes)",
                    p->name, (unsigned)d.arena, (unsigned long long)a->bytes);
  if (!top || p->type != ST_PARAM_TENSOR) return ST_OK;
  if (p->tensor_dtype >= 0 && (int)d.dtype != p->tensor_dtype)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s' has dtype %s; the endpoint wants %s", p->name,
                    st_dtype_name(d.dtype), st_dtype_name((st_dtype_t)p->tensor_dtype));
  st__tensor_device_t have = a->cuda ? ST_TDEV_CUDA : ST_TDEV_CPU;
  if (p->tensor_device != ST_TDEV_ANY && p->tensor_device != have)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "argument '%s' is on %s; the endpoint wants %s", p->name, device_name(have),
                    device_name(p->tensor_device));
  return ST_OK;
}

static int walk(const st__targs_t *t, const st__param_t *p, const msgpack_object *v, int top,
                size_t *count, char *err, size_t errlen) {
  if (v->type == MSGPACK_OBJECT_EXT) {
    if (v->via.ext.type != ST_EXT_TENSOR)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "argument '%s': only tensors may be passed (ext type %d is not an "
                      "argument; pass a module's tensors one by one)",
                      p->name, (int)v->via.ext.type);
    (*count)++;
    return check_tensor(t, p, v, top, err, errlen);
  }
  if (v->type == MSGPACK_OBJECT_ARRAY) {
    for (uint32_t i = 0; i < v->via.array.size; i++) {
      int rc = walk(t, p, &v->via.array.ptr[i], 0, count, err, errlen);
      if (rc != ST_OK) return rc;
    }
  } else if (v->type == MSGPACK_OBJECT_MAP) {
    for (uint32_t i = 0; i < v->via.map.size; i++) {
      int rc = walk(t, p, &v->via.map.ptr[i].val, 0, count, err, errlen);
      if (rc != ST_OK) return rc;
    }
  }
  return ST_OK;
}

/* See targs.h. Any thread. */
int st__targs_check(const st__targs_t *t, const st__param_t *p, const msgpack_object *v,
                    size_t *ntensors, char *err, size_t errlen) {
  size_t count = 0;
  if (p->type == ST_PARAM_TENSOR &&
      !(v->type == MSGPACK_OBJECT_EXT && v->via.ext.type == ST_EXT_TENSOR))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "argument '%s' must be a tensor",
                    p->name);
  int rc = walk(t, p, v, 1, &count, err, errlen);
  if (ntensors) *ntensors += count;
  return rc;
}

/* See targs.h. Worker thread. */
int st__targs_import(st__targs_t *t, char *err, size_t errlen) {
  if (t->n == 0) return ST_OK;
  if (!t->arenas) {
    t->arenas = calloc(t->n, sizeof *t->arenas);
    if (!t->arenas) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  }
  for (size_t i = 0; i < t->n; i++) {
    if (t->arenas[i]) continue;
    char why[512];
    int fd = t->fds[i];
    t->fds[i] = -1;   /* st__arena_import takes it */
    int rc = st__arena_import(&t->descs[i], fd, &t->arenas[i], why, sizeof why);
    if (rc != ST_OK)
      return st__fail(rc, err, errlen, "tensor argument arena %zu (%s): %s", i,
                      t->descs[i].cuda ? t->descs[i].uuid : "cpu", why);
  }
  return ST_OK;
}

/* See targs.h. */
void st__targs_clear(st__targs_t *t) {
  for (size_t i = 0; i < t->n; i++) {
    if (t->fds && t->fds[i] >= 0) close(t->fds[i]);
    if (t->arenas) st__arena_unref(t->arenas[i]);
  }
  free(t->descs);
  free(t->fds);
  free(t->arenas);
  memset(t, 0, sizeof *t);
}
