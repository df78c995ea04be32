/* src/common: where the sockets are when nobody says (include/st/wire.h,
 * docs/operations.md "Where the socket is"). The one list of default
 * socket bases that stserver (and libstembed), libstclient and through it
 * stcli and the Python and Lua clients share:
 *   1. $XDG_RUNTIME_DIR/sharedtensor/st  when XDG_RUNTIME_DIR is set to an
 *      absolute path (a user's own server);
 *   2. /run/sharedtensor/st              (root, or a systemd service with
 *      RuntimeDirectory=sharedtensor);
 *   3. /tmp/shared-tensor                (the fallback, as before).
 * The server takes the first it can use (server/sockdir.c), a client the
 * first where the socket of its device exists (client/connect.c).
 * $SHARED_TENSOR_BASE_PATH, base_path and --base-path bypass the list.
 */
#ifndef ST_COMMON_SOCKDIR_H
#define ST_COMMON_SOCKDIR_H

#include <stddef.h>

/* Tests only: the directory that stands for /run in entry 2 (a test cannot
 * write /run). Unset everywhere else. */
#define ST__ENV_TEST_RUN_DIR "SHARED_TENSOR_TEST_RUN_DIR"

#define ST__SOCKDIR_MAX 3

typedef enum { ST__SOCKDIR_XDG, ST__SOCKDIR_RUN, ST__SOCKDIR_TMP } st__sockdir_kind_t;

typedef struct st__sockdir {
  st__sockdir_kind_t kind;
  char base[256];   /* the socket base: sockets are "<base>-<device>.sock"  */
  char dir[256];    /* the directory that holds the sockets                 */
  char parent[256]; /* where dir is made: $XDG_RUNTIME_DIR, /run or /tmp     */
} st__sockdir_t;

/* The default socket bases in the order they are tried, read from the
 * environment now (XDG_RUNTIME_DIR; ST__ENV_TEST_RUN_DIR). Writes 2 or 3
 * entries into out and returns how many. Any thread (reads the
 * environment only). */
int st__sockdir_list(st__sockdir_t out[ST__SOCKDIR_MAX]);

/* What an entry is, for messages: "$XDG_RUNTIME_DIR", "/run" or "the
 * fallback". Static string. Any thread. */
const char *st__sockdir_kind_name(st__sockdir_kind_t kind);

/* 1 when `dir` is the socket directory of a private entry of the list
 * (XDG or run: a directory the server makes for itself alone), else 0.
 * The server holds such a directory to the strict rule: its own, not
 * writable by group or others. Any thread. */
int st__sockdir_is_private(const char *dir);

#endif
