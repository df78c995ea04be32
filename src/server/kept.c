/* src/server: ids of what a connection's client holds (kept.h). Loop
 * thread only. */
#include <stdlib.h>

#include "server/kept.h"

#include "proto/proto.h"
#include "st/errors.h"

/* Slot of id in the open-addressed table (0 marks a free slot; arena
 * and object ids start at 1), or of the free slot where it would go. */
static size_t slot_of(const st__keptset_t *s, uint64_t id) {
  size_t mask = s->cap - 1;
  size_t i = (size_t)(id * 0x9e3779b97f4a7c15ull >> 20) & mask;
  while (s->slots[i] && s->slots[i] != id) i = (i + 1) & mask;
  return i;
}

/* See kept.h. Loop thread. */
int st__keptset_has(const st__keptset_t *s, uint64_t id) {
  if (!s->on || !s->n || id == 0) return 0;
  return s->slots[slot_of(s, id)] == id;
}

/* Doubles the table (at least 64 slots). 0, or -1 out of memory. */
static int grow(st__keptset_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  uint64_t *old = s->slots;
  size_t ocap = s->cap;
  s->slots = calloc(cap, sizeof *s->slots);
  if (!s->slots) {
    s->slots = old;
    return -1;
  }
  s->cap = cap;
  for (size_t i = 0; i < ocap; i++)
    if (old[i]) s->slots[slot_of(s, old[i])] = old[i];
  free(old);
  return 0;
}

/* See kept.h. Loop thread. */
int st__keptset_add(st__keptset_t *s, uint64_t id) {
  if (!s->on || id == 0) return 0;
  if (s->n && s->slots[slot_of(s, id)] == id) return 1;
  if (s->n >= ST_KEPTSET_MAX) return 0;
  if ((s->n + 1) * 2 > s->cap && grow(s) != 0) return 0;
  s->slots[slot_of(s, id)] = id;
  s->n++;
  return 1;
}

/* Removes id (linear probing: the entries after it that hashed before its
 * slot move back, so that every lookup still finds them). */
static void remove_id(st__keptset_t *s, uint64_t id) {
  if (!s->n || id == 0) return;
  size_t mask = s->cap - 1;
  size_t i = slot_of(s, id);
  if (s->slots[i] != id) return;
  s->slots[i] = 0;
  s->n--;
  for (size_t j = (i + 1) & mask; s->slots[j]; j = (j + 1) & mask) {
    uint64_t v = s->slots[j];
    s->slots[j] = 0;
    s->slots[slot_of(s, v)] = v;
  }
}

/* See kept.h. Loop thread. */
int st__keptset_drop_listed(st__keptset_t *s, const msgpack_object *params, const char *key,
                          const char *noun, char *err, size_t errlen) {
  const msgpack_object *u;
  int rc = st__map_get_ids(params, key, noun, &u, err, errlen);
  if (rc != ST_OK || !u) return rc;
  for (uint32_t i = 0; i < u->via.array.size; i++)
    remove_id(s, u->via.array.ptr[i].via.u64);
  return ST_OK;
}

/* See kept.h. Loop thread. */
void st__keptset_start(st__keptset_t *s, int asked) {
  /* A hello starts over: nothing was sent under what it asks for now. */
  st__keptset_clear(s);
  s->on = asked;
}

/* See kept.h. Loop thread. */
void st__keptset_clear(st__keptset_t *s) {
  free(s->slots);
  s->slots = NULL;
  s->cap = s->n = 0;
  s->on = 0;
}
