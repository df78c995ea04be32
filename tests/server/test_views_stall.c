/* A view's walk never holds the loop thread (docs/views.md, "What runs
 * where"): the worst view the bounds allow, glob selectors of 250 bytes
 * against thousands of names of 2000 bytes, runs on a worker (the
 * `views_on_workers` counter moves) while another connection's pings are
 * answered, and its reply is the one the loop would have given. A small
 * view stays on the loop. */
#include <signal.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

/* The spec: rule d takes the names that end in digit d, through a
 * selector `*a*a*...*a*d` of about 250 bytes (a backtracking glob pays
 * the name's length times the selector's for each). */
static void worst_spec(char *spec, size_t len) {
  size_t n = 0;
  for (int d = 0; d < 10; d++) {
    n += (size_t)snprintf(spec + n, len - n, "%s", d ? ";" : "");
    for (int k = 0; k < 120; k++) n += (size_t)snprintf(spec + n, len - n, "*a");
    n += (size_t)snprintf(spec + n, len - n, "*%d:narrow(0,0,1)", d);
  }
}

TEST(the_worst_view_runs_on_a_worker) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  static char spec[4096];
  worst_spec(spec, sizeof spec);
  CHECK(strlen(spec) < 4096);
  int64_t before = rc_info_int(&b, "counters.views_on_workers");
  CHECK(before >= 0);
  if (before < 0) return;
  CHECK(rc_sendf(&a, "[0, 5, 'call', [{endpoint: 'wide', args: {}, view: '%s'}]]", spec) == 0);
  /* The loop answers b while a's walk runs: info shows the walk handed
   * to a worker, then a ping comes back before a's reply. */
  CHECK(rc_wait_info(&b, "counters.views_on_workers", before + 1, 60000) == 0);
  msg_t m;
  CHECK(rc_rpcf(&b, &m, "[0, 100, 'ping', []]") == 1 && !m.error);
  msg_free(&m);
  CHECK(rc_read(&a, 0) == 0);   /* nothing from a yet */
  /* The reply: every tensor narrowed to one row. */
  CHECK(rc_next(&a, &m, 120000) == 1 && !m.error);
  if (m.result) {
    char big[1991];
    memset(big, 'a', 1990);
    big[1990] = '\0';
    const msgpack_object *t = obj_get(obj_get(obj_get(m.result, "value"), big), "000123");
    st__tensor_desc_t d;
    char why[200];
    CHECK(t && st__parse_tensor(t, &d, why, sizeof why) == ST_OK && d.ndim == 1 &&
          d.shape[0] == 1);
  }
  msg_free(&m);
  rc_drop_fds(&a);
  rc_close(&a);
  rc_close(&b);
}

TEST(a_small_view_stays_on_the_loop) {
  OPEN_RC(c, S.socket);
  int64_t before = rc_info_int(&c, "counters.views_on_workers");
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 7, 'call', [{endpoint: 'small', args: {}, view: 'w*:narrow(0,0,1)'}]]") == 1 &&
        !m.error);
  msg_free(&m);
  rc_drop_fds(&c);
  CHECK_EQ_INT(rc_info_int(&c, "counters.views_on_workers"), before);
  rc_close(&c);
}

static const stt_endpoint_t endpoints[] = {
    /* 3000 tensors named "<1990 a's>.<6 digits>", all one small tensor. */
    {"wide.lua",
     "return st.endpoint{ name = 'wide', cache = true,\n"
     "  build = function()\n"
     "    local t, inner = st.arange{4}, {}\n"
     "    for i = 1, 3000 do inner[string.format('%06d', i)] = t end\n"
     "    return { [string.rep('a', 1990)] = inner }\n"
     "  end }\n"},
    {"small.lua",
     "return st.endpoint{ name = 'small', cache = true,\n"
     "  build = function() return { w1 = st.arange{4}, w2 = st.arange{4} } end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2,", endpoints);
  RUN(the_worst_view_runs_on_a_worker);
  RUN(a_small_view_stays_on_the_loop);
  return stt_server_finish(&S);
}
