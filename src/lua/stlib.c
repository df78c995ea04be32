/* src/lua: the `st` module as endpoint code sees it (docs/endpoints.md).
 *
 *   st.endpoint{...}   declares an endpoint (returns the declaration)
 *   st.required        default marking a parameter the caller must pass
 *   st.cancelled()     true once the running call was cancelled
 *   st.sleep(s)        sleeps, waking for cancel and the timeout
 *   st.progress(f, n)  reports progress of the running call (tasks)
 *   st.array(t)        marks t to serialize as an array even when empty
 *   st.bytes(s)        a binary value (msgpack bin) of s's bytes (value.c)
 *   st.null            nil inside arguments' arrays and maps, and in
 *                      results (value.c): the light userdata NULL
 *   st.version         server version string
 *   st.key(name [, v]) a key a client published (keys.c)
 *   + tensors (construct.c) and st.module (module.c)
 *
 * The table is built once per state and exposed as a read-only proxy.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in stlib.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/stlib.h"
#include "common/clock.h"
#include "lua/construct.h"
#include "lua/keys.h"
#include "lua/module.h"
#include "lua/safetensors.h"
#include "lua/value.h"

#include <math.h>
#include <string.h>
#include <time.h>

static char st_key;           /* registry: the read-only st proxy           */
static char required_key;     /* registry: the st.required sentinel         */
static char decls_key;        /* registry: weak table decl -> line          */
static char array_mt_key;     /* registry: metatable of marked arrays       */
static char tparam_mt_key;    /* registry: metatable of st.tensor_param{}   */

/* [-0, +1] Pushes the st.required sentinel. */
static void push_required(lua_State *L) {
  lua_pushlightuserdata(L, &required_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
}

int st__lua_is_required(lua_State *L, int idx) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  push_required(L);
  int eq = lua_rawequal(L, idx, -1);
  lua_pop(L, 1);
  return eq;
}

void st__lua_push_array_mt(lua_State *L) {
  lua_pushlightuserdata(L, &array_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
}

/* `return st.endpoint{...}` is a tail call: the file's frame is gone when
 * st.endpoint runs, and LuaJIT gives the tail call the line of its last
 * token. The line hook saw that line last (ctx->main_line); the call
 * starts on the nearest line at or above it that mentions st.endpoint. */
static int tail_call_line(const st__lua_ctx_t *c) {
  if (!c->src_text || c->main_line <= 0) return c->main_line;
  int line = 1, found = 0;
  const char *p = c->src_text, *end = c->src_text + c->src_len;
  while (p < end && line <= c->main_line) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *eol = nl ? nl : end;
    for (const char *q = p; q + 11 <= eol; q++)
      if (memcmp(q, "st.endpoint", 11) == 0) {
        found = line;
        break;
      }
    p = eol + 1;
    line++;
  }
  return found ? found : c->main_line;
}

/* st.endpoint{...}: remembers the line of the call and returns the table.
 * Validation happens when the file has returned (decl.c), so that every
 * problem of every declaration is reported, each with this line. */
static int l_endpoint(lua_State *L) {
  if (lua_type(L, 1) != LUA_TTABLE || lua_gettop(L) != 1)
    return st__lua_raise(L, "st.endpoint expects one table: st.endpoint{ name = ..., build = ... }");
  lua_Debug ar;
  int line = 0;
  if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "l", &ar)) line = ar.currentline;
  if (line <= 0) line = tail_call_line(st__lua_ctx(L));
  if (line <= 0) line = 1;
  st__lua_decl_mark(L, 1, line);
  return 1;
}

void st__lua_decl_mark(lua_State *L, int idx, int line) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lua_pushlightuserdata(L, &decls_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* decls */
  lua_pushvalue(L, idx);
  lua_pushinteger(L, line);
  lua_rawset(L, -3);                          /* decls[t] = line */
  lua_pop(L, 1);
}

int st__lua_decl_line(lua_State *L, int idx) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  if (lua_type(L, idx) != LUA_TTABLE) return 0;
  lua_pushlightuserdata(L, &decls_key);
  lua_rawget(L, LUA_REGISTRYINDEX);           /* decls */
  lua_pushvalue(L, idx);
  lua_rawget(L, -2);                          /* decls, line? */
  int line = (int)lua_tointeger(L, -1);
  lua_pop(L, 2);
  return line;
}

