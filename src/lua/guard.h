/* src/lua/guard.h: the limits of running Lua code (guard.c): a state whose
 * allocator counts every byte and refuses past a cap, the count hook that
 * enforces a time limit and a cancel flag, and st__lua_run, which runs one
 * function under all three. Endpoint bodies (vm.c) and a file's top level
 * (vm.c, loader.c, config_load.c) run through these.
 *
 * How a limit stops Lua code:
 *  - memory: the allocator of a state made with a limit (LuaJIT's own,
 *    wrapped so that it counts) refuses a growth past ctx->mem_limit while a
 *    protected call of st__lua_pcall runs (never outside one: an
 *    unprotected allocation failure would panic the state). LuaJIT then
 *    raises "not enough memory" and ctx->stop says ST_ERR_OUT_OF_MEMORY.
 *    The overshoot is zero: the state never holds more than the cap,
 *    except ST__LUA_MEM_RESERVE bytes granted once it stopped, so that the
 *    error can unwind and be formatted.
 *  - time and cancel: the count hook checks every ST__LUA_HOOK_COUNT
 *    instructions; the allocator checks too (every ST__LUA_CLOCK_BYTES
 *    bytes allocated, or one allocation of that size), so that a few
 *    instructions that each allocate a lot (s = s .. s) cannot outrun the
 *    deadline by more than the time to allocate and copy that much.
 *  - the sandbox's pcall/xpcall re-raise a stop, so Lua code cannot
 *    swallow it (sandbox.c).
 * The JIT engine is off in every sandboxed state (sandbox.c): compiled
 * traces would skip the hook. The allocator does not depend on it.
 *
 * Threads: a state and its context are used by one thread at a time.
 */
#ifndef ST_LUA_GUARD_H
#define ST_LUA_GUARD_H

#include "lua/state.h"

/* Bytes a stopped call may still allocate past the cap to unwind (error
 * messages, the traceback). */
#define ST__LUA_MEM_RESERVE ((size_t)1 << 20)

/* Bytes allocated between two checks of the deadline by the allocator. */
#define ST__LUA_CLOCK_BYTES ((size_t)1 << 20)

/* Creates a bare state (luaL_newstate). With ctx->mem_limit set, its
 * allocator is wrapped by one that counts into ctx (mem_used, mem_peak:
 * every byte the state holds, exactly as LuaJIT counts them) and enforces
 * the limit; such a state must be closed with st__lua_close. Without a
 * limit nothing is counted. NULL when out of memory. ctx is borrowed and
 * must outlive the state; the caller registers it (st__lua_set_ctx). */
lua_State *st__lua_newstate(st__lua_ctx_t *ctx);

/* Closes a state made by st__lua_newstate (NULL: nothing), handing LuaJIT
 * back its own allocator first so that it releases all its memory. */
void st__lua_close(lua_State *L);

/* Arms the count hook: a limit (seconds, 0 = none) and a cancel flag (may
 * be NULL) for the next call into Lua; clears ctx->stop and the recorded
 * failure of the tensor context. In ST__LUA_LOAD states a line hook also
 * tracks ctx->main_line (st.endpoint needs it when it is tail-called:
 * `return st.endpoint{...}` leaves no caller frame to ask).
 * st__lua_disarm removes the hooks. */
void st__lua_arm(lua_State *L, double limit_s, const volatile int *cancel);
void st__lua_disarm(lua_State *L);

/* [-(nargs+1), +nresults or +0] Runs the function below the nargs
 * arguments through st__lua_pcall under a time limit (seconds, 0 = none),
 * a cancel flag (may be NULL) and the state's memory cap. Returns ST_OK
 * with the results on the stack, or with nothing on the stack:
 *   ST_ERR_TIMEOUT        past limit_s ("file:line: timed out after 5 s")
 *   ST_ERR_CANCELLED      *cancel became nonzero
 *   ST_ERR_OUT_OF_MEMORY  the state reached its cap (or malloc failed)
 *   ST_ERR_ENDPOINT       any other error the code raised
 * with the message, "file:line: ..." where Lua had a position, in err.
 * ctx->stop tells the stops apart afterwards as well. The thread that owns
 * L. The primitive for running any Lua chunk under a time and memory
 * limit. */
int st__lua_run(lua_State *L, int nargs, int nresults, double limit_s,
                const volatile int *cancel, char *err, size_t errlen);

#endif
