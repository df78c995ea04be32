/* src/lua: tensor userdata (docs/endpoints.md, "Tensors").
 *
 * A tensor is a view into an arena: a reference on the arena, a byte
 * offset to element 0, a dtype, a shape and strides in elements (never
 * negative: the wire has no negative strides). Views share the arena and
 * each hold their own reference; __gc drops it (after waiting for the
 * worker's stream when the arena is on a CUDA device). Dimensions and
 * indices are 0-based as in PyTorch; negative ones count from the end.
 * This file holds geometry and views; methods that touch element data are
 * in tensor_ops.c, device handling in device.c.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in lua_int.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/lua_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char tensor_mt_key;    /* registry: metatable of tensors */

/* Full GC before an allocation once this many arena bytes were made since
 * the last one: Lua's collector does not see arena memory. */
#define GC_DEBT_LIMIT (256ull << 20)

/* ------------------------------------------------------------ numbers */

int st__lua_num_to_int(double d, int64_t *out) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return 0;
  if (floor(d) != d) return 0;
  *out = (int64_t)d;
  return 1;
}

int64_t st__lua_check_int(lua_State *L, int idx, const char *fn, const char *what) {
  int64_t v;
  if (lua_type(L, idx) != LUA_TNUMBER || !st__lua_num_to_int(lua_tonumber(L, idx), &v))
    st__lua_raise(L, "%s: %s must be an integer, got %s", fn, what,
                  lua_type(L, idx) == LUA_TNUMBER ? "a fraction" : luaL_typename(L, idx));
  return v;
}

/* ------------------------------------------------------------ geometry */

int64_t st__ltensor_numel(const st__ltensor_t *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

int st__ltensor_is_contiguous(const st__ltensor_t *t) {
  int64_t expect = 1;
  if (st__ltensor_numel(t) == 0) return 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != expect) return 0;
    expect *= t->shape[i];
  }
  return 1;
}

void st__ltensor_set_contiguous(st__ltensor_t *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->strides[i] = s;
    s *= t->shape[i] ? t->shape[i] : 1;
  }
}

char *st__ltensor_data(const st__ltensor_t *t) {
  return (char *)st__arena_base(t->arena) + t->offset;
}

/* Copies element by element over `shape`, row-major. Same dtypes copy
 * bytes (exact for int64 and NaN payloads); different dtypes go through
 * st_dtype_load/store (a double). Contiguous rows are one memcpy. */