int st__lua_decl_list(lua_State *L, int idx) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  const char *shape = "the file must return st.endpoint{...} or an array of them";
  if (st__lua_decl_line(L, idx) > 0) {
    lua_createtable(L, 1, 0);                 /* list */
    lua_pushvalue(L, idx);
    lua_rawseti(L, -2, 1);
    return 1;
  }
  if (lua_type(L, idx) != LUA_TTABLE) {
    lua_pushfstring(L, "%s (it returned %s)", shape, luaL_typename(L, idx));
    return -1;
  }
  int n = (int)lua_objlen(L, idx);
  int count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {                  /* key, value */
    count++;
    lua_pop(L, 1);
  }
  if (n == 0 || count != n) {
    lua_pushfstring(L, "%s (it returned a table that is neither)", shape);
    return -1;
  }
  lua_createtable(L, n, 0);                   /* list */
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);                   /* list, v */
    if (st__lua_decl_line(L, -1) <= 0) {
      lua_pop(L, 2);
      lua_pushfstring(L, "%s (element %d is not an st.endpoint{...})", shape, i);
      return -1;
    }
    lua_rawseti(L, -2, i);                    /* list */
  }
  return n;
}

static int l_cancelled(lua_State *L) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  lua_pushboolean(L, c->stop == ST_ERR_CANCELLED || st__lua_cancel_requested(c));
  return 1;
}

/* st.progress(fraction [, note]): what a task's status shows while it
 * runs. Misuse raises; outside a call (no sink) it does nothing. */
static int l_progress(lua_State *L) {
  if (lua_type(L, 1) != LUA_TNUMBER)
    return st__lua_raise(L, "st.progress: fraction must be a number in [0, 1], got %s",
                         luaL_typename(L, 1));
  double f = lua_tonumber(L, 1);
  if (!(f >= 0 && f <= 1))
    return st__lua_raise(L, "st.progress: fraction must be in [0, 1], got %g", f);
  const char *note = NULL;
  size_t len = 0;
  if (!lua_isnoneornil(L, 2)) {
    if (lua_type(L, 2) != LUA_TSTRING)
      return st__lua_raise(L, "st.progress: note must be a string, got %s", luaL_typename(L, 2));
    note = lua_tolstring(L, 2, &len);
    if (len > ST_PROGRESS_NOTE_MAX)
      return st__lua_raise(L, "st.progress: note of %zu bytes is longer than %d", len,
                           ST_PROGRESS_NOTE_MAX);
  }
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (c->progress) st__progress_set(c->progress, f, note, len);
  return 0;
}

/* Sleeps in slices of at most 10 ms; raises at cancel or the deadline. */
static int l_sleep(lua_State *L) {
  if (lua_type(L, 1) != LUA_TNUMBER)
    return st__lua_raise(L, "st.sleep: seconds must be a number");
  double s = lua_tonumber(L, 1);
  if (!(s >= 0) || isinf(s)) return st__lua_raise(L, "st.sleep: seconds must be >= 0 and finite");
  double end = st__now_mono() + s;
  for (;;) {
    st__lua_check_stop(L);
    double left = end - st__now_mono();
    if (left <= 0) break;
    if (left > 0.010) left = 0.010;
    struct timespec ts = {0, (long)(left * 1e9)};
    nanosleep(&ts, NULL);
  }
  return 0;
}

static int l_array(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  st__lua_push_array_mt(L);
  lua_setmetatable(L, 1);
  return 1;
}

/* st.tensor_param{dtype = "float32", device = "cpu" | "cuda"}: the marker
 * of a parameter that takes a tensor argument (both options may be left
 * out: any dtype, any device). Returns a table {dtype, device} with the
 * marker metatable; raises on an unknown option, dtype or device. */
