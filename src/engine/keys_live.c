/* src/engine: live keys of the key table (keys.h; docs/views.md,
 * section 3): who publishes them, and what the server writes into their
 * control pages (engine/key_page.h). Loop thread, except the reads that
 * say otherwise. */
#include <string.h>

#include "common/fail.h"
#include "common/log.h"
#include "engine/keys.h"
#include "st/errors.h"

/* See keys.h. Any thread: a read of the page. */
int st__keys_torn(const st__key_t *k) {
  return k->page && (atomic_load(&k->page->flags) & ST__KEY_TORN) != 0;
}

/* See keys.h. Any thread: a read of the page. */
uint64_t st__keys_version_of(const st__key_t *k, const st__key_version_t *v) {
  return k->page ? atomic_load(&k->page->version) : v->version;
}

/* See keys.h. Loop thread. */
int st__keys_take(st__keys_t *t, const st__key_put_t *p, st__key_t **key, char *err,
                  size_t errlen) {
  *key = NULL;
  st__key_t *k = st__smap_get(&t->by_name, p->name, p->len);
  if (!k || !k->live)
    return st__fail(ST_ERR_NOT_FOUND, err, errlen, "no live key '%.*s'", (int)p->len, p->name);
  if (k->uid != p->uid)
    return st__fail(ST_ERR_AUTH, err, errlen, "key '%s' belongs to uid %u; uid %u may not put it",
                    k->name, (unsigned)k->uid, (unsigned)p->uid);
  if (k->owner_conn != p->conn)
    ST_LOG_I("keys", "live key '%s': connection %llu takes over from %llu", k->name,
             (unsigned long long)p->conn, (unsigned long long)k->owner_conn);
  k->owner_conn = p->conn;
  atomic_store(&k->page->owner, p->conn);
  *key = k;
  return ST_OK;
}

static void leave_one(const char *name, size_t len, void *value, void *ud) {
  (void)name;
  (void)len;
  st__key_t *k = value;
  uint64_t conn = *(const uint64_t *)ud;
  if (!k->live || k->owner_conn != conn) return;
  k->owner_conn = 0;
  atomic_store(&k->page->owner, 0);
  if (!st__key_page_updating(k->page)) return;
  ST_LOG_W("keys", "live key '%s' is torn: its publisher (connection %llu) left in the middle "
           "of an update", k->name, (unsigned long long)conn);
  st__key_page_flag(k->page, ST__KEY_TORN);
}

/* See keys.h. Loop thread. */
void st__keys_conn_closed(st__keys_t *t, uint64_t conn) {
  if (t->live) st__smap_each(&t->by_name, leave_one, &conn);
}
