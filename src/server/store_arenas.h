/* src/server: the arenas published state keeps across restarts
 * (restart.c), one entry per allocation, numbered: the entry's number n
 * names its descriptor in the fd store ("st-arena-<n>") and its ARENA
 * record in the journal.
 *
 * One allocation may be several arena objects: a client that puts the
 * same allocation twice sends the same descriptor twice, and each put
 * imports it as an arena of its own. The service manager keeps one
 * descriptor per open file (systemd drops a second descriptor of a file
 * it holds), so the entry is per allocation: a memory file is known by its
 * device and inode (st__arena_file_id), a CUDA allocation's descriptor by
 * its open file (kcmp), and every arena object of it is an alias of the
 * entry, each counting the kept things (key versions, live pages,
 * buffers) that hold it. An entry keeps a descriptor only for a CUDA
 * allocation (to compare the next one with).
 *
 * Ownership: the table owns its entries; it holds no arena reference
 * (the kept things do, and release their alias before they let go).
 * Loop thread.
 */
#ifndef ST_SERVER_STORE_ARENAS_H
#define ST_SERVER_STORE_ARENAS_H

#include <stdint.h>

#include "engine/smap.h"
#include "mem/arena.h"

typedef struct st__stored_arena st__stored_arena_t;

typedef struct st__store_arenas {
  st__smap_t by_arena;        /* arena object (its address) -> entry       */
  st__smap_t by_file;         /* memory file (device, inode) -> entry      */
  st__smap_t by_number;       /* decimal number -> entry                   */
  uint64_t next;              /* the number the next entry gets            */
} st__store_arenas_t;

void st__store_arenas_init(st__store_arenas_t *t);

/* Frees every entry (the store is not told). */
void st__store_arenas_clear(st__store_arenas_t *t);

/* The entry of arena a, or of the allocation a is another arena object
 * of; NULL when none. */
st__stored_arena_t *st__store_arenas_find(st__store_arenas_t *t, const st__arena_t *a);

/* A new entry of allocation a, numbered n (0: the next number; the next
 * number passes n), holding nothing yet; NULL when out of memory or out
 * of descriptors (a CUDA allocation's). */
st__stored_arena_t *st__store_arenas_add(st__store_arenas_t *t, const st__arena_t *a,
                                         uint64_t n);

/* Entry e is held once more through arena object a (an alias of e from
 * now on). ST_OK or OUT_OF_MEMORY (nothing changed). */
int st__store_arenas_hold(st__store_arenas_t *t, st__stored_arena_t *e, const st__arena_t *a);

/* One hold through arena object a less (a is no alias any more when that
 * was its last). Returns a's entry when that was the entry's last hold
 * (the caller then drops it: st__store_arenas_drop), else NULL. */
st__stored_arena_t *st__store_arenas_release(st__store_arenas_t *t, const st__arena_t *a);

/* Frees entry e (held by nothing). */
void st__store_arenas_drop(st__store_arenas_t *t, st__stored_arena_t *e);

/* The number of entry e; an arena object of it (valid while it is held). */
uint64_t st__stored_arena_number(const st__stored_arena_t *e);
const st__arena_t *st__stored_arena_any(const st__stored_arena_t *e);

/* The number of the entry arena object a is held through; 0: none. */
uint64_t st__store_arenas_number_of(st__store_arenas_t *t, const st__arena_t *a);

/* The entry numbered n, or NULL. */
st__stored_arena_t *st__store_arenas_by_number(st__store_arenas_t *t, uint64_t n);

/* fn(e, ud) for every entry, in no particular order; fn must not add or
 * drop entries. */
void st__store_arenas_each(st__store_arenas_t *t, void (*fn)(st__stored_arena_t *e, void *ud),
                           void *ud);

#endif
