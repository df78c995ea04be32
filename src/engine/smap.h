/* src/engine: a small hash map from byte strings to pointers, used for the
 * loop thread's indexes (objects and tasks by id, the cache, flights of
 * singleflight builds, the queues of serialized endpoints).
 *
 * Keys are copied; values are borrowed (the map never frees them).
 * Chained buckets, doubled when the map holds more entries than buckets.
 * Not thread-safe: each map belongs to one thread (the loop thread).
 */
#ifndef ST_ENGINE_SMAP_H
#define ST_ENGINE_SMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct st__smap_node {
  struct st__smap_node *next;
  uint64_t hash;
  void *value;
  size_t len;
  char key[];                 /* len bytes, then a NUL */
} st__smap_node_t;

typedef struct st__smap {
  st__smap_node_t **buckets;
  size_t nbuckets;            /* 0 or a power of two */
  size_t count;
} st__smap_t;

/* An empty map (no allocation until the first put). */
void st__smap_init(st__smap_t *m);

/* Frees the nodes (not the values); the map is empty and reusable. */
void st__smap_clear(st__smap_t *m);

/* The value stored under key, or NULL. */
void *st__smap_get(const st__smap_t *m, const void *key, size_t len);

/* Stores value under key, replacing an earlier value. ST_OK or
 * ST_ERR_OUT_OF_MEMORY (the map is unchanged then). */
int st__smap_put(st__smap_t *m, const void *key, size_t len, void *value);

/* Removes key; returns its value, or NULL when it was absent. */
void *st__smap_del(st__smap_t *m, const void *key, size_t len);

/* Calls fn(key, len, value, ud) for every entry, in no particular order.
 * fn must not change the map. */
void st__smap_each(const st__smap_t *m,
                   void (*fn)(const char *key, size_t len, void *value, void *ud), void *ud);

/* Keys for 64-bit ids: the 8 bytes of the id. */
#define ST__ID_KEY(idp) (const void *)(idp), sizeof(uint64_t)

#endif
