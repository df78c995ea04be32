/* src/server: the arenas kept across restarts (store_arenas.h). Loop
 * thread. */
#include "server/store_arenas.h"

#include <fcntl.h>
#include <inttypes.h>
#include <linux/kcmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "st/errors.h"

typedef struct alias {
  const st__arena_t *arena;
  uint64_t holds;
} alias_t;

struct st__stored_arena {
  uint64_t n;
  uint64_t holds;             /* the sum of its aliases' holds             */
  alias_t *aliases;
  size_t naliases, cap;
  int has_file;
  unsigned char file[16];     /* device and inode of a memory file         */
  int fd;                     /* a CUDA allocation's descriptor, else -1   */
};

static size_t number_key(uint64_t n, char *buf, size_t cap) {
  return (size_t)snprintf(buf, cap, "%" PRIu64, n);
}

/* See store_arenas.h. */
void st__store_arenas_init(st__store_arenas_t *t) {
  st__smap_init(&t->by_arena);
  st__smap_init(&t->by_file);
  st__smap_init(&t->by_number);
  t->next = 1;
}

static void free_entry(st__stored_arena_t *e) {
  if (e->fd >= 0) close(e->fd);
  free(e->aliases);
  free(e);
}

static void free_each(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  (void)ud;
  free_entry(value);
}

/* See store_arenas.h. */
void st__store_arenas_clear(st__store_arenas_t *t) {
  st__smap_each(&t->by_number, free_each, NULL);
  st__smap_clear(&t->by_arena);
  st__smap_clear(&t->by_file);
  st__smap_clear(&t->by_number);
  st__store_arenas_init(t);
}

/* Whether two descriptors are one open file (the descriptor a client sent
 * twice). */
static int same_open_file(int a, int b) {
  pid_t me = getpid();
  return syscall(SYS_kcmp, me, me, KCMP_FILE, a, b) == 0;
}

typedef struct cuda_find {
  int fd;
  st__stored_arena_t *found;
} cuda_find_t;

static void find_cuda(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  cuda_find_t *f = ud;
  st__stored_arena_t *e = value;
  if (!f->found && e->fd >= 0 && same_open_file(f->fd, e->fd)) f->found = e;
}

/* See store_arenas.h. */
st__stored_arena_t *st__store_arenas_find(st__store_arenas_t *t, const st__arena_t *a) {
  st__stored_arena_t *e = st__smap_get(&t->by_arena, &a, sizeof a);
  if (e) return e;
  uint64_t id[2];
  if (st__arena_file_id(a, &id[0], &id[1])) return st__smap_get(&t->by_file, id, sizeof id);
  if (st__arena_device(a) < 0 || !st__arena_has_fd(a)) return NULL;
  cuda_find_t f = {.fd = st__arena_dup_fd(a, NULL, 0)};
  if (f.fd < 0) return NULL;
  st__smap_each(&t->by_number, find_cuda, &f);
  close(f.fd);
  return f.found;
}

/* See store_arenas.h. */
st__stored_arena_t *st__store_arenas_add(st__store_arenas_t *t, const st__arena_t *a,
                                         uint64_t n) {
  st__stored_arena_t *e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->n = n ? n : t->next;
  e->fd = -1;
  uint64_t id[2];
  if (st__arena_file_id(a, &id[0], &id[1])) {
    e->has_file = 1;
    memcpy(e->file, id, sizeof id);
  } else if (st__arena_device(a) >= 0 && st__arena_has_fd(a) &&
             (e->fd = st__arena_dup_fd(a, NULL, 0)) < 0) {
    free(e);
    return NULL;
  }
  char key[24];
  size_t klen = number_key(e->n, key, sizeof key);
  if (st__smap_put(&t->by_number, key, klen, e) != ST_OK ||
      (e->has_file && st__smap_put(&t->by_file, e->file, sizeof e->file, e) != ST_OK)) {
    st__smap_del(&t->by_number, key, klen);
    free_entry(e);
    return NULL;
  }
  if (e->n >= t->next) t->next = e->n + 1;
  return e;
}

/* See store_arenas.h. */
int st__store_arenas_hold(st__store_arenas_t *t, st__stored_arena_t *e, const st__arena_t *a) {
  for (size_t i = 0; i < e->naliases; i++)
    if (e->aliases[i].arena == a) {
      e->aliases[i].holds++;
      e->holds++;
      return ST_OK;
    }
  if (e->naliases == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 2;
    alias_t *g = realloc(e->aliases, cap * sizeof *g);
    if (!g) return ST_ERR_OUT_OF_MEMORY;
    e->aliases = g;
    e->cap = cap;
  }
  if (st__smap_put(&t->by_arena, &a, sizeof a, e) != ST_OK) return ST_ERR_OUT_OF_MEMORY;
  e->aliases[e->naliases++] = (alias_t){a, 1};
  e->holds++;
  return ST_OK;
}

/* See store_arenas.h. */
st__stored_arena_t *st__store_arenas_release(st__store_arenas_t *t, const st__arena_t *a) {
  st__stored_arena_t *e = st__smap_get(&t->by_arena, &a, sizeof a);
  if (!e) return NULL;
  for (size_t i = 0; i < e->naliases; i++) {
    if (e->aliases[i].arena != a) continue;
    e->holds--;
    if (--e->aliases[i].holds == 0) {
      e->aliases[i] = e->aliases[--e->naliases];
      st__smap_del(&t->by_arena, &a, sizeof a);
    }
    break;
  }
  return e->holds == 0 ? e : NULL;
}

/* See store_arenas.h. */
void st__store_arenas_drop(st__store_arenas_t *t, st__stored_arena_t *e) {
  for (size_t i = 0; i < e->naliases; i++)
    st__smap_del(&t->by_arena, &e->aliases[i].arena, sizeof e->aliases[i].arena);
  if (e->has_file) st__smap_del(&t->by_file, e->file, sizeof e->file);
  char key[24];
  st__smap_del(&t->by_number, key, number_key(e->n, key, sizeof key));
  free_entry(e);
}

/* See store_arenas.h. */
uint64_t st__stored_arena_number(const st__stored_arena_t *e) { return e->n; }

/* See store_arenas.h. */
const st__arena_t *st__stored_arena_any(const st__stored_arena_t *e) {
  return e->naliases ? e->aliases[0].arena : NULL;
}

/* See store_arenas.h. */
uint64_t st__store_arenas_number_of(st__store_arenas_t *t, const st__arena_t *a) {
  st__stored_arena_t *e = st__smap_get(&t->by_arena, &a, sizeof a);
  return e ? e->n : 0;
}

/* See store_arenas.h. */
st__stored_arena_t *st__store_arenas_by_number(st__store_arenas_t *t, uint64_t n) {
  char key[24];
  return st__smap_get(&t->by_number, key, number_key(n, key, sizeof key));
}

typedef struct each {
  void (*fn)(st__stored_arena_t *e, void *ud);
  void *ud;
} each_t;

static void each_one(const char *key, size_t len, void *value, void *ud) {
  (void)key;
  (void)len;
  each_t *w = ud;
  w->fn(value, w->ud);
}

/* See store_arenas.h. */
void st__store_arenas_each(st__store_arenas_t *t, void (*fn)(st__stored_arena_t *e, void *ud),
                           void *ud) {
  each_t w = {fn, ud};
  st__smap_each(&t->by_number, each_one, &w);
}
