/* src/lua: st.module, an ordered state dict in one arena (docs/design.md,
 * section 3, decision 3).
 *
 *   st.module({ {"weight", w}, {"bias", b} } [, metadata])   order as given
 *   st.module({ weight = w, bias = b } [, metadata])          names sorted
 *
 * Every tensor is copied (contiguous) into ONE new arena at offsets that
 * are multiples of ST_ARENA_ALIGN, so a client maps the whole module with
 * one descriptor. All tensors must be on one device (the arena's: the CPU
 * or one CUDA device; CUDA tensors are copied device to device). The
 * module userdata holds the arena; its environment
 * table holds the names in order, a view per name and the metadata.
 *
 *   m.weight / m["layers.0.bias"] / m:tensor(name)   the view
 *   m:names()  m:metadata()  m:nbytes()  #m
 * Methods take precedence over tensor names in m.x; m:tensor(name) always
 * works.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in module.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/module.h"
#include "lua/scope.h"
#include "lua/tensor.h"
#include "tensor/ops.h"

#include <stdlib.h>
#include <string.h>

static char module_mt_key;    /* registry: metatable of modules */
static char methods_key;      /* registry: method table of modules */

st__lmodule_t *st__lua_tomodule(lua_State *L, int idx) {
  void *p = lua_touserdata(L, idx);
  if (!p || !lua_getmetatable(L, idx)) return NULL;
  lua_pushlightuserdata(L, &module_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  int is = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return is ? p : NULL;
}

static st__lmodule_t *check_module(lua_State *L, int idx, const char *fn) {
  st__lmodule_t *m = st__lua_tomodule(L, idx);
  if (!m) st__lua_raise(L, "%s: expected a module, got %s (call methods with ':')", fn,
                        luaL_typename(L, idx));
  st__lua_check_alive(L, m->arena, fn);
  return m;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* st.module(spec [, metadata]) */
static int l_module(lua_State *L) {
  if (lua_type(L, 1) != LUA_TTABLE)
    return st__lua_raise(L, "module: expected a table of tensors, got %s", luaL_typename(L, 1));
  if (!lua_isnoneornil(L, 2)) {
    if (lua_type(L, 2) != LUA_TTABLE)
      return st__lua_raise(L, "module: metadata must be a table, got %s", luaL_typename(L, 2));
    lua_pushnil(L);
    while (lua_next(L, 2)) {
      if (lua_type(L, -2) != LUA_TSTRING)
        return st__lua_raise(L, "module: metadata keys must be strings");
      lua_pop(L, 1);
    }
  }
  lua_settop(L, 2);

  /* names: array of name strings in order, at index 3; pairs at 4 */
  lua_newtable(L);                            /* spec, meta, names */
  lua_newtable(L);                            /* spec, meta, names, byname */
  int ordered = lua_objlen(L, 1) > 0;
  size_t n = 0;
  if (ordered) {
    size_t len = lua_objlen(L, 1);
    for (size_t i = 1; i <= len; i++) {
      lua_rawgeti(L, 1, (int)i);              /* ..., pair */
      if (lua_type(L, -1) != LUA_TTABLE)
        return st__lua_raise(L, "module: entry %d must be a {name, tensor} pair", (int)i);
      lua_rawgeti(L, -1, 1);                  /* ..., pair, name */
      lua_rawgeti(L, -2, 2);                  /* ..., pair, name, tensor */
      if (lua_type(L, -2) != LUA_TSTRING || lua_objlen(L, -2) == 0)
        return st__lua_raise(L, "module: entry %d needs a non-empty name", (int)i);
      if (!st__lua_name(L, -2))
        return st__lua_raise(L, "module: entry %d's name holds a NUL byte", (int)i);
      const st__tensor_t *t = st__lua_totensor(L, -1);
      if (!t)
        return st__lua_raise(L, "module: entry %d ('%s') is not a tensor", (int)i,
                             lua_tostring(L, -2));
      st__lua_check_alive(L, t->arena, "module");
      lua_pushvalue(L, -2);
      lua_rawget(L, 4);                       /* ..., pair, name, tensor, dup? */
      if (!lua_isnil(L, -1))
        return st__lua_raise(L, "module: duplicate name '%s'", lua_tostring(L, -3));
      lua_pop(L, 1);
      lua_pushvalue(L, -2);
      lua_rawseti(L, 3, (int)++n);            /* names[n] = name */
      lua_rawset(L, 4);                       /* byname[name] = tensor; ..., pair */
      lua_pop(L, 1);
    }
    lua_pushnil(L);                           /* every key must be in the array */
    size_t count = 0;
    while (lua_next(L, 1)) {
      count++;
      lua_pop(L, 1);
    }
    if (count != len)
      return st__lua_raise(L, "module: mixes {name, tensor} pairs with named entries");
  } else {
    lua_pushnil(L);
    while (lua_next(L, 1)) {                  /* ..., key, value */
      if (lua_type(L, -2) != LUA_TSTRING)
        return st__lua_raise(L, "module: names must be strings");
      if (!st__lua_name(L, -2))
        return st__lua_raise(L, "module: a name holds a NUL byte");
      const st__tensor_t *t = st__lua_totensor(L, -1);
      if (!t)
        return st__lua_raise(L, "module: '%s' is not a tensor (metadata goes in the second "
                                "argument)", lua_tostring(L, -2));
      st__lua_check_alive(L, t->arena, "module");
      lua_pushvalue(L, -2);
      lua_insert(L, -2);                      /* ..., key, key, value */
      lua_rawset(L, 4);                       /* ..., key */
      lua_pushvalue(L, -1);
      lua_rawseti(L, 3, (int)++n);
    }
    /* sort the names (a userdata: nothing leaks if a push below raises) */
    const char **names = lua_newuserdata(L, (n ? n : 1) * sizeof *names);  /* ..., ud */
    for (size_t i = 0; i < n; i++) {
      lua_rawgeti(L, 3, (int)i + 1);
      names[i] = lua_tostring(L, -1);         /* anchored in byname's keys */
      lua_pop(L, 1);
    }
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
      lua_pushstring(L, names[i]);
      lua_rawseti(L, 3, (int)i + 1);
    }
    lua_pop(L, 1);                            /* the names' userdata */
  }
  /* stack: spec, meta, names, byname */

  /* layout: offsets in a userdata (freed by the GC if anything raises);
   * every tensor on one device, which the arena is made on */
  uint64_t total = 0;
  int device = n ? ST__DEV_MAX : st__lua_tensor_ctx(L)->device;
  uint64_t *offs = lua_newuserdata(L, (n ? n : 1) * sizeof *offs);  /* ..., offs */
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 3, (int)i + 1);
    lua_rawget(L, 4);
    st__tensor_t *t = lua_touserdata(L, -1);
    lua_pop(L, 1);
    int d = st__tensor_device(t);
    if (device == ST__DEV_MAX) {
      device = d;
    } else if (d != device) {
      char a[16], b[16];
      lua_rawgeti(L, 3, (int)i + 1);
      return st__lua_raise(L, "module: tensors on different devices ('%s' is on %s, the ones "
                              "before it on %s): move them with :to(device) first",
                           lua_tostring(L, -1), st__tensor_device_name(d, a, sizeof a),
                           st__tensor_device_name(device, b, sizeof b));
    }
    total = (total + ST_ARENA_ALIGN - 1) / ST_ARENA_ALIGN * ST_ARENA_ALIGN;
    offs[i] = total;
    total += st__geom_nbytes(&t->geom);
  }

  st__lmodule_t *m = lua_newuserdata(L, sizeof *m);  /* ..., offs, m */
  m->arena = NULL;
  m->ntensors = n;
  lua_pushlightuserdata(L, &module_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setmetatable(L, -2);
  st__lua_scope_add(L, -1);
  int midx = lua_gettop(L);
  m->arena = st__lua_new_arena(L, device, total);

  lua_createtable(L, 3, 0);                   /* ..., offs, m, env */
  lua_newtable(L);                            /* ..., env, views */
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 3, (int)i + 1);            /* ..., views, name */
    lua_pushvalue(L, -1);
    lua_rawget(L, 4);                         /* ..., views, name, src */
    st__tensor_t *src = lua_touserdata(L, -1);
    st__tensor_t *v = st__lua_push_tensor(L);   /* ..., views, name, src, view */
    st__geom_t g = src->geom;
    g.offset = offs[i];
    st__geom_set_contiguous(&g);
    st__tensor_share(v, &(st__tensor_t){.arena = m->arena}, &g);
    /* CPU: a packing loop; CUDA: a device-to-device copy (or a gather
     * kernel for a strided source) on the worker's stream. */
    char err[512];
    int rc = st__tensor_copy(st__lua_tensor_ctx(L), v, src, "module", err, sizeof err);
    if (rc != ST_OK) return st__lua_raise(L, "%s", err);
    lua_replace(L, -2);                       /* ..., views, name, view */
    lua_rawset(L, -3);                        /* ..., views */
  }
  lua_rawseti(L, -2, ST__MODULE_TENSORS);     /* ..., offs, m, env */
  lua_pushvalue(L, 3);
  lua_rawseti(L, -2, ST__MODULE_NAMES);
  if (!lua_isnil(L, 2)) {
    lua_pushvalue(L, 2);
    lua_rawseti(L, -2, ST__MODULE_METADATA);
  }
  lua_setfenv(L, midx);                       /* ..., offs, m */
  return 1;
}

