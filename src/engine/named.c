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
int st__named_lookup(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     uid_t uid, const char *what, st__named_t **out, char *err, size_t errlen) {
  st__named_t *e = st__named_find(l, s, n);
  if (!e)
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "no %s named '%.*s'", kind,
                    (int)(n > ST__NAME_MAX ? ST__NAME_MAX : n), s);
  if (e->uid != uid)
    return st__fail(ST_ERR_AUTH, err, errlen, "%s '%s' belongs to uid %u; uid %u may not %s it",
                    kind, e->name, (unsigned)e->uid, (unsigned)uid, what);
  *out = e;
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
  st__arena_unref(e->data);
  st__arena_unref(e->page_arena);
  e->data = e->page_arena = NULL;
}
