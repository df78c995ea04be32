/* src/engine: THE list of endpoint options (docs/endpoints.md, "Options"):
 * the keys of st.endpoint{...} besides name, doc, params and build. Each
 * X(...) entry declares one option once; from it come its field in
 * st__endpoint_decl_t (generation.h), its parsing and validation
 * (src/lua/decl.c), its entry in every map of the `endpoints` method
 * (src/server/describe.c), the FLAGS column of `stcli endpoints` (from
 * what `endpoints` sends) and its place in `stserver --check`.
 *
 * Adding an option: one X(...) line here, the code that acts on the new
 * field, and its row in docs/endpoints.md. A new kind of value (a new
 * ST_OPT_* type) also needs its reader in src/lua/decl.c and its packing,
 * text and default test in engine/options.c.
 *
 *   X(name, field, ctype, type, dflt, choices, implies, description)
 *
 *   name         the option as written in st.endpoint{...} (an identifier)
 *   field        the st__endpoint_decl_t member that holds its value
 *   ctype        that member's C type: ENUM and BOOL an int-sized type,
 *                SECONDS double, the string types char * (owned, NULL = unset)
 *   type         ST_OPT_ENUM       one word of `choices`; the value is its index
 *                ST_OPT_BOOL       true or false
 *                ST_OPT_SECONDS    a number of seconds > 0; 0 = none
 *                ST_OPT_STRING     any string
 *                ST_OPT_DEVICE     "cpu", "cuda" or "cuda:N"
 *                ST_OPT_KEY_FORMAT a string whose every {name} is a parameter
 *   dflt         the value when the option is not given (a number: ENUM the
 *                index, BOOL 0/1, SECONDS 0; the string types have none)
 *   choices      ENUM: the words, "a|b", in the order of the C enum; else NULL
 *   implies      NULL, or a BOOL option that a value of this one sets to true
 *                (declaring that one false as well is an error)
 *   description  one line
 */
#ifndef ST_ENGINE_ENDPOINT_OPTIONS_H
#define ST_ENGINE_ENDPOINT_OPTIONS_H

#define ST__ENDPOINT_OPTIONS(X)                                                                \
  X(execution, execution, st__execution_t, ST_OPT_ENUM, 0, "direct|task", NULL,                \
    "direct: the call replies when the body is done; task: a call runs as a task")             \
  X(concurrency, concurrency, st__concurrency_t, ST_OPT_ENUM, 0, "parallel|serialized", NULL,  \
    "serialized: one build of the endpoint at a time, the others wait in a queue")             \
  X(managed, managed, int, ST_OPT_BOOL, 0, NULL, NULL,                                         \
    "the server keeps the result as an object and gives each caller a lease")                  \
  X(cache, cache, int, ST_OPT_BOOL, 0, NULL, NULL,                                             \
    "reuse the result of earlier calls with the same key")                                     \
  X(cache_format_key, cache_format_key, char *, ST_OPT_KEY_FORMAT, 0, NULL, "cache",           \
    "the cache key, e.g. \"linear:{input_dim}\"; implies cache = true")                        \
  X(singleflight, singleflight, int, ST_OPT_BOOL, 0, NULL, NULL,                               \
    "concurrent calls with the same key share one build")                                      \
  X(timeout, timeout_s, double, ST_OPT_SECONDS, 0, NULL, NULL,                                 \
    "the body is stopped with TIMEOUT after this many seconds")                                \
  X(device, device, char *, ST_OPT_DEVICE, 0, NULL, NULL,                                      \
    "where the body builds by default; none: the config's default_device")                     \
  X(ipc, ipc, st__ipc_t, ST_OPT_ENUM, 0, "vmm|legacy", NULL,                                   \
    "CUDA sharing mode of the results (legacy: cudaIpcMemHandle_t, opt-in)")                   \
  X(readonly, readonly, int, ST_OPT_BOOL, 0, NULL, NULL,                                       \
    "clients map the objects it makes read-only (docs/keys.md, section 5)")

#endif