static void strided_copy(char *dbase, st_dtype_t dd, const int64_t *dstr,
                         const char *sbase, st_dtype_t sd, const int64_t *sstr,
                         int ndim, const int64_t *shape) {
  size_t des = st_dtype_size(dd), ses = st_dtype_size(sd);
  int64_t idx[ST_MAX_NDIM] = {0};
  for (int i = 0; i < ndim; i++)
    if (shape[i] == 0) return;
  int inner = ndim - 1;
  int64_t rows = 1;
  for (int i = 0; i < inner; i++) rows *= shape[i];
  int64_t len = ndim ? shape[inner] : 1;
  int64_t ds = ndim ? dstr[inner] : 0, ss = ndim ? sstr[inner] : 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t doff = 0, soff = 0;
    for (int i = 0; i < inner; i++) {
      doff += idx[i] * dstr[i];
      soff += idx[i] * sstr[i];
    }
    if (dd == sd && ds == 1 && ss == 1) {
      memcpy(dbase + doff * (int64_t)des, sbase + soff * (int64_t)ses, (size_t)len * des);
    } else if (dd == sd) {
      for (int64_t j = 0; j < len; j++)
        memcpy(dbase + (doff + j * ds) * (int64_t)des, sbase + (soff + j * ss) * (int64_t)ses, des);
    } else {
      for (int64_t j = 0; j < len; j++)
        st_dtype_store(dd, dbase, (size_t)(doff + j * ds),
                       st_dtype_load(sd, sbase, (size_t)(soff + j * ss)));
    }
    for (int i = inner - 1; i >= 0; i--) {    /* odometer over outer dims */
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}

void st__ltensor_copy(const st__ltensor_t *dst, const st__ltensor_t *src) {
  strided_copy(st__ltensor_data(dst), dst->dtype, dst->strides, st__ltensor_data(src),
               src->dtype, src->strides, dst->ndim, dst->shape);
}

void st__ltensor_fill_cpu(const st__ltensor_t *t, double v) {
  unsigned char pat[8];
  st_dtype_store(t->dtype, pat, 0, v);
  int64_t zero[ST_MAX_NDIM] = {0};
  size_t es = st_dtype_size(t->dtype);
  int64_t n = st__ltensor_numel(t);
  if (st__ltensor_is_contiguous(t) && n > 0) {
    char *d = st__ltensor_data(t);            /* doubling copies of the pattern */
    memcpy(d, pat, es);
    size_t have = es, total = (size_t)n * es;
    while (have < total) {
      size_t k = have < total - have ? have : total - have;
      memcpy(d + have, d, k);
      have += k;
    }
  } else {
    strided_copy(st__ltensor_data(t), t->dtype, t->strides, (char *)pat, t->dtype, zero,
                 t->ndim, t->shape);
  }
}

void st__ltensor_affine_cpu(const st__ltensor_t *t, double mul, double add) {
  int64_t idx[ST_MAX_NDIM] = {0};
  int64_t n = st__ltensor_numel(t);
  char *base = st__ltensor_data(t);
  for (int64_t k = 0; k < n; k++) {
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) off += idx[i] * t->strides[i];
    volatile double prod = st_dtype_load(t->dtype, base, (size_t)off) * mul;  /* no FMA */
    st_dtype_store(t->dtype, base, (size_t)off, prod + add);
    for (int i = t->ndim - 1; i >= 0; i--) {   /* odometer */
      if (++idx[i] < t->shape[i]) break;
      idx[i] = 0;
    }
  }
}

void st__ltensor_pack(void *dst_base, const st__ltensor_t *t) {
  st__ltensor_t c = *t;
  st__ltensor_set_contiguous(&c);
  strided_copy(dst_base, t->dtype, c.strides, st__ltensor_data(t), t->dtype, t->strides,
               t->ndim, t->shape);
}

/* ------------------------------------------------------------ userdata */

st__arena_t *st__lua_new_arena_on(lua_State *L, int device, uint64_t bytes) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (device != ST__DEV_CPU) st__lua_device_check(L, device, "tensor");
  if (c->gc_debt > GC_DEBT_LIMIT) {
    c->gc_debt = 0;
    lua_gc(L, LUA_GCCOLLECT, 0);
  }
  st__arena_t *a;
  char err[256];
  int rc = device == ST__DEV_CPU ? st__arena_new_cpu(bytes, &a, err, sizeof err)
           : c->cuda_legacy     ? st__arena_new_cuda_legacy(device, bytes, &a, err, sizeof err)
                                : st__arena_new_cuda(device, bytes, &a, err, sizeof err);
  if (rc != ST_OK) {
    c->alloc_err = rc;
    snprintf(c->alloc_msg, sizeof c->alloc_msg, "%s", err);
    st__lua_raise(L, "%s", err);
  }
  c->gc_debt += bytes;
  return a;
}

st__arena_t *st__lua_new_arena(lua_State *L, uint64_t bytes) {
  return st__lua_new_arena_on(L, ST__DEV_CPU, bytes);
}

void st__lua_arena_release(st__arena_t *a) {
  if (!a) return;
  int dev = st__arena_device(a);
  if (dev >= 0) st__lua_cuda_quiesce(dev);
  st__arena_unref(a);
}

int st__ltensor_device(const st__ltensor_t *t) {
  return st__arena_device(t->arena);
}

static int l_tensor_gc(lua_State *L) {
  st__ltensor_t *t = lua_touserdata(L, 1);
  st__lua_arena_release(t->arena);
  t->arena = NULL;
  return 0;
}

