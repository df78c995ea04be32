/* Integration-test fixture: a real stserver in a private temp directory.
 *
 *   stt_server_t s;
 *   stt_server_init(&s);                        // temp dir, default config
 *   stt_write_endpoint(&s, "echo.lua", "return st.endpoint{...}");
 *   stt_server_config(&s, "workers = 2, limits = { max_inflight = 4 }");
 *   if (stt_server_start(&s) != 0) ...          // waits until ping answers
 *   ... connect to s.socket ...
 *   int status = stt_server_stop(&s);           // SIGTERM; 0 = clean exit
 *   stt_server_cleanup(&s);                     // removes the temp dir
 *
 * Without stt_write_endpoint the server serves the repository's endpoints/.
 * The server's stderr goes to <dir>/server.log; stt_server_log() reads it.
 * Never sleeps blindly: start polls ping every 5 ms (10 s limit), stop
 * waits for the exit (10 s limit, then SIGKILL and a failure).
 */
#ifndef STT_FIXTURE_H
#define STT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct stt_server {
  pid_t pid;
  char dir[256];          /* temp dir                                   */
  char base[300];         /* --base-path                                */
  char socket[320];       /* <base>-0.sock                              */
  char endpoints[300];    /* <dir>/endpoints, or the repo's endpoints/  */
  char config[300];       /* <dir>/config.lua                           */
  char log[300];          /* <dir>/server.log                           */
  char extra_config[4096];/* text inserted into the config table        */
  const char *extra_args[16];
  int own_endpoints;
} stt_server_t;

/* Creates the temp dir. Aborts the test program on failure (setup bug). */
void stt_server_init(stt_server_t *s);
/* Adds lines inside the config table, e.g. "workers = 2,". Appends. */
void stt_server_config(stt_server_t *s, const char *lua_fields);
/* Writes <dir>/endpoints/<name> and serves that directory from now on. */
void stt_write_endpoint(stt_server_t *s, const char *name, const char *text);
/* Starts the server and waits until ping answers. 0, or -1 (log printed). */
int stt_server_start(stt_server_t *s);
/* SIGTERM, wait. Returns the exit status (0 clean), or -1 if it had to be
 * killed or died by a signal. Checks that the socket file is gone. */
int stt_server_stop(stt_server_t *s);
/* Removes the temp dir (after stop). */
void stt_server_cleanup(stt_server_t *s);
/* The server log so far, malloc'ed (free). */
char *stt_server_log(const stt_server_t *s);

/* Raw connection to a socket path; fd or -1. */
int stt_connect(const char *path);
/* Sends all bytes (blocking). 0 or -1. */
int stt_send_all(int fd, const void *buf, size_t len);
/* Reads one msgpack-RPC response into *buf (malloc'ed msgpack bytes of the
 * whole message), collecting any fds into fds[] and their count into *nfds (max `maxfds`).
 * timeout_ms bounds the wait. Returns 1 on a message, 0 on EOF, -1 on
 * error or timeout. */
int stt_recv_message(int fd, char **buf, size_t *len, int *fds, int maxfds, int *nfds,
                     int timeout_ms);
/* Sends [0, id, "ping", []] and checks the reply is "pong". 0 or -1. */
int stt_ping(int fd, uint32_t id);
/* Monotonic milliseconds. */
double stt_now_ms(void);
/* Writes a file (creating it). Aborts on failure. */
void stt_write_file(const char *path, const char *text);

#endif
