/* src/lua: tensor methods that read or write elements (docs/endpoints.md,
 * "Tensor methods"), on the CPU or a CUDA device:
 *
 *   t:fill(v)  t:contiguous()  t:clone()  t:to(dtype|device [, ...])
 *   t:copy_(src)  t:get(i, ...)  t:set(i, ..., v)  t:item()  t:tolist()
 *
 * CPU tensors are read and written in place. CUDA tensors go through
 * kernels on the worker's stream (device.c); element reads and tolist copy
 * to the host (small synchronous copies). Copies between devices move a
 * contiguous buffer: a strided source is gathered first, on its own device,
 * and a cast or a strided destination is finished on the destination's
 * side.
 *
 * The contract of each non-static function is its comment in lua_int.h;
 * all of them run on the thread that owns the lua_State they are given.
 */
#include "lua/lua_int.h"

#include <stdio.h>
#include <string.h>

/* Elements at most that tolist() converts. */
#define TOLIST_MAX 1000000

/* ------------------------------------------------------------ copies */

/* Same device, elements that do not overlap. */
static void copy_same(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                      const char *fn) {
  if (st__ltensor_device(dst) == ST__DEV_CPU) st__ltensor_copy(dst, src);
  else st__lua_cuda_copy(L, dst, src, fn);
}

/* [-0, +1] A contiguous temporary like t (shape) on `device` with `dtype`. */
static st__ltensor_t *temp_like(lua_State *L, const st__ltensor_t *t, int device,
                                st_dtype_t dtype) {
  return st__lua_new_tensor_on(L, device, dtype, t->ndim, t->shape);
}

void st__lua_tensor_copy(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                         const char *fn) {
  int64_t n = st__ltensor_numel(dst);
  if (n == 0) return;
  int top = lua_gettop(L);
  int dd = st__ltensor_device(dst), sd = st__ltensor_device(src);
  if (dd == sd) {
    if (dst->arena == src->arena) {
      /* May overlap: through a private contiguous copy. */
      st__ltensor_t *tmp = temp_like(L, src, sd, src->dtype);
      copy_same(L, tmp, src, fn);
      copy_same(L, dst, tmp, fn);
    } else {
      copy_same(L, dst, src, fn);
    }
    lua_settop(L, top);
    return;
  }
  /* Another device: move one contiguous buffer. */
  const st__ltensor_t *s = src;
  if (!st__ltensor_is_contiguous(src)) {
    st__ltensor_t *g = temp_like(L, src, sd, src->dtype);
    copy_same(L, g, src, fn);
    s = g;
  }
  uint64_t bytes = (uint64_t)n * st_dtype_size(s->dtype);
  if (st__ltensor_is_contiguous(dst) && dst->dtype == s->dtype) {
    st__lua_transfer(L, st__ltensor_data(dst), dd, st__ltensor_data(s), sd, bytes, fn);
  } else if (dd == ST__DEV_CPU) {
    st__ltensor_t *h = temp_like(L, s, ST__DEV_CPU, s->dtype);
    st__lua_transfer(L, st__ltensor_data(h), ST__DEV_CPU, st__ltensor_data(s), sd, bytes, fn);
    st__ltensor_copy(dst, h);                 /* cast and strides on the host */
  } else if (sd == ST__DEV_CPU) {
    /* Cast on the host (the kernels store the same bytes), then upload. */
    st__ltensor_t *h = temp_like(L, s, ST__DEV_CPU, dst->dtype);
    st__ltensor_copy(h, s);
    uint64_t hbytes = (uint64_t)n * st_dtype_size(dst->dtype);
    if (st__ltensor_is_contiguous(dst)) {
      st__lua_transfer(L, st__ltensor_data(dst), dd, st__ltensor_data(h), ST__DEV_CPU, hbytes,
                       fn);
    } else {
      st__ltensor_t *d = temp_like(L, s, dd, dst->dtype);
      st__lua_transfer(L, st__ltensor_data(d), dd, st__ltensor_data(h), ST__DEV_CPU, hbytes, fn);
      copy_same(L, dst, d, fn);
    }
  } else {
    st__ltensor_t *d = temp_like(L, s, dd, s->dtype);
    st__lua_transfer(L, st__ltensor_data(d), dd, st__ltensor_data(s), sd, bytes, fn);
    copy_same(L, dst, d, fn);
  }
  lua_settop(L, top);
}

