/* src/lua: tensor constructors (docs/endpoints.md, "Creating tensors"),
 * bindings of the core's (src/tensor/constructors.h).
 *
 *   st.empty{2, 3, dtype = "float32", device = "cpu"}   or  st.empty{shape = {2, 3}}
 *   st.zeros{...}  st.ones{...}  st.full{..., value = 1.5}
 *   st.arange{n}  st.arange{start, stop[, step]}  st.arange{start =, stop =, step =}
 *   st.rand{..., seed = 0}  st.randn{..., seed = 0}
 *
 * Each constructor makes a new arena on its device: `device` names one
 * ("cpu", "cuda", "cuda:N"), else the call's default. This file reads the
 * option table; the core checks the values, makes the tensor and fills it
 * (on a CUDA device with the kernels of src/cuda, which store the bytes
 * the CPU loops store). Unknown options raise (a typo must not silently
 * build the wrong tensor). rand/randn are counter-based (Philox4x32-10,
 * key = seed, counter = row-major element index), so the same seed gives
 * the same bytes on every host and every backend.
 *
 * All of it runs on the thread that owns the lua_State it is given.
 */
#include "lua/construct.h"

#include <string.h>

#include "lua/tensor.h"
#include "tensor/constructors.h"

typedef struct spec {
  const char *fn;
  st_dtype_t dtype;             /* INVALID: not given */
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  int npos;                     /* positional numbers (shape or arange bounds) */
  double pos[3];
  int has_value, has_seed;
  double value;
  uint64_t seed;
  int has_start, has_stop, has_step;
  double start, stop, step;
  int device;                   /* ST__DEV_CPU or a CUDA ordinal */
} spec_t;

#define OPT_VALUE 1
#define OPT_SEED  2
#define OPT_RANGE 4

static double check_number(lua_State *L, int idx, const char *fn, const char *what) {
  if (lua_type(L, idx) != LUA_TNUMBER)
    st__lua_raise(L, "%s: %s must be a number, got %s", fn, what, luaL_typename(L, idx));
  return lua_tonumber(L, idx);
}

static void read_shape_table(lua_State *L, int idx, spec_t *s) {
  int n = (int)lua_objlen(L, idx);
  if (n > ST_MAX_NDIM) st__lua_raise(L, "%s: at most %d dimensions", s->fn, ST_MAX_NDIM);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, idx, i + 1);
    s->shape[i] = st__lua_check_int(L, -1, s->fn, "size");
    if (s->shape[i] < 0) st__lua_raise(L, "%s: size %lld is negative", s->fn, (long long)s->shape[i]);
    lua_pop(L, 1);
  }
  s->ndim = n;
}

/* Reads the option table at index 1. `opts` says which of value, seed and
 * start/stop/step are accepted; positional numbers are the shape unless
 * OPT_RANGE (then they are arange's bounds). */
static void parse_spec(lua_State *L, const char *fn, int opts, spec_t *s) {
  memset(s, 0, sizeof *s);
  s->fn = fn;
  s->device = st__lua_tensor_ctx(L)->device;
  if (lua_type(L, 1) != LUA_TTABLE || lua_gettop(L) != 1)
    st__lua_raise(L, "%s: expected one table, e.g. st.%s{2, 3, dtype = \"float32\"}", fn, fn);
  int n = (int)lua_objlen(L, 1);
  int has_shape = 0;
  lua_pushnil(L);
  while (lua_next(L, 1)) {                    /* tbl, key, value */
    if (lua_type(L, -2) == LUA_TNUMBER) {
      int64_t k;
      if (!st__lua_num_to_int(lua_tonumber(L, -2), &k) || k < 1 || k > n)
        st__lua_raise(L, "%s: positional sizes must form an array", fn);
    } else if (!st__lua_name(L, -2)) {
      st__lua_raise(L, "%s: option names must be strings without NUL bytes", fn);
    } else {
      const char *k = lua_tostring(L, -2);
      if (strcmp(k, "dtype") == 0) {
        const char *d = st__lua_name(L, -1);
        s->dtype = d ? st_dtype_from_name(d) : ST_DTYPE_INVALID;
        if (s->dtype == ST_DTYPE_INVALID)
          st__lua_raise(L, "%s: unknown dtype '%s'", fn, d ? d : st__lua_not_name(L, -1));
      } else if (strcmp(k, "device") == 0) {
        s->device = st__lua_device_arg(L, lua_gettop(L), fn);
      } else if (strcmp(k, "shape") == 0 && !(opts & OPT_RANGE)) {
        if (lua_type(L, -1) != LUA_TTABLE) st__lua_raise(L, "%s: shape must be a table", fn);
        read_shape_table(L, lua_gettop(L), s);
        has_shape = 1;
      } else if (strcmp(k, "value") == 0 && (opts & OPT_VALUE)) {
        if (lua_type(L, -1) == LUA_TBOOLEAN) s->value = lua_toboolean(L, -1);
        else s->value = check_number(L, -1, fn, "value");
        s->has_value = 1;
      } else if (strcmp(k, "seed") == 0 && (opts & OPT_SEED)) {
        int64_t seed = st__lua_check_int(L, -1, fn, "seed");
        if (seed < 0) st__lua_raise(L, "%s: seed must be >= 0", fn);
        s->seed = (uint64_t)seed;
        s->has_seed = 1;
      } else if (strcmp(k, "start") == 0 && (opts & OPT_RANGE)) {
        s->start = check_number(L, -1, fn, "start");
        s->has_start = 1;
      } else if (strcmp(k, "stop") == 0 && (opts & OPT_RANGE)) {
        s->stop = check_number(L, -1, fn, "stop");
        s->has_stop = 1;
      } else if (strcmp(k, "step") == 0 && (opts & OPT_RANGE)) {
        s->step = check_number(L, -1, fn, "step");
        s->has_step = 1;
      } else {
        st__lua_raise(L, "%s: unknown option '%s'", fn, k);
      }
    }
    lua_pop(L, 1);                            /* tbl, key */
  }
  if (opts & OPT_RANGE) {
    if (n > 3) st__lua_raise(L, "%s: at most 3 positional values (start, stop, step)", fn);
    for (int i = 0; i < n; i++) {
      lua_rawgeti(L, 1, i + 1);
      s->pos[i] = check_number(L, -1, fn, "bound");
      lua_pop(L, 1);
    }
    s->npos = n;
  } else if (n > 0) {
    if (has_shape) st__lua_raise(L, "%s: give the sizes or shape = {...}, not both", fn);
    read_shape_table(L, 1, s);
  }
  if (s->dtype == ST_DTYPE_INVALID && !(opts & OPT_RANGE)) s->dtype = ST_DTYPE_FLOAT32;
}

