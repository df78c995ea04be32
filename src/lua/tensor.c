/* src/lua/tensor.c: the tensor userdata, its geometry methods and views
 * (docs/endpoints.md, "Tensors"); the contracts are in tensor.h.
 *
 * A tensor is the core's st__tensor_t (src/tensor/tensor.h): a view into
 * an arena with a byte offset, a dtype, a shape and strides in elements
 * (never negative). Views share the arena and each hold their own
 * reference; __gc drops it (after waiting for the worker's stream when
 * the arena is on a CUDA device). Dimensions and indices are 0-based as in
 * PyTorch; negative ones count from the end. Methods that touch element
 * data are in tensor_ops.c.
 *
 * All of it runs on the thread that owns the lua_State it is given.
 */
#include "lua/tensor.h"

#include <stdio.h>
#include <string.h>

#include "lua/scope.h"
#include "tensor/ops.h"

static char tensor_mt_key;    /* registry: metatable of tensors */

/* Full GC before an allocation once this many arena bytes were made since
 * the last one: Lua's collector does not see arena memory. */
#define GC_DEBT_LIMIT (256ull << 20)

/* ------------------------------------------------------------ userdata */

static int l_tensor_gc(lua_State *L) {
  st__tensor_release(lua_touserdata(L, 1));
  return 0;
}

st__tensor_t *st__lua_push_tensor(lua_State *L) {
  st__tensor_t *t = lua_newuserdata(L, sizeof *t);
  memset(t, 0, sizeof *t);
  lua_pushlightuserdata(L, &tensor_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* t, mt */
  lua_setmetatable(L, -2);                    /* t */
  st__lua_scope_add(L, -1);
  return t;
}

st__tensor_t *st__lua_totensor(lua_State *L, int idx) {
  void *p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return NULL;
  lua_pushlightuserdata(L, &tensor_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* mt, tensor_mt */
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return is ? p : NULL;
}

st__tensor_t *st__lua_check_tensor(lua_State *L, int idx, const char *fn) {
  st__tensor_t *t = st__lua_totensor(L, idx);
  if (!t)
    st__lua_raise(L, "%s: expected a tensor, got %s (call methods with ':')", fn,
                  luaL_typename(L, idx));
  st__lua_check_alive(L, t->arena, fn);
  return t;
}

/* ------------------------------------------------------------ new arenas */

static void gc_before_alloc(lua_State *L) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (c->gc_debt > GC_DEBT_LIMIT) {
    c->gc_debt = 0;
    lua_gc(L, LUA_GCCOLLECT, 0);
  }
}

st__tensor_t *st__lua_tensor_begin(lua_State *L) {
  st__tensor_t *t = st__lua_push_tensor(L);
  gc_before_alloc(L);
  return t;
}

void st__lua_tensor_end(lua_State *L, const st__tensor_t *t, int rc, const char *err) {
  if (rc != ST_OK) st__lua_raise(L, "%s", err);
  if (!st__lua_scope_region(t->arena)) st__lua_ctx(L)->gc_debt += st__arena_bytes(t->arena);
}

st__arena_t *st__lua_new_arena(lua_State *L, int device, uint64_t bytes) {
  char err[512];
  st__arena_t *a;
  gc_before_alloc(L);
  if (st__tensor_arena_new(st__lua_tensor_ctx(L), device, bytes, ST__INIT_ZEROS, &a, err,
                           sizeof err) != ST_OK)
    st__lua_raise(L, "%s", err);
  if (!st__lua_scope_region(a)) st__lua_ctx(L)->gc_debt += bytes;
  return a;
}

/* Raises "fn: err" unless rc is ST_OK (for the geometry's messages, which
 * name no operation); returns otherwise. */
static void check_geom(lua_State *L, int rc, const char *fn, const char *err) {
  if (rc != ST_OK) st__lua_raise(L, "%s: %s", fn, err);
}

int st__lua_device_arg(lua_State *L, int idx, const char *fn) {
  st__tensor_ctx_t *c = st__lua_tensor_ctx(L);
  if (lua_isnoneornil(L, idx)) {
    char err[512];
    if (st__tensor_device_check(c, c->device, fn, err, sizeof err) != ST_OK)
      st__lua_raise(L, "%s", err);
    return c->device;
  }
  const char *s = st__lua_name(L, idx);
  if (!s) s = st__lua_not_name(L, idx);
  int device;
  char err[512];
  if (st__tensor_device_parse(c, s, fn, &device, err, sizeof err) != ST_OK)
    st__lua_raise(L, "%s", err);
  return device;
}

/* ------------------------------------------------------------ helpers */

static int64_t check_dim(lua_State *L, const st__tensor_t *t, int idx, const char *fn) {
  int64_t d = st__lua_check_int(L, idx, fn, "dim");
  int out;
  char err[256];
  check_geom(L, st__geom_dim(&t->geom, d, &out, err, sizeof err), fn, err);
  return out;
}

static void push_shape(lua_State *L, int n, const int64_t *v) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number)v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* Reads integers from a table at idx or from the values idx..top (a
 * shape, a permutation) into v; returns how many. */
