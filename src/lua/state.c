/* src/lua/state.c: the context of a state, the clock and stop checks of
 * the running call, raising with the endpoint's position, read-only
 * proxies and integer arguments (see state.h for every contract). The
 * bottom of src/lua: it calls no other file of the module. All of it runs
 * on the thread that owns the lua_State it is given.
 */
#include "lua/state.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

static char ctx_key;          /* registry: light userdata st__lua_ctx_t*    */
static char readonly_key;     /* key present in the metatable of proxies    */

void st__lua_set_ctx(lua_State *L, st__lua_ctx_t *ctx) {
  lua_pushlightuserdata(L, &ctx_key);
  lua_pushlightuserdata(L, ctx);
  lua_rawset(L, LUA_REGISTRYINDEX);
}

st__lua_ctx_t *st__lua_ctx(lua_State *L) {
  lua_pushlightuserdata(L, &ctx_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  st__lua_ctx_t *c = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return c;
}

st__tensor_ctx_t *st__lua_tensor_ctx(lua_State *L) {
  return &st__lua_ctx(L)->tensor;
}

void st__lua_where(lua_State *L, char *buf, size_t len) {
  lua_Debug ar;
  for (int level = 0; lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar)) break;
    if (ar.currentline > 0) {
      snprintf(buf, len, "%s:%d", ar.short_src, ar.currentline);
      return;
    }
  }
  snprintf(buf, len, "?");
}

int st__lua_raise(lua_State *L, const char *fmt, ...) {
  char msg[1024], where[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  st__lua_where(L, where, sizeof where);
  /* No Lua frame (a tail call such as `return require('x')` replaced it):
   * the caller of the protected call adds the endpoint's own position. */
  if (strcmp(where, "?") == 0) lua_pushstring(L, msg);
  else lua_pushfstring(L, "%s: %s", where, msg);
  lua_error(L);
  __builtin_unreachable();
}

/* ------------------------------------------------------------ stops */

int st__lua_cancel_requested(const st__lua_ctx_t *c) {
  return c->cancel && __atomic_load_n(c->cancel, __ATOMIC_RELAXED);
}

int st__lua_stop_due(const st__lua_ctx_t *c) {
  if (st__lua_cancel_requested(c)) return ST_ERR_CANCELLED;
  if (c->deadline > 0 && st__now_mono() > c->deadline) return ST_ERR_TIMEOUT;
  return 0;
}

const char *st__lua_stop_message(const st__lua_ctx_t *c, char *buf, size_t len) {
  switch (c->stop) {
  case ST_ERR_TIMEOUT: snprintf(buf, len, "timed out after %g s", c->limit_s); break;
  case ST_ERR_CANCELLED: snprintf(buf, len, "cancelled"); break;
  case ST_ERR_OUT_OF_MEMORY:
    snprintf(buf, len, "out of memory: the Lua state reached its limit of %zu bytes (%g MiB)",
             c->mem_limit, (double)c->mem_limit / (1 << 20));
    break;
  default: snprintf(buf, len, "%s", ""); break;
  }
  return buf;
}

void st__lua_check_stop(lua_State *L) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (!c) return;
  if (!c->stop) c->stop = st__lua_stop_due(c);
  if (!c->stop) return;
  char msg[160];
  st__lua_raise(L, "%s", st__lua_stop_message(c, msg, sizeof msg));
}

/* ------------------------------------------------------------ tables */

void st__lua_set_funcs(lua_State *L, int idx, const luaL_Reg *funcs) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  for (const luaL_Reg *r = funcs; r && r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, idx, r->name);
  }
}

void st__lua_push_metatable(lua_State *L, const luaL_Reg *meta) {
  lua_createtable(L, 0, 6);
  st__lua_set_funcs(L, -1, meta);
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
}

void st__lua_register_class(lua_State *L, void *key, const luaL_Reg *meta,
                            const luaL_Reg *methods, const luaL_Reg *more) {
  lua_pushlightuserdata(L, key);
  st__lua_push_metatable(L, meta);            /* key, mt */
  lua_newtable(L);                            /* key, mt, methods */
  st__lua_set_funcs(L, -1, methods);
  st__lua_set_funcs(L, -1, more);
  lua_setfield(L, -2, "__index");             /* key, mt */
  lua_rawset(L, LUA_REGISTRYINDEX);           /* (empty) */
}

void st__lua_push_built(lua_State *L, void *key, void (*build)(lua_State *L)) {
  lua_pushlightuserdata(L, key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (!lua_isnil(L, -1)) return;
  lua_pop(L, 1);
  build(L);
  lua_pushlightuserdata(L, key);
  lua_rawget(L, LUA_REGISTRYINDEX);
}

/* ------------------------------------------------------------ read-only proxies */

static int l_readonly_newindex(lua_State *L) {
  /* stack: proxy, key, value */
  return st__lua_raise(L, "attempt to modify read-only table (field '%s')",
                       lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
}

void st__lua_push_readonly(lua_State *L, int idx) {
  static const luaL_Reg meta[] = {{"__newindex", l_readonly_newindex}, {NULL, NULL}};
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lua_newtable(L);                            /* proxy */
  st__lua_push_metatable(L, meta);            /* proxy, mt */
  lua_pushvalue(L, idx);
  lua_setfield(L, -2, "__index");
  lua_pushlightuserdata(L, &readonly_key);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_setmetatable(L, -2);                    /* proxy */
}

int st__lua_is_readonly(lua_State *L, int idx) {
  if (!lua_getmetatable(L, idx)) return 0;    /* mt */
  lua_pushlightuserdata(L, &readonly_key);
  lua_rawget(L, -2);                          /* mt, flag */
  int ro = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return ro;
}

/* ------------------------------------------------------------ integers */

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

const char *st__lua_name(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TSTRING) return NULL;
  size_t len;
  const char *s = lua_tolstring(L, idx, &len);
  return strlen(s) == len ? s : NULL;
}

const char *st__lua_not_name(lua_State *L, int idx) {
  return lua_type(L, idx) == LUA_TSTRING ? "a string with a NUL byte" : luaL_typename(L, idx);
}