st__ltensor_t *st__lua_push_tensor(lua_State *L) {
  st__ltensor_t *t = lua_newuserdata(L, sizeof *t);
  memset(t, 0, sizeof *t);
  lua_pushlightuserdata(L, &tensor_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* t, mt */
  lua_setmetatable(L, -2);                    /* t */
  return t;
}

st__ltensor_t *st__lua_totensor(lua_State *L, int idx) {
  void *p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return NULL;
  lua_pushlightuserdata(L, &tensor_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* mt, tensor_mt */
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return is ? p : NULL;
}

st__ltensor_t *st__lua_check_tensor(lua_State *L, int idx, const char *fn) {
  st__ltensor_t *t = st__lua_totensor(L, idx);
  if (!t || !t->arena)
    st__lua_raise(L, "%s: expected a tensor, got %s (call methods with ':')", fn,
                  luaL_typename(L, idx));
  return t;
}

st__ltensor_t *st__lua_new_tensor_on(lua_State *L, int device, st_dtype_t dtype, int ndim,
                                     const int64_t *shape) {
  if (ndim < 0 || ndim > ST_MAX_NDIM)
    st__lua_raise(L, "a tensor has at most %d dimensions, got %d", ST_MAX_NDIM, ndim);
  uint64_t n = 1;
  const uint64_t max = 1ull << 62;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) st__lua_raise(L, "size %lld of dim %d is negative", (long long)shape[i], i);
    if (shape[i] && n > max / (uint64_t)shape[i]) st__lua_raise(L, "tensor shape is too large");
    n *= (uint64_t)shape[i];
  }
  size_t es = st_dtype_size(dtype);
  if (n > max / es) st__lua_raise(L, "tensor shape is too large");
  st__ltensor_t *t = st__lua_push_tensor(L);
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  st__ltensor_set_contiguous(t);
  t->arena = st__lua_new_arena_on(L, device, n * es);
  return t;
}

st__ltensor_t *st__lua_new_tensor(lua_State *L, st_dtype_t dtype, int ndim,
                                  const int64_t *shape) {
  return st__lua_new_tensor_on(L, st__lua_ctx(L)->device, dtype, ndim, shape);
}

st__ltensor_t *st__lua_push_view(lua_State *L, const st__ltensor_t *t, uint64_t offset,
                                 int ndim, const int64_t *shape, const int64_t *strides) {
  st__ltensor_t *v = st__lua_push_tensor(L);
  v->dtype = t->dtype;
  v->offset = offset;
  v->ndim = ndim;
  memcpy(v->shape, shape, (size_t)ndim * sizeof *shape);
  memcpy(v->strides, strides, (size_t)ndim * sizeof *strides);
  st__arena_ref(t->arena);
  v->arena = t->arena;
  return v;
}

/* ------------------------------------------------------------ helpers */

static int check_dim(lua_State *L, const st__ltensor_t *t, int idx, const char *fn) {
  int64_t d = st__lua_check_int(L, idx, fn, "dim");
  int64_t n = t->ndim;
  if (d < -n || d >= n || n == 0)
    st__lua_raise(L, "%s: dim %lld is out of range for a tensor of %d dims", fn, (long long)d,
                  t->ndim);
  return (int)(d < 0 ? d + n : d);
}

static void push_shape(lua_State *L, int n, const int64_t *v) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number)v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/* Reads a shape from a table at idx or from the numbers idx..top, with one
 * -1 inferred from numel. */
static int parse_new_shape(lua_State *L, int idx, const char *fn, int64_t numel, int64_t *shape) {
  int n, from_table = lua_type(L, idx) == LUA_TTABLE;
  n = from_table ? (int)lua_objlen(L, idx) : lua_gettop(L) - idx + 1;
  if (n > ST_MAX_NDIM) st__lua_raise(L, "%s: at most %d dimensions", fn, ST_MAX_NDIM);
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < n; i++) {
    if (from_table) lua_rawgeti(L, idx, i + 1);
    else lua_pushvalue(L, idx + i);
    shape[i] = st__lua_check_int(L, -1, fn, "size");
    lua_pop(L, 1);
    if (shape[i] == -1) {
      if (infer >= 0) st__lua_raise(L, "%s: only one size may be -1", fn);
      infer = i;
    } else if (shape[i] < 0) {
      st__lua_raise(L, "%s: invalid size %lld", fn, (long long)shape[i]);
    } else {
      if (shape[i] > 0 && known > ((int64_t)1 << 62) / shape[i])
        st__lua_raise(L, "%s: shape is too large", fn);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known)
      st__lua_raise(L, "%s: cannot infer size -1 for %lld elements", fn, (long long)numel);
    shape[infer] = numel / known;
    known = numel;
  }
  if (known != numel)
    st__lua_raise(L, "%s: shape of %lld elements does not fit a tensor of %lld elements", fn,
                  (long long)known, (long long)numel);
  return n;
}

