/* src/peer: host-name resolution off the loop thread. A peer's address
 * may be a name ("gpu-node-7:7400"); getaddrinfo on a name can wait for
 * DNS for seconds, which the channel's loop must never do. Each
 * resolution runs on a short-lived detached thread of its own; its answer
 * comes back to the loop through an ev_async and is handed to the owner's
 * callback there.
 *
 * Ownership: the resolver belongs to the loop thread that made it. A
 * thread still resolving when the resolver is freed finishes on its own
 * and drops its answer; the state both share is reference counted (the
 * resolver holds one reference, each running thread another), so neither
 * side frees what the other uses. Bounded by the caller: the channel asks
 * for at most one resolution per configured peer at a time.
 */
#ifndef ST_PEER_RESOLVE_H
#define ST_PEER_RESOLVE_H

#include <ev.h>
#include <netdb.h>
#include <stddef.h>
#include <stdint.h>

typedef struct st__resolver st__resolver_t;

/* An answer, on the loop thread: `res` (owned by the callee, to be freed
 * with freeaddrinfo; NULL on failure) or gai_error (a getaddrinfo error,
 * EAI_SYSTEM with errno's value in sys_errno). */
typedef void (*st__resolved_fn)(void *ctx, uint64_t tag, struct addrinfo *res, int gai_error,
                                int sys_errno);

/* A resolver on `loop` whose answers go to fn(ctx, ...). ST_OK or
 * ST_ERR_OUT_OF_MEMORY. Loop thread. */
int st__resolver_new(struct ev_loop *loop, st__resolved_fn fn, void *ctx, st__resolver_t **out);

/* Resolves host:port (numeric port; SOCK_STREAM) on a thread of its own;
 * the answer comes to the callback with `tag`, never before this returns.
 * ST_OK, or ST_ERR_OUT_OF_MEMORY / ST_ERR_INTERNAL (no thread) with the
 * reason in err. Loop thread. */
int st__resolver_start(st__resolver_t *r, const char *host, const char *port, uint64_t tag,
                       char *err, size_t errlen);

/* Stops the resolver: answers not yet delivered are dropped (their
 * threads finish and free them). NULL is a no-op. Loop thread. */
void st__resolver_free(st__resolver_t *r);

#endif