static int l_module_gc(lua_State *L) {
  st__lmodule_t *m = lua_touserdata(L, 1);
  st__tensor_arena_release(m->arena);
  m->arena = NULL;
  return 0;
}

/* m.key: a method, else the tensor named key, else nil. */
static int l_module_index(lua_State *L) {
  /* stack: m, key */
  lua_pushlightuserdata(L, &methods_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* m, key, methods */
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);                          /* m, key, methods, method? */
  if (!lua_isnil(L, -1)) return 1;
  lua_getfenv(L, 1);                          /* ..., env */
  lua_rawgeti(L, -1, ST__MODULE_TENSORS);     /* ..., env, views */
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

static int l_module_tensor(lua_State *L) {
  check_module(L, 1, "tensor");
  /* The whole string is the name: "w\0x" is not "w". */
  const char *name = st__lua_name(L, 2);
  if (!name)
    return st__lua_raise(L, "tensor: the name must be a string without NUL bytes, got %s",
                         st__lua_not_name(L, 2));
  lua_getfenv(L, 1);                          /* m, name, env */
  lua_rawgeti(L, -1, ST__MODULE_TENSORS);     /* m, name, env, tensors */
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);                          /* m, name, env, tensors, t? */
  if (lua_isnil(L, -1)) return st__lua_raise(L, "module has no tensor '%s'", name);
  return 1;
}