void st__lua_tensor_fill(lua_State *L, const st__ltensor_t *t, double v, const char *fn) {
  if (st__ltensor_numel(t) == 0) return;
  if (st__ltensor_device(t) == ST__DEV_CPU) st__ltensor_fill_cpu(t, v);
  else st__lua_cuda_fill(L, t, v, fn);
}

/* ------------------------------------------------------------ elements */

static double check_value(lua_State *L, int idx, const char *fn) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) return lua_toboolean(L, idx) ? 1.0 : 0.0;
  if (lua_type(L, idx) != LUA_TNUMBER)
    st__lua_raise(L, "%s: value must be a number or a boolean, got %s", fn, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

/* Element offset of the indices at stack positions first..first+ndim-1. */
static int64_t element_offset(lua_State *L, const st__ltensor_t *t, int first, const char *fn) {
  int64_t off = 0;
  for (int i = 0; i < t->ndim; i++) {
    int64_t k = st__lua_check_int(L, first + i, fn, "index");
    int64_t k0 = k;
    if (k < 0) k += t->shape[i];
    if (k < 0 || k >= t->shape[i])
      st__lua_raise(L, "%s: index %lld is out of range for dim %d of size %lld", fn,
                    (long long)k0, i, (long long)t->shape[i]);
    off += k * t->strides[i];
  }
  return off;
}

static void push_value(lua_State *L, st_dtype_t dtype, double v) {
  if (dtype == ST_DTYPE_BOOL) lua_pushboolean(L, v != 0);
  else lua_pushnumber(L, v);
}

/* Element `off` (in elements from element 0), from either device. */
static double load_element(lua_State *L, const st__ltensor_t *t, int64_t off, const char *fn) {
  int dev = st__ltensor_device(t);
  if (dev == ST__DEV_CPU) return st_dtype_load(t->dtype, st__ltensor_data(t), (size_t)off);
  unsigned char buf[8];
  size_t es = st_dtype_size(t->dtype);
  st__lua_transfer(L, buf, ST__DEV_CPU, st__ltensor_data(t) + off * (int64_t)es, dev, es, fn);
  return st_dtype_load(t->dtype, buf, 0);
}

static void push_list(lua_State *L, const st__ltensor_t *t, int d, int64_t off) {
  if (d == t->ndim) {
    push_value(L, t->dtype, st_dtype_load(t->dtype, st__ltensor_data(t), (size_t)off));
    return;
  }
  luaL_checkstack(L, 4, "tolist");
  lua_createtable(L, (int)t->shape[d], 0);
  for (int64_t i = 0; i < t->shape[d]; i++) {
    push_list(L, t, d + 1, off + i * t->strides[d]);
    lua_rawseti(L, -2, (int)i + 1);
  }
}

/* ------------------------------------------------------------ methods */

static int l_fill(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "fill");
  double v = check_value(L, 2, "fill");
  st__lua_tensor_fill(L, t, v, "fill");
  lua_settop(L, 1);
  return 1;
}

/* t:mul_(k) and t:add_(k): in place, on the tensor's own memory (a tensor
 * argument's writes land in the client's allocation); return t. */
static int affine(lua_State *L, double mul, double add, const char *fn) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, fn);
  lua_settop(L, 1);
  if (st__ltensor_numel(t) == 0) return 1;
  if (st__ltensor_device(t) == ST__DEV_CPU) st__ltensor_affine_cpu(t, mul, add);
  else st__lua_cuda_affine(L, t, mul, add, fn);
  return 1;
}

static int l_mul_(lua_State *L) { return affine(L, check_value(L, 2, "mul_"), 0.0, "mul_"); }
static int l_add_(lua_State *L) { return affine(L, 1.0, check_value(L, 2, "add_"), "add_"); }

/* [-0, +1] A contiguous copy of t on `device` with `dtype`. */
static void push_copy(lua_State *L, const st__ltensor_t *t, int device, st_dtype_t dtype,
                      const char *fn) {
  st__ltensor_t *c = st__lua_new_tensor_on(L, device, dtype, t->ndim, t->shape);
  st__lua_tensor_copy(L, c, t, fn);
}

static int l_contiguous(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "contiguous");
  if (st__ltensor_is_contiguous(t)) lua_settop(L, 1);
  else push_copy(L, t, st__ltensor_device(t), t->dtype, "contiguous");
  return 1;
}

static int l_clone(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "clone");
  push_copy(L, t, st__ltensor_device(t), t->dtype, "clone");
  return 1;
}

