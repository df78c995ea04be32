/* src/mem: the per-uid ledger of quotas (uidq.h). Any thread. */
#include "mem/uidq.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "st/errors.h"

typedef struct entry {
  uid_t uid;
  uint64_t used[ST__UIDQ_NKINDS];
} entry_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *table;        /* owned; n used of cap */
static size_t n, cap;
static uint64_t limits[ST__UIDQ_NKINDS];
static uid_t server_uid;

static const char *const names[ST__UIDQ_NKINDS] = {
    "keys", "versions", "buffers", "handoffs", "tasks", "fds", "pinned_bytes", "pool_bytes"};

/* See uidq.h. */
const char *st__uidq_name(st__uidq_kind_t kind) {
  return kind < ST__UIDQ_NKINDS ? names[kind] : "?";
}

/* See uidq.h. */
void st__uidq_configure(const uint64_t l[ST__UIDQ_NKINDS], uid_t server) {
  pthread_mutex_lock(&lock);
  memcpy(limits, l, sizeof limits);
  server_uid = server;
  pthread_mutex_unlock(&lock);
}

/* See uidq.h. */
uint64_t st__uidq_limit(st__uidq_kind_t kind) {
  pthread_mutex_lock(&lock);
  uint64_t v = kind < ST__UIDQ_NKINDS ? limits[kind] : 0;
  pthread_mutex_unlock(&lock);
  return v;
}

static int exempt(uid_t uid) { return uid == 0 || uid == server_uid; }

/* Kinds whose refusal only takes a slower path (a pool past its uid's
 * bytes gives results arenas of their own): they bind the exempt uids
 * too. */
static int binds_exempt(st__uidq_kind_t kind) { return kind == ST__UIDQ_POOL_BYTES; }

/* See uidq.h. */
int st__uidq_exempt(uid_t uid) {
  pthread_mutex_lock(&lock);
  int e = exempt(uid);
  pthread_mutex_unlock(&lock);
  return e;
}

/* The entry of uid, made when `make`; NULL when absent (or no memory).
 * Lock held. */
static entry_t *find(uid_t uid, int make) {
  for (size_t i = 0; i < n; i++)
    if (table[i].uid == uid) return &table[i];
  if (!make) return NULL;
  if (n == cap) {
    size_t c = cap ? cap * 2 : 16;
    entry_t *t = realloc(table, c * sizeof *t);
    if (!t) return NULL;
    table = t;
    cap = c;
  }
  memset(&table[n], 0, sizeof table[n]);
  table[n].uid = uid;
  return &table[n++];
}

/* ST_OK when uid may take `more` of kind; else LIMIT with the reason.
 * Lock held. */
static int fits(const entry_t *e, uid_t uid, st__uidq_kind_t kind, uint64_t more, char *err,
                size_t errlen) {
  uint64_t used = e ? e->used[kind] : 0, max = limits[kind];
  if (!max || (exempt(uid) && !binds_exempt(kind)) || (more <= max && used <= max - more))
    return ST_OK;
  if (err && errlen)
    snprintf(err, errlen,
             "uid %u uses %" PRIu64 " %s; %" PRIu64 " more would pass quotas.%s = %" PRIu64
             " (a per-uid quota: other uids are not affected)",
             (unsigned)uid, used, names[kind], more, names[kind], max);
  return ST_ERR_LIMIT;
}

/* See uidq.h. */
int st__uidq_charge(uid_t uid, st__uidq_kind_t kind, uint64_t more, char *err, size_t errlen) {
  if (kind >= ST__UIDQ_NKINDS) return ST_ERR_INVALID_ARGUMENT;
  if (!more) return ST_OK;
  pthread_mutex_lock(&lock);
  entry_t *e = find(uid, 0);
  int rc = fits(e, uid, kind, more, err, errlen);
  if (rc == ST_OK && !e && !(e = find(uid, 1))) {
    if (err && errlen) snprintf(err, errlen, "out of memory");
    rc = ST_ERR_OUT_OF_MEMORY;
  }
  if (rc == ST_OK) e->used[kind] += more;
  pthread_mutex_unlock(&lock);
  return rc;
}

/* See uidq.h. */
int st__uidq_room(uid_t uid, st__uidq_kind_t kind, uint64_t more, char *err, size_t errlen) {
  if (kind >= ST__UIDQ_NKINDS) return ST_ERR_INVALID_ARGUMENT;
  pthread_mutex_lock(&lock);
  int rc = fits(find(uid, 0), uid, kind, more, err, errlen);
  pthread_mutex_unlock(&lock);
  return rc;
}

/* See uidq.h. */
void st__uidq_add(uid_t uid, st__uidq_kind_t kind, uint64_t more) {
  if (kind >= ST__UIDQ_NKINDS || !more) return;
  pthread_mutex_lock(&lock);
  entry_t *e = find(uid, 1);
  if (e) e->used[kind] += more;
  pthread_mutex_unlock(&lock);
}

/* See uidq.h. An entry that holds nothing any more leaves the table. */
void st__uidq_uncharge(uid_t uid, st__uidq_kind_t kind, uint64_t less) {
  if (kind >= ST__UIDQ_NKINDS || !less) return;
  pthread_mutex_lock(&lock);
  entry_t *e = find(uid, 0);
  if (e) {
    e->used[kind] = e->used[kind] > less ? e->used[kind] - less : 0;
    int any = 0;
    for (int k = 0; k < ST__UIDQ_NKINDS; k++) any |= e->used[k] != 0;
    if (!any) *e = table[--n];
  }
  pthread_mutex_unlock(&lock);
}

/* See uidq.h. */
uint64_t st__uidq_used(uid_t uid, st__uidq_kind_t kind) {
  if (kind >= ST__UIDQ_NKINDS) return 0;
  pthread_mutex_lock(&lock);
  const entry_t *e = find(uid, 0);
  uint64_t v = e ? e->used[kind] : 0;
  pthread_mutex_unlock(&lock);
  return v;
}

/* See uidq.h. */
void st__uidq_each(void (*fn)(uid_t uid, const uint64_t used[ST__UIDQ_NKINDS], void *ud),
                   void *ud) {
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n; i++) fn(table[i].uid, table[i].used, ud);
  pthread_mutex_unlock(&lock);
}

/* See uidq.h. */
void st__uidq_reset(void) {
  pthread_mutex_lock(&lock);
  free(table);
  table = NULL;
  n = cap = 0;
  pthread_mutex_unlock(&lock);
}
