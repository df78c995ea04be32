/* src/common/log.c: the server's log (see log.h).
 *
 * Each event is formatted into a stack buffer and written to fd 2 with one
 * write(2), so lines of concurrent threads never interleave (writes to a pipe
 * or terminal up to PIPE_BUF bytes are atomic; longer lines are cut to
 * LOG_LINE_MAX). The level is one atomic int: any thread may log or change
 * it. Control characters in the message are escaped so that one event stays
 * one line (a Lua traceback's newlines become "\n").
 */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096

static int log_level = ST_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

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

/* Writes one line "<UTC time> <level> <who>: <message>" to stderr when
 * `level` is enabled. `who` (may be NULL) and `fmt` are borrowed. Keeps
 * errno. Any thread. */
void st__log(st__log_level_t level, const char *who, const char *fmt, ...) {
  if (!st__log_enabled(level)) return;
  int saved_errno = errno;

  char msg[LOG_LINE_MAX];
  va_list ap;
  va_start(ap, fmt);
  int mlen = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (mlen < 0) msg[0] = '\0';

  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);

  const char *lname = ((unsigned)level < 4) ? level_names[level] : "?";
  char line[LOG_LINE_MAX + 128];
  int hlen = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %-5s %s: ",
                      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
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
  errno = saved_errno;
}