/* t:to(x [, y]): x and y each a dtype or a device; a new tensor. */
static int l_to(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "to");
  int nargs = lua_gettop(L) - 1;
  if (nargs < 1 || nargs > 2)
    return st__lua_raise(L, "to: expected a dtype and/or a device, e.g. t:to(\"float16\"), "
                            "t:to(\"cuda:0\") or t:to(\"cpu\", \"float32\")");
  int device = st__ltensor_device(t), have_device = 0, have_dtype = 0;
  st_dtype_t dt = t->dtype;
  for (int i = 2; i <= nargs + 1; i++) {
    const char *name = lua_type(L, i) == LUA_TSTRING ? lua_tostring(L, i) : NULL;
    if (name && st__lua_is_device_name(name) && !have_device) {
      device = st__lua_device_arg(L, i, "to");
      have_device = 1;
    } else if (name && st_dtype_from_name(name) != ST_DTYPE_INVALID && !have_dtype) {
      dt = st_dtype_from_name(name);
      have_dtype = 1;
    } else {
      return st__lua_raise(L, "to: unknown dtype '%s' (nor a device: \"cpu\", \"cuda\", "
                              "\"cuda:N\"; one of each at most)",
                           name ? name : luaL_typename(L, i));
    }
  }
  push_copy(L, t, device, dt, "to");
  return 1;
}

static int l_copy_(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "copy_");
  st__ltensor_t *s = st__lua_check_tensor(L, 2, "copy_");
  int same = t->ndim == s->ndim;
  for (int i = 0; same && i < t->ndim; i++) same = t->shape[i] == s->shape[i];
  if (!same) return st__lua_raise(L, "copy_: source and destination shapes differ");
  st__lua_tensor_copy(L, t, s, "copy_");
  lua_settop(L, 1);
  return 1;
}

static int l_get(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "get");
  if (lua_gettop(L) != 1 + t->ndim)
    return st__lua_raise(L, "get: expected %d indices, got %d", t->ndim, lua_gettop(L) - 1);
  push_value(L, t->dtype, load_element(L, t, element_offset(L, t, 2, "get"), "get"));
  return 1;
}

static int l_set(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "set");
  if (lua_gettop(L) != 2 + t->ndim)
    return st__lua_raise(L, "set: expected %d indices and a value, got %d arguments", t->ndim,
                         lua_gettop(L) - 1);
  double v = check_value(L, 2 + t->ndim, "set");
  int64_t off = element_offset(L, t, 2, "set");
  int dev = st__ltensor_device(t);
  if (dev == ST__DEV_CPU) {
    st_dtype_store(t->dtype, st__ltensor_data(t), (size_t)off, v);
  } else {
    unsigned char buf[8];
    size_t es = st_dtype_size(t->dtype);
    st_dtype_store(t->dtype, buf, 0, v);
    st__lua_transfer(L, st__ltensor_data(t) + off * (int64_t)es, dev, buf, ST__DEV_CPU, es, "set");
  }
  lua_settop(L, 1);
  return 1;
}

static int l_item(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "item");
  if (st__ltensor_numel(t) != 1)
    return st__lua_raise(L, "item: the tensor has %lld elements, not 1",
                         (long long)st__ltensor_numel(t));
  push_value(L, t->dtype, load_element(L, t, 0, "item"));
  return 1;
}

static int l_tolist(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "tolist");
  int64_t n = st__ltensor_numel(t);
  if (n > TOLIST_MAX)
    return st__lua_raise(L, "tolist: the tensor has %lld elements (at most %d)", (long long)n,
                         TOLIST_MAX);
  if (st__ltensor_device(t) != ST__DEV_CPU) {
    push_copy(L, t, ST__DEV_CPU, t->dtype, "tolist");   /* t, host copy */
    t = lua_touserdata(L, -1);
  }
  push_list(L, t, 0, 0);
  return 1;
}

void st__lua_open_tensor_ops(lua_State *L, int idx) {
  static const luaL_Reg methods[] = {
    {"fill", l_fill}, {"contiguous", l_contiguous}, {"clone", l_clone}, {"to", l_to},
    {"copy_", l_copy_}, {"get", l_get}, {"set", l_set}, {"item", l_item},
    {"tolist", l_tolist}, {"mul_", l_mul_}, {"add_", l_add_}, {NULL, NULL}
  };
  for (const luaL_Reg *r = methods; r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, idx, r->name);
  }
}