/* A core constructor of a shaped tensor (tensor/constructors.h). */
typedef int (*shaped_fn)(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                         int ndim, const int64_t *shape, char *err, size_t errlen);

/* [-0, +1] Pushes what `make` builds for the spec at index 1. */
static int build_shaped(lua_State *L, const char *fn, shaped_fn make) {
  spec_t s;
  parse_spec(L, fn, 0, &s);
  char err[512];
  st__tensor_t *t = st__lua_tensor_begin(L);
  int rc = make(st__lua_tensor_ctx(L), t, s.device, s.dtype, s.ndim, s.shape, err, sizeof err);
  st__lua_tensor_end(L, t, rc, err);
  return 1;
}

static int l_empty(lua_State *L) { return build_shaped(L, "empty", st__tensor_empty); }
static int l_zeros(lua_State *L) { return build_shaped(L, "zeros", st__tensor_zeros); }
static int l_ones(lua_State *L) { return build_shaped(L, "ones", st__tensor_ones); }

static int l_full(lua_State *L) {
  spec_t s;
  parse_spec(L, "full", OPT_VALUE, &s);
  if (!s.has_value) return st__lua_raise(L, "full: value is required: st.full{2, 3, value = 1.5}");
  char err[512];
  st__tensor_t *t = st__lua_tensor_begin(L);
  int rc = st__tensor_full(st__lua_tensor_ctx(L), t, s.device, s.dtype, s.ndim, s.shape, s.value,
                           err, sizeof err);
  st__lua_tensor_end(L, t, rc, err);
  return 1;
}

static int l_arange(lua_State *L) {
  spec_t s;
  parse_spec(L, "arange", OPT_RANGE, &s);
  double start = 0, stop, step = 1;
  if (s.npos && (s.has_start || s.has_stop || s.has_step))
    return st__lua_raise(L, "arange: give positional bounds or start/stop/step, not both");
  if (s.npos == 1) {
    stop = s.pos[0];
  } else if (s.npos >= 2) {
    start = s.pos[0];
    stop = s.pos[1];
    if (s.npos == 3) step = s.pos[2];
  } else {
    if (!s.has_stop) return st__lua_raise(L, "arange: stop is required: st.arange{10}");
    stop = s.stop;
    if (s.has_start) start = s.start;
    if (s.has_step) step = s.step;
  }
  char err[512];
  st__tensor_t *t = st__lua_tensor_begin(L);
  int rc = st__tensor_arange(st__lua_tensor_ctx(L), t, s.device, s.dtype, start, stop, step, err,
                             sizeof err);
  st__lua_tensor_end(L, t, rc, err);
  return 1;
}

/* A core constructor of random values (tensor/constructors.h). */
typedef int (*random_fn)(st__tensor_ctx_t *c, st__tensor_t *out, int device, st_dtype_t dtype,
                         int ndim, const int64_t *shape, uint64_t seed, char *err, size_t errlen);

static int build_random(lua_State *L, const char *fn, random_fn make) {
  spec_t s;
  parse_spec(L, fn, OPT_SEED, &s);
  char err[512];
  st__tensor_t *t = st__lua_tensor_begin(L);
  int rc = make(st__lua_tensor_ctx(L), t, s.device, s.dtype, s.ndim, s.shape, s.seed, err,
                sizeof err);
  st__lua_tensor_end(L, t, rc, err);
  return 1;
}

static int l_rand(lua_State *L) { return build_random(L, "rand", st__tensor_rand); }
static int l_randn(lua_State *L) { return build_random(L, "randn", st__tensor_randn); }

void st__lua_open_construct(lua_State *L, int idx) {
  static const luaL_Reg funcs[] = {
    {"empty", l_empty}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full},
    {"arange", l_arange}, {"rand", l_rand}, {"randn", l_randn}, {NULL, NULL}
  };
  st__lua_set_funcs(L, idx, funcs);
}
