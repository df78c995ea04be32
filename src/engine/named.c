/* src/engine: name rules, tables and memory of named shared things
 * (named.h). Loop thread only. */
#include "engine/named.h"

#include <string.h>

#include "common/fail.h"
#include "common/log.h"
#include "st/errors.h"

/* See named.h. */
int st__named_check(const char *kind, const char *s, size_t n, char *err, size_t errlen) {
  int ok = n > 0 && n <= ST__NAME_MAX;
  for (size_t i = 0; ok && i < n; i++) {
    char ch = s[i];
    ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-';
  }
  if (ok) return ST_OK;
  return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                  "a %s name is 1 to %d characters of A-Z a-z 0-9 . _ -", kind, ST__NAME_MAX);
}

/* See named.h. */
st__named_t *st__named_find(const st__named_list_t *l, const char *s, size_t n) {
  for (st__named_t *e = l->head; e; e = e->next)
    if (strlen(e->name) == n && memcmp(e->name, s, n) == 0) return e;
  return NULL;
}

/* See named.h. */
int st__named_unused(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     char *err, size_t errlen) {
  if (!st__named_find(l, s, n)) return ST_OK;
  return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen, "a %s named '%.*s' exists", kind, (int)n,
                  s);
}

/* See named.h. */
int st__grant_allows(const st__grant_t *g, const st__who_t *w) {
  if (!g) return 0;
  for (uint32_t i = 0; i < g->nuids; i++)
    if (g->uids[i] == w->uid) return 1;
  for (uint32_t i = 0; i < g->ngids; i++)
    if (g->gids[i] == w->gid) return 1;
  for (uint32_t i = 0; w->in_group && i < g->ngids; i++)
    if (w->in_group(w, g->gids[i])) return 1;
  return 0;
}

/* See named.h. */
int st__access(uid_t owner, const st__grant_t *g, const st__who_t *w, st__use_t use, int force,
               const char *kind, const char *name, char *err, size_t errlen) {
  if (w->uid == owner) return ST_OK;
  int reader = st__grant_allows(g, w);
  if (!w->admin && !reader) {
    if (err && errlen) err[0] = '\0';
    return ST_ERR_NOT_FOUND;
  }
  if (use == ST__USE_READ) return ST_OK;
  if (use == ST__USE_REMOVE && w->admin && force) return ST_OK;
  if (use == ST__USE_REMOVE && w->admin)
    return st__fail(ST_ERR_AUTH, err, errlen,
                    "%s '%s' belongs to uid %u; root and the server's uid remove another uid's "
                    "%s with force (stcli ... --force)",
                    kind, name, (unsigned)owner, kind);
  return st__fail(ST_ERR_AUTH, err, errlen,
                  "%s '%s' belongs to uid %u; uid %u may only read it%s", kind, name,
                  (unsigned)owner, (unsigned)w->uid,
                  use == ST__USE_WRITE ? " (open it read-only)" : "");
}

/* See named.h. */
int st__named_lookup(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     const st__who_t *w, st__use_t use, int force, st__named_t **out,
                     char *err, size_t errlen) {
  st__named_t *e = st__named_find(l, s, n);
  int rc = e ? st__access(e->uid, &e->readers, w, use, force, kind, e->name, err, errlen)
             : ST_ERR_NOT_FOUND;
  if (rc == ST_ERR_NOT_FOUND)
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "no %s named '%.*s'", kind,
                    (int)(n > ST__NAME_MAX ? ST__NAME_MAX : n), s);
  if (rc != ST_OK) return rc;
  *out = e;
  return ST_OK;
}

/* See named.h. */
unsigned st__named_arena_fds(const st__arena_t *a) {
  int device;
  uint64_t bytes;
  unsigned fds = 0;
  st__arena_charge(a, &device, &bytes, &fds);
  return fds;
}

