/* src/lua/tensor_ops.c: tensor methods that read or write elements
 * (docs/endpoints.md, "Tensor methods"), bindings of the core's
 * operations (src/tensor/ops.h) on either device:
 *
 *   t:fill(v)  t:contiguous()  t:clone()  t:to(dtype|device [, ...])
 *   t:copy_(src)  t:get(i, ...)  t:set(i, ..., v)  t:item()  t:tolist()
 *   t:mul_(k)  t:add_(k)
 *
 * All of it runs on the thread that owns the lua_State it is given.
 */
#include "lua/tensor.h"

#include <string.h>

#include "tensor/ops.h"

/* Elements at most that tolist() converts. */
#define TOLIST_MAX 1000000

/* Raises the core's message unless rc is ST_OK. */
static void check(lua_State *L, int rc, const char *err) {
  if (rc != ST_OK) st__lua_raise(L, "%s", err);
}

static double check_value(lua_State *L, int idx, const char *fn) {
  if (lua_type(L, idx) == LUA_TBOOLEAN) return lua_toboolean(L, idx) ? 1.0 : 0.0;
  if (lua_type(L, idx) != LUA_TNUMBER)
    st__lua_raise(L, "%s: value must be a number or a boolean, got %s", fn, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

/* Element offset of the indices at stack positions first..first+ndim-1. */
static int64_t element_offset(lua_State *L, const st__tensor_t *t, int first, const char *fn) {
  const st__geom_t *g = &t->geom;
  int64_t off = 0;
  for (int i = 0; i < g->ndim; i++) {
    int64_t k = st__lua_check_int(L, first + i, fn, "index");
    int64_t k0 = k;
    if (k < 0) k += g->shape[i];
    if (k < 0 || k >= g->shape[i])
      st__lua_raise(L, "%s: index %lld is out of range for dim %d of size %lld", fn,
                    (long long)k0, i, (long long)g->shape[i]);
    off += k * g->strides[i];
  }
  return off;
}

static void push_value(lua_State *L, st_dtype_t dtype, double v) {
  if (dtype == ST_DTYPE_BOOL) lua_pushboolean(L, v != 0);
  else lua_pushnumber(L, v);
}

/* Element `off` of t, from either device. */
static double load_element(lua_State *L, const st__tensor_t *t, int64_t off, const char *fn) {
  double v = 0;
  char err[512];
  check(L, st__tensor_get(st__lua_tensor_ctx(L), t, off, &v, fn, err, sizeof err), err);
  return v;
}

/* Nested tables of a CPU tensor's elements from dimension d on. */
static void push_list(lua_State *L, const st__tensor_t *t, int d, int64_t off) {
  const st__geom_t *g = &t->geom;
  if (d == g->ndim) {
    push_value(L, g->dtype, st_dtype_load(g->dtype, st__tensor_data(t), (size_t)off));
    return;
  }
  luaL_checkstack(L, 4, "tolist");
  lua_createtable(L, (int)g->shape[d], 0);
  for (int64_t i = 0; i < g->shape[d]; i++) {
    push_list(L, t, d + 1, off + i * g->strides[d]);
    lua_rawseti(L, -2, (int)i + 1);
  }
}

/* [-0, +1] A contiguous copy of t on `device` with `dtype`. */
static void push_copy(lua_State *L, const st__tensor_t *t, int device, st_dtype_t dtype,
                      const char *fn) {
  char err[512];
  st__tensor_t *c = st__lua_tensor_begin(L);
  int rc = st__tensor_to(st__lua_tensor_ctx(L), c, t, device, dtype, fn, err, sizeof err);
  st__lua_tensor_end(L, c, rc, err);
}

/* ------------------------------------------------------------ methods */

static int l_fill(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "fill");
  double v = check_value(L, 2, "fill");
  char err[512];
  check(L, st__tensor_fill(st__lua_tensor_ctx(L), t, v, "fill", err, sizeof err), err);
  lua_settop(L, 1);
  return 1;
}

/* t:mul_(k) and t:add_(k): in place, on the tensor's own memory (a tensor
 * argument's writes land in the client's allocation); return t. */
static int affine(lua_State *L, double mul, double add, const char *fn) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, fn);
  lua_settop(L, 1);
  char err[512];
  check(L, st__tensor_affine(st__lua_tensor_ctx(L), t, mul, add, fn, err, sizeof err), err);
  return 1;
}

