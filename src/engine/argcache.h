/* src/engine: the argument cache of tensor arguments (docs/pool.md, section 4;
 * docs/protocol.md, "Tensor arguments").
 *
 * A source (st__targ_src_t) is one client allocation as the server received
 * it: the description and descriptor of its first request, then, once a
 * worker imported it (an mmap, or for CUDA the descriptor kept after an
 * fstat: mem/arena.h), the imported arena. It is imported at most once,
 * whichever request's worker gets there first: the requests that name it
 * and the connection's cache each hold a reference, and the last one
 * closes the descriptor or drops the arena.
 *
 * The cache (st__argcache_t) is one connection's table of sources by the
 * client's id for them (`arg_id`), least recently used last. It knows no
 * limits: the connection decides when to put and what to evict
 * (src/server/argcache.c). Nothing in it crosses connections.
 *
 * Threads: a source's reference count and import are thread-safe (loop
 * thread and workers); a cache belongs to its connection's loop thread.
 */
#ifndef ST_ENGINE_ARGCACHE_H
#define ST_ENGINE_ARGCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "mem/arena.h"
#include "proto/proto.h"

typedef struct st__targ_src st__targ_src_t;

/* A new source for arena `d` received as `fd` (ownership moves to the
 * source; closed on failure too), holding one reference. NULL when out of
 * memory. Any thread. */
st__targ_src_t *st__targ_src_new(const st__arena_desc_t *d, int fd);

/* Reference counting; the last unref closes the descriptor or drops the
 * imported arena. NULL is a no-op for unref. Any thread. */
void st__targ_src_ref(st__targ_src_t *s);
void st__targ_src_unref(st__targ_src_t *s);

/* The description the source was received with (borrowed). Any thread. */
const st__arena_desc_t *st__targ_src_desc(const st__targ_src_t *s);

/* Nonzero once an import of the source failed (it never succeeds later).
 * Any thread. */
int st__targ_src_failed(const st__targ_src_t *s);

/* The imported arena with one more reference in *out (owned by the
 * caller): imported here on first use (st__arena_import), reused after.
 * ST_OK, or the import's failure (the same one for every later caller)
 * with its reason in err. Worker thread (a CUDA import talks to the
 * driver). */
int st__targ_src_import(st__targ_src_t *s, st__arena_t **out, char *err, size_t errlen);

typedef struct st__argcache_entry st__argcache_entry_t;

typedef struct st__argcache {
  st__argcache_entry_t **buckets;  /* chains by arg_id; NULL until the first put */
  size_t nbuckets;
  size_t n;                        /* entries */
  st__argcache_entry_t *mru, *lru; /* use order, most recent first */
} st__argcache_t;

/* The source cached under arg_id (borrowed; the cache keeps its
 * reference), marked most recently used; NULL when there is none. */
st__targ_src_t *st__argcache_get(st__argcache_t *c, uint64_t arg_id);

/* Caches s under arg_id with a reference of its own, most recently used,
 * in place of what the id named before. ST_OK or ST_ERR_OUT_OF_MEMORY
 * (nothing changed). */
int st__argcache_put(st__argcache_t *c, uint64_t arg_id, st__targ_src_t *s);

/* Drops the entry of arg_id. Returns 1 when there was one, else 0. */
int st__argcache_forget(st__argcache_t *c, uint64_t arg_id);

/* Drops the least recently used entry. Returns 1 when there was one. */
int st__argcache_evict_lru(st__argcache_t *c);

/* Drops every entry and frees the table; *c is empty afterwards. */
void st__argcache_clear(st__argcache_t *c);

#endif
