/* src/lua: st.load_safetensors, a checkpoint as a module in one arena
 * (docs/endpoints.md, "Loading safetensors"; src/mem/safetensors.h).
 *
 *   st.load_safetensors(path [, { dtype = "float16", device = "cuda:0" }])
 *
 * `path` is a .safetensors file, a directory holding
 * model.safetensors.index.json, or that index; it must resolve inside one
 * of the config's data_dirs (a relative path is looked up in each). The
 * result is the same kind of userdata st.module returns: names in the
 * file's order (the weight_map's for shards), m:metadata() the file's
 * __metadata__, every tensor a view into ONE arena, on the call's default
 * device unless `device` names another. `dtype` converts the floating
 * tensors (integer and bool tensors keep theirs).
 *
 * Files are read on the worker, in C, outside the Lua hook: the load polls
 * the call's deadline and cancel flag itself between pieces. CUDA loads
 * copy on the worker's stream for that device (st__tensor_stream), which
 * st__vm_build synchronizes before the call completes; the loader also
 * synchronizes it before returning.
 *
 * The module userdata is made here, with module.c's metatable: st.module is
 * this function's upvalue, and the metatable of the empty module it
 * returns is kept in the registry. The layout of a module (st__lmodule_t
 * and its environment slots) is the one module.h describes.
 *
 * Errors raise "load_safetensors: <reason>". An arena that cannot be made
 * fails the call with OUT_OF_MEMORY, LIMIT or CAPABILITY (as constructors
 * do), the deadline and cancel with TIMEOUT and CANCELLED; a missing,
 * refused or malformed file is an endpoint error with the file, the tensor
 * and what is wrong in the message.
 */
#include "lua/safetensors.h"
#include "common/clock.h"
#include "lua/module.h"
#include "lua/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/safetensors.h"

static char module_mt_key;    /* registry: the metatable of modules (module.c's) */
static char guard_mt_key;     /* registry: metatable of the open-checkpoint guard */

/* __gc of the guard: frees a checkpoint left open when something raised. */
static int l_guard_gc(lua_State *L) {
  st__safetensors_t **g = lua_touserdata(L, 1);
  st__safetensors_free(*g);
  *g = NULL;
  return 0;
}

/* [-0, +1] Pushes a guard userdata holding NULL; whatever checkpoint is
 * stored in it is freed when the guard is collected. */
