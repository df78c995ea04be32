/* src/lua: sandboxed states (docs/endpoints.md, "Sandbox").
 *
 * A state's globals table is replaced by a fresh environment that holds
 * only the allow-list below. The environment is strict: reading or
 * assigning a name that is not in it raises. Library tables (string, table,
 * math, bit, os, st) are read-only proxies, so one endpoint cannot change
 * what another sees. The real string table (the __index of the string
 * metatable) has no `dump`, and the string metatable is hidden.
 *
 * The JIT engine is off in every sandboxed state: LuaJIT does not call
 * hooks inside compiled traces, and the count hook is what enforces
 * `timeout` and cancellation (guard.c). The allocator of the state counts
 * its memory and enforces its cap (guard.c). Endpoint bodies orchestrate; the heavy work
 * (filling, copying, random numbers) runs in C either way.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in sandbox.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/sandbox.h"
#include "lua/scope.h"
#include "lua/stlib.h"
#include "lua/tensor.h"
#include "lua/zerobranch.h"

#include <luajit.h>
#include <lualib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

/* ------------------------------------------------------------ strict globals */

static int l_strict_index(lua_State *L) {
  /* stack: env, key */
  return st__lua_raise(L, "undeclared global '%s' (not available in the sandbox)",
                       lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
}

static int l_strict_newindex(lua_State *L) {
  /* stack: env, key, value */
  return st__lua_raise(L, "assignment to undeclared global '%s' (use local)",
                       lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : "?");
}

/* ------------------------------------------------------------ safe globals */

/* rawset that refuses read-only proxies (library tables and st). */
static int l_rawset(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkany(L, 2);
  luaL_checkany(L, 3);
  if (st__lua_is_readonly(L, 1)) return st__lua_raise(L, "rawset: table is read-only");
  lua_settop(L, 3);
  lua_rawset(L, 1);
  return 1;
}

static int l_rawlen(lua_State *L) {
  int t = lua_type(L, 1);
  luaL_argcheck(L, t == LUA_TTABLE || t == LUA_TSTRING, 1, "table or string expected");
  lua_pushinteger(L, (lua_Integer)lua_objlen(L, 1));
  return 1;
}

/* pcall/xpcall that re-raise a stop (timeout, cancel): the count hook's
 * error must reach the top however the body wraps its code. So does the
 * end of a zero-branch script's top level at app:main. */
static int finish_pcall(lua_State *L, int status, int base) {
  st__lua_ctx_t *c = st__lua_ctx(L);
  if (status != 0 && (c->stop || status == LUA_ERRMEM || st__lua_main_reached(L)))
    return lua_error(L);
  lua_pushboolean(L, status == 0);
  lua_replace(L, base);                       /* status in place of the handler slot */
  return lua_gettop(L) - base + 1;
}

static int l_pcall(lua_State *L) {
  luaL_checkany(L, 1);
  /* stack: f, args... -> nil(slot), f, args... */
  lua_pushnil(L);
  lua_insert(L, 1);
  int status = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
  /* stack: slot, results... | slot, error */
  return finish_pcall(L, status, 1);
}

static int l_xpcall(lua_State *L) {
  luaL_checkany(L, 2);
  /* stack: f, handler, args... -> handler, f, args... */
  lua_pushvalue(L, 1);
  lua_pushvalue(L, 2);
  lua_replace(L, 1);
  lua_replace(L, 2);
  int status = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 1);
  /* stack: handler, results... | handler, error */
  return finish_pcall(L, status, 1);
}

/* load(text [, chunkname [, mode [, env]]]): text only, never bytecode.
 * Compile errors return nil, message (as Lua does); bytecode raises. */
