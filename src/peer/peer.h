/* src/peer: the server-to-server channel (docs/multihost.md, "Peers and
 * the channel"). Servers that name each other in config.lua's `peer`
 * table talk msgpack-RPC (src/proto's framing) over TLS 1.3 (tls.h) on
 * TCP: a listener (peer.listen, off by default) and outgoing links to the
 * peers that have an address, re-dialled with backoff. After TLS both
 * sides send `peer_hello` (server id, peer protocol, engines with their
 * versions); a link is up once each accepted the other's. Only methods
 * named peer_* are served on a link; anything else closes it. No
 * descriptor ever travels on it.
 *
 * The rest of the server adds methods (st__peer_method_add), sends
 * requests to a peer by id (st__peer_request) and hears of links coming
 * up and going down (st__peer_on_state). Nothing here knows the server:
 * it is given a libev loop, its configuration and the engines list.
 *
 * Threads: the channel's watchers run on the loop given to st__peer_start
 * (the server's loop 0, whose callbacks run with the write side of the
 * server lock). Every function below may be called from any thread that
 * holds what serializes that loop's callbacks (the server lock's write
 * side); output queued from another thread is sent by the channel's loop
 * after an ev_async wake-up. Handlers and callbacks run on the channel's
 * loop thread.
 */
#ifndef ST_PEER_PEER_H
#define ST_PEER_PEER_H

#include <ev.h>
#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The peer protocol this build speaks (peer_hello's `protocol`). */
#define ST__PEER_PROTOCOL 2
/* Configured peers, exported globs, engines at most. */
#define ST__PEER_MAX_PEERS 64
#define ST__PEER_MAX_EXPORT 64
#define ST__PEER_MAX_ENGINES 8
/* Bytes of an engine's device list in peer_hello (space-separated UUIDs). */
#define ST__PEER_DEVICES_MAX 1024
/* The largest frame either way on a link; a larger one closes it. */
#define ST__PEER_MAX_FRAME (4u << 20)
/* Accepted connections not yet identified by a hello, at once. */
#define ST__PEER_MAX_PENDING 32
/* Plaintext queued for one link at most; past it the link is closed. */
#define ST__PEER_MAX_QUEUED (64u << 20)
/* Longest peer id. */
#define ST__PEER_ID_MAX 255

/* One entry of peer.peers. */
typedef struct st__peer_entry {
  char *id;                   /* owned: the name in config.lua            */
  char *addr;                 /* owned "host:port", NULL: accept-only     */
  int64_t as_uid;             /* the local uid pushes from it land under;
                                 -1: none (pushes from it are refused)    */
} st__peer_entry_t;

/* config.lua's `peer` table (docs/operations.md, "Peers"). Filled by
 * server/config.c's rows; plain data. */
typedef struct st__peer_conf {
  char *id;                   /* owned: this server's id (default: the
                                 host name)                               */
  char *listen;               /* owned "host:port" or NULL (no listener)  */
  char *secret;               /* owned: the cluster key file, or NULL     */
  char *tls_cert, *tls_key, *tls_ca;   /* owned, or NULL                  */
  int npeers;
  st__peer_entry_t peers[ST__PEER_MAX_PEERS];
  int nexport;
  char *exports[ST__PEER_MAX_EXPORT];  /* owned globs of exported keys    */
  int max_transfers_per_peer;
  int live_staged;            /* live_reads: 0 "fenced", 1 "staged"       */
  uint64_t max_bytes_in_flight_per_peer;
  double transfer_timeout_s;
  double connect_timeout_s;   /* TCP connect, TLS and hello of one link   */
  char *ucx_library, *nccl_library;    /* owned paths, or NULL: by soname */
} st__peer_conf_t;

/* One transfer engine as this server reports it in peer_hello: its name,
 * its version (NULL: unavailable), why it is unavailable, and for an
 * engine that needs a device of its own on each side (NCCL: one rank per
 * GPU) the UUIDs of this server's devices, space-separated (NULL: none
 * named). */
typedef struct st__peer_engine {
  const char *name;
  const char *version;
  const char *why;
  const char *devices;
} st__peer_engine_t;

typedef enum {
  ST__PEER_DOWN = 0,          /* no link, none being made                 */
  ST__PEER_CONNECTING,        /* TCP connect in progress                  */
  ST__PEER_HANDSHAKE,         /* TLS or hello in progress                 */
  ST__PEER_UP,                /* a link is up: requests may be sent       */
  ST__PEER_REFUSED            /* the last attempt was refused (TLS, hello) */
} st__peer_state_t;

/* "down", "connecting", "handshake", "up", "refused". */
const char *st__peer_state_name(st__peer_state_t s);

typedef struct st__peer st__peer_t;

/* A request that came in on a link, for a handler: who sent it, and what
 * st__peer_reply needs to answer it, now or later (copy `ticket`; the
 * other fields are borrowed for the handler's call only). */
typedef struct st__peer_ticket {
  uint64_t link;              /* the link's serial: a reply after it closed
                                 is dropped                               */
  uint32_t id;                /* the request id                            */
} st__peer_ticket_t;

typedef struct st__peer_req {
  st__peer_ticket_t ticket;
  const char *peer;           /* the sender's peer id                      */
  const char *method;         /* NUL-terminated                            */
  const msgpack_object *params;   /* the request's named-parameter map, or
                                     NULL for []                           */
} st__peer_req_t;

/* A method handler: answers req with st__peer_reply / st__peer_reply_error
 * (at once or later, once). ud as given to st__peer_method_add. */
