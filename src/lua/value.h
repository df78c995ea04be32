/* src/lua/value.h: msgpack <-> Lua and result serialization (value.c). */
#ifndef ST_LUA_VALUE_H
#define ST_LUA_VALUE_H

#include <msgpack.h>

#include "engine/result.h"
#include "lua/state.h"

/* Packs the Lua value at idx. With res, tensors and modules are packed as
 * ext values and their arenas are added to res (references taken); with
 * res NULL they are refused (declaration defaults). Returns ST_OK or
 * ST_ERR_SERIALIZATION with a message naming where in the value the
 * problem is ("value.layers[2]: cannot serialize a function"). `root`
 * names the top of the value in messages. Does not raise. */
int st__lua_pack(lua_State *L, int idx, msgpack_packer *pk, st__build_result_t *res,
                 const char *root, char *err, size_t errlen);

/* [-0, +1] Pushes a msgpack object as a Lua value (arrays and maps become
 * tables; an empty array keeps the array marker). A tensor ext value
 * becomes a tensor on the call's argument arena it names
 * (ctx->arg_arenas); any other ext value, or a tensor that names no mapped
 * arena or does not fit it, pushes nothing and returns
 * ST_ERR_INVALID_ARGUMENT. May raise when out of memory. */
int st__lua_push_msgpack(lua_State *L, const msgpack_object *o, char *err, size_t errlen);

/* Binary values (msgpack bin): a full userdata of the bytes, st.bytes in
 * endpoint code (docs/endpoints.md, "Arguments as Lua values"). A bin
 * argument arrives as one and packs back as bin; a Lua string packs as
 * str. */

/* [-0, +1] Pushes a binary value of the n bytes at p. May raise when out
 * of memory. */
void st__lua_push_bytes(lua_State *L, const void *p, size_t n);

/* The bytes of the binary value at idx (*n their count), or NULL when it
 * is not one. */
const char *st__lua_tobytes(lua_State *L, int idx, size_t *n);

/* st.bytes(s): a binary value of the bytes of string s (a binary value
 * is returned as it is); raises for anything else. */
int st__lua_bytes(lua_State *L);

#endif
