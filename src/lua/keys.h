/* src/lua/keys.h: st.key, a published key read by an endpoint (keys.c). */
#ifndef ST_LUA_KEYS_H
#define ST_LUA_KEYS_H

#include "lua/state.h"

/* Adds st.key to the st table at idx. */
void st__lua_open_keys(lua_State *L, int idx);

#endif
