/* src/lua: declarations shared by the files of this module only. Everything
 * here may use Lua types; nothing outside src/lua includes this header.
 *
 * Files:
 *   sandbox.c      states, the allow-listed environment, strict globals,
 *                  read-only library proxies, safe load/require/print/pcall,
 *                  the count hook that enforces time limits and cancel
 *   pcall.c        the one protected-call wrapper (adds a traceback)
 *   stlib.c        the `st` module table: endpoint, required, cancelled,
 *                  sleep, progress, array; declaration lists of a file
 *   tensor.c       tensor userdata and its methods (geometry, views)
 *   tensor_ops.c   tensor methods that touch data (fill, copies, to, get,
 *                  set, tolist) on either device
 *   device.c       devices of a call: parsing "cpu"/"cuda"/"cuda:N", the
 *                  worker's CUDA stream per device, copies between devices,
 *                  the synchronization before a call completes
 *   construct.c    st.empty/zeros/ones/full/arange/rand/randn
 *   module.c       st.module: several tensors packed in one arena
 *   value.c        msgpack <-> Lua, result serialization
 *   decl.c         validation of one st.endpoint{...} table
 *   loader.c       st__generation_load
 *   vm.c           worker states: st__vm_new/build/free
 *   config_load.c  st__settings_load (config.lua by a settings schema)
 *   zerobranch.c   the built-in "st.zerobranch" module of zero-branch
 *                  scripts (app:endpoint, app:main, app:role)
 *
 * Threads: a lua_State is used by one thread at a time; nothing here keeps
 * global mutable state (registry keys are addresses of static chars).
 */
#ifndef ST_LUA_INT_H
#define ST_LUA_INT_H

#include <lauxlib.h>
#include <lua.h>
#include <msgpack.h>
#include <stdint.h>

#include "engine/generation.h"
#include "engine/result.h"
#include "lua/st_lua.h"
#include "mem/arena.h"
#include "st/dtype.h"
#include "st/errors.h"
#include "st/wire.h"

/* How long a file's top level (config.lua, an endpoint file) may run while
 * it is loaded: a file that loops forever is a load error, not a hang. */
#define ST__LUA_LOAD_LIMIT_S 10.0

/* Instructions between two checks of the deadline and the cancel flag. */
#define ST__LUA_HOOK_COUNT 1000

typedef enum {
  ST__LUA_CONFIG = 0,    /* config.lua: no st module */
  ST__LUA_LOAD,          /* validation of endpoint files (loop thread) */
  ST__LUA_VM             /* a worker's state */
} st__lua_mode_t;

/* Per-state context, reachable from every C function of the state. */
typedef struct st__lua_ctx {
  st__lua_mode_t mode;
  const char *who;                 /* log name ("lua") */
  double deadline;                 /* monotonic seconds; 0 = none */
  double limit_s;                  /* the limit, for messages */
  const volatile int *cancel;      /* may be NULL; read with atomic loads */
  st__progress_t *progress;        /* st.progress goes here; may be NULL */
  int stop;                        /* 0, ST_ERR_TIMEOUT or ST_ERR_CANCELLED */
  int alloc_err;                   /* last arena failure of the current call */
  char alloc_msg[256];
  uint64_t gc_debt;                /* arena bytes made since the last full GC */
  int main_line;                   /* ST__LUA_LOAD: last line run by a main chunk */
  const char *src_text;            /* ST__LUA_LOAD: the file being run (borrowed) */
  size_t src_len;
  /* Devices (device.c). Set by st__lua_state_new to the CPU; a worker's
   * st__vm_build sets them for each call. */
  int in_call;                     /* a build body runs: CUDA is allowed */
  int device;                      /* where constructors build by default:
                                      ST__DEV_CPU or a CUDA ordinal */
  int cuda_device;                 /* what "cuda" means (the socket's CUDA
                                      device); -1: none */
  uint64_t cuda_used;              /* bit N: the call queued work on cuda:N */
  int cuda_legacy;                 /* the call's endpoint has ipc = "legacy":
                                      its CUDA arenas are legacy IPC ones */
  /* Tensor arguments of the current call (engine/targs.h): the arenas
   * mapped from the client's descriptors, borrowed from the job while the
   * body runs; tensor values of the arguments index them. */
  st__arena_t *const *arg_arenas;
  size_t narg_arenas;
} st__lua_ctx_t;