static int read_ints(lua_State *L, int idx, const char *fn, const char *what, int64_t *v) {
  int from_table = lua_type(L, idx) == LUA_TTABLE;
  int n = from_table ? (int)lua_objlen(L, idx) : lua_gettop(L) - idx + 1;
  if (n > ST_MAX_NDIM) st__lua_raise(L, "%s: at most %d dimensions", fn, ST_MAX_NDIM);
  for (int i = 0; i < n; i++) {
    if (from_table) lua_rawgeti(L, idx, i + 1);
    else lua_pushvalue(L, idx + i);
    v[i] = st__lua_check_int(L, -1, fn, what);
    lua_pop(L, 1);
  }
  return n;
}

/* ------------------------------------------------------------ views */

/* A view made by `make` from integers read at index 2 on (a table or
 * the remaining arguments): view's sizes, permute's dims. */
typedef int (*ints_view_fn)(st__tensor_t *out, const st__tensor_t *t, int n, const int64_t *v,
                            char *err, size_t errlen);

static int view_of_ints(lua_State *L, const char *fn, const char *what, ints_view_fn make) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, fn);
  int64_t v[ST_MAX_NDIM];
  int n = read_ints(L, 2, fn, what, v);
  char err[256];
  st__tensor_t *out = st__lua_push_tensor(L);
  check_geom(L, make(out, t, n, v, err, sizeof err), fn, err);
  return 1;
}

static int l_view(lua_State *L) { return view_of_ints(L, "view", "size", st__tensor_view); }

static int l_reshape(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "reshape");
  int64_t shape[ST_MAX_NDIM];
  int n = read_ints(L, 2, "reshape", "size", shape);
  char err[512];
  if (st__geom_is_contiguous(&t->geom)) {
    st__tensor_t *v = st__lua_push_tensor(L);
    check_geom(L, st__tensor_view(v, t, n, shape, err, sizeof err), "reshape", err);
    return 1;
  }
  st__geom_t g = t->geom;                     /* the sizes first: no arena for a bad shape */
  st__geom_set_contiguous(&g);
  check_geom(L, st__geom_view(&g, n, shape, err, sizeof err), "reshape", err);
  st__tensor_t *c = st__lua_tensor_begin(L);
  int rc = st__tensor_reshape(st__lua_tensor_ctx(L), c, t, n, shape, "reshape", err, sizeof err);
  st__lua_tensor_end(L, c, rc, err);
  return 1;
}

static int l_narrow(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "narrow");
  int64_t d = check_dim(L, t, 2, "narrow");
  int64_t start = st__lua_check_int(L, 3, "narrow", "start");
  int64_t length = st__lua_check_int(L, 4, "narrow", "length");
  char err[256];
  st__tensor_t *v = st__lua_push_tensor(L);
  check_geom(L, st__tensor_narrow(v, t, d, start, length, err, sizeof err), "narrow",
                     err);
  return 1;
}

static int l_slice(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "slice");
  int64_t d = check_dim(L, t, 2, "slice");
  int64_t start = lua_isnoneornil(L, 3) ? 0 : st__lua_check_int(L, 3, "slice", "start");
  int64_t stop = lua_isnoneornil(L, 4) ? t->geom.shape[d]
                                       : st__lua_check_int(L, 4, "slice", "stop");
  int64_t step = lua_isnoneornil(L, 5) ? 1 : st__lua_check_int(L, 5, "slice", "step");
  char err[256];
  st__tensor_t *v = st__lua_push_tensor(L);
  check_geom(L, st__tensor_slice(v, t, d, start, stop, step, err, sizeof err), "slice",
                     err);
  return 1;
}