static int l_load(lua_State *L) {
  if (lua_type(L, 1) != LUA_TSTRING)
    return st__lua_raise(L, "load: only source text (a string) can be loaded");
  size_t len;
  const char *s = lua_tolstring(L, 1, &len);
  if (len > 0 && s[0] == LUA_SIGNATURE[0])
    return st__lua_raise(L, "load: binary chunks are not allowed");
  const char *mode = luaL_optstring(L, 3, "t");
  if (!strchr(mode, 't'))
    return st__lua_raise(L, "load: only text mode is allowed");
  const char *name = luaL_optstring(L, 2, "=(load)");
  if (luaL_loadbufferx(L, s, len, name, "t") != 0) {
    lua_pushnil(L);                           /* ..., msg, nil */
    lua_insert(L, -2);                        /* ..., nil, msg */
    return 2;
  }
  if (!lua_isnoneornil(L, 4)) {               /* ..., f */
    luaL_checktype(L, 4, LUA_TTABLE);
    lua_pushvalue(L, 4);
    lua_setfenv(L, -2);
  }
  return 1;
}

/* print(...) -> one info line in the server log, prefixed with file:line.
 * Long lines are cut at 4 KiB. */
static int l_print(lua_State *L) {
  int n = lua_gettop(L);
  char line[4096], where[256];
  size_t used = 0;
  st__lua_where(L, where, sizeof where);
  line[0] = '\0';
  for (int i = 1; i <= n; i++) {
    const char *s;
    char tmp[64];
    switch (lua_type(L, i)) {
    case LUA_TNIL: s = "nil"; break;
    case LUA_TBOOLEAN: s = lua_toboolean(L, i) ? "true" : "false"; break;
    case LUA_TNUMBER:
    case LUA_TSTRING: s = lua_tostring(L, i); break;
    default:
      if (luaL_callmeta(L, i, "__tostring") && lua_type(L, -1) == LUA_TSTRING) {
        s = lua_tostring(L, -1);              /* stays on the stack until return */
      } else {
        snprintf(tmp, sizeof tmp, "%s: %p", luaL_typename(L, i), lua_topointer(L, i));
        s = tmp;
      }
    }
    int k = snprintf(line + used, sizeof line - used, "%s%s", i > 1 ? "\t" : "", s);
    if (k < 0) break;
    used += (size_t)k;
    if (used >= sizeof line) {
      used = sizeof line - 1;
      break;
    }
  }
  st__log(ST_LOG_INFO, st__lua_ctx(L)->who, "%s: %s", where, line);
  return 0;
}

/* require("st") is the st module; require("st.zerobranch") the built-in
 * module of zero-branch scripts (zerobranch.c), so that a script that is
 * also a program loads as an endpoint file. Nothing else is reachable:
 * every other name raises. */
static int l_require(lua_State *L) {
  const char *name = st__lua_name(L, 1);     /* "st\0x" is not "st" */
  if (!name)
    name = lua_type(L, 1) == LUA_TSTRING ? "(a name with a NUL byte)" : luaL_checkstring(L, 1);
  if (strcmp(name, "st") == 0) {
    st__lua_push_st(L);
    return 1;
  }
  if (strcmp(name, "st.zerobranch") == 0) {
    st__lua_push_zerobranch(L);
    return 1;
  }
  return st__lua_raise(L, "require: module '%s' is not available in endpoints "
                          "(only 'st' and 'st.zerobranch')", name);
}

/* string.rep, checking the deadline and the cancel flag first: one call
 * can copy gigabytes without allocating (a result LuaJIT has interned
 * already), so neither the count hook nor the allocator would see it. */
static int l_rep_checked(lua_State *L) {
  st__lua_check_stop(L);
  int n = lua_gettop(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, 1);
  return 1;
}

/* ------------------------------------------------------------ the state */

static const char *const base_allow[] = {
  "assert", "error", "ipairs", "next", "pairs", "select", "tonumber", "tostring",
  "type", "unpack", "rawequal", "rawget", "setmetatable", "getmetatable", NULL
};

static const luaL_Reg safe_funcs[] = {
  {"rawset", l_rawset}, {"rawlen", l_rawlen}, {"pcall", l_pcall}, {"xpcall", l_xpcall},
  {"load", l_load}, {"print", l_print}, {NULL, NULL}
};

static void open_lib(lua_State *L, lua_CFunction f, const char *name) {
  lua_pushcfunction(L, f);
  lua_pushstring(L, name);
  lua_call(L, 1, 0);
}

