/* src/server: who a request's peer is, and the `readers` it grants
 * (rpc.h; engine/named.h; docs/security.md, finding 3). Loop threads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "mem/uidq.h"
#include "server/rpc.h"
#include "st/errors.h"

/* Whether the peer on socket w->fd is in group g (SO_PEERGROUPS; a kernel
 * without it: no supplementary group counts). */
static int peer_in_group(const st__who_t *w, gid_t g) {
  gid_t some[64], *gids = some;
  socklen_t len = sizeof some;
  int rc = getsockopt(w->fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len);
  if (rc != 0 && len > sizeof some) {
    gids = malloc(len);
    rc = gids ? getsockopt(w->fd, SOL_SOCKET, SO_PEERGROUPS, gids, &len) : -1;
  }
  int in = 0;
  for (size_t i = 0; rc == 0 && !in && i < len / sizeof *gids; i++) in = gids[i] == g;
  if (gids != some) free(gids);
  return in;
}

/* See rpc.h. */
void st__rpc_who(const st__rpc_req_t *r, st__who_t *w) {
  memset(w, 0, sizeof *w);
  w->uid = r->c->cred.uid;
  w->gid = r->c->cred.gid;
  w->admin = st__uidq_exempt(w->uid);
  w->in_group = peer_in_group;
  w->fd = r->c->fd;
}

/* See rpc.h. */
int st__rpc_listing_all(st__rpc_req_t *r, const char *method, const char *what, st__who_t *w) {
  st__rpc_who(r, w);
  int all = st__rpc_bool(r, "all", 0);
  if (all && !w->admin) {
    st__rpc_error(r, ST_ERR_AUTH, "%s: 'all' lists every uid's %s: root and the server's uid only",
                  method, what);
    return -1;
  }
  return all;
}

/* Reads ids of array o (NULL: none) into out (at most ST__GRANT_MAX).
 * The count, or -1 after an error reply naming `what`. */
static int ids_of(st__rpc_req_t *r, const msgpack_object *o, const char *what, uint32_t *out) {
  if (!o || o->type == MSGPACK_OBJECT_NIL) return 0;
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size > ST__GRANT_MAX) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                  "%s: 'readers.%s' must be a list of at most %d ids", r->method->name, what,
                  ST__GRANT_MAX);
    return -1;
  }
  for (uint32_t i = 0; i < o->via.array.size; i++) {
    const msgpack_object *e = &o->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 >= UINT32_MAX) {
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                    "%s: 'readers.%s' element %u is not a uid/gid (an integer 0..%u)",
                    r->method->name, what, i, UINT32_MAX - 1);
      return -1;
    }
    out[i] = (uint32_t)e->via.u64;
  }
  return (int)o->via.array.size;
}

/* See rpc.h. */
int st__rpc_readers(st__rpc_req_t *r, st__grant_t *g) {
  memset(g, 0, sizeof *g);
  const msgpack_object *o = st__rpc_arg(r, "readers");
  if (!o) return 0;
  if (o->type != MSGPACK_OBJECT_MAP) {
    st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                  "%s: 'readers' must be a map {uids = [...], gids = [...]}", r->method->name);
    return -1;
  }
  const msgpack_object *uids = NULL, *gids = NULL;
  for (uint32_t i = 0; i < o->via.map.size; i++) {
    const msgpack_object *k = &o->via.map.ptr[i].key;
    const msgpack_object *v = &o->via.map.ptr[i].val;
    if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 4 &&
        memcmp(k->via.str.ptr, "uids", 4) == 0)
      uids = v;
    else if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 4 &&
             memcmp(k->via.str.ptr, "gids", 4) == 0)
      gids = v;
    else {
      st__rpc_error(r, ST_ERR_INVALID_ARGUMENT,
                    "%s: 'readers' takes the keys 'uids' and 'gids' only", r->method->name);
      return -1;
    }
  }
  uint32_t ids[ST__GRANT_MAX];
  int n = ids_of(r, uids, "uids", ids);
  if (n < 0) return -1;
  g->nuids = (uint32_t)n;
  for (int i = 0; i < n; i++) g->uids[i] = (uid_t)ids[i];
  n = ids_of(r, gids, "gids", ids);
  if (n < 0) return -1;
  g->ngids = (uint32_t)n;
  for (int i = 0; i < n; i++) g->gids[i] = (gid_t)ids[i];
  return 1;
}
