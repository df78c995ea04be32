/* The server log (src/common/log.h): line format, levels, escaping,
 * whole lines from concurrent threads, the rate limit of repeated
 * warnings, and the syslog priority prefixes when stderr is the journal.
 * stderr is pointed at a temp file. */
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/log.h"
#include "fixture.h"
#include <stdlib.h>

static char path[] = "/tmp/st-test-log-XXXXXX";
static int saved_stderr = -1;

/* Points fd 2 at an empty temp file. */
static int capture(void) {
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  saved_stderr = dup(2);
  dup2(fd, 2);
  close(fd);
  return 0;
}

/* Restores fd 2 and returns what was written (malloc'd). */
static char *release(void) {
  off_t n = lseek(2, 0, SEEK_END);
  char *buf = calloc(1, (size_t)n + 1);
  if (n > 0 && pread(2, buf, (size_t)n, 0) != n) buf[0] = '\0';
  dup2(saved_stderr, 2);
  close(saved_stderr);
  strcpy(path, "/tmp/st-test-log-XXXXXX");
  return buf;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ " */
static int stamp_ok(const char *s) {
  const char *pat = "dddd-dd-ddTdd:dd:dd.dddZ ";
  for (size_t i = 0; pat[i]; i++) {
    if (pat[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != pat[i]) return 0;
  }
  return 1;
}

TEST(format_and_levels) {
  CHECK(capture() == 0);
  st__log_set_level(ST_LOG_INFO);
  CHECK(st__log_enabled(ST_LOG_INFO));
  CHECK(!st__log_enabled(ST_LOG_DEBUG));
  ST_LOG_I("loop", "listening on %s", "/tmp/x.sock");
  ST_LOG_D("loop", "hidden %d", 1);
  ST_LOG_W("conn", "slow");
  ST_LOG_E(NULL, "bad");
  st__log_set_level(ST_LOG_DEBUG);
  ST_LOG_D("lua", "two\nlines\r");
  st__log_set_level(ST_LOG_ERROR);
  ST_LOG_W("conn", "not shown");
  ST_LOG_E("conn", "shown");
  st__log_set_level(ST_LOG_INFO);
  char *out = release();
  fprintf(stderr, "%s", out);
  const char *want[] = {"info  loop: listening on /tmp/x.sock", "warn  conn: slow",
                        "error -: bad", "debug lua: two\\nlines\\r", "error conn: shown"};
  char *line = out;
  for (size_t i = 0; i < 5; i++) {
    char *nl = strchr(line, '\n');
    CHECK(nl != NULL);
    *nl = '\0';
    CHECK(stamp_ok(line));
    CHECK_STR_EQ(line + 25, want[i]);
    line = nl + 1;
  }
  CHECK_STR_EQ(line, "");
  free(out);
}

TEST(long_message_is_one_line) {
  CHECK(capture() == 0);
  char big[10000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  ST_LOG_I("big", "%s", big);
  char *out = release();
  char *nl = strchr(out, '\n');
  CHECK(nl != NULL && nl[1] == '\0');
  CHECK(strlen(out) < 4200);
  free(out);
}

static void *spam(void *arg) {
  for (int i = 0; i < 500; i++) ST_LOG_I("thread", "worker %ld line %d", (long)(intptr_t)arg, i);
  return NULL;
}

TEST(threads_write_whole_lines) {
  CHECK(capture() == 0);
  pthread_t t[4];
  for (intptr_t i = 0; i < 4; i++) pthread_create(&t[i], NULL, spam, (void *)i);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  char *out = release();
  int lines = 0;
  for (char *line = out, *nl; (nl = strchr(line, '\n')); line = nl + 1) {
    *nl = '\0';
    CHECK(stamp_ok(line));
    CHECK(strncmp(line + 25, "info  thread: worker ", 21) == 0);
    lines++;
  }
  CHECK_EQ_INT(lines, 2000);
  free(out);
}

static void warn_flood(int i) {
  ST_LOG_W("conn", "conn %d: bad frame; closing", i);
}

TEST(repeated_warnings_are_rate_limited) {
  st__log_set_rate_limit(3, 0.2);
  CHECK(capture() == 0);
  for (int i = 0; i < 50; i++) warn_flood(i);
  ST_LOG_W("other", "another place still logs");
  for (int i = 0; i < 30; i++) ST_LOG_I("info", "info line %d", i);   /* not limited */
  for (int i = 0; i < 30; i++)   /* a report (a failed load's problems): every line */
    st__log_all(ST_LOG_ERROR, "server", "f.lua:%d: problem", i);
  /* Once the window passed, the site's next line comes after the count
   * of what was suppressed. */
  double end = stt_now_ms() + 5000;
  int reported = 0;
  while (!reported && stt_now_ms() < end) {
    warn_flood(1000);
    off_t n = lseek(2, 0, SEEK_END);
    char buf[64 * 1024];
    ssize_t k = pread(2, buf, sizeof buf - 1, n > (off_t)sizeof buf - 1 ? n - (off_t)sizeof buf + 1 : 0);
    buf[k > 0 ? k : 0] = '\0';
    reported = strstr(buf, "were suppressed") != NULL;
    if (!reported) usleep(20000);
  }
  char *out = release();
  st__log_set_rate_limit(ST_LOG_RATE_BURST, ST_LOG_RATE_WINDOW_S);
  CHECK(reported);
  CHECK_EQ_INT(stt_lines_containing(out, "bad frame; closing"), 4);   /* 3, then 1 after the window */
  CHECK_EQ_INT(stt_lines_containing(out, "another place still logs"), 1);
  CHECK_EQ_INT(stt_lines_containing(out, "info  info: info line"), 30);
  CHECK_EQ_INT(stt_lines_containing(out, ": problem"), 30);
  const char *rep = strstr(out, "more lines like the next one were suppressed");
  CHECK(rep != NULL);
  /* 47 of the flood, and those of the polling loop before the window ended. */
  const char *num = rep - 1;   /* "<count> more lines ..." */
  while (num > out && num[-1] >= '0' && num[-1] <= '9') num--;
  CHECK(strtoul(num, NULL, 10) >= 47);
  CHECK_CONTAINS(rep, "(at most 3 per 0.2 s from one place)");
  free(out);
}

/* $JOURNAL_STREAM naming fd 2 (as systemd sets it when stderr is the
 * journal): "<N>" before each line, N the level's syslog priority; naming
 * another file, or unset: no prefix. */
TEST(journal_stream_gets_priorities) {
  CHECK(capture() == 0);
  struct stat st;
  CHECK(fstat(2, &st) == 0);
  char js[64];
  snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino);
  setenv("JOURNAL_STREAM", js, 1);
  CHECK_EQ_INT(st__log_detect_journal(), 1);
  st__log_set_level(ST_LOG_DEBUG);
  ST_LOG_E("a", "e");
  ST_LOG_W("a", "w");
  ST_LOG_I("a", "i");
  ST_LOG_D("a", "d");
  snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino + 1);
  setenv("JOURNAL_STREAM", js, 1);   /* another file: stderr was redirected */
  CHECK_EQ_INT(st__log_detect_journal(), 0);
  ST_LOG_E("b", "e");
  unsetenv("JOURNAL_STREAM");
  CHECK_EQ_INT(st__log_detect_journal(), 0);
  ST_LOG_I("c", "i");
  st__log_set_level(ST_LOG_INFO);
  char *out = release();
  const char *want[] = {"<3>", "error a: e", "<4>", "warn  a: w", "<6>", "info  a: i",
                        "<7>", "debug a: d", "",    "error b: e", "",    "info  c: i"};
  char *line = out;
  for (size_t i = 0; i < 12; i += 2) {
    char *nl = strchr(line, '\n');
    CHECK(nl != NULL);
    if (!nl) break;
    *nl = '\0';
    size_t p = strlen(want[i]);
    CHECK(strncmp(line, want[i], p) == 0);
    CHECK(stamp_ok(line + p));
    CHECK_STR_EQ(line + p + 25, want[i + 1]);
    line = nl + 1;
  }
  free(out);
}

int main(void) {
  RUN(format_and_levels);
  RUN(journal_stream_gets_priorities);
  RUN(long_message_is_one_line);
  RUN(threads_write_whole_lines);
  RUN(repeated_warnings_are_rate_limited);
  return stt_summary();
}