/* t:transpose(d0, d1): the two dimensions swapped (a view). */
static int l_transpose(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "transpose");
  int64_t d0 = st__lua_check_int(L, 2, "transpose", "dim");
  int64_t d1 = st__lua_check_int(L, 3, "transpose", "dim");
  char err[256];
  st__tensor_t *v = st__lua_push_tensor(L);
  check_geom(L, st__tensor_transpose(v, t, d0, d1, err, sizeof err), "transpose", err);
  return 1;
}

/* t:permute(d0, d1, ...) or t:permute{d0, d1, ...}: new dimension i is
 * old dimension di (a view). */
static int l_permute(lua_State *L) { return view_of_ints(L, "permute", "dim", st__tensor_permute); }

/* ------------------------------------------------------------ geometry */

static int l_dtype(lua_State *L) {
  lua_pushstring(L, st_dtype_name(st__lua_check_tensor(L, 1, "dtype")->geom.dtype));
  return 1;
}

static int l_device(lua_State *L) {
  char name[16];
  lua_pushstring(L, st__tensor_device_name(st__tensor_device(st__lua_check_tensor(L, 1, "device")),
                                           name, sizeof name));
  return 1;
}

/* shape() -> table; shape(dim) -> size of dim. */
static int l_shape(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "shape");
  if (lua_isnoneornil(L, 2)) push_shape(L, t->geom.ndim, t->geom.shape);
  else lua_pushnumber(L, (lua_Number)t->geom.shape[check_dim(L, t, 2, "shape")]);
  return 1;
}

static int l_stride(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "stride");
  if (lua_isnoneornil(L, 2)) push_shape(L, t->geom.ndim, t->geom.strides);
  else lua_pushnumber(L, (lua_Number)t->geom.strides[check_dim(L, t, 2, "stride")]);
  return 1;
}

static int l_numel(lua_State *L) {
  lua_pushnumber(L, (lua_Number)st__geom_numel(&st__lua_check_tensor(L, 1, "numel")->geom));
  return 1;
}

static int l_nbytes(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "nbytes");
  lua_pushnumber(L, (lua_Number)st__geom_nbytes(&t->geom));
  return 1;
}

static int l_dim(lua_State *L) {
  lua_pushinteger(L, st__lua_check_tensor(L, 1, "dim")->geom.ndim);
  return 1;
}

static int l_is_contiguous(lua_State *L) {
  lua_pushboolean(L, st__geom_is_contiguous(&st__lua_check_tensor(L, 1, "is_contiguous")->geom));
  return 1;
}

static int l_tostring(lua_State *L) {
  st__tensor_t *t = lua_touserdata(L, 1);
  char buf[512];
  size_t n = (size_t)snprintf(buf, sizeof buf, "tensor(%s, {", st_dtype_name(t->geom.dtype));
  for (int i = 0; i < t->geom.ndim && n < sizeof buf; i++)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%lld", i ? "," : "",
                          (long long)t->geom.shape[i]);
  char dev[16];
  if (n < sizeof buf)
    snprintf(buf + n, sizeof buf - n, "}, %s)",
             st__tensor_device_name(t->arena ? st__tensor_device(t) : ST__DEV_CPU, dev,
                                    sizeof dev));
  lua_pushstring(L, buf);
  return 1;
}

static int l_len(lua_State *L) {
  st__tensor_t *t = st__lua_check_tensor(L, 1, "len");
  if (t->geom.ndim == 0) return st__lua_raise(L, "len() of a 0-d tensor");
  lua_pushnumber(L, (lua_Number)t->geom.shape[0]);
  return 1;
}

void st__lua_open_tensor(lua_State *L, const luaL_Reg *ops) {
  static const luaL_Reg methods[] = {
    {"reshape", l_reshape}, {"view", l_view}, {"narrow", l_narrow}, {"slice", l_slice},
    {"transpose", l_transpose}, {"permute", l_permute}, {"dtype", l_dtype},
    {"device", l_device}, {"shape", l_shape}, {"size", l_shape}, {"stride", l_stride},
    {"numel", l_numel}, {"nbytes", l_nbytes}, {"dim", l_dim},
    {"is_contiguous", l_is_contiguous}, {NULL, NULL}
  };
  static const luaL_Reg meta[] = {
    {"__gc", l_tensor_gc}, {"__tostring", l_tostring}, {"__len", l_len}, {NULL, NULL}
  };
  st__lua_register_class(L, &tensor_mt_key, meta, methods, ops);
}