/* The CPU, as a device number; CUDA devices are their ordinals (>= 0). */
#define ST__DEV_CPU (-1)
/* CUDA ordinals a call may use (bits of cuda_used). */
#define ST__DEV_MAX 64

/* ------------------------------------------------------------ sandbox.c */

/* Creates a state with the JIT engine off, the sandbox environment as its
 * globals and, unless mode is ST__LUA_CONFIG, the st module. `ctx` is
 * borrowed and must outlive the state. NULL when out of memory. */
lua_State *st__lua_state_new(st__lua_ctx_t *ctx);

/* The context of a state (never NULL for states made above). */
st__lua_ctx_t *st__lua_ctx(lua_State *L);

/* Monotonic clock in seconds. */
double st__lua_now(void);

/* Arms the count hook: a limit (seconds, 0 = none) and a cancel flag (may
 * be NULL) for the next call into Lua; clears ctx->stop and alloc_err. In
 * ST__LUA_LOAD states a line hook also tracks ctx->main_line (st.endpoint
 * needs it when it is tail-called: `return st.endpoint{...}` leaves no
 * caller frame to ask). st__lua_disarm removes the hooks. */
void st__lua_arm(lua_State *L, double limit_s, const volatile int *cancel);
void st__lua_disarm(lua_State *L);

/* Raises the stop error if the deadline passed or cancel is set (sets
 * ctx->stop); returns otherwise. Used by the hook and st.sleep. */
void st__lua_check_stop(lua_State *L);

/* Nonzero once the cancel flag of the running call is set (an atomic
 * load; 0 when there is no flag). */
int st__lua_cancel_requested(const st__lua_ctx_t *c);

/* Raises an error "where: message" where `where` is the innermost Lua
 * frame (C functions called through pcall or metamethods still report the
 * endpoint's file:line). Never returns. */
int st__lua_raise(lua_State *L, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));

/* Writes "file:line" of the innermost Lua frame into buf ("?" if none). */
void st__lua_where(lua_State *L, char *buf, size_t len);

/* [-0, +1] Pushes a read-only proxy of the table at idx: reads go to the
 * table, writes raise, the metatable is hidden, rawset refuses it. */
void st__lua_push_readonly(lua_State *L, int idx);

/* ------------------------------------------------------------ device.c */

typedef struct st__ltensor st__ltensor_t;    /* tensor.c, below */

/* Parses the device value at idx for function fn: nil gives the call's
 * default (ctx->device), "cpu" ST__DEV_CPU, "cuda" the socket's CUDA
 * device, "cuda:N" N. Raises for anything else, and for a CUDA device
 * this process cannot use (recorded as ST_ERR_CAPABILITY with
 * "no CUDA device: cuda:N is unavailable: <reason>", so the call fails
 * with CAPABILITY),
 * and for CUDA outside a build body. */
int st__lua_device_arg(lua_State *L, int idx, const char *fn);

/* Raises (CAPABILITY, as above) unless `device` is the CPU or a CUDA
 * device this process can use inside the running call. */
void st__lua_device_check(lua_State *L, int device, const char *fn);

/* "cpu" or "cuda:N" into buf. Returns buf. */
const char *st__lua_device_name(int device, char *buf, size_t len);

/* The calling worker thread's stream on CUDA device `ordinal` (a CUstream,
 * created the first time and kept for the life of the thread), with the
 * device's primary context made current, and the device marked as used
 * by the running call: st__vm_build synchronizes every used stream before
 * the call completes (DESIGN §3, decision 5). Work queued on it by the
 * body needs no synchronization of its own. Raises (CAPABILITY or
 * INTERNAL) when the stream cannot be made. */
