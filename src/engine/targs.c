/* src/engine: tensor arguments (targs.h). */
#include "engine/targs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fail.h"
#include "st/errors.h"

/* See targs.h. */
size_t st__targs_count_fds(const msgpack_object *list) {
  size_t n = 0;
  for (uint32_t i = 0; i < list->via.array.size; i++) {
    const msgpack_object *e = &list->via.array.ptr[i];
    n += !(e->type == MSGPACK_OBJECT_MAP && st__map_get(e, "arg_id") && !st__map_get(e, "fd"));
  }
  return n;
}

/* Whether the cached source `have` can stand for arena `want` of a later
 * request: the same backend and device, and no more bytes than it has. */
static int same_allocation(const st__arena_desc_t *have, const st__arena_desc_t *want) {
  return have->cuda == want->cuda && strcmp(have->backend, want->backend) == 0 &&
         strcmp(have->uuid, want->uuid) == 0 && want->bytes <= have->bytes;
}

/* Entry i of the request: its description is parsed into t->descs[i]; its
 * source is a new one for the next of the request's descriptors (*next_fd
 * counts them) or the cached one its arg_id names. 1 when that id is not
 * cached (recorded in uncached[]), else ST_OK or a failure. */
static int take_one(st__targs_t *t, size_t i, const msgpack_object *o, int *fds, size_t *next_fd,
                    st__argcache_t *cache, uint64_t *uncached, size_t *nuncached, char *err,
                    size_t errlen) {
  char why[256];
  st__arena_desc_t *d = &t->descs[i];
  if (st__parse_arena(o, d, why, sizeof why) != ST_OK)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "arenas[%zu]: %s", i, why);
  if (d->legacy || strcmp(d->backend, d->cuda ? "vmm" : "memfd") != 0)
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "arenas[%zu]: backend \"%s\" cannot carry an argument (memfd for cpu, vmm "
                    "for cuda)",
                    i, d->backend);
  if (!d->no_fd) {
    if (d->fd != *next_fd)
      return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                      "arenas[%zu]: fd must be %zu (descriptors go in the order of the arenas "
                      "that carry one)",
                      i, *next_fd);
    int fd = fds[*next_fd];
    fds[(*next_fd)++] = -1;
    t->srcs[i] = st__targ_src_new(d, fd);
    if (!t->srcs[i]) return st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
    return ST_OK;
  }
  st__targ_src_t *s = cache ? st__argcache_get(cache, d->arg_id) : NULL;
  if (s && st__targ_src_failed(s)) {
    st__argcache_forget(cache, d->arg_id);
    s = NULL;
  }
  if (!s) {
    uncached[(*nuncached)++] = d->arg_id;
    return 1;
  }
  const st__arena_desc_t *have = st__targ_src_desc(s);
  if (!same_allocation(have, d))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "arenas[%zu]: arg_id %llu names a %s allocation of %llu bytes on %s; this "
                    "one is %s, %llu bytes on %s",
                    i, (unsigned long long)d->arg_id, have->backend,
                    (unsigned long long)have->bytes, have->cuda ? have->uuid : "cpu", d->backend,
                    (unsigned long long)d->bytes, d->cuda ? d->uuid : "cpu");
  st__targ_src_ref(s);
  t->srcs[i] = s;
  return ST_OK;
}

/* See targs.h. Loop thread; takes the descriptors. */
int st__targs_take(st__targs_t *t, const msgpack_object *list, int *fds, size_t nfds,
                   st__argcache_t *cache, uint64_t *uncached, size_t *nuncached, char *err,
                   size_t errlen) {
  memset(t, 0, sizeof *t);
  *nuncached = 0;
  size_t n = list->via.array.size;
  if (n == 0) return ST_OK;
  t->descs = calloc(n, sizeof *t->descs);
  t->srcs = calloc(n, sizeof *t->srcs);
  int rc = ST_OK;
  if (!t->descs || !t->srcs) {
    rc = st__fail(ST_ERR_OUT_OF_MEMORY, err, errlen, "out of memory");
  } else {
    t->n = n;
    size_t next_fd = 0;
    for (size_t i = 0; i < n && rc == ST_OK; i++) {
      int r = take_one(t, i, &list->via.array.ptr[i], fds, &next_fd, cache, uncached, nuncached,
                       err, errlen);
      if (r < 0) rc = r;
    }
    if (rc != ST_OK)
      *nuncached = 0;   /* a fault of its own: no resend helps */
    else if (*nuncached)
      rc = st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "arg_id %llu%s is not cached on this connection (never sent with its "
                    "descriptor, forgotten or evicted): send the descriptor again",
                    (unsigned long long)uncached[0], *nuncached > 1 ? " and others" : "");
  }
  for (size_t i = 0; i < nfds; i++)
    if (fds[i] >= 0) close(fds[i]);
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
    int rc = st__targ_src_import(t->srcs[i], &t->arenas[i], why, sizeof why);
    if (rc != ST_OK)
      return st__fail(rc, err, errlen, "tensor argument arena %zu (%s): %s", i,
                      t->descs[i].cuda ? t->descs[i].uuid : "cpu", why);
  }
  return ST_OK;
}

/* See targs.h. Worker thread. */
uint32_t *st__targs_match_result(const st__targs_t *t, const st__build_result_t *r) {
  if (!t->arenas || !t->n || !r->narenas) return NULL;
  uint32_t *of = NULL;
  for (size_t k = 0; k < r->narenas; k++)
    for (size_t i = 0; i < t->n; i++) {
      if (r->arenas[k] != t->arenas[i]) continue;
      if (!of && !(of = calloc(r->narenas, sizeof *of))) return NULL;
      of[k] = (uint32_t)i + 1;
      break;
    }
  return of;
}

/* See targs.h. */
void st__targs_clear(st__targs_t *t) {
  for (size_t i = 0; i < t->n; i++) {
    if (t->srcs) st__targ_src_unref(t->srcs[i]);
    if (t->arenas) st__arena_unref(t->arenas[i]);
  }
  free(t->descs);
  free(t->srcs);
  free(t->arenas);
  memset(t, 0, sizeof *t);
}
