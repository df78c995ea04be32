/* src/common/log.c: the server's log (see log.h).
 *
 * Each event is formatted into a stack buffer and written to fd 2 with one
 * write(2), so lines of concurrent threads never interleave (writes to a pipe
 * or terminal up to PIPE_BUF bytes are atomic; longer lines are cut to
 * LOG_LINE_MAX). The level is one atomic int: any thread may log or change
 * it. Control characters in the message are escaped so that one event stays
 * one line (a Lua traceback's newlines become "\n").
 *
 * Warnings and errors are rate-limited per call site (the address of the
 * format string): a site writes at most `burst` lines per `window_s`
 * seconds; what it would have written beyond that is counted, and the
 * first line the site writes once its window has passed comes after one
 * that says how many were suppressed. So a client that makes the server
 * warn in a loop costs a few lines per window, not megabytes. The sites
 * live in a small table under a mutex (warnings are not the hot path).
 *
 * Under systemd, stderr is often the journal's stream: systemd then sets
 * $JOURNAL_STREAM to "<device>:<inode>" of that stream. When fd 2 is that
 * very file, each line starts with its syslog priority, "<3>" error, "<4>"
 * warning, "<6>" info, "<7>" debug, which the journal takes as the line's
 * priority (so `journalctl -p err` finds the errors). Anywhere else (a
 * terminal, a file, a pipe; or stderr redirected away from the journal
 * while $JOURNAL_STREAM was inherited) lines have no prefix.
 */
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"

#define LOG_LINE_MAX 4096

static int log_level = ST_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
/* syslog priorities of the levels: LOG_ERR, LOG_WARNING, LOG_INFO,
 * LOG_DEBUG. */
static const char level_priority[] = {'3', '4', '6', '7'};

/* 1: fd 2 is the journal's stream (prefix "<N>"), 0: it is not, -1: not
 * looked at yet. */
static int journal_stream = -1;

