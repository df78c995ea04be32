/* Test harness state, failure reports and summary; see check.h. */
#include "check.h"

#include <stdarg.h>

#include "st/errors.h"

int stt_failed_now;
int stt_passed, stt_failed;
void (*stt_fail_hook)(void);

static void report(const char *file, int line, const char *fmt, va_list ap) {
  fprintf(stderr, "%s:%d: ", file, line);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
}

void stt_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(file, line, fmt, ap);
  va_end(ap);
  if (!stt_failed_now && stt_fail_hook) stt_fail_hook();
  stt_failed_now = 1;
}

void stt_fail_main(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  report(file, line, fmt, ap);
  va_end(ap);
  if (stt_fail_hook) stt_fail_hook();
  stt_failed++;
}

const char *stt_err_label(long long code) {
  static char buf[64];
  if (code == ST_OK) return "ST_OK";
  if (code < ST_ERR_MIN || code > -1) return "";
  snprintf(buf, sizeof buf, "ST_ERR_%s", st_err_name((int)code));
  return buf;
}

void stt_fail_err(const char *file, int line, const char *expr, long long got, long long want,
                  const char *msg) {
  char gotl[64], quoted[1100] = "";
  snprintf(gotl, sizeof gotl, "%s", stt_err_label(got));
  if (msg && *msg) snprintf(quoted, sizeof quoted, " \"%.1024s\"", msg);
  stt_fail(file, line, "%s = %s%s(%lld)%s, want %s%s(%lld)", expr, gotl, *gotl ? " " : "", got,
           quoted, stt_err_label(want), *stt_err_label(want) ? " " : "", want);
}

int stt_summary(void) {
  printf("%d passed, %d failed\n", stt_passed, stt_failed);
  return stt_failed ? 1 : 0;
}

void stt_skip(const char *why) {
  printf("skipped: %s\n", why);
  exit(77);
}

/* See check.h. */
int stt_lines_containing(const char *text, const char *part) {
  int n = 0;
  for (const char *line = text, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
    const char *hit = strstr(line, part);
    if (hit && hit < nl) n++;
  }
  return n;
}