void *st__lua_cuda_stream(lua_State *L, int ordinal);

/* Waits for every stream the running call used (ctx->cuda_used), then
 * clears the mask. ST_OK, or the first failure with a message in err. */
int st__lua_cuda_sync_used(lua_State *L, char *err, size_t errlen);

/* Waits for the calling thread's stream on `ordinal`, if it has one
 * (before an arena that queued work may touch is released). Never
 * raises. */
void st__lua_cuda_quiesce(int ordinal);

/* Raises for a failed CUDA step (kernels.h or cuda.h status rc with its
 * message), recording rc so that the call fails with that code. */
int st__lua_cuda_fail(lua_State *L, int rc, const char *fn, const char *msg)
    __attribute__((noreturn));

/* Copies `bytes` between two addresses of the same or different devices
 * (ST__DEV_CPU: host memory, e.g. a CPU arena; N: a device address of
 * cuda:N), in order with the call's earlier work, and returns when the
 * destination holds the bytes. Copies between two CUDA devices go
 * through host memory. Raises on failure. */
void st__lua_transfer(lua_State *L, void *dst, int dst_dev, const void *src, int src_dev,
                      uint64_t bytes, const char *fn);

/* What st__lua_cuda_generate writes into a contiguous CUDA tensor (the
 * same values the CPU loops of construct.c write). */
typedef enum {
  ST__GEN_FILL = 0,                /* a */
  ST__GEN_ARANGE,                  /* a + i*b */
  ST__GEN_RAND,                    /* uniform of `seed` */
  ST__GEN_RANDN                    /* normal of `seed` */
} st__lua_gen_t;

/* Runs the matching kernel (src/cuda/kernels.h) over every element of the
 * contiguous CUDA tensor t on the worker's stream. Raises on failure. */
void st__lua_cuda_generate(lua_State *L, const st__ltensor_t *t, st__lua_gen_t kind, double a,
                           double b, uint64_t seed, const char *fn);

/* Stores v in every element of the CUDA tensor t (any strides). */
void st__lua_cuda_fill(lua_State *L, const st__ltensor_t *t, double v, const char *fn);
/* x * mul + add in place on a CUDA tensor (st__cuda_affine_strided). */
void st__lua_cuda_affine(lua_State *L, const st__ltensor_t *t, double mul, double add,
                         const char *fn);

/* Copies src into dst, both on the same CUDA device, with casts and any
 * strides (the elements must not overlap). Raises on failure. */
void st__lua_cuda_copy(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                       const char *fn);

/* Nonzero when s is a device name ("cpu", "cuda", "cuda:N"). */
int st__lua_is_device_name(const char *s);

/* ------------------------------------------------------------ pcall.c */

/* [-(nargs+1), +nresults or +0] Calls the function below the nargs
 * arguments with a message handler that records a traceback. On success
 * returns 0 with the results on the stack. On failure returns the Lua
 * status, leaves nothing on the stack, copies the message (prefixed with
 * file:line when it had no position) into err and logs the traceback at
 * debug level. */
int st__lua_pcall(lua_State *L, int nargs, int nresults, char *err, size_t errlen);

/* Nonzero when msg starts with a "chunk:line:" position. */
int st__lua_has_position(const char *msg);

/* ------------------------------------------------------------ stlib.c */

/* [-0, +1] Pushes the read-only st module (built on first use). */
void st__lua_push_st(lua_State *L);

/* [-0, +1] Pushes the st.required sentinel. */
void st__lua_push_required(lua_State *L);

/* Nonzero if the value at idx is st.required. */
int st__lua_is_required(lua_State *L, int idx);

/* Nonzero when the value at idx was made by st.tensor_param{...}; then
 * *dtype is its st_dtype_t (-1: any) and *device an st__tensor_device_t
 * (engine/generation.h). */
int st__lua_is_tensor_param(lua_State *L, int idx, int *dtype, int *device);