/* ------------------------------------------------------------ methods */

static int l_view(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "view");
  if (!st__ltensor_is_contiguous(t))
    return st__lua_raise(L, "view: the tensor is not contiguous (use reshape, which copies)");
  int64_t shape[ST_MAX_NDIM], strides[ST_MAX_NDIM];
  int n = parse_new_shape(L, 2, "view", st__ltensor_numel(t), shape);
  st__ltensor_t tmp = {.ndim = n};
  memcpy(tmp.shape, shape, sizeof shape);
  st__ltensor_set_contiguous(&tmp);
  memcpy(strides, tmp.strides, sizeof strides);
  st__lua_push_view(L, t, t->offset, n, shape, strides);
  return 1;
}

static int l_reshape(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "reshape");
  int64_t shape[ST_MAX_NDIM];
  int n = parse_new_shape(L, 2, "reshape", st__ltensor_numel(t), shape);
  st__ltensor_t tmp = {.ndim = n};
  memcpy(tmp.shape, shape, sizeof shape);
  st__ltensor_set_contiguous(&tmp);
  if (st__ltensor_is_contiguous(t)) {
    st__lua_push_view(L, t, t->offset, n, shape, tmp.strides);
    return 1;
  }
  st__ltensor_t *c = st__lua_new_tensor_on(L, st__ltensor_device(t), t->dtype, t->ndim,
                                           t->shape);   /* ..., copy */
  st__lua_tensor_copy(L, c, t, "reshape");
  c->ndim = n;
  memcpy(c->shape, shape, sizeof shape);
  memcpy(c->strides, tmp.strides, sizeof tmp.strides);
  return 1;
}

static int l_narrow(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "narrow");
  int d = check_dim(L, t, 2, "narrow");
  int64_t start = st__lua_check_int(L, 3, "narrow", "start");
  int64_t length = st__lua_check_int(L, 4, "narrow", "length");
  int64_t size = t->shape[d];
  if (start < 0) start += size;
  if (start < 0 || start > size)
    return st__lua_raise(L, "narrow: start %lld is out of range for dim %d of size %lld",
                         (long long)lua_tonumber(L, 3), d, (long long)size);
  if (length < 0) return st__lua_raise(L, "narrow: length %lld is negative", (long long)length);
  if (start + length > size)
    return st__lua_raise(L, "narrow: start %lld + length %lld exceeds size %lld of dim %d",
                         (long long)start, (long long)length, (long long)size, d);
  int64_t shape[ST_MAX_NDIM];
  memcpy(shape, t->shape, sizeof shape);
  shape[d] = length;
  uint64_t off = t->offset + (uint64_t)(start * t->strides[d]) * st_dtype_size(t->dtype);
  st__lua_push_view(L, t, off, t->ndim, shape, t->strides);
  return 1;
}

static int l_slice(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "slice");
  int d = check_dim(L, t, 2, "slice");
  int64_t size = t->shape[d];
  int64_t start = lua_isnoneornil(L, 3) ? 0 : st__lua_check_int(L, 3, "slice", "start");
  int64_t stop = lua_isnoneornil(L, 4) ? size : st__lua_check_int(L, 4, "slice", "stop");
  int64_t step = lua_isnoneornil(L, 5) ? 1 : st__lua_check_int(L, 5, "slice", "step");
  if (step <= 0) return st__lua_raise(L, "slice: step must be positive, got %lld", (long long)step);
  if (start < 0) start += size;
  if (stop < 0) stop += size;
  start = start < 0 ? 0 : start > size ? size : start;
  stop = stop < start ? start : stop > size ? size : stop;
  int64_t shape[ST_MAX_NDIM], strides[ST_MAX_NDIM];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[d] = (stop - start + step - 1) / step;
  strides[d] = t->strides[d] * step;
  uint64_t off = t->offset + (uint64_t)(start * t->strides[d]) * st_dtype_size(t->dtype);
  st__lua_push_view(L, t, off, t->ndim, shape, strides);
  return 1;
}