static int l_mul_(lua_State *L) { return affine(L, check_value(L, 2, "mul_"), 0.0, "mul_"); }
static int l_add_(lua_State *L) { return affine(L, 1.0, check_value(L, 2, "add_"), "add_"); }

static int l_contiguous(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "contiguous");
  if (st__geom_is_contiguous(&t->geom)) lua_settop(L, 1);
  else push_copy(L, t, st__tensor_device(t), t->geom.dtype, "contiguous");
  return 1;
}

static int l_clone(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "clone");
  push_copy(L, t, st__tensor_device(t), t->geom.dtype, "clone");
  return 1;
}

/* t:to(x [, y]): x and y each a dtype or a device; a new tensor. */
static int l_to(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "to");
  int nargs = lua_gettop(L) - 1;
  if (nargs < 1 || nargs > 2)
    return st__lua_raise(L, "to: expected a dtype and/or a device, e.g. t:to(\"float16\"), "
                            "t:to(\"cuda:0\") or t:to(\"cpu\", \"float32\")");
  int device = st__tensor_device(t), have_device = 0, have_dtype = 0;
  st_dtype_t dt = t->geom.dtype;
  for (int i = 2; i <= nargs + 1; i++) {
    const char *name = st__lua_name(L, i);
    if (name && st__tensor_is_device_name(name) && !have_device) {
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
  st__tensor_t *t = st__lua_check_tensor(L, 1, "copy_");
  st__tensor_t *s = st__lua_check_tensor(L, 2, "copy_");
  char err[512];
  check(L, st__tensor_copy(st__lua_tensor_ctx(L), t, s, "copy_", err, sizeof err), err);
  lua_settop(L, 1);
  return 1;
}

static int l_get(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "get");
  if (lua_gettop(L) != 1 + t->geom.ndim)
    return st__lua_raise(L, "get: expected %d indices, got %d", t->geom.ndim, lua_gettop(L) - 1);
  push_value(L, t->geom.dtype, load_element(L, t, element_offset(L, t, 2, "get"), "get"));
  return 1;
}

static int l_set(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "set");
  if (lua_gettop(L) != 2 + t->geom.ndim)
    return st__lua_raise(L, "set: expected %d indices and a value, got %d arguments",
                         t->geom.ndim, lua_gettop(L) - 1);
  double v = check_value(L, 2 + t->geom.ndim, "set");
  int64_t off = element_offset(L, t, 2, "set");
  char err[512];
  check(L, st__tensor_set(st__lua_tensor_ctx(L), t, off, v, "set", err, sizeof err), err);
  lua_settop(L, 1);
  return 1;
}

static int l_item(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "item");
  if (st__geom_numel(&t->geom) != 1)
    return st__lua_raise(L, "item: the tensor has %lld elements, not 1",
                         (long long)st__geom_numel(&t->geom));
  push_value(L, t->geom.dtype, load_element(L, t, 0, "item"));
  return 1;
}

static int l_tolist(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "tolist");
  int64_t n = st__geom_numel(&t->geom);
  if (n > TOLIST_MAX)
    return st__lua_raise(L, "tolist: the tensor has %lld elements (at most %d)", (long long)n,
                         TOLIST_MAX);
  if (st__tensor_device(t) != ST__DEV_CPU) {   /* read on the host */
    push_copy(L, t, ST__DEV_CPU, t->geom.dtype, "tolist");   /* t, host copy */
    t = lua_touserdata(L, -1);
  }
  push_list(L, t, 0, 0);
  return 1;
}

const luaL_Reg st__lua_tensor_ops[] = {
  {"fill", l_fill}, {"contiguous", l_contiguous}, {"clone", l_clone}, {"to", l_to},
  {"copy_", l_copy_}, {"get", l_get}, {"set", l_set}, {"item", l_item},
  {"tolist", l_tolist}, {"mul_", l_mul_}, {"add_", l_add_}, {NULL, NULL}
};
