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
 * The shape most test programs have, in two calls:
 *
 *   stt_server_setup(&s, "workers = 2,", endpoints);  // init..start, or exit 1
 *   RUN(...); ...
 *   return stt_server_finish(&s);                     // stop, cleanup, summary
 *
 * The server's stderr goes to <dir>/server.log; stt_server_log() reads it.
 * When a check fails (check.h), the last STT_LOG_TAIL_LINES lines of the log
 * of every server between init and cleanup are printed, as they are when a
 * server fails to start or exits uncleanly; a passing test prints none.
 * Never sleeps blindly: start polls ping every 5 ms (10 s limit), stop
 * waits for the exit (10 s limit, then SIGKILL and a failure).
 */
#ifndef STT_FIXTURE_H
#define STT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define STT_LOG_TAIL_LINES 40

/* An endpoint file: name ("echo.lua") and Lua text. Tables of them end
 * with {NULL, NULL}. */
typedef struct stt_endpoint {
  const char *name;
  const char *text;
} stt_endpoint_t;

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
  char netns[64];         /* "": this process's network namespace; else
                             the server runs in /var/run/netns/<netns>  */
  /* Called in the server's process just before exec (NULL: nothing):
   * what a service manager sets up (svcmgr.h). Async-signal-safe work
   * only (the test may have threads). */
  void (*before_exec)(void *ud);
  void *before_exec_ud;
} stt_server_t;

/* Creates the temp dir. Aborts the test program on failure (setup bug). */
void stt_server_init(stt_server_t *s);
/* Adds lines inside the config table, e.g. "workers = 2,". Appends. */
void stt_server_config(stt_server_t *s, const char *lua_fields);
/* Writes <dir>/endpoints/<name> and serves that directory from now on. */
void stt_write_endpoint(stt_server_t *s, const char *name, const char *text);
/* Writes <stem>_cuda.lua and <stem>_cpu.lua from one text in which each
 * "$DEVICE" stands for the device ("cuda", "cpu"): the same endpoint built
 * on both. */
void stt_write_endpoint_per_device(stt_server_t *s, const char *stem, const char *text);
/* stt_write_endpoint for each row of a table ending with {NULL, NULL}. */
void stt_write_endpoints(stt_server_t *s, const stt_endpoint_t *eps);
/* init, config (NULL: none), endpoints (NULL: the repository's); not
 * started. */
void stt_server_prepare(stt_server_t *s, const char *lua_fields, const stt_endpoint_t *eps);
/* init, config (NULL: none), endpoints (NULL: the repository's), start:
 * on a failed start the log tail is printed and the program exits 1. */
void stt_server_setup(stt_server_t *s, const char *lua_fields, const stt_endpoint_t *eps);
/* stt_server_start, or on failure cleanup and exit 1 (the log tail was
 * printed). */
void stt_server_start_or_exit(stt_server_t *s);
/* The end of a test program: stops s (an unclean exit counts as a failed
 * test, with the log tail), removes its dir and returns stt_summary(). */
int stt_server_finish(stt_server_t *s);
/* The same for a server a test already stopped, whose stt_server_stop
 * gave `status`. */
int stt_server_end(stt_server_t *s, int status);
/* Starts s, runs body(s) if it started, stops s. 0 when it started and
 * exited cleanly, else -1 (said on stderr). The caller cleans up. */
int stt_server_run(stt_server_t *s, void (*body)(stt_server_t *s));
/* Waits (timeout_ms) for a server that was already signalled to exit,
 * without signalling it. Its exit status, or -1 (killed by a signal, or
 * still running at the deadline). */
int stt_server_wait_exit(stt_server_t *s, int timeout_ms);
/* Starts the server and waits until ping answers. 0, or -1 (log printed). */
int stt_server_start(stt_server_t *s);
/* SIGTERM, wait. Returns the exit status (0 clean), or -1 if it had to be
 * killed or died by a signal. Checks that the socket file is gone. */
int stt_server_stop(stt_server_t *s);
/* Removes the temp dir (after stop). */
void stt_server_cleanup(stt_server_t *s);
/* The server log so far, malloc'ed (free). */
char *stt_server_log(const stt_server_t *s);
/* Prints the log lines of s that are new since the last print, at most
 * STT_LOG_TAIL_LINES of them, under a line naming `why`. */
void stt_server_print_log_tail(const stt_server_t *s, const char *why);
/* Removes the directory `dir` and everything below it (best effort). */
void stt_remove_tree(const char *dir);
/* Sleeps ms milliseconds: only to space out load, never to wait for a
 * state (poll for those). */
void stt_sleep_ms(int ms);

/* Raw connection to a socket path; fd or -1. */
int stt_connect(const char *path);
/* Sends all bytes (blocking). 0 or -1. */
int stt_send_all(int fd, const void *buf, size_t len);
/* Sends all bytes with nfds descriptors (at most ST_MAX_FDS_PER_MESSAGE)
 * riding on the first of them; the descriptors stay the caller's. 0 or -1. */
int stt_send_fds(int fd, const void *buf, size_t len, const int *fds, int nfds);
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