/* Whether fd 2 is the stream $JOURNAL_STREAM ("<dev>:<ino>") names. */
static int stderr_is_journal(void) {
  const char *js = getenv("JOURNAL_STREAM");
  unsigned long long dev, ino;
  char tail;
  if (!js || sscanf(js, "%llu:%llu%c", &dev, &ino, &tail) != 2) return 0;
  struct stat st;
  if (fstat(2, &st) != 0) return 0;
  return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* See log.h. */
int st__log_detect_journal(void) {
  int j = stderr_is_journal();
  __atomic_store_n(&journal_stream, j, __ATOMIC_RELAXED);
  return j;
}

/* ------------------------------------------------------------ rate limit */

#define SITES 256             /* call sites tracked; a power of two */
#define SITE_PROBES 8

typedef struct site {
  const char *fmt;            /* the call site; NULL: a free slot */
  double window_start;        /* monotonic seconds */
  unsigned lines;             /* written in this window */
  unsigned long suppressed;   /* not written since the last report */
  double suppressed_since;    /* monotonic, the first one suppressed */
} site_t;

static pthread_mutex_t sites_mu = PTHREAD_MUTEX_INITIALIZER;
static site_t sites[SITES];
static unsigned rate_burst = ST_LOG_RATE_BURST;
static double rate_window_s = ST_LOG_RATE_WINDOW_S;

/* Sets the limit of every warning and error call site: `burst` lines per
 * `window_s` seconds; burst 0 turns the limit off. Any thread. */
void st__log_set_rate_limit(unsigned burst, double window_s) {
  pthread_mutex_lock(&sites_mu);
  rate_burst = burst;
  rate_window_s = window_s > 0 ? window_s : ST_LOG_RATE_WINDOW_S;
  memset(sites, 0, sizeof sites);
  pthread_mutex_unlock(&sites_mu);
}

/* The slot of call site fmt: its own, a free one, or (the table being
 * full around it) the home slot, taken over. Under sites_mu. */
static site_t *site_of(const char *fmt) {
  size_t home = ((uintptr_t)fmt >> 3) * 2654435761u & (SITES - 1);
  for (size_t i = 0; i < SITE_PROBES; i++) {
    site_t *s = &sites[(home + i) & (SITES - 1)];
    if (s->fmt == fmt) return s;
    if (!s->fmt) {
      s->fmt = fmt;
      return s;
    }
  }
  site_t *s = &sites[home];
  memset(s, 0, sizeof *s);
  s->fmt = fmt;
  return s;
}

/* Whether a line of call site fmt is written now (1) or suppressed (0).
 * When it is written after some were suppressed, *report gets their count
 * and *over the seconds they span. Any thread. */
static int rate_admit(const char *fmt, unsigned long *report, double *over) {
  *report = 0;
  pthread_mutex_lock(&sites_mu);
  if (!rate_burst) {
    pthread_mutex_unlock(&sites_mu);
    return 1;
  }
  double now = st__now_mono();
  site_t *s = site_of(fmt);
  if (s->lines == 0 || now - s->window_start >= rate_window_s) {
    s->window_start = now;
    s->lines = 0;
  }
  int ok = s->lines < rate_burst;
  if (ok) {
    s->lines++;
    *report = s->suppressed;
    *over = now - s->suppressed_since;
    s->suppressed = 0;
  } else if (s->suppressed++ == 0) {
    s->suppressed_since = now;
  }
  pthread_mutex_unlock(&sites_mu);
  return ok;
}

/* "error" | "warn" | "info" | "debug" (also "warning"), or -1. */
int st__log_level_parse(const char *s) {
  if (!s) return -1;
  if (strcmp(s, "warning") == 0) return ST_LOG_WARN;
  for (int i = 0; i < 4; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  return -1;
}

/* Sets the most verbose level that is written. Any thread. */
void st__log_set_level(st__log_level_t level) {
  __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

/* Nonzero if events of `level` are written. Any thread. */
int st__log_enabled(st__log_level_t level) {
  return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

/* Appends `src` to line[*len..cap), escaping control characters; stops
 * silently when the buffer is full. */
static void append_escaped(char *line, size_t *len, size_t cap, const char *src) {
  size_t n = *len;
  for (const unsigned char *s = (const unsigned char *)src; *s && n < cap; s++) {
    unsigned char c = *s;
    if (c >= 0x20 || c == '\t') { line[n++] = (char)c; continue; }
    if (n + 2 > cap) break;
    line[n++] = '\\';
    line[n++] = c == '\n' ? 'n' : c == '\r' ? 'r' : '?';
  }
  *len = n;
}

/* Writes "<UTC time> <level> <who>: <msg>" with one write(2). */
static void write_line(st__log_level_t level, const char *who, const char *msg) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);

  const char *lname = ((unsigned)level < 4) ? level_names[level] : "?";
  int journal = __atomic_load_n(&journal_stream, __ATOMIC_RELAXED);
  if (journal < 0) journal = st__log_detect_journal(); /* the first line; idempotent */
  char prio[4] = "";
  if (journal) {
    prio[0] = '<';
    prio[1] = (unsigned)level < 4 ? level_priority[level] : '6';
    prio[2] = '>';
  }
  char line[LOG_LINE_MAX + 128];
  int hlen = snprintf(line, sizeof line, "%s%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %-5s %s: ",
                      prio, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                      tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000), lname,
                      who ? who : "-");
  size_t len = (hlen < 0) ? 0 : (size_t)hlen;
  if (len > LOG_LINE_MAX) len = LOG_LINE_MAX;
  append_escaped(line, &len, LOG_LINE_MAX, msg);
  line[len++] = '\n';

  ssize_t w;
  do {
    w = write(2, line, len);
  } while (w < 0 && errno == EINTR);
}

/* st__log and st__log_all: `limited` applies the rate limit (warnings and
 * errors only). */
static void vlog(st__log_level_t level, const char *who, int limited, const char *fmt,
                 va_list ap) {
  if (!st__log_enabled(level)) return;
  int saved_errno = errno;
  unsigned long suppressed = 0;
  double over = 0;
  if (limited && level <= ST_LOG_WARN && !rate_admit(fmt, &suppressed, &over)) {
    errno = saved_errno;
    return;
  }
  char msg[LOG_LINE_MAX];
  if (suppressed) {
    snprintf(msg, sizeof msg, "%lu more lines like the next one were suppressed in %.1f s "
             "(at most %u per %g s from one place)", suppressed, over, rate_burst, rate_window_s);
    write_line(level, who, msg);
  }
  int mlen = vsnprintf(msg, sizeof msg, fmt, ap);
  if (mlen < 0) msg[0] = '\0';
  write_line(level, who, msg);
  errno = saved_errno;
}

/* Writes one line "<UTC time> <level> <who>: <message>" to stderr when
 * `level` is enabled and, for warnings and errors, the call site is within
 * its rate limit. `who` (may be NULL) and `fmt` are borrowed. Keeps
 * errno. Any thread. */
void st__log(st__log_level_t level, const char *who, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, who, 1, fmt, ap);
  va_end(ap);
}

/* st__log without the rate limit; see log.h. Any thread. */
void st__log_all(st__log_level_t level, const char *who, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vlog(level, who, 0, fmt, ap);
  va_end(ap);
}
