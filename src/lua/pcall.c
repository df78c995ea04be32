/* src/lua: the one wrapper through which C calls into Lua.
 *
 * Every call from the server into Lua code (a file's top level, a build
 * body) goes through st__lua_pcall: a message handler captures the
 * traceback at the point of the error (the stack is gone once lua_pcall
 * returns), the message itself stays "file:line: message" for the client,
 * and the traceback goes to the log at debug level.
 *
 * The contract of each non-static function (what it does, returns and owns)
 * is its comment in pcall.h; all of them run on the thread that owns the
 * lua_State they are given.
 */
#include "lua/pcall.h"
#include "lua/state.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"

static char traceback_key;    /* registry: traceback of the last error */

int st__lua_has_position(const char *msg) {
  /* "<chunk>:<digits>:" somewhere on the first line */
  for (const char *p = msg; *p && *p != '\n'; p++) {
    if (*p != ':' || !isdigit((unsigned char)p[1])) continue;
    const char *q = p + 1;
    while (isdigit((unsigned char)*q)) q++;
    if (*q == ':' && p > msg) return 1;
  }
  return 0;
}

/* Message handler: turns the error value into a string with a position,
 * stores a traceback in the registry and returns the message. */
static int l_handler(lua_State *L) {
  /* stack: err */
  const char *msg = lua_tostring(L, 1);
  const st__lua_ctx_t *c = st__lua_ctx(L);
  char stop[160];
  if (c && c->stop && !(msg && strstr(msg, st__lua_stop_message(c, stop, sizeof stop)))) {
    /* A stop the allocator raised arrives as LuaJIT's "not enough
     * memory": every stop reads as what it is (its position is added
     * below). */
    lua_pushstring(L, stop);                  /* err, msg */
    msg = lua_tostring(L, -1);
  } else if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) {
      msg = lua_tostring(L, -1);              /* err, str */
    } else {
      msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
  }
  if (!st__lua_has_position(msg)) {
    char where[256];
    st__lua_where(L, where, sizeof where);
    if (strcmp(where, "?") != 0) msg = lua_pushfstring(L, "%s: %s", where, msg);
  }
  /* stack: err, ..., msg */
  lua_pushlightuserdata(L, &traceback_key);
  luaL_traceback(L, L, msg, 1);               /* ..., msg, key, tb */
  lua_rawset(L, LUA_REGISTRYINDEX);           /* ..., msg */
  return 1;
}

int st__lua_pcall(lua_State *L, int nargs, int nresults, char *err, size_t errlen) {
  int base = lua_gettop(L) - nargs;           /* index of the function */
  lua_pushcfunction(L, l_handler);
  lua_insert(L, base);                        /* handler, f, args... */
  /* The allocator may refuse only inside the protected call (guard.h). */
  st__lua_ctx_t *c = st__lua_ctx(L);
  int guarded = c ? c->guarded : 0;
  if (c) c->guarded = 1;
  int status = lua_pcall(L, nargs, nresults, base);
  if (c) c->guarded = guarded;
  lua_remove(L, base);                        /* results... | msg */
  if (status == 0) return 0;

  const char *msg = lua_tostring(L, -1);
  char stop[160];
  /* LuaJIT calls no message handler for a memory error: a stop the
   * allocator raised (guard.h) reads as what it is here, without a
   * position. */
  if (status == LUA_ERRMEM && c && c->stop) msg = st__lua_stop_message(c, stop, sizeof stop);
  else if (status == LUA_ERRMEM) msg = "not enough memory for the Lua state";
  else if (!msg) msg = "(error object is not a string)";
  if (err) snprintf(err, errlen, "%s", msg);
  if (st__log_enabled(ST_LOG_DEBUG)) {
    lua_pushlightuserdata(L, &traceback_key);
    lua_rawget(L, LUA_REGISTRYINDEX);         /* msg, tb */
    const char *tb = lua_tostring(L, -1);
    st__log(ST_LOG_DEBUG, "lua", "%s", tb ? tb : msg);
    lua_pop(L, 1);                            /* msg */
  }
  lua_pop(L, 1);                              /* (empty) */
  lua_pushlightuserdata(L, &traceback_key);
  lua_pushnil(L);
  lua_rawset(L, LUA_REGISTRYINDEX);
  return status;
}
