/* src/engine: what named shared things (hand-offs, buffers) have in
 * common: the name rules, who may use one, the table they live in, and
 * their memory (a data arena and a control page).
 *
 * Names are 1 to ST__NAME_MAX bytes of [A-Za-z0-9._-], one namespace per
 * kind and server process. Who may use a named thing (docs/security.md,
 * finding 3): the uid that created it, everything; the uids and gids its
 * creator granted read (`readers`), read only; root and the server's own
 * uid (`admin`), read, and remove with `force`; any other uid gets
 * NOT_FOUND, the same as for a name that does not exist. The same rules
 * hold for published keys (keys.h). Each thing is charged to its
 * creator's quotas (mem/uidq.h) while the server keeps it. A thing embeds st__named_t as its first member, so
 * a table (st__named_list_t) holds hand-offs or buffers alike. The data
 * arena is a memfd arena on the CPU or a VMM arena on CUDA, the page a
 * memfd arena; both are charged to their device's memory budget like any
 * arena. Loop thread only.
 */
#ifndef ST_ENGINE_NAMED_H
#define ST_ENGINE_NAMED_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mem/arena.h"
#include "mem/uidq.h"

#define ST__NAME_MAX 64

/* Who a named thing's creator granted read (the `readers` parameter of
 * put, buffer_create, handoff_create): at most ST__GRANT_MAX uids and as
 * many gids. */
#define ST__GRANT_MAX 16
typedef struct st__grant {
  uint32_t nuids, ngids;
  uid_t uids[ST__GRANT_MAX];
  gid_t gids[ST__GRANT_MAX];
} st__grant_t;

/* Who asks: the peer's uid and primary gid, whether it is root or the
 * server's uid (admin), and a test of its supplementary groups (may be
 * NULL: the primary gid alone counts), asked only when a grant names
 * gids the primary one is not. */
typedef struct st__who {
  uid_t uid;
  gid_t gid;
  int admin;
  int (*in_group)(const struct st__who *w, gid_t g);
  int fd;                       /* for in_group: the peer's socket */
} st__who_t;

/* What the asker wants to do with a named thing. */
typedef enum {
  ST__USE_READ,                 /* get, buffer_open read-only, handoff_open */
  ST__USE_WRITE,                /* put into it, buffer_open read-write      */
  ST__USE_REMOVE                /* delete, buffer_unlink, handoff_delete    */
} st__use_t;

/* Whether grant g lets w read. */
int st__grant_allows(const st__grant_t *g, const st__who_t *w);

/* Whether w may `use` a thing of `owner` with grant g (`force`: the
 * admin's removal of another uid's thing). ST_OK; ST_ERR_NOT_FOUND with
 * nothing in err when w may not even see it (the caller words it as for
 * an absent name); ST_ERR_AUTH for a reader or admin that asks more than
 * it may (the message names the owner, and `force` for an admin). */
int st__access(uid_t owner, const st__grant_t *g, const st__who_t *w, st__use_t use, int force,
               const char *kind, const char *name, char *err, size_t errlen);

typedef struct st__named {
  struct st__named *next;
  char name[ST__NAME_MAX + 1];
  uid_t uid;                    /* the creator's (see the top)            */
  st__grant_t readers;          /* its creator's grant of read            */
  int charged;                  /* charged to uid's quotas (named_charge) */
  uint64_t charged_fds, charged_bytes;
  int device;                   /* -1: the CPU; else a CUDA ordinal        */
  st__arena_t *data;            /* owned reference                        */
  st__arena_t *page_arena;      /* owned reference                        */
  void *page;                   /* the server's mapping of page_arena     */
  uint64_t page_bytes;
} st__named_t;

typedef struct st__named_list {
  st__named_t *head;
  size_t count;
} st__named_list_t;

/* ST_OK when s (n bytes) is a valid name, else ST_ERR_INVALID_ARGUMENT
 * with "a <kind> name is 1 to 64 characters of A-Z a-z 0-9 . _ -" in
 * err. */
int st__named_check(const char *kind, const char *s, size_t n, char *err, size_t errlen);

/* The entry of l named s (n bytes), or NULL. */
st__named_t *st__named_find(const st__named_list_t *l, const char *s, size_t n);

/* ST_OK when no entry of l is named s, else INVALID_ARGUMENT "a <kind>
 * named 'x' exists". */
int st__named_unused(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     char *err, size_t errlen);

/* The entry of l named s that w wants to `use` (force: see st__access):
 * ST_OK with *out, NOT_FOUND ("no <kind> named 'x'": absent, or not
 * visible to w), or AUTH (st__access). */
int st__named_lookup(const st__named_list_t *l, const char *kind, const char *s, size_t n,
                     const st__who_t *w, st__use_t use, int force, st__named_t **out,
                     char *err, size_t errlen);

/* ST_OK when a connection that uses `n` <things> may use one more (n <
 * max), else ST_ERR_LIMIT naming limits.<key> and its value. */
int st__named_room(int n, int max, const char *things, const char *key, char *err,
                   size_t errlen);

/* Fills e (zeroed by the caller) with name s of uid `uid` and allocates
 * its data arena (`data_bytes` on `device`) and its page (`page_bytes`,
 * zero-filled, mapped at e->page). Errors of the arenas (OUT_OF_MEMORY,
 * LIMIT, CAPABILITY) with nothing left allocated. */
int st__named_init(st__named_t *e, const char *s, size_t n, uid_t uid, int device,
                   uint64_t data_bytes, uint64_t page_bytes, char *err, size_t errlen);

/* st__named_init for a restore (server/restart.c): e takes one reference
 * to `data` and to `page` (a CPU arena of at least `page_bytes`, mapped
 * at e->page) instead of allocating them. INVALID_ARGUMENT (a page that
 * is no CPU arena of that size) with nothing taken. */
int st__named_adopt(st__named_t *e, const char *s, size_t n, uid_t uid, st__arena_t *data,
                    st__arena_t *page, uint64_t page_bytes, char *err, size_t errlen);

/* Charges e (initialized) to its uid's quotas: 1 of `kind` (buffers,
 * hand-offs), its arenas' descriptors and bytes. ST_OK, or LIMIT naming
 * the quota with nothing charged. st__named_release gives it back. */
int st__named_charge(st__named_t *e, st__uidq_kind_t kind, char *err, size_t errlen);

/* The descriptors the ledger holds for arena a (0 or 1). */
unsigned st__named_arena_fds(const st__arena_t *a);

/* Puts e at the head of l. */
void st__named_add(st__named_list_t *l, st__named_t *e);

/* Takes e out of l (NULL, or e not in it: nothing). */
void st__named_remove(st__named_list_t *l, st__named_t *e);

/* Takes e out of l (as st__named_remove) and drops its arenas; the caller
 * frees e. Clients' mappings keep the memory. */
void st__named_release(st__named_list_t *l, st__named_t *e);

#endif
