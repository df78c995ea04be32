/* src/lua/sandbox.h: sandboxed states (sandbox.c; docs/endpoints.md,
 * "Sandbox"). Their limits (memory, time, cancel) are guard.h's. */
#ifndef ST_LUA_SANDBOX_H
#define ST_LUA_SANDBOX_H

#include "lua/guard.h"
#include "lua/state.h"

/* Creates a state (st__lua_newstate: with ctx->mem_limit set, its memory
 * is counted and capped) with the JIT engine off, the sandbox environment
 * as its globals and, unless mode is ST__LUA_CONFIG, the st module. `ctx`
 * is borrowed and must outlive the state; its tensor context is reset to
 * the CPU. NULL when out of memory. Close it with st__lua_close. */
lua_State *st__lua_state_new(st__lua_ctx_t *ctx);

#endif
