/* The server's log through the journal: when stderr is the journal's
 * stream ($JOURNAL_STREAM names stderr's device and inode, as systemd sets
 * it), each line starts with its syslog priority, "<6>" info, "<7>" debug,
 * "<4>" warning, so `journalctl -p` filters by level; with
 * $JOURNAL_STREAM naming another file (stderr redirected away from the
 * journal) or unset, no line has a prefix. A real stserver with stderr on
 * a file; the test sets $JOURNAL_STREAM to that file's device and inode. */
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "check.h"
#include "wire.h"

static const stt_endpoint_t endpoints[] = {
    {"boom.lua",
     "return st.endpoint{ name = 'boom', build = function() error('boom') end }\n"},
    {NULL, NULL},
};

/* Starts s with $JOURNAL_STREAM: its log file's "dev:ino" plus `ino_delta`
 * (0: the very file), or unset when ino_delta < 0; makes a call fail (a
 * warning) and stops s. The log, malloc'ed. */
static char *run_with_journal(stt_server_t *s, long ino_delta) {
  stt_server_prepare(s, NULL, endpoints);
  stt_write_file(s->log, "");   /* the fixture appends: the inode stays */
  struct stat st;
  if (stat(s->log, &st) != 0) return NULL;
  char js[64];
  snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
           (unsigned long long)st.st_ino + (unsigned long long)(ino_delta > 0 ? ino_delta : 0));
  if (ino_delta >= 0)
    setenv("JOURNAL_STREAM", js, 1);
  else
    unsetenv("JOURNAL_STREAM");
  int started = stt_server_start(s) == 0;
  unsetenv("JOURNAL_STREAM");
  if (!started) return NULL;
  rc_t c;
  if (rc_open(&c, s->socket) == 0) {
    msg_t m;
    if (rk_call(&c, "boom", NULL, 0, &m) == 1) msg_free(&m);
    rc_close(&c);
  }
  if (stt_server_stop(s) != 0) return NULL;
  return stt_server_log(s);
}

/* Every line of log starts with "<N>" for its level (want 1), or none
 * does (want 0). *nlines: the number of lines checked. */
static void check_prefixes(const char *log, int want, int *nlines) {
  int lines = 0;
  *nlines = 0;
  static const char *const levels[] = {"error ", "warn  ", "info  ", "debug "};
  static const char prio[] = {'3', '4', '6', '7'};
  for (const char *l = log; *l; lines++) {
    const char *nl = strchr(l, '\n');
    size_t len = nl ? (size_t)(nl - l) : strlen(l);
    int has = len > 3 && l[0] == '<' && l[2] == '>';
    if (has != want) {
      fprintf(stderr, "   line %d: %.*s\n", lines + 1, (int)len, l);
      CHECK(has == want);
    }
    if (has) {
      /* "<N>YYYY-MM-DDTHH:MM:SS.mmmZ level ..." */
      int k = -1;
      for (int i = 0; i < 4; i++)
        if (len > 28 + 6 && strncmp(l + 28, levels[i], 6) == 0) k = i;
      CHECK(k >= 0);
      if (k >= 0) CHECK(l[1] == prio[k]);
    }
    l = nl ? nl + 1 : l + len;
    *nlines = lines + 1;
  }
}

TEST(prefixes_when_stderr_is_the_journal) {
  stt_server_t s;
  char *log = run_with_journal(&s, 0);
  CHECK(log != NULL);
  if (log) {
    int n;
    check_prefixes(log, 1, &n);
    CHECK(n > 3);
    CHECK_CONTAINS(log, "<6>");
    CHECK_CONTAINS(log, "<7>");          /* the fixture logs at debug */
    CHECK_CONTAINS(log, "<4>");          /* the failed call */
    CHECK_CONTAINS(log, "Z warn  call: boom failed");
  }
  free(log);
  stt_server_cleanup(&s);
}

TEST(no_prefix_elsewhere) {
  for (int variant = 0; variant < 2; variant++) {
    stt_server_t s;
    char *log = run_with_journal(&s, variant == 0 ? 1 : -1);
    CHECK(log != NULL);
    if (log) {
      int n;
      check_prefixes(log, 0, &n);
      CHECK(n > 3);
      CHECK_CONTAINS(log, "warn  call: boom failed");
    }
    free(log);
    stt_server_cleanup(&s);
  }
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(prefixes_when_stderr_is_the_journal);
  RUN(no_prefix_elsewhere);
  return stt_summary();
}
