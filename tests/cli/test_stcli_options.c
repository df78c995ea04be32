/* stcli endpoints shows endpoint options from what the server sends
 * (non_default in the `endpoints` reply): every option not at its
 * default appears in FLAGS, a true boolean by its name, the others as
 * name=value; execution and concurrency keep their columns. */
#include <st/client.h>

#include "check.h"
#include "cli_run.h"
#include "fixture.h"

static stt_server_t srv;
#define SOCK "--socket", srv.socket

/* The line of `stcli endpoints` that starts with the endpoint's name. */
static const char *row_of(const char *out, const char *name, char *buf, size_t len) {
  size_t n = strlen(name);
  for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, name, n) == 0 && p[n] == ' ') {
      snprintf(buf, len, "%.*s", (int)strcspn(p, "\n"), p);
      return buf;
    }
  }
  return "";
}

TEST(flags_list_every_option_set) {
  char row[1024];
  CHECK_EQ_INT(STCLI(SOCK, "endpoints"), 0);
  CHECK_CONTAINS(row_of(R.out, "k", row, sizeof row),
                 " task ");
  CHECK_CONTAINS(row, " serialized ");
  CHECK_CONTAINS(row, " managed cache cache_format_key=k:{n} singleflight timeout=2.5 device=cpu "
                      "ipc=legacy ");
  CHECK_CONTAINS(row_of(R.out, "p", row, sizeof row), " direct ");
  CHECK_CONTAINS(row, " parallel ");
  CHECK_CONTAINS(row, " -  ");
}

int main(void) {
  cli_require_bin();
  stt_server_init(&srv);
  stt_write_endpoint(&srv, "k.lua",
                     "return st.endpoint{ name = 'k', execution = 'task',\n"
                     "  concurrency = 'serialized', managed = true, cache_format_key = 'k:{n}',\n"
                     "  singleflight = true, timeout = 2.5, device = 'cpu', ipc = 'legacy',\n"
                     "  params = { n = 1 }, build = function(a) return a.n end }\n");
  stt_write_endpoint(&srv, "p.lua",
                     "return st.endpoint{ name = 'p', params = { n = 1 },\n"
                     "  build = function(a) return a.n end }\n");
  if (stt_server_start(&srv) != 0) return 1;
  RUN(flags_list_every_option_set);
  int status = stt_server_stop(&srv);
  if (status != 0) {
    fprintf(stderr, "stserver did not exit cleanly (%d)\n", status);
    stt_failed++;
  }
  stt_server_cleanup(&srv);
  return stt_summary();
}