/* [-0, +1] Normalizes what an endpoint file returned (at idx): one
 * st.endpoint{...} or an array of them. Pushes an array of declaration
 * tables and returns its length, or pushes an error message and returns -1. */
int st__lua_decl_list(lua_State *L, int idx);

/* Line of the st.endpoint{...} call that made the table at idx (0 if it
 * was not made by st.endpoint). */
int st__lua_decl_line(lua_State *L, int idx);

/* Records the table at idx as a declaration made at `line`, as
 * st.endpoint{...} does (zerobranch.c's app:endpoint). The st module must
 * exist (st__lua_push_st). */
void st__lua_decl_mark(lua_State *L, int idx, int line);

/* ------------------------------------------------------------ zerobranch.c */

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

/* [-0, +1] Pushes the marker metatable of tables that serialize as arrays
 * even when empty. */
void st__lua_push_array_mt(lua_State *L);

/* ------------------------------------------------------------ tensor.c */

typedef struct st__ltensor {
  st__arena_t *arena;              /* owned reference (NULL only while built) */
  uint64_t offset;                 /* bytes from the arena start to element 0 */
  st_dtype_t dtype;
  int ndim;
  int64_t shape[ST_MAX_NDIM];
  int64_t strides[ST_MAX_NDIM];    /* in elements, >= 0 */
} st__ltensor_t;

/* Registers the tensor metatable; called once per state. */
void st__lua_open_tensor(lua_State *L);

/* [-0, +1] Pushes a tensor userdata with no arena yet (the caller fills
 * every field; arena takes a reference the tensor owns). */
st__ltensor_t *st__lua_push_tensor(lua_State *L);

/* [-0, +1] Pushes a new contiguous, zero-filled tensor in its own arena
 * on device `device` (ST__DEV_CPU or a CUDA ordinal; see device.c).
 * Raises on a bad shape, an unusable device or when the arena cannot be
 * made. st__lua_new_tensor builds on the call's default device
 * (ctx->device). */
st__ltensor_t *st__lua_new_tensor_on(lua_State *L, int device, st_dtype_t dtype, int ndim,
                                     const int64_t *shape);
st__ltensor_t *st__lua_new_tensor(lua_State *L, st_dtype_t dtype, int ndim,
                                  const int64_t *shape);

/* [-0, +1] Pushes a view: a new userdata sharing t's arena (one more ref)
 * with the given geometry. `t` is borrowed. */
st__ltensor_t *st__lua_push_view(lua_State *L, const st__ltensor_t *t, uint64_t offset,
                                 int ndim, const int64_t *shape, const int64_t *strides);

/* The tensor at idx, or NULL if the value is not one. */
st__ltensor_t *st__lua_totensor(lua_State *L, int idx);

/* The tensor at idx; raises "fn: expected a tensor" otherwise. */
st__ltensor_t *st__lua_check_tensor(lua_State *L, int idx, const char *fn);

/* Creates a zero-filled arena of `bytes` on `device` for the current
 * state (st__arena_new_cpu, or on a CUDA device st__arena_new_cuda, or
 * st__arena_new_cuda_legacy when ctx->cuda_legacy); on failure records the
 * error in the context (so that st__vm_build returns OUT_OF_MEMORY, LIMIT
 * or CAPABILITY) and raises. Runs a full GC first when many arena bytes
 * were made since the last one (Lua's collector does not see arena
 * memory). The caller owns the reference. st__lua_new_arena is
 * st__lua_new_arena_on the CPU. */
st__arena_t *st__lua_new_arena_on(lua_State *L, int device, uint64_t bytes);
st__arena_t *st__lua_new_arena(lua_State *L, uint64_t bytes);

/* Drops an arena reference held by a userdata (its __gc): waits first for
 * this thread's stream on the arena's device, so that memory a queued
 * kernel still writes is never unmapped under it. NULL is a no-op. */
void st__lua_arena_release(st__arena_t *a);