/* Builds everything inside a protected call (any allocation may raise). */
static int l_setup(lua_State *L) {
  st__lua_ctx_t *ctx = lua_touserdata(L, 1);
  st__lua_set_ctx(L, ctx);

  open_lib(L, luaopen_base, "");
  open_lib(L, luaopen_string, LUA_STRLIBNAME);
  open_lib(L, luaopen_table, LUA_TABLIBNAME);
  open_lib(L, luaopen_math, LUA_MATHLIBNAME);
  open_lib(L, luaopen_bit, LUA_BITLIBNAME);
  open_lib(L, luaopen_os, LUA_OSLIBNAME);

  lua_newtable(L);                                 /* env */
  int env = lua_gettop(L);
  for (int i = 0; base_allow[i]; i++) {
    lua_getglobal(L, base_allow[i]);
    lua_setfield(L, env, base_allow[i]);
  }
  st__lua_set_funcs(L, env, safe_funcs);
  if (ctx->mode != ST__LUA_CONFIG) {
    lua_pushcfunction(L, l_require);
    lua_setfield(L, env, "require");
  }

  /* string: no dump, and the string metatable is hidden so that its
   * __index (the real string table) cannot be reached or changed. */
  lua_getglobal(L, "string");                      /* env, string */
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_getfield(L, -1, "rep");
  lua_pushcclosure(L, l_rep_checked, 1);
  lua_setfield(L, -2, "rep");
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);                         /* env, string, "", smt */
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);                                   /* env, string */
  st__lua_push_readonly(L, -1);
  lua_setfield(L, env, "string");
  lua_pop(L, 1);                                   /* env */

  static const char *const libs[] = {"table", "math", "bit", NULL};
  for (int i = 0; libs[i]; i++) {
    lua_getglobal(L, libs[i]);                     /* env, lib */
    st__lua_push_readonly(L, -1);                  /* env, lib, proxy */
    lua_setfield(L, env, libs[i]);
    lua_pop(L, 1);
  }

  /* os: only the clock and the calendar. */
  lua_getglobal(L, "os");                          /* env, os */
  lua_createtable(L, 0, 3);                        /* env, os, safe_os */
  static const char *const os_allow[] = {"time", "clock", "date", NULL};
  for (int i = 0; os_allow[i]; i++) {
    lua_getfield(L, -2, os_allow[i]);
    lua_setfield(L, -2, os_allow[i]);
  }
  st__lua_push_readonly(L, -1);                    /* env, os, safe_os, proxy */
  lua_setfield(L, env, "os");
  lua_pop(L, 2);                                   /* env */

  if (ctx->mode != ST__LUA_CONFIG) {
    st__lua_open_tensor(L, st__lua_tensor_ops);
    st__lua_scope_open(L);
    st__lua_push_st(L);                            /* env, st */
    lua_setfield(L, env, "st");
  }

  static const luaL_Reg strict[] = {
    {"__index", l_strict_index}, {"__newindex", l_strict_newindex}, {NULL, NULL}
  };
  st__lua_push_metatable(L, strict);               /* env, mt */
  lua_setmetatable(L, env);                        /* env */

  /* The environment becomes the globals of everything loaded from now on;
   * the original globals (with io-free but still unsafe base functions
   * such as setfenv) are unreachable afterwards. */
  lua_replace(L, LUA_GLOBALSINDEX);
  return 0;
}

lua_State *st__lua_state_new(st__lua_ctx_t *ctx) {
  st__tensor_ctx_init(&ctx->tensor);  /* the CPU; a worker's calls set their own */
  lua_State *L = st__lua_newstate(ctx);
  if (!L) return NULL;
  luaJIT_setmode(L, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  if (lua_cpcall(L, l_setup, ctx) != 0) {
    const char *msg = lua_tostring(L, -1);
    st__log(ST_LOG_ERROR, "lua", "cannot set up a Lua state: %s", msg ? msg : "?");
    st__lua_close(L);
    return NULL;
  }
  lua_settop(L, 0);
  return L;
}