/* See named.h. */
int st__named_charge(st__named_t *e, st__uidq_kind_t kind, char *err, size_t errlen) {
  uint64_t fds = 0, bytes = 0;
  st__arena_t *a[2] = {e->data, e->page_arena};
  for (int i = 0; i < 2; i++) {
    if (!a[i]) continue;
    fds += st__named_arena_fds(a[i]);
    bytes += st__arena_bytes(a[i]);
  }
  char why[300];
  int rc = st__uidq_charge(e->uid, kind, 1, why, sizeof why);
  if (rc == ST_OK && (rc = st__uidq_charge(e->uid, ST__UIDQ_FDS, fds, why, sizeof why)) != ST_OK)
    st__uidq_uncharge(e->uid, kind, 1);
  if (rc == ST_OK &&
      (rc = st__uidq_charge(e->uid, ST__UIDQ_PINNED_BYTES, bytes, why, sizeof why)) != ST_OK) {
    st__uidq_uncharge(e->uid, kind, 1);
    st__uidq_uncharge(e->uid, ST__UIDQ_FDS, fds);
  }
  if (rc != ST_OK) return st__fail(rc, err, errlen, "%s", why);
  e->charged = (int)kind + 1;
  e->charged_fds = fds;
  e->charged_bytes = bytes;
  return ST_OK;
}

/* See named.h. */
int st__named_room(int n, int max, const char *things, const char *key, char *err,
                   size_t errlen) {
  if (n < max) return ST_OK;
  return st__fail(ST_ERR_LIMIT, err, errlen,
                  "this connection uses %d %s; 1 more would pass limits.%s = %d", n, things, key,
                  max);
}

/* See named.h. */
int st__named_init(st__named_t *e, const char *s, size_t n, uid_t uid, int device,
                   uint64_t data_bytes, uint64_t page_bytes, char *err, size_t errlen) {
  memcpy(e->name, s, n < ST__NAME_MAX ? n : ST__NAME_MAX);
  e->uid = uid;
  e->device = device;
  e->page_bytes = page_bytes;
  int rc = st__arena_new(&(st__arena_spec_t){.device = device, .bytes = data_bytes}, &e->data,
                         err, errlen);
  if (rc == ST_OK) rc = st__arena_new_cpu(page_bytes, &e->page_arena, err, errlen);
  if (rc != ST_OK) {
    st__arena_unref(e->data);
    e->data = NULL;
    return rc;
  }
  e->page = st__arena_base(e->page_arena);
  return ST_OK;
}

/* See named.h. */
int st__named_adopt(st__named_t *e, const char *s, size_t n, uid_t uid, st__arena_t *data,
                    st__arena_t *page, uint64_t page_bytes, char *err, size_t errlen) {
  if (st__arena_device(page) != -1 || st__arena_bytes(page) < page_bytes || !st__arena_base(page))
    return st__fail(ST_ERR_INVALID_ARGUMENT, err, errlen,
                    "'%.*s': its control page is no CPU arena of %llu bytes", (int)n, s,
                    (unsigned long long)page_bytes);
  memcpy(e->name, s, n < ST__NAME_MAX ? n : ST__NAME_MAX);
  e->uid = uid;
  e->device = st__arena_device(data);
  e->page_bytes = page_bytes;
  st__arena_ref(data);
  st__arena_ref(page);
  e->data = data;
  e->page_arena = page;
  e->page = st__arena_base(page);
  return ST_OK;
}

/* See named.h. */
void st__named_add(st__named_list_t *l, st__named_t *e) {
  e->next = l->head;
  l->head = e;
  l->count++;
}

/* See named.h. */
void st__named_remove(st__named_list_t *l, st__named_t *e) {
  for (st__named_t **pp = l ? &l->head : NULL; pp && *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      e->next = NULL;
      l->count--;
      return;
    }
}

/* See named.h. */
void st__named_release(st__named_list_t *l, st__named_t *e) {
  st__named_remove(l, e);
  ST_LOG_D("named", "'%s' released", e->name);
  if (e->charged) {
    st__uidq_uncharge(e->uid, (st__uidq_kind_t)(e->charged - 1), 1);
    st__uidq_uncharge(e->uid, ST__UIDQ_FDS, e->charged_fds);
    st__uidq_uncharge(e->uid, ST__UIDQ_PINNED_BYTES, e->charged_bytes);
    e->charged = 0;
  }
  st__arena_unref(e->data);
  st__arena_unref(e->page_arena);
  e->data = e->page_arena = NULL;
}
