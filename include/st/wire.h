/* sharedtensor: wire constants. docs/protocol.md is the specification; this
 * header only names its numbers so that the server and every client agree.
 */
#ifndef ST_WIRE_H
#define ST_WIRE_H

#ifdef __cplusplus
extern "C" {
#endif

#define ST_VERSION_STRING "0.1.0"

/* Bumped on any incompatible change of docs/protocol.md. */
#define ST_PROTOCOL_VERSION 1

/* msgpack-RPC message types: the first element of every message array. */
#define ST_MSG_REQUEST      0   /* [0, id, method, params]  */
#define ST_MSG_RESPONSE     1   /* [1, id, error, result]    */
#define ST_MSG_NOTIFICATION 2   /* [2, method, params]       */

/* msgpack ext types used inside values. The payload of each is itself one
 * msgpack map (see docs/protocol.md, "Values"). */
#define ST_EXT_TENSOR 1
#define ST_EXT_MODULE 2

/* Socket base: sockets live at "<base>-<device index>.sock". The
 * environment variable names the base (a --base-path flag or the config
 * file overrides the environment). Without any of them the base is the
 * first of these that fits (docs/operations.md, "Where the socket is"):
 *   "$XDG_RUNTIME_DIR/" ST_XDG_BASE_PATH   (a user's own server)
 *   ST_RUN_BASE_PATH                       (root, or a systemd service
 *                                           with RuntimeDirectory=sharedtensor)
 *   ST_DEFAULT_BASE_PATH                   (the fallback)
 * A server takes the first it can use; a client the first where a socket
 * of its device exists. */
#define ST_XDG_BASE_PATH     "sharedtensor/st"
#define ST_RUN_BASE_PATH     "/run/sharedtensor/st"
#define ST_DEFAULT_BASE_PATH "/tmp/shared-tensor"
#define ST_ENV_BASE_PATH     "SHARED_TENSOR_BASE_PATH"

/* Default limits (config.lua can change each; docs/operations.md). */
#define ST_DEFAULT_MAX_MESSAGE_BYTES  (16u << 20)  /* one incoming frame   */
#define ST_DEFAULT_MAX_CONNECTIONS    1024
#define ST_DEFAULT_MAX_INFLIGHT       64           /* per connection       */
#define ST_DEFAULT_FRAME_TIMEOUT_MS   10000        /* half-sent frame      */
#define ST_DEFAULT_MAX_OBJECT_BYTES   0ull         /* 0: memory_budget bounds it */
#define ST_MAX_DEPTH                  32           /* value nesting        */
#define ST_MAX_NDIM                   16
/* Linux caps one SCM_RIGHTS message at 253 descriptors (SCM_MAX_FD). */
#define ST_MAX_FDS_PER_MESSAGE        253

#ifdef __cplusplus
}
#endif
#endif