static int l_dtype(lua_State *L) {
  lua_pushstring(L, st_dtype_name(st__lua_check_tensor(L, 1, "dtype")->dtype));
  return 1;
}

static int l_device(lua_State *L) {
  char name[16];
  lua_pushstring(L, st__lua_device_name(st__ltensor_device(st__lua_check_tensor(L, 1, "device")),
                                        name, sizeof name));
  return 1;
}

/* shape() -> table; shape(dim) -> size of dim. */
static int l_shape(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "shape");
  if (lua_isnoneornil(L, 2)) push_shape(L, t->ndim, t->shape);
  else lua_pushnumber(L, (lua_Number)t->shape[check_dim(L, t, 2, "shape")]);
  return 1;
}

static int l_stride(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "stride");
  if (lua_isnoneornil(L, 2)) push_shape(L, t->ndim, t->strides);
  else lua_pushnumber(L, (lua_Number)t->strides[check_dim(L, t, 2, "stride")]);
  return 1;
}

static int l_numel(lua_State *L) {
  lua_pushnumber(L, (lua_Number)st__ltensor_numel(st__lua_check_tensor(L, 1, "numel")));
  return 1;
}

static int l_nbytes(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "nbytes");
  lua_pushnumber(L, (lua_Number)st__ltensor_numel(t) * (lua_Number)st_dtype_size(t->dtype));
  return 1;
}

static int l_dim(lua_State *L) {
  lua_pushinteger(L, st__lua_check_tensor(L, 1, "dim")->ndim);
  return 1;
}

static int l_is_contiguous(lua_State *L) {
  lua_pushboolean(L, st__ltensor_is_contiguous(st__lua_check_tensor(L, 1, "is_contiguous")));
  return 1;
}

static int l_tostring(lua_State *L) {
  st__ltensor_t *t = lua_touserdata(L, 1);
  char buf[512];
  size_t n = (size_t)snprintf(buf, sizeof buf, "tensor(%s, {", st_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && n < sizeof buf; i++)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%lld", i ? "," : "", (long long)t->shape[i]);
  char dev[16];
  if (n < sizeof buf)
    snprintf(buf + n, sizeof buf - n, "}, %s)",
             st__lua_device_name(t->arena ? st__ltensor_device(t) : ST__DEV_CPU, dev, sizeof dev));
  lua_pushstring(L, buf);
  return 1;
}

static int l_len(lua_State *L) {
  st__ltensor_t *t = st__lua_check_tensor(L, 1, "len");
  if (t->ndim == 0) return st__lua_raise(L, "len() of a 0-d tensor");
  lua_pushnumber(L, (lua_Number)t->shape[0]);
  return 1;
}

void st__lua_open_tensor(lua_State *L) {
  static const luaL_Reg methods[] = {
    {"reshape", l_reshape}, {"view", l_view}, {"narrow", l_narrow},
    {"slice", l_slice}, {"dtype", l_dtype}, {"device", l_device}, {"shape", l_shape},
    {"size", l_shape}, {"stride", l_stride}, {"numel", l_numel}, {"nbytes", l_nbytes},
    {"dim", l_dim}, {"is_contiguous", l_is_contiguous}, {NULL, NULL}
  };
  lua_pushlightuserdata(L, &tensor_mt_key);
  lua_createtable(L, 0, 6);                   /* key, mt */
  lua_createtable(L, 0, 24);                  /* key, mt, methods */
  for (const luaL_Reg *r = methods; r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, -2, r->name);
  }
  st__lua_open_tensor_ops(L, lua_gettop(L));
  lua_setfield(L, -2, "__index");             /* key, mt */
  lua_pushcfunction(L, l_tensor_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, l_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushcfunction(L, l_len);
  lua_setfield(L, -2, "__len");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_rawset(L, LUA_REGISTRYINDEX);           /* (empty) */
}
