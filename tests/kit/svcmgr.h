/* A service manager for tests: systemd's part in a server's restart
 * (docs/lifecycle.md, "Restarts"). It binds a notify socket, reads every
 * notification on a thread of its own (READY=1; FDSTORE=1 with FDNAME=
 * and the descriptors riding on it; FDSTOREREMOVE=1 with FDNAME=), keeps
 * the stored descriptors as systemd's fd store does (a second descriptor
 * of an open file it holds is dropped), and starts a server
 * as systemd would: $NOTIFY_SOCKET, $FDSTORE, and the stored descriptors
 * from 3 with $LISTEN_FDS, $LISTEN_FDNAMES and $LISTEN_PID.
 *
 *   stt_svcmgr_t m;
 *   stt_svcmgr_start(&m, s.dir, 4096);
 *   stt_svcmgr_attach(&m, &s);          // before each stt_server_start
 *   ...kill the server...
 *   stt_svcmgr_sync(&m);                // every notification it sent is in
 *   stt_svcmgr_stop(&m);
 *
 * The store is locked: the reader thread changes it while the test reads.
 */
#ifndef STT_SVCMGR_H
#define STT_SVCMGR_H

#include <pthread.h>
#include <stdint.h>

#include "fixture.h"

#define STT_SVCMGR_MAX_FDS 1024

typedef struct stt_svcmgr_fd {
  char name[256];
  int fd;
} stt_svcmgr_fd_t;

typedef struct stt_svcmgr {
  int sock;
  char path[300];
  uint64_t max;
  pthread_t thread;
  volatile int stop;
  int busy;                   /* the thread handles a datagram            */
  pthread_mutex_t lock;
  stt_svcmgr_fd_t fds[STT_SVCMGR_MAX_FDS];
  int nfds;
  int ready;                  /* READY=1 seen                             */
  uint64_t stored, removed;   /* FDSTORE=1 / FDSTOREREMOVE=1 messages     */
  int overflow;               /* a descriptor past STT_SVCMGR_MAX_FDS     */
  uint64_t duplicates;        /* descriptors of a file already stored,
                                 dropped as systemd drops them            */
  /* Prepared by stt_svcmgr_attach for the server's process. */
  int exec_fds[STT_SVCMGR_MAX_FDS];
  int nexec;
  char env_notify[320], env_max[32], env_count[32];
  char *env_names;
} stt_svcmgr_t;

/* Binds <dir>/notify and starts the reader; `max` is what $FDSTORE says
 * (0: unset, the store is off). Aborts on a setup failure. */
void stt_svcmgr_start(stt_svcmgr_t *m, const char *dir, uint64_t max);

/* The next start of s gets the service's environment and the store's
 * descriptors as they are now. */
void stt_svcmgr_attach(stt_svcmgr_t *m, stt_server_t *s);

/* Waits until every notification already sent is handled (after the
 * server is gone, or to read the store now). */
void stt_svcmgr_sync(stt_svcmgr_t *m);

/* Descriptors stored under names starting with `prefix`. */
int stt_svcmgr_count(stt_svcmgr_t *m, const char *prefix);

/* The first descriptor stored under `name` (borrowed), or -1. */
int stt_svcmgr_fd(stt_svcmgr_t *m, const char *name);

/* Replaces the descriptor stored under `name` by fd (taken), as a
 * process that wrote into the store could; 0, or -1 when no descriptor
 * has that name. */
int stt_svcmgr_replace(stt_svcmgr_t *m, const char *name, int fd);

/* The name of the stored descriptor of the file of inode ino, copied
 * into name (cap bytes); 0, or -1 when none is that file. */
int stt_svcmgr_name_of(stt_svcmgr_t *m, unsigned long long ino, char *name, size_t cap);

/* READY=1 notifications seen so far. */
int stt_svcmgr_ready(stt_svcmgr_t *m);

/* Stops the reader, closes the socket and every stored descriptor. */
void stt_svcmgr_stop(stt_svcmgr_t *m);

#endif