typedef void (*st__peer_method_fn)(st__peer_t *p, const st__peer_req_t *req, void *ud);

/* The outcome of st__peer_request, called once: code ST_OK with the
 * result (borrowed for the call), or an error code and message: the
 * remote's error (its code and message), ST_ERR_TIMEOUT, ST_ERR_IO (the
 * link closed before the answer), ST_ERR_SHUTTING_DOWN (the channel
 * stopped). */
typedef void (*st__peer_reply_fn)(void *ud, const char *peer, int code, const char *message,
                                  const msgpack_object *result);

/* A peer's state changed (why: the reason for DOWN and REFUSED, else ""). */
typedef void (*st__peer_state_fn)(void *ud, const char *peer, st__peer_state_t state,
                                  const char *why);

/* Checks conf without opening anything: ids, addresses, and (when a
 * listener or peers are configured) that TLS loads with the key file or
 * certificates. ST_OK, or the first problem in err naming the key of
 * config.lua (ST_ERR_CONFIGURATION, ST_ERR_CAPABILITY when OpenSSL is
 * missing). `owner`: the uid the key file must belong to. Any thread. */
int st__peer_check(const st__peer_conf_t *conf, uid_t owner, char *err, size_t errlen);

/* Whether conf asks for the channel at all (a listener or a peer). */
int st__peer_configured(const st__peer_conf_t *conf);

/* Starts the channel on loop: the listener (when peer.listen is set) and
 * the dials of the peers that have an address. conf is borrowed and must
 * outlive the channel; engines (n of them) are copied. ST_OK with *out
 * (NULL when conf configures nothing: no channel, nothing opened), or the
 * error in err (the same as st__peer_check's, or the bind's). The thread
 * that calls it becomes the channel's loop thread. */
int st__peer_start(struct ev_loop *loop, const st__peer_conf_t *conf,
                   const st__peer_engine_t *engines, size_t n, st__peer_t **out, char *err,
                   size_t errlen);

/* Closes every link (pending requests fail with SHUTTING_DOWN) and the
 * listener, and frees the channel. NULL is fine. Loop thread. */
void st__peer_stop(st__peer_t *p);

/* Replaces the engines this server reports (copied); links made from now
 * on compare them. */
int st__peer_set_engines(st__peer_t *p, const st__peer_engine_t *engines, size_t n);

/* Adds the handler of method `name` (which must begin with "peer_"; copied).
 * ST_OK, ST_ERR_INVALID_ARGUMENT (a name without the prefix, or taken),
 * ST_ERR_LIMIT (64 methods). */
int st__peer_method_add(st__peer_t *p, const char *name, st__peer_method_fn fn, void *ud);

/* Sends request `method` (a peer_* name) with params (the packed msgpack
 * of the request's params array, e.g. [{key: ...}]; copied) to peer `peer`
 * on its link that is up. ST_OK: cb will be called exactly once, never
 * before this returns (reply, remote error, timeout_s passed, link
 * closed, channel stopped; the request is sent from the channel's loop
 * after a wake-up), and
 * *handle (may be NULL) names the request for st__peer_cancel. Else an
 * error and cb is never called: ST_ERR_NOT_FOUND (no such peer),
 * ST_ERR_CAPABILITY (no link up to it; err says its state and last
 * error), ST_ERR_INVALID_ARGUMENT, ST_ERR_LIMIT (frame too large),
 * ST_ERR_OUT_OF_MEMORY. */
int st__peer_request(st__peer_t *p, const char *peer, const char *method, const void *params,
                     size_t params_len, double timeout_s, st__peer_reply_fn cb, void *ud,
                     uint64_t *handle, char *err, size_t errlen);

/* Forgets request `handle`: its callback is not called. 1 when it was
 * pending, 0 otherwise. */
int st__peer_cancel(st__peer_t *p, uint64_t handle);

/* Answers a request with a result: `result` is the packed msgpack of one
 * value (copied). Dropped when the link is gone (0), else 1. */
int st__peer_reply(st__peer_t *p, st__peer_ticket_t t, const void *result, size_t len);
/* Answers a request with an error (code: a negative ST_ERR_*). */
int st__peer_reply_error(st__peer_t *p, st__peer_ticket_t t, int code, const char *message);

/* Sets the one listener of state changes (NULL: none). */
void st__peer_on_state(st__peer_t *p, st__peer_state_fn fn, void *ud);

/* A peer's state; ST__PEER_DOWN for an unknown id. */
st__peer_state_t st__peer_state(const st__peer_t *p, const char *peer);

/* Whether engine `engine` may be used with `peer`: 1, or 0 with the reason
 * in why (the link is not up, one side lacks it, the versions differ
 * naming both). */
int st__peer_engine_usable(const st__peer_t *p, const char *peer, const char *engine, char *why,
                           size_t whylen);

/* The `peers` method's result: one map per configured peer (sorted by
 * id): {id, addr, state, engines, since, rtt_us, last_error, link, as_uid}
 * (docs/protocol.md, "peers"). p NULL: the peers of conf, all down. */
void st__peer_pack_peers(msgpack_packer *pk, const st__peer_t *p, const st__peer_conf_t *conf);

/* info's `peer` map: {id, listen, auth, tls, peers, links_up, refused,
 * last_refused}. p NULL: the channel is off. */
void st__peer_pack_info(msgpack_packer *pk, const st__peer_t *p, const st__peer_conf_t *conf);

/* The address the listener is bound to ("127.0.0.1:40123"), or NULL. */
const char *st__peer_listen_address(const st__peer_t *p);

#endif