static st__safetensors_t **push_guard(lua_State *L) {
  st__safetensors_t **g = lua_newuserdata(L, sizeof *g);
  *g = NULL;
  lua_pushlightuserdata(L, &guard_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* g, mt? */
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 1);                 /* g, mt */
    lua_pushcfunction(L, l_guard_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushlightuserdata(L, &guard_mt_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_setmetatable(L, -2);                    /* g */
  return g;
}

/* [-0, +0] Stores module.c's metatable under module_mt_key, once. */
static void fetch_module_mt(lua_State *L) {
  lua_pushlightuserdata(L, &module_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  int have = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (have) return;
  /* An empty module on the CPU (a one-page memfd, collected at once): on
   * a CUDA default device it would take a device granule. The device is
   * set again for every call, so a raise here leaves nothing wrong. */
  st__tensor_ctx_t *c = st__lua_tensor_ctx(L);
  int device = c->device;
  c->device = ST__DEV_CPU;
  lua_pushvalue(L, lua_upvalueindex(1));      /* st.module */
  lua_newtable(L);
  lua_call(L, 1, 1);                          /* empty module */
  c->device = device;
  lua_pushlightuserdata(L, &module_mt_key);
  if (!lua_getmetatable(L, -2))               /* the raw one: __metatable only guards Lua */
    st__lua_raise(L, "load_safetensors: st.module returned no module");
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
}

/* Polled by the reader threads: the call's cancel flag and deadline. */
static int stop_requested(void *ud) {
  const st__lua_ctx_t *c = ud;
  if (st__lua_cancel_requested(c)) return ST_ERR_CANCELLED;
  if (c->deadline > 0 && st__now_mono() > c->deadline) return ST_ERR_TIMEOUT;
  return 0;
}

/* Reads the option table at idx into o (dtype) and *device_idx (the stack
 * index of the device value, 0 when absent). Unknown options raise. */
static void read_opts(lua_State *L, int idx, st__safetensors_opts_t *o, int *device_idx) {
  *device_idx = 0;
  if (lua_isnoneornil(L, idx)) return;
  if (lua_type(L, idx) != LUA_TTABLE)
    st__lua_raise(L, "load_safetensors: options must be a table, got %s", luaL_typename(L, idx));
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* ..., key, value */
    const char *k = st__lua_name(L, -2);     /* "dtype\0x" is no option name */
    if (k && strcmp(k, "dtype") == 0) {
      const char *d = st__lua_name(L, -1);
      o->dtype = d ? st_dtype_from_name(d) : ST_DTYPE_INVALID;
      if (o->dtype == ST_DTYPE_INVALID || !st_dtype_is_float(o->dtype))
        st__lua_raise(L, "load_safetensors: dtype must be a floating dtype (float16, bfloat16, "
                         "float32, float64, float8_e4m3fn, float8_e5m2), got '%s'",
                      d ? d : st__lua_not_name(L, -1));
    } else if (k && strcmp(k, "device") == 0) {
      *device_idx = -1;                       /* read below, where it stays on the stack */
    } else {
      st__lua_raise(L, "load_safetensors: unknown option '%s' (expected dtype, device)",
                    k ? k : st__lua_not_name(L, -2));
    }
    lua_pop(L, 1);
  }
  if (*device_idx) {
    lua_getfield(L, idx, "device");           /* ..., device */
    *device_idx = lua_gettop(L);
  }
}

/* Raises for a failed open or load, with the code the call should fail
 * with recorded where st__vm_build finds it. */
static int raise_load_error(lua_State *L, int rc, const char *msg) {
  if (rc == ST_ERR_TIMEOUT || rc == ST_ERR_CANCELLED) {
    st__lua_check_stop(L);                    /* raises the call's own stop error */
    st__lua_raise(L, "load_safetensors: %s", msg);
  }
  if (rc == ST_ERR_OUT_OF_MEMORY || rc == ST_ERR_LIMIT || rc == ST_ERR_CAPABILITY) {
    st__tensor_ctx_t *c = st__lua_tensor_ctx(L);
    c->err_code = rc;
    snprintf(c->err_msg, sizeof c->err_msg, "load_safetensors: %s", msg);
    st__lua_raise(L, "%s", c->err_msg);
  }
  st__lua_raise(L, "load_safetensors: %s", msg);
}

/* st.load_safetensors(path [, opts]) */
static int l_load_safetensors(lua_State *L) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (c->mode != ST__LUA_VM || !c->tensor.in_call)
    return st__lua_raise(L, "load_safetensors: only inside a build function (files are read "
                            "on a worker, not when endpoint files load)");
  if (lua_type(L, 1) != LUA_TSTRING)
    return st__lua_raise(L, "load_safetensors: path must be a string, got %s",
                         luaL_typename(L, 1));
  lua_settop(L, 2);
  /* The whole string is the path: "w.safetensors\0x" would open "w.safetensors". */
  const char *path = st__lua_name(L, 1);
  if (!path) return st__lua_raise(L, "load_safetensors: the path holds a NUL byte");
  st__safetensors_opts_t o;
  memset(&o, 0, sizeof o);
  o.device = ST__DEV_CPU;
  int device_idx = 0;
  read_opts(L, 2, &o, &device_idx);
  o.device = st__lua_device_arg(L, device_idx ? device_idx : 3, "load_safetensors");
  if (o.device >= 0) {
    char why[512];
    if (st__tensor_stream(&c->tensor, o.device, &o.stream, why, sizeof why) != ST_OK)
      return st__lua_raise(L, "%s", why);
  }
  o.stop = stop_requested;
  o.stop_ud = c;
  fetch_module_mt(L);

  /* The module first, anchored on the stack: if a later Lua allocation
   * raises, its __gc releases the arena. */
  st__lmodule_t *m = lua_newuserdata(L, sizeof *m);     /* ..., m */
  m->arena = NULL;
  m->ntensors = 0;
  lua_pushlightuserdata(L, &module_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setmetatable(L, -2);
  int midx = lua_gettop(L);

  /* The checkpoint lives in a guard and the layout in userdata, all
   * anchored on the stack: whatever raises from here on, the GC frees
   * them. */
  st__safetensors_t **g = push_guard(L);      /* ..., m, g */
  char err[1024];
  int rc = st__safetensors_open(path, 1, g, err, sizeof err);
  if (rc != ST_OK) return raise_load_error(L, rc, err);
  st__safetensors_t *s = *g;
  size_t n = s->ntensors;
  uint64_t *offsets = lua_newuserdata(L, (n ? n : 1) * sizeof *offsets);  /* ..., m, g, offs */
  st_dtype_t *dtypes = lua_newuserdata(L, (n ? n : 1) * sizeof *dtypes);  /* ..., offs, dts */
  st__arena_t *arena = NULL;
  rc = st__safetensors_load(s, &o, &arena, offsets, dtypes, err, sizeof err);
  if (rc != ST_OK) {
    st__safetensors_free(s);                  /* close the files now, not at the next GC */
    *g = NULL;
    return raise_load_error(L, rc, err);
  }
  m->arena = arena;                           /* owned by the module from here */
  m->ntensors = n;
  c->gc_debt += st__arena_bytes(arena);

  /* stack: ..., m, g, offs, dts */
  lua_createtable(L, 3, 0);                   /* ..., dts, env */
  lua_createtable(L, (int)n, 0);              /* ..., dts, env, names */
  lua_createtable(L, 0, (int)n);              /* ..., dts, env, names, views */
  for (size_t i = 0; i < n; i++) {
    const st__safetensors_tensor_t *t = &s->tensors[i];
    lua_pushstring(L, t->name);               /* ..., names, views, name */
    lua_pushvalue(L, -1);
    lua_rawseti(L, -4, (int)i + 1);           /* names[i + 1] = name */
    st__tensor_t *v = st__lua_push_tensor(L);   /* ..., names, views, name, view */
    st__geom_t g;
    if (st__geom_init(&g, dtypes[i], t->ndim, t->shape, err, sizeof err) != ST_OK)
      return st__lua_raise(L, "load_safetensors: %s", err);
    g.offset = offsets[i];
    st__tensor_share(v, &(st__tensor_t){.arena = arena}, &g);
    lua_rawset(L, -3);                        /* views[name] = view */
  }
  lua_rawseti(L, -3, ST__MODULE_TENSORS);     /* ..., dts, env, names */
  lua_rawseti(L, -2, ST__MODULE_NAMES);       /* ..., dts, env */
  lua_createtable(L, 0, (int)s->nmeta);       /* ..., dts, env, meta */
  for (size_t i = 0; i < s->nmeta; i++) {
    lua_pushstring(L, s->meta_values[i]);
    lua_setfield(L, -2, s->meta_keys[i]);
  }
  lua_rawseti(L, -2, ST__MODULE_METADATA);    /* ..., m, g, offs, dts, env */
  lua_setfenv(L, midx);                       /* ..., m, g, offs, dts */
  st__safetensors_free(s);
  *g = NULL;
  lua_settop(L, midx);                        /* ..., m */
  return 1;
}

/* Adds st.load_safetensors to the st table at idx (after st.module, whose
 * function it keeps as an upvalue). */
void st__lua_open_safetensors(lua_State *L, int idx) {
  lua_getfield(L, idx, "module");
  lua_pushcclosure(L, l_load_safetensors, 1);
  lua_setfield(L, idx, "load_safetensors");
}
