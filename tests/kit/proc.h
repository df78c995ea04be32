/* Running a program from a test (stcli, stserver, bash) with its stdout
 * and stderr captured, each through a pipe or, where the program must see
 * a terminal, a pseudo-terminal:
 *
 *   stt_proc_t p;
 *   int code = stt_run(&p, bin, (const char *const[]){"--help", NULL}, NULL, 0);
 *   ... p.out, p.err ...
 *
 *   stt_proc_start(&p, bin, args, NULL, 0);   // in the background
 *   stt_proc_read(&p, 100);                   // what came within 100 ms
 *   int code = stt_proc_finish(&p, 10000);    // to EOF, then the exit code
 *
 * The child runs without $SHARED_TENSOR_BASE_PATH (tests name their socket)
 * and $XDG_RUNTIME_DIR, with SHARED_TENSOR_TEST_RUN_DIR naming a directory
 * that does not exist (so a default socket base is the /tmp fallback, never
 * the host's /run), plus the "NAME=value" lines of `env`. Never sleeps
 * blindly: reads poll, and a child still running at the deadline is
 * killed.
 */
#ifndef STT_PROC_H
#define STT_PROC_H

#include <stddef.h>
#include <sys/types.h>

/* Which streams go to a pseudo-terminal instead of a pipe. */
#define STT_PTY_OUT 1
#define STT_PTY_ERR 2

typedef struct stt_proc {
  pid_t pid;
  int fd_out, fd_err;   /* read ends; -1 once at EOF (EIO for a terminal) */
  int status;           /* exit code, or 128 + signal; -1 while running */
  char out[16384];      /* what came so far, NUL-terminated */
  char err[16384];
  size_t nout, nerr;
} stt_proc_t;

/* Starts prog with args (NULL-terminated, without the program name) and
 * env ("NAME=value" lines, or NULL). 0, or -1 when it could not be started. */
int stt_proc_start(stt_proc_t *p, const char *prog, const char *const *args, const char *env,
                   int pty);
/* Reads what arrives within ms milliseconds (one poll). */
void stt_proc_read(stt_proc_t *p, int ms);
/* Reads to EOF (killing the child at the deadline), waits for it and
 * returns its exit code (also in p->status). */
int stt_proc_finish(stt_proc_t *p, int timeout_ms);
/* stt_proc_start then stt_proc_finish with a 30 s deadline; the exit code,
 * or -1 when it could not be started. */
int stt_run(stt_proc_t *p, const char *prog, const char *const *args, const char *env, int pty);
/* The number of '\n' in s. */
int stt_count_lines(const char *s);

/* The inode of the file process pid maps at addr (/proc/PID/maps), or 0
 * (no file there). */
unsigned long long stt_proc_inode_at(pid_t pid, const void *addr);

/* Whether process pid maps a file of inode ino (a memfd another process
 * mapped too: the same memory, not a copy). */
int stt_proc_maps_inode(pid_t pid, unsigned long long ino);

/* Descriptors process pid holds now (/proc/PID/fd), or -1. */
int stt_proc_fd_count(pid_t pid);

#endif
