/* src/server: the service manager's file-descriptor store (systemd's
 * FDSTORE=1 / FDNAME= / FDSTOREREMOVE=1 over $NOTIFY_SOCKET, given back
 * to the next process of the service as LISTEN_FDS / LISTEN_FDNAMES /
 * LISTEN_PID; docs/lifecycle.md, "Restarts"), and the descriptors a
 * takeover hands over the same way (takeover.c).
 *
 * The store is used when the manager says it has one: $NOTIFY_SOCKET set
 * and $FDSTORE (systemd sets it from FileDescriptorStoreMax=, a unit may
 * set it too) a positive number, the most descriptors the store keeps.
 *
 * What this process received is a table of (name, descriptor) that the
 * restore (restart.c) claims entry by entry; what nobody claims is closed
 * and removed from the store. Nothing received is trusted: each claimer
 * checks the descriptor's kind (fstat, seals) before it uses it.
 *
 * Threads: loop thread (at start, and for every store change).
 */
#ifndef ST_SERVER_FDSTORE_H
#define ST_SERVER_FDSTORE_H

#include <stddef.h>
#include <stdint.h>

/* A name in the store: systemd takes at most 255 characters, none of
 * them ':' or control characters. */
#define ST__FDNAME_MAX 255

typedef struct st__fdstore_entry {
  char name[ST__FDNAME_MAX + 1];
  int fd;                     /* owned until claimed; -1 once claimed      */
} st__fdstore_entry_t;

typedef struct st__fdstore {
  int enabled;                /* the store is used (see the top)           */
  uint64_t max;               /* $FDSTORE: descriptors the store keeps     */
  uint64_t stored;            /* names this process keeps there now        */
  st__fdstore_entry_t *received; /* owned: what the process started with   */
  size_t nreceived;
} st__fdstore_t;

/* Reads the environment: whether the store is used, and the descriptors
 * given to this process (LISTEN_PID must be this process, LISTEN_FDS the
 * count from descriptor 3, LISTEN_FDNAMES their names; a descriptor
 * without a name is named "unknown"). Each received descriptor is made
 * close-on-exec and the three variables are unset (a child never sees
 * them). A malformed variable is logged and its descriptors are not
 * taken. Loop thread, at start. */
void st__fdstore_init(st__fdstore_t *s);

/* Replaces what the environment gave by the n entries of `handed` (a
 * takeover's, takeover.h): their descriptors are the table's from now on
 * (the caller's entries are marked -1). Loop thread, at start. */
void st__fdstore_adopt(st__fdstore_t *s, st__fdstore_entry_t *handed, size_t n);

/* Takes received descriptor `name` (the caller owns it from now on), or
 * -1 when none has that name. Loop thread. */
int st__fdstore_claim(st__fdstore_t *s, const char *name);

/* Closes every received descriptor nobody claimed, each removed from
 * the store and logged. Loop thread, once the restore is done. */
void st__fdstore_drop_unclaimed(st__fdstore_t *s);

/* Stores a duplicate of `fd` under `name` (FDPOLL=0: the manager does
 * not watch it). Counts it against $FDSTORE (`fresh`: a name not stored
 * yet). ST_OK once the message is in the manager's queue; LIMIT (the
 * store is full), or st__notify_send's errors, with the reason in err.
 * Loop thread. */
int st__fdstore_put(st__fdstore_t *s, const char *name, int fd, int fresh, char *err,
                    size_t errlen);

/* Removes every descriptor stored under `name`. Logged on failure.
 * Loop thread. */
void st__fdstore_remove(st__fdstore_t *s, const char *name);

/* Closes what is left of the received table. Loop thread, at exit. */
void st__fdstore_free(st__fdstore_t *s);

#endif
