/* src/lua: the only module that includes lua.h. This header is its face to
 * the rest of the server and has no Lua types in it.
 *
 *  - st__settings_load:   runs a configuration file (config.lua) in a
 *                         sandbox and reads the table it returns into a
 *                         struct by the rows of a settings schema.
 *  - st__generation_load: loads endpoints/NAME.lua, validates every
 *                         declaration, and produces a generation.
 *  - st__vm_*:            one worker's Lua state for one generation; runs
 *                         endpoint bodies and turns what they return into a
 *                         build result (msgpack value + arenas).
 *
 * Sandbox (docs/endpoints.md): endpoint code sees an allow-list of globals
 * (assert error ipairs next pairs pcall xpcall select tonumber tostring type
 * unpack rawequal rawget rawset rawlen setmetatable getmetatable string
 * (without dump) table math bit os.{time,clock,date} load (text only, in the
 * sandbox) require ("st" and "st.zerobranch" only) print (to the server
 * log) and st);
 * no io, os.execute, os.exit, ffi, debug, jit, package, dofile, loadfile,
 * loadstring, string.dump, and reading or assigning an undeclared global is
 * an error.
 */
#ifndef ST_LUA_H
#define ST_LUA_H

#include <stddef.h>
#include <stdint.h>

#include "common/settings.h"
#include "engine/generation.h"
#include "engine/job.h"
#include "engine/workers.h"
#include "engine/result.h"

/* Runs the configuration file at `path` (sandboxed, no st module, under
 * the load time limit) and reads the table it returns into *obj by
 * `rows` (common/settings.h), over obj's current values. Every key is
 * checked and every problem is reported in errs, as "path: key: message"
 * ("path: limits.max_inflight: expected an integer in 1..1048576, got 0")
 * or "path:line: message" for a Lua error. Returns ST_OK, or
 * ST_ERR_CONFIGURATION (obj may then hold some of the new values). The
 * thread that calls it, at start. */
int st__settings_load(const char *path, const st__setting_t *rows, void *obj,
                      st__errlist_t *errs);

/* How st__generation_load runs the files' top levels. */
typedef struct st__load_opts {
  double limit_s;                 /* a file's top level may run this long; 0:
                                     ST__LUA_LOAD_LIMIT_S (10 s) */
  const volatile int *cancel;     /* may be NULL; nonzero (atomic load): stop
                                     the file running now, the load fails */
} st__load_opts_t;

/* Loads every "*.lua" file of `dir` (sorted by name, not recursive), or
 * `dir` itself when it names a regular file. Each must return one
 * st.endpoint{...} or an array of them, or declare its endpoints with
 * require("st.zerobranch").app():endpoint{...} and return nothing. Every problem is
 * reported in errs as "file:line: message": a syntax or runtime error, an
 * unknown option, a wrong type, a bad enum value, a cache_format_key naming
 * no parameter, a duplicate endpoint name (naming both files), a top level
 * that ran past opts->limit_s ("file:line: timed out after 0.5 s (a
 * file's top level may run at most 0.5 s: endpoint_load_timeout_s)").
 * `opts` (NULL: the defaults) is borrowed; the generation remembers the
 * limit, and workers compile its sources under the same one. On success
 * *out holds one reference. Returns ST_OK or ST_ERR_CONFIGURATION (then
 * *out is NULL and nothing leaks). Any thread (the server loads on a
 * loader thread of its own, reload.c); touches no global state and never
 * runs a build body. */
int st__generation_load(const char *dir, uint64_t number, const st__load_opts_t *opts,
                        st__generation_t **out, st__errlist_t *errs);

typedef struct st__vm st__vm_t;

/* Creates a sandboxed state that has compiled every source of `gen` and
 * keeps a reference to gen. `worker_id` only names the state in logs.
 * `limits` (copied; NULL: none): the cap of the state's Lua memory, which
 * the top level of each file runs under too, and the timeout of endpoints
 * that declare none. ST_OK, or ST_ERR_CONFIGURATION / ST_ERR_OUT_OF_MEMORY
 * with a reason. Called on the worker thread that will use it. */
int st__vm_new(st__generation_t *gen, int worker_id, const st__vm_limits_t *limits,
               st__vm_t **out, char *err, size_t errlen);

/* Closes the state and drops its generation reference. NULL ok. */
void st__vm_free(st__vm_t *vm);

/* Borrowed: the generation this state was built from. */
st__generation_t *st__vm_generation(const st__vm_t *vm);

/* Where the next st__vm_build builds by default: `device` is -1 (the CPU)
 * or a CUDA ordinal, `cuda_device` the ordinal that "cuda" names in the
 * body (the CUDA device of the socket the call came in on; -1: none). A
 * new state builds on the CPU. The server resolved and checked both
 * (docs/endpoints.md, "Devices"). Worker thread that owns vm. */
void st__vm_set_device(st__vm_t *vm, int device, int cuda_device);

/* The workers' per-job hook (engine/workers.h): st__vm_set_device with the
 * job's devices, and the job's mapped tensor arguments (job->targs,
 * borrowed until the next st__vm_build returns) for the arguments' tensor
 * values. Worker thread that owns vm. */
void st__vm_prepare(st__vm_t *vm, const st__job_t *job);

/* Runs the build body of `ep` (a declaration of this vm's generation) with
 * `args`, the msgpack map of bound arguments (every parameter present).
 * On success fills *res (initialised here; the caller destroys it).
 * Errors, each with a message in err:
 *   ST_ERR_ENDPOINT       the body raised ("file:line: message")
 *   ST_ERR_SERIALIZATION  it returned something that cannot be sent
 *                         (function, userdata, cycle, nesting > 32, a key
 *                         that is not a string or integer)
 *   ST_ERR_OUT_OF_MEMORY  an arena could not be allocated, or the state's
 *                         Lua memory reached limits.lua_memory_bytes (the
 *                         state is then collected, and rebuilt when the
 *                         garbage was not what filled it)
 *   ST_ERR_LIMIT          an arena above max_object_bytes
 *   ST_ERR_CAPABILITY     a CUDA device this process cannot use
 *   ST_ERR_INTERNAL       a CUDA kernel or copy failed
 *   ST_ERR_TIMEOUT        the body ran past ep->timeout_s (or, when it
 *                         is 0, past the limits' default_timeout_s)
 *   ST_ERR_CANCELLED      *cancel became nonzero while it ran
 * `cancel` may be NULL; it is read with atomic loads. `progress` (may be
 * NULL) receives what the body reports with st.progress(fraction, note).
 * Work the body queued on CUDA streams is complete when this returns.
 * The state stays usable after any error. */
int st__vm_build(st__vm_t *vm, const st__endpoint_decl_t *ep, const char *args, size_t args_len,
                 const volatile int *cancel, st__progress_t *progress, st__build_result_t *res,
                 char *err, size_t errlen);

#endif