static int l_tensor_param(lua_State *L) {
  if (lua_isnoneornil(L, 1)) {
    lua_settop(L, 0);
    lua_newtable(L);
  }
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  lua_createtable(L, 0, 2);                   /* opts, r */
  lua_pushnil(L);
  while (lua_next(L, 1)) {                    /* opts, r, k, v */
    const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
    if (strcmp(k, "dtype") == 0) {
      const char *name = st__lua_name(L, -1);
      st_dtype_t dt = name ? st_dtype_from_name(name) : ST_DTYPE_INVALID;
      if (dt == ST_DTYPE_INVALID)
        return luaL_error(L, "st.tensor_param: unknown dtype %s",
                          name ? name : st__lua_not_name(L, -1));
      lua_pushstring(L, st_dtype_name(dt));
      lua_setfield(L, 2, "dtype");
    } else if (strcmp(k, "device") == 0) {
      const char *dev = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "";
      if (strcmp(dev, "cpu") != 0 && strcmp(dev, "cuda") != 0)
        return luaL_error(L, "st.tensor_param: device must be \"cpu\" or \"cuda\", got %s",
                          dev[0] ? dev : luaL_typename(L, -1));
      lua_pushvalue(L, -1);
      lua_setfield(L, 2, "device");
    } else {
      return luaL_error(L, "st.tensor_param: unknown option '%s' (dtype, device)", k);
    }
    lua_pop(L, 1);
  }
  lua_pushlightuserdata(L, &tparam_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setmetatable(L, 2);
  return 1;
}

/* See stlib.h. */
int st__lua_is_tensor_param(lua_State *L, int idx, int *dtype, int *device) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  if (lua_type(L, idx) != LUA_TTABLE || !lua_getmetatable(L, idx)) return 0;
  lua_pushlightuserdata(L, &tparam_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  int eq = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  if (!eq) return 0;
  lua_getfield(L, idx, "dtype");
  *dtype = lua_isstring(L, -1) ? (int)st_dtype_from_name(lua_tostring(L, -1)) : -1;
  lua_getfield(L, idx, "device");
  const char *dev = lua_isstring(L, -1) ? lua_tostring(L, -1) : "";
  *device = strcmp(dev, "cpu") == 0 ? 1 : strcmp(dev, "cuda") == 0 ? 2 : 0;
  lua_pop(L, 2);
  return 1;
}

static int l_tensor_param_tostring(lua_State *L) {
  lua_getfield(L, 1, "dtype");
  lua_getfield(L, 1, "device");
  lua_pushfstring(L, "st.tensor_param{dtype = %s, device = %s}",
                  lua_isstring(L, -2) ? lua_tostring(L, -2) : "any",
                  lua_isstring(L, -1) ? lua_tostring(L, -1) : "any");
  return 1;
}

static int l_required_tostring(lua_State *L) {
  lua_pushliteral(L, "st.required");
  return 1;
}

/* Builds the st table and its proxy in the registry. */
static void build_st(lua_State *L) {
  /* st.required: a full userdata, unique per state, printable. */
  lua_pushlightuserdata(L, &required_key);
  lua_newuserdata(L, 1);                      /* key, req */
  lua_createtable(L, 0, 2);
  lua_pushcfunction(L, l_required_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_pushlightuserdata(L, &decls_key);
  lua_newtable(L);                            /* key, decls */
  lua_createtable(L, 0, 1);
  lua_pushliteral(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);

  static const luaL_Reg tparam_meta[] = {{"__tostring", l_tensor_param_tostring}, {NULL, NULL}};
  lua_pushlightuserdata(L, &array_mt_key);
  st__lua_push_metatable(L, NULL);            /* key, mt */
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_pushlightuserdata(L, &tparam_mt_key);
  st__lua_push_metatable(L, tparam_meta);     /* key, mt */
  lua_rawset(L, LUA_REGISTRYINDEX);

  lua_newtable(L);                            /* st */
  int st = lua_gettop(L);
  static const luaL_Reg funcs[] = {
    {"endpoint", l_endpoint}, {"cancelled", l_cancelled}, {"sleep", l_sleep},
    {"progress", l_progress}, {"array", l_array}, {"bytes", st__lua_bytes},
    {"tensor_param", l_tensor_param}, {NULL, NULL}
  };
  st__lua_set_funcs(L, st, funcs);
  push_required(L);
  lua_setfield(L, st, "required");
  lua_pushlightuserdata(L, NULL);
  lua_setfield(L, st, "null");
  lua_pushliteral(L, ST_VERSION_STRING);
  lua_setfield(L, st, "version");
  st__lua_open_construct(L, st);
  st__lua_open_module(L, st);
  st__lua_open_safetensors(L, st);
  st__lua_open_keys(L, st);

  lua_pushlightuserdata(L, &st_key);
  st__lua_push_readonly(L, st);               /* st, key, proxy */
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);                              /* (empty) */
}

void st__lua_push_st(lua_State *L) { st__lua_push_built(L, &st_key, build_st); }
