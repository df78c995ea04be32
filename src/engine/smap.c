/* src/engine: byte-string hash map (smap.h). Loop thread only. */
#include "engine/smap.h"

#include <stdlib.h>
#include <string.h>

#include "st/errors.h"

static uint64_t hash_bytes(const void *key, size_t len) {
  const unsigned char *p = key;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h ^ (h >> 29);
}

/* Empty map. */
void st__smap_init(st__smap_t *m) {
  memset(m, 0, sizeof *m);
}

/* Frees every node and the bucket array; values are the caller's. */
void st__smap_clear(st__smap_t *m) {
  for (size_t b = 0; b < m->nbuckets; b++) {
    st__smap_node_t *n = m->buckets[b];
    while (n) {
      st__smap_node_t *next = n->next;
      free(n);
      n = next;
    }
  }
  free(m->buckets);
  st__smap_init(m);
}

static st__smap_node_t **slot(const st__smap_t *m, const void *key, size_t len, uint64_t h) {
  st__smap_node_t **pp = &m->buckets[h & (m->nbuckets - 1)];
  while (*pp && !((*pp)->hash == h && (*pp)->len == len && memcmp((*pp)->key, key, len) == 0))
    pp = &(*pp)->next;
  return pp;
}

/* Value under key or NULL. */
void *st__smap_get(const st__smap_t *m, const void *key, size_t len) {
  if (!m->nbuckets) return NULL;
  st__smap_node_t **pp = slot(m, key, len, hash_bytes(key, len));
  return *pp ? (*pp)->value : NULL;
}

static int grow(st__smap_t *m) {
  size_t nb = m->nbuckets ? m->nbuckets * 2 : 16;
  st__smap_node_t **b = calloc(nb, sizeof *b);
  if (!b) return ST_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < m->nbuckets; i++) {
    st__smap_node_t *n = m->buckets[i];
    while (n) {
      st__smap_node_t *next = n->next;
      n->next = b[n->hash & (nb - 1)];
      b[n->hash & (nb - 1)] = n;
      n = next;
    }
  }
  free(m->buckets);
  m->buckets = b;
  m->nbuckets = nb;
  return ST_OK;
}

/* Inserts or replaces. ST_OK or ST_ERR_OUT_OF_MEMORY. */
int st__smap_put(st__smap_t *m, const void *key, size_t len, void *value) {
  if (m->count >= m->nbuckets && grow(m) != ST_OK && !m->nbuckets) return ST_ERR_OUT_OF_MEMORY;
  uint64_t h = hash_bytes(key, len);
  st__smap_node_t **pp = slot(m, key, len, h);
  if (*pp) {
    (*pp)->value = value;
    return ST_OK;
  }
  st__smap_node_t *n = malloc(sizeof *n + len + 1);
  if (!n) return ST_ERR_OUT_OF_MEMORY;
  n->next = NULL;
  n->hash = h;
  n->value = value;
  n->len = len;
  memcpy(n->key, key, len);
  n->key[len] = '\0';
  *pp = n;
  m->count++;
  return ST_OK;
}

/* Removes and returns the value (NULL if absent). */
void *st__smap_del(st__smap_t *m, const void *key, size_t len) {
  if (!m->nbuckets) return NULL;
  st__smap_node_t **pp = slot(m, key, len, hash_bytes(key, len));
  st__smap_node_t *n = *pp;
  if (!n) return NULL;
  *pp = n->next;
  void *v = n->value;
  free(n);
  m->count--;
  return v;
}

/* Visits every entry. */
void st__smap_each(const st__smap_t *m,
                   void (*fn)(const char *key, size_t len, void *value, void *ud), void *ud) {
  for (size_t b = 0; b < m->nbuckets; b++)
    for (st__smap_node_t *n = m->buckets[b]; n; n = n->next) fn(n->key, n->len, n->value, ud);
}
