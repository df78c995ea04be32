/* src/lua/zerobranch.h: the built-in "st.zerobranch" module of zero-branch
 * scripts (zerobranch.c; docs/zero-branch.md). */
#ifndef ST_LUA_ZEROBRANCH_H
#define ST_LUA_ZEROBRANCH_H

#include "lua/state.h"

/* [-0, +1] Pushes the sandbox's built-in "st.zerobranch" module: `app()`
 * gives an object whose :endpoint(decl) is st.endpoint(decl) and also
 * records decl as one of the file's declarations, whose :main(fn) checks
 * fn, marks the state (st__lua_main_reached) and raises to end the file's
 * top level, and whose :role() is "server". */
void st__lua_push_zerobranch(lua_State *L);

/* Nonzero when the file being run reached app:main: its top level raised
 * to stop there, and the file counts as run to the end (returning
 * nothing). Cleared by st__lua_file_decls. */
int st__lua_main_reached(lua_State *L);

/* [-0, +1] st__lua_decl_list for the value a file returned (at idx), with
 * the declarations its app:endpoint calls recorded: a file that returned
 * nothing and declared endpoints that way gives those. Takes the recorded
 * list (the next file starts empty). Returns the count, or -1 with a
 * message pushed. */
int st__lua_file_decls(lua_State *L, int idx);

#endif
