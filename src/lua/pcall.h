/* src/lua/pcall.h: the one protected-call wrapper (pcall.c). */
#ifndef ST_LUA_PCALL_H
#define ST_LUA_PCALL_H

#include <stddef.h>

#include <lua.h>

/* [-(nargs+1), +nresults or +0] Calls the function below the nargs
 * arguments with a message handler that records a traceback. On success
 * returns 0 with the results on the stack. On failure returns the Lua
 * status, leaves nothing on the stack, copies the message (prefixed with
 * file:line when it had no position) into err and logs the traceback at
 * debug level. */
int st__lua_pcall(lua_State *L, int nargs, int nresults, char *err, size_t errlen);

/* Nonzero when msg starts with a "chunk:line:" position. */
int st__lua_has_position(const char *msg);

#endif