int64_t st__ltensor_numel(const st__ltensor_t *t);
int st__ltensor_is_contiguous(const st__ltensor_t *t);
/* Device of the tensor's arena: ST__DEV_CPU or a CUDA ordinal. */
int st__ltensor_device(const st__ltensor_t *t);
/* Address of element 0 (a device address for a CUDA tensor). */
char *st__ltensor_data(const st__ltensor_t *t);
/* Fills row-major contiguous strides for t's shape. */
void st__ltensor_set_contiguous(st__ltensor_t *t);
/* Copies src into dst element by element (same shape; casts). Both on
 * the CPU; dst and src must not overlap. */
void st__ltensor_copy(const st__ltensor_t *dst, const st__ltensor_t *src);
/* Stores v in every element of t (on the CPU; any strides). */
void st__ltensor_fill_cpu(const st__ltensor_t *t, double v);
/* Every element x of a CPU tensor becomes x * mul + add (in double, then
 * stored as st_dtype_store does; the same bytes as the CUDA kernel). */
void st__ltensor_affine_cpu(const st__ltensor_t *t, double mul, double add);
/* Copies t (on the CPU) into dst_base (contiguous, t's dtype). */
void st__ltensor_pack(void *dst_base, const st__ltensor_t *t);

/* Copies src into dst (same shape; casts; any strides), on whichever
 * devices they live: CPU loops, CUDA kernels on the worker's stream, or
 * transfers through contiguous temporaries (collected by the GC). dst and
 * src may share an arena. Leaves the stack as it found it. Raises on
 * failure (fn names the method in messages). */
void st__lua_tensor_copy(lua_State *L, const st__ltensor_t *dst, const st__ltensor_t *src,
                         const char *fn);

/* Stores v in every element of t (any strides, either device). */
void st__lua_tensor_fill(lua_State *L, const st__ltensor_t *t, double v, const char *fn);

/* Opens the data methods of tensor_ops.c into the method table at idx. */
void st__lua_open_tensor_ops(lua_State *L, int idx);

/* Reads an integral Lua number at idx for argument checks; raises
 * "fn: what must be an integer" otherwise. */
int64_t st__lua_check_int(lua_State *L, int idx, const char *fn, const char *what);

/* Converts a double to int64 when it is integral and in range. */
int st__lua_num_to_int(double d, int64_t *out);

/* ------------------------------------------------------------ construct.c */

/* Adds st.empty, zeros, ones, full, arange, rand, randn to the table at
 * idx. */
void st__lua_open_construct(lua_State *L, int idx);

/* ------------------------------------------------------------ module.c */

typedef struct st__lmodule {
  st__arena_t *arena;              /* owned reference */
  size_t ntensors;
} st__lmodule_t;

/* The module's environment table holds these slots. */
#define ST__MODULE_NAMES    1      /* array of names, in order */
#define ST__MODULE_TENSORS  2      /* name -> tensor (a view in the arena) */
#define ST__MODULE_METADATA 3      /* table or absent */

void st__lua_open_module(lua_State *L, int idx);
st__lmodule_t *st__lua_tomodule(lua_State *L, int idx);

/* ------------------------------------------------------------ value.c */

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

/* ------------------------------------------------------------ decl.c */

/* Validates the declaration table at idx (made by st.endpoint at
 * file:line) into *out (zeroed first; on errors everything is freed again
 * and the problems are in errs). Returns the number of errors added. */
int st__lua_decl_parse(lua_State *L, int idx, const char *file, int line,
                       st__endpoint_decl_t *out, st__errlist_t *errs);

/* Frees what a declaration owns (not the struct). */
void st__lua_decl_free(st__endpoint_decl_t *d);

/* 64-bit FNV-1a, continued from h (start with ST__FNV_OFFSET). */
#define ST__FNV_OFFSET 0xcbf29ce484222325ull
uint64_t st__lua_fnv1a(uint64_t h, const void *data, size_t len);

/* ------------------------------------------------------------ safetensors.c */

/* Adds st.load_safetensors to the st table at idx; call after
 * st__lua_open_module (it keeps st.module as an upvalue). */
void st__lua_open_safetensors(lua_State *L, int idx);

#endif
