/* src/server: the arenas a connection's client keeps mapped
 * (docs/protocol.md, "Arenas sent once"). A client whose hello lists the
 * feature "arena_refs" receives an object's arena with a descriptor once;
 * the reply's `kept` says the server remembers that it did, and later
 * replies on the same connection name the arena by id alone ({ref: id})
 * until the client says in a request's `unmapped` that it let the mapping
 * go. The set holds arena ids only (never reused in a server's life) and
 * no reference: naming an id sends nothing the client does not hold
 * already. One set per connection (conn.h); loop thread only.
 */
#ifndef ST_SERVER_ARENA_REFS_H
#define ST_SERVER_ARENA_REFS_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

/* Arena ids one connection's client received with a descriptor and keeps
 * mapped; at most this many, later ones always travel with their
 * descriptor. */
#define ST_ARENA_REFS_MAX 4096

typedef struct st__arena_refs {
  int on;                     /* the client's hello asked for "arena_refs" */
  uint64_t *slots;            /* open-addressed set of arena ids; 0: free  */
  size_t cap, n;
} st__arena_refs_t;

/* hello's `features` (may be NULL): "arena_refs" turns the rule on; any
 * hello starts with an empty set. ST_OK, or ST_ERR_INVALID_ARGUMENT with
 * the reason in err when features is not an array of strings (the set is
 * left as it was). */
int st__arena_refs_hello(st__arena_refs_t *s, const msgpack_object *features, char *err,
                         size_t errlen);

/* 1 when the client was sent arena `arena_id` with `kept` and has not said
 * since that it unmapped it: a reply names it by id alone. */
int st__arena_refs_sent(const st__arena_refs_t *s, uint64_t arena_id);

/* Remembers that the reply being queued sends `arena_id` with its
 * descriptor and lists it in `kept`. Returns 1, or 0 when the rule is off,
 * the set is full (ST_ARENA_REFS_MAX) or memory is short: then the reply
 * does not list it and it travels with a descriptor each time. */
int st__arena_refs_keep(st__arena_refs_t *s, uint64_t arena_id);

/* Drops the ids params.unmapped names (params may be NULL; unknown ids are
 * ignored). ST_OK, or ST_ERR_INVALID_ARGUMENT with the reason in err when
 * it is not an array of integers >= 1 (nothing dropped then). */
int st__arena_refs_unmapped(st__arena_refs_t *s, const msgpack_object *params, char *err,
                            size_t errlen);

/* Forgets every id and turns the rule off (a hello, or the close). */
void st__arena_refs_clear(st__arena_refs_t *s);

#endif
