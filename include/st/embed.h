/* sharedtensor: the server engine inside another process (libstembed).
 *
 * libstembed runs the same server as stserver (endpoint loader, worker
 * pool, Lua sandbox, cache, objects, tasks) in the calling process. Zero-
 * branch scripts use it (lua/st/zerobranch.lua, docs/zero-branch.md):
 *
 *  - st_embed_start: in-process. The server runs on a background thread
 *    with its own event loop, listening on a private socket in a fresh
 *    0700 directory; the caller talks to it with the normal client
 *    (libstclient) at st_embed_socket_path(). It installs no signal
 *    handler and logs at warn and above unless told otherwise.
 *  - st_embed_serve: the calling thread becomes the server, in the
 *    foreground, as stserver is: the usual socket, SIGTERM/SIGINT stop,
 *    SIGHUP reloads the endpoints.
 *
 * Errors are negative ST_ERR_* codes (st/errors.h) with a message in the
 * caller's buffer; nothing here aborts the host.
 */
#ifndef ST_EMBED_H
#define ST_EMBED_H

#include <stddef.h>

#include "st/api.h"
#include "st/errors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct st_embed st_embed_t;

/* What to serve and how. Zero-initialise, then set `endpoints`; every other
 * field has a default. Strings are borrowed for the duration of the call. */
typedef struct st_embed_options {
  const char *endpoints;   /* required: one endpoint file (such as a zero-
                              branch script) or a directory of them        */
  const char *config;      /* a config.lua to start from; NULL: the
                              built-in defaults (./config.lua is NOT read) */
  const char *base_path;   /* st_embed_serve: socket base (NULL: the
                              config's, else $SHARED_TENSOR_BASE_PATH, else
                              the first usable default, as for stserver:
                              st/wire.h). st_embed_start ignores it: its
                              socket is always private                     */
  int device;              /* the socket index served (what "cuda" means in
                              endpoints); -1: the config's devices ({0})   */
  int workers;             /* worker threads; 0: the config's (4)          */
  const char *log_level;   /* "error", "warn", "info" or "debug"; NULL:
                              "warn" for st_embed_start, the config's
                              ("info") for st_embed_serve. The log level is
                              process-wide, as the log (stderr) is         */
} st_embed_options_t;

/* Starts a server for opts->endpoints on a background thread of this
 * process, on a private socket in a new directory made with mkdtemp (mode
 * 0700, under $TMPDIR when it is short enough, else /tmp). Returns once it
 * answers, or failed: ST_OK and *out (owned by the caller: st_embed_stop),
 * or an error with *out NULL and the reason in err, e.g.
 * ST_ERR_CONFIGURATION with every problem of the endpoint files as
 * "file:line: message" lines. Blocks every signal in the threads it makes.
 * A server still running when the process exits (exit(), not _exit or a
 * fatal signal) is stopped by an atexit handler. Any thread. */
ST_API int st_embed_start(const st_embed_options_t *opts, st_embed_t **out, char *err,
                          size_t errlen);

/* The socket path of a started server (borrowed; valid until
 * st_embed_stop). Connect with st_client_connect(path, ...). */
ST_API const char *st_embed_socket_path(const st_embed_t *e);

/* Stops the server as SIGTERM stops stserver (no new calls, the calls in
 * flight finish within shutdown_grace_s), joins its thread, removes the
 * socket and its directory, and frees e. NULL is a no-op. Returns ST_OK,
 * or ST_ERR_IO when the directory could not be removed (something else
 * was put there). Any thread but the server's own, once per handle. */
ST_API int st_embed_stop(st_embed_t *e);

/* Runs the server in the calling thread until SIGTERM or SIGINT, as
 * stserver runs: libev's default loop, the signal watchers (SIGHUP
 * reloads the endpoints), logs on stderr. Returns ST_OK after a clean
 * shutdown, or an error when it could not start (the reason in err, and
 * in the log). Main thread of a process that serves and does nothing
 * else. */
ST_API int st_embed_serve(const st_embed_options_t *opts, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
