/* src/client: which tensor arguments the server keeps for a connection
 * (docs/protocol.md, "Tensor arguments"; docs/pool.md, section 4).
 *
 * Each own allocation (map.c) has a process-unique id, sent as `arg_id`.
 * When the server's hello lists the "arg_cache" feature, a connection
 * remembers the ids whose descriptor it sent (`arg_kept`): a later request
 * names such an allocation by its id alone, without a descriptor. When an
 * allocation is freed (its last reference dropped, on any thread), its id
 * leaves `arg_kept` of every connection that had it and waits in that
 * connection's `forget` list, which goes with its next request
 * (params.forget). A server that evicted an id answers INVALID_ARGUMENT
 * with `uncached`; the call then drops the request's ids from `arg_kept` and
 * sends its descriptors again, once (call.c). A reconnect starts with
 * nothing kept.
 *
 * Threads: the lists of every connection are guarded by the library's
 * process-wide lock (map.c), because frees come from any thread; the rest
 * of a connection belongs to its thread, as everywhere in st_client_t.
 */
#include <stdlib.h>
#include <string.h>

#include "client/client_internal.h"

static st_client_t *clients;       /* connections with the cache on */


/* Index of the first id >= `id` in the sorted kept list. */
static size_t kept_pos(const st_client_t *c, uint64_t id) {
  size_t lo = 0, hi = c->arg_nkept;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (c->arg_kept[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static int kept_has(const st_client_t *c, uint64_t id) {
  size_t i = kept_pos(c, id);
  return i < c->arg_nkept && c->arg_kept[i] == id;
}

/* Adds id; 0, or -1 when out of memory (then it is simply not kept). */
static int kept_add(st_client_t *c, uint64_t id) {
  size_t i = kept_pos(c, id);
  if (i < c->arg_nkept && c->arg_kept[i] == id) return 0;
  if (c->arg_nkept == c->arg_kept_cap) {
    size_t cap = c->arg_kept_cap ? c->arg_kept_cap * 2 : 16;
    uint64_t *p = realloc(c->arg_kept, cap * sizeof *p);
    if (!p) return -1;
    c->arg_kept = p;
    c->arg_kept_cap = cap;
  }
  memmove(c->arg_kept + i + 1, c->arg_kept + i, (c->arg_nkept - i) * sizeof *c->arg_kept);
  c->arg_kept[i] = id;
  c->arg_nkept++;
  return 0;
}

static int kept_remove(st_client_t *c, uint64_t id) {
  size_t i = kept_pos(c, id);
  if (i >= c->arg_nkept || c->arg_kept[i] != id) return 0;
  memmove(c->arg_kept + i, c->arg_kept + i + 1, (c->arg_nkept - i - 1) * sizeof *c->arg_kept);
  c->arg_nkept--;
  return 1;
}

static void unlink_client(st_client_t *c) {
  for (st_client_t **pp = &clients; *pp; pp = &(*pp)->arg_next) {
    if (*pp == c) {
      *pp = c->arg_next;
      break;
    }
  }
  c->arg_next = NULL;
}

/* See client_internal.h. Thread of the client. */
void st__client_argcache_reset(st_client_t *c, int on) {
  st__client_lock();
  unlink_client(c);
  c->arg_cache = on;
  c->arg_nkept = 0;
  c->arg_nforget = 0;
  if (on) {
    c->arg_next = clients;
    clients = c;
  }
  st__client_unlock();
  if (!on) {
    free(c->arg_kept);
    free(c->arg_forget);
    c->arg_kept = c->arg_forget = NULL;
    c->arg_kept_cap = c->arg_forget_cap = 0;
  }
}

/* See client_internal.h. Any thread. */
void st__client_argcache_freed(uint64_t arg_id) {
  st__client_lock();
  for (st_client_t *c = clients; c; c = c->arg_next) {
    if (!kept_remove(c, arg_id)) continue;
    if (c->arg_nforget == c->arg_forget_cap) {
      size_t cap = c->arg_forget_cap ? c->arg_forget_cap * 2 : 16;
      uint64_t *p = realloc(c->arg_forget, cap * sizeof *p);
      if (!p) continue;   /* the server keeps it until evicted or closed */
      c->arg_forget = p;
      c->arg_forget_cap = cap;
    }
    c->arg_forget[c->arg_nforget++] = arg_id;
  }
  st__client_unlock();
}

/* See client_internal.h. Thread of the client. */
size_t st__client_argcache_pack(st_client_t *c, msgpack_packer *pk, st__mapping_t *const *arenas,
                                size_t n, int *fds) {
  size_t nfds = 0;
  msgpack_pack_array(pk, n);
  if (c->arg_cache) st__client_lock();
  for (size_t i = 0; i < n; i++) {
    st__arena_desc_t d;
    st__client_own_describe(arenas[i], &d);
    if (c->arg_cache) {
      d.arg_id = d.id;
      d.no_fd = kept_has(c, d.id);
      /* Held from now on: the server keeps what it received, and says
       * `uncached` if it did not. */
      if (!d.no_fd) kept_add(c, d.id);
    }
    if (!d.no_fd) {
      d.fd = (uint32_t)nfds;
      fds[nfds++] = st__client_own_fd(arenas[i]);
    }
    st__pack_arena(pk, &d);
  }
  if (c->arg_cache) st__client_unlock();
  return nfds;
}

/* See client_internal.h. Thread of the client. */
void st__client_argcache_unkeep(st_client_t *c, st__mapping_t *const *arenas, size_t n) {
  if (!c->arg_cache) return;
  st__client_lock();
  for (size_t i = 0; i < n; i++) {
    st__arena_desc_t d;
    st__client_own_describe(arenas[i], &d);
    kept_remove(c, d.id);
  }
  st__client_unlock();
}

/* See client_internal.h. Thread of the client. */
int st__client_argcache_params(st_client_t *c, const void *params, size_t len, st__cbuf_t *out) {
  if (!c->arg_cache) return 0;
  st__client_lock();
  uint64_t *ids = c->arg_forget;
  size_t nids = c->arg_nforget;
  if (nids) {
    c->arg_forget = NULL;
    c->arg_nforget = c->arg_forget_cap = 0;
  }
  st__client_unlock();
  if (!nids) return 0;
  int rc = st__client_params_with_ids(params, len, "forget", ids, nids, out);
  free(ids);
  return rc == 0;
}
