/* src/engine: one generation of endpoints, as the loop thread sees it.
 *
 * A generation is what one load of the endpoints directory produced: the
 * validated declarations (plain C, no Lua) and the source text of every
 * file. Workers compile that same text into their own lua_State, so every
 * worker runs exactly the code that was validated, whatever happens on disk
 * afterwards. A generation is immutable once loaded and reference-counted:
 * in-flight jobs hold it, so a reload never frees code that still runs.
 *
 * Threads: loaded on any one thread (st__generation_load lives in src/lua;
 * the server loads on a loader thread and hands the result to the loop
 * thread); immutable afterwards, read from any thread; ref/unref are
 * atomic.
 */
#ifndef ST_ENGINE_GENERATION_H
#define ST_ENGINE_GENERATION_H

#include <stddef.h>
#include <stdint.h>

#include "common/log.h"
#include "engine/endpoint_options.h"

/* The values of the ENUM options, in the order of their choices
 * (endpoint_options.h). */
typedef enum { ST_EXEC_DIRECT = 0, ST_EXEC_TASK = 1 } st__execution_t;
typedef enum { ST_CONC_PARALLEL = 0, ST_CONC_SERIALIZED = 1 } st__concurrency_t;
typedef enum { ST_IPC_VMM = 0, ST_IPC_LEGACY = 1 } st__ipc_t;

/* Type of a parameter, taken from its default value. A call argument must
 * have the same type (an integer is accepted for a NUMBER parameter);
 * ANY accepts everything (a required parameter, or default nil). */
typedef enum {
  ST_PARAM_ANY = 0,
  ST_PARAM_BOOL,
  ST_PARAM_INTEGER,
  ST_PARAM_NUMBER,
  ST_PARAM_STRING,
  ST_PARAM_TABLE,
  ST_PARAM_TENSOR             /* st.tensor_param{...}: a tensor argument */
} st__param_type_t;

/* Where a TENSOR parameter's tensor must live. */
typedef enum { ST_TDEV_ANY = 0, ST_TDEV_CPU = 1, ST_TDEV_CUDA = 2 } st__tensor_device_t;

typedef struct st__param {
  char *name;                 /* owned */
  int required;               /* no default: the caller must pass it */
  st__param_type_t type;
  char *default_mp;           /* owned msgpack bytes of the default (NULL if required) */
  size_t default_len;
  int tensor_dtype;           /* TENSOR: the st_dtype_t it must have, -1 any */
  st__tensor_device_t tensor_device;   /* TENSOR: where it must live */
} st__param_t;

/* One member per endpoint option (engine/endpoint_options.h), named and
 * typed there: execution, concurrency, managed, cache (effective: true
 * also when a cache_format_key is set), cache_format_key (owned, may be
 * NULL), singleflight, timeout_s (0: no limit), device (owned: "cpu",
 * "cuda", "cuda:N", or NULL = the config's default_device), ipc. */
#define ST__OPTION_FIELD(name, field, ctype, type, dflt, choices, implies, desc) ctype field;

typedef struct st__endpoint_decl {
  char *name;                 /* owned */
  char *file;                 /* owned, path as loaded */
  int line;                   /* line of the st.endpoint{...} call */
  char *doc;                  /* owned, may be NULL */
  ST__ENDPOINT_OPTIONS(ST__OPTION_FIELD)
  size_t nparams;
  st__param_t *params;        /* owned, sorted by name */
  uint64_t fingerprint;       /* hash of the declaration and its file's text:
                                 a reload keeps caches of unchanged endpoints */
} st__endpoint_decl_t;

typedef struct st__source {
  char *path;                 /* owned */
  char *text;                 /* owned, NUL-terminated */
  size_t len;
} st__source_t;

typedef struct st__generation {
  int refs;                   /* atomic */
  uint64_t number;            /* 1 for the first load, +1 per reload */
  double loaded_at;           /* unix time */
  double load_limit_s;        /* a file's top level may run this long (> 0) */
  char *dir;                  /* owned */
  size_t nendpoints;
  st__endpoint_decl_t *endpoints;  /* owned, sorted by name */
  size_t nsources;
  st__source_t *sources;      /* owned, sorted by path */
} st__generation_t;

/* Error list filled by loaders: each entry "file:line: message". */
typedef struct st__errlist {
  size_t count;
  char **items;               /* owned */
} st__errlist_t;

void st__errlist_add(st__errlist_t *l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void st__errlist_clear(st__errlist_t *l);
/* All entries joined with "\n"; owned string (free) or NULL if empty. */
char *st__errlist_join(const st__errlist_t *l);

/* Logs each entry as one line of `level` from `who`. */
void st__errlist_log(const st__errlist_t *l, st__log_level_t level, const char *who);

/* The endpoint names of g, "a, b, c", into out (cut with "..." when they
 * do not fit cap bytes); "" for NULL. */
void st__generation_names(const st__generation_t *g, char *out, size_t cap);

void st__generation_ref(st__generation_t *g);
void st__generation_unref(st__generation_t *g);   /* frees at zero */

/* Compares the C string a with the blen bytes at b (not NUL-terminated,
 * any bytes: wire names): memcmp over the common prefix, then the shorter
 * first, so names without NUL order as strcmp orders them. Any thread. */
int st__name_cmp(const char *a, const char *b, size_t blen);

/* Endpoint by name (binary search), or NULL. Borrowed. */
const st__endpoint_decl_t *st__generation_find(const st__generation_t *g, const char *name,
                                               size_t len);

#endif
