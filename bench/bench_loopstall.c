/* bench_loopstall: another connection's ping while one connection asks
 * for the worst view the bounds allow (docs/views.md, "What runs where";
 * docs/security.md, finding 1), against a real stserver.
 *
 *   bench_loopstall [--tensors N] [--rounds N]
 *
 * The endpoint returns N tensors (default 3000) named "<1990 a's>.<6
 * digits>"; the view has 10 rules `*a*a...*a*d` of about 250 bytes (rule d
 * narrows the names ending in digit d). Each round, connection A sends
 * that view; connection B pings back to back until A's reply arrives. It
 * prints the view's time, B's ping p50/p99 during the views, and B's pings
 * answered per view. Timings are printed, never asserted.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "kit.h"
#include "wire.h"

int main(int argc, char **argv) {
  int tensors = 3000, rounds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tensors")) tensors = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
  }
  bk_setup();
  stt_server_t s;
  stt_server_init(&s);
  bk_server_config(&s, -1);
  char ep[600];
  snprintf(ep, sizeof ep,
           "return st.endpoint{ name = 'wide', cache = true,\n"
           "  build = function()\n"
           "    local t, inner = st.arange{4}, {}\n"
           "    for i = 1, %d do inner[string.format('%%06d', i)] = t end\n"
           "    return { [string.rep('a', 1990)] = inner }\n"
           "  end }\n", tensors);
  stt_write_endpoint(&s, "wide.lua", ep);
  if (stt_server_start(&s) != 0) return 1;
  static char spec[4096];
  size_t n = 0;
  for (int d = 0; d < 10; d++) {
    n += (size_t)snprintf(spec + n, sizeof spec - n, "%s", d ? ";" : "");
    for (int k = 0; k < 120; k++) n += (size_t)snprintf(spec + n, sizeof spec - n, "*a");
    n += (size_t)snprintf(spec + n, sizeof spec - n, "*%d:narrow(0,0,1)", d);
  }
  rc_t a, b;
  if (rc_open(&a, s.socket) != 0 || rc_open(&b, s.socket) != 0) return 1;
  msg_t m;
  /* The build, once (cached): the rounds time the view alone. */
  if (rc_rpcf(&a, &m, "[0, 1, 'call', [{endpoint: 'wide', args: {}}]]") != 1 || m.error) return 1;
  msg_free(&m);
  rc_drop_fds(&a);
  size_t cap = 1 << 20, np = 0;
  double *ping = malloc(cap * sizeof *ping), *view = malloc((size_t)rounds * sizeof *view);
  for (int r = 0; r < rounds; r++) {
    double t0 = stt_now_ms();
    if (rc_sendf(&a, "[0, %d, 'call', [{endpoint: 'wide', args: {}, view: '%s'}]]", 10 + r,
                 spec) != 0)
      return 1;
    int done = 0;
    while (!done) {
      double p0 = stt_now_ms();
      if (rc_rpcf(&b, &m, "[0, 2, 'ping', []]") != 1 || m.error) return 1;
      msg_free(&m);
      if (np < cap) ping[np++] = (stt_now_ms() - p0) * 1000.0;
      while (rc_read(&a, 0) > 0) {
      }
      if (rc_take(&a, &m)) {
        if (m.error) {
          fprintf(stderr, "view: %s\n", msg_errmsg(&m));
          return 1;
        }
        msg_free(&m);
        rc_drop_fds(&a);
        done = 1;
      }
    }
    view[r] = (stt_now_ms() - t0) * 1000.0;
  }
  printf("worst view: %d tensors of 1997-byte names, 10 rules of 243-byte globs\n", tensors);
  printf("pings answered during the views: %zu (%.1f per view)\n", np, (double)np / rounds);
  bk_report("view (us)", view, rounds);
  bk_report("another connection's ping during it (us)", ping, (int)np);
  rc_close(&a);
  rc_close(&b);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc;
}