static int l_module_names(lua_State *L) {
  st__lmodule_t *m = check_module(L, 1, "names");
  lua_getfenv(L, 1);
  lua_rawgeti(L, -1, ST__MODULE_NAMES);       /* m, env, names */
  lua_createtable(L, (int)m->ntensors, 0);    /* m, env, names, copy */
  for (size_t i = 1; i <= m->ntensors; i++) {
    lua_rawgeti(L, -2, (int)i);
    lua_rawseti(L, -2, (int)i);
  }
  return 1;
}

static int l_module_metadata(lua_State *L) {
  check_module(L, 1, "metadata");
  lua_getfenv(L, 1);
  lua_rawgeti(L, -1, ST__MODULE_METADATA);
  if (lua_isnil(L, -1)) lua_newtable(L);
  return 1;
}

static int l_module_nbytes(lua_State *L) {
  st__lmodule_t *m = check_module(L, 1, "nbytes");
  lua_pushnumber(L, (lua_Number)st__arena_bytes(m->arena));
  return 1;
}

static int l_module_len(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)check_module(L, 1, "len")->ntensors);
  return 1;
}

static int l_module_tostring(lua_State *L) {
  st__lmodule_t *m = lua_touserdata(L, 1);
  char dev[16];
  lua_pushfstring(L, "module(%d tensors, %d bytes, %s)", (int)m->ntensors,
                  m->arena ? (int)st__arena_bytes(m->arena) : 0,
                  st__tensor_device_name(m->arena ? st__arena_device(m->arena) : ST__DEV_CPU,
                                         dev, sizeof dev));
  return 1;
}

void st__lua_open_module(lua_State *L, int idx) {
  static const luaL_Reg methods[] = {
    {"tensor", l_module_tensor}, {"names", l_module_names}, {"metadata", l_module_metadata},
    {"nbytes", l_module_nbytes}, {NULL, NULL}
  };
  static const luaL_Reg meta[] = {
    {"__index", l_module_index}, {"__gc", l_module_gc}, {"__len", l_module_len},
    {"__tostring", l_module_tostring}, {NULL, NULL}
  };
  lua_pushlightuserdata(L, &methods_key);
  lua_newtable(L);
  st__lua_set_funcs(L, -1, methods);
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_pushlightuserdata(L, &module_mt_key);
  st__lua_push_metatable(L, meta);
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_pushcfunction(L, l_module);
  lua_setfield(L, idx, "module");
}
