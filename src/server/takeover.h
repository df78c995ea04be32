/* src/server: a takeover: a new server process takes over from a running
 * one, listening sockets, published state and all, without a service
 * manager (`stserver --takeover`; docs/operations.md, "Upgrades without
 * a service manager").
 *
 * The new process (N) connects to the running one's (O's) socket as a
 * process of O's uid (or root) and sends the `takeover` request. O
 * answers with its pid, then:
 *  1. stops accepting (new connections wait in the listen backlog) and
 *     stops reading every client connection (st__conn_stop_reading):
 *     requests already read are answered, then the connection closes; a
 *     client sees its end with nothing unanswered that ran, and connects
 *     again (to whichever server accepts then);
 *  2. once no connection and no build is left (or shutdown_grace_s after
 *     the request, when what still runs is cancelled and what is still
 *     open is closed), sends N over the request's connection a journal of
 *     its tables and a descriptor of every arena it names and of every
 *     listening socket (st__restart_handover): frames of a 4-byte length
 *     and text "st-handover 1\n" then one name a line, the frame's
 *     descriptors riding on it (at most ST__TAKEOVER_FDS_PER_FRAME), and
 *     a last frame "st-handover end <count>\n";
 *  3. waits for N's one line: "ready <pid>": O exits with status 0 and
 *     leaves N the socket files; "failed <why>", the end of the
 *     connection or 60 s of silence: O accepts again and serves on.
 * N restores from what it received as from the fd store (restart.c),
 * serves on the sockets it received (listen.c), then says ready.
 *
 * Threads: loop thread (O); the main thread before the server starts (N).
 */
#ifndef ST_SERVER_TAKEOVER_H
#define ST_SERVER_TAKEOVER_H

#include <stddef.h>
#include <sys/types.h>

#include "server/fdstore.h"

#define ST__TAKEOVER_FDS_PER_FRAME 200

struct st__rpc_req;
typedef struct st__server st__server_t;

/* O: the `takeover` method (rpc.h). AUTH for a uid other than the
 * server's and root; BUSY while a takeover runs; SHUTTING_DOWN. */
void st__rpc_takeover(struct st__rpc_req *r);

/* O: stops a takeover in progress at exit and frees it. Loop thread. */
void st__takeover_free(st__server_t *srv);

/* N: connects to the server at socket `path` (its peer must be of this
 * process's uid, or root), asks it to hand over, and receives what it
 * hands: *out (malloc'ed, *n entries; the caller owns each descriptor),
 * *channel (the connection, for st__takeover_answer), *old (its pid).
 * ST_OK, or the reason in err (nothing left open). Main thread. */
int st__takeover_request(const char *path, int *channel, st__fdstore_entry_t **out, size_t *n,
                         pid_t *old, char *err, size_t errlen);

/* N: tells the old server this one serves now (ok), or why it could not
 * start (it then serves on), and closes the channel. Main thread. */
void st__takeover_answer(int channel, int ok, const char *why);

#endif
