/* src/server: ids of what a connection's client holds, sent in full once
 * (docs/protocol.md, "Arenas sent once" and "Objects sent once"). A
 * client whose hello lists the feature receives the thing in full once;
 * the reply says that the server remembers it did (`kept`, `object_kept`),
 * and later replies on the same connection name it by id alone ({ref: id},
 * `same`) until the client says in a request (`unmapped`, `objects_freed`)
 * that it let it go. The set holds ids only (arena and object ids are never
 * reused in a server's life) and no reference: naming an id sends nothing
 * the client does not hold already. Two sets per connection (conn.h):
 * arenas and objects. Loop thread only.
 */
#ifndef ST_SERVER_KEPT_H
#define ST_SERVER_KEPT_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

/* Ids one connection's client holds; at most this many, later ones always
 * travel in full. */
#define ST_KEPTSET_MAX 4096

typedef struct st__keptset {
  int on;                     /* the client's hello asked for the feature */
  uint64_t *slots;            /* open-addressed set of ids; 0: free       */
  size_t cap, n;
} st__keptset_t;

/* A hello: the set starts empty, on when the client asked for the feature
 * (`asked`). Loop thread. */
void st__keptset_start(st__keptset_t *s, int asked);

/* 1 when the client was sent `id` in full with the reply's mark and has
 * not said since that it let it go: a reply names it by id alone. */
int st__keptset_has(const st__keptset_t *s, uint64_t id);

/* Remembers that the reply being queued sends `id` in full and marks it.
 * Returns 1, or 0 when the set is off, full (ST_KEPTSET_MAX) or memory is
 * short: then the reply does not mark it and it travels in full each
 * time. */
int st__keptset_add(st__keptset_t *s, uint64_t id);

/* Drops the ids params[key] names (params may be NULL; unknown ids are
 * ignored). ST_OK, or ST_ERR_INVALID_ARGUMENT with the reason in err when
 * it is not an array of integers >= 1 (nothing dropped then; `noun` names
 * them in the message). */
int st__keptset_drop_listed(st__keptset_t *s, const msgpack_object *params, const char *key,
                          const char *noun, char *err, size_t errlen);

/* Forgets every id and turns the set off (the close). */
void st__keptset_clear(st__keptset_t *s);

#endif
