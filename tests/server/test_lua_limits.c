/* The limits of endpoint bodies over the real socket (one worker, so that
 * every call runs in the same Lua state): a body past
 * limits.lua_memory_bytes (64 MiB here) fails with OUT_OF_MEMORY naming
 * the limit and its key, quickly and without the server's memory growing
 * past the cap, even when it catches errors with pcall or keeps what it
 * made in its file; the next call on the same worker succeeds. A body
 * without `timeout` is stopped at limits.default_timeout_s, and a body
 * whose few instructions each allocate a lot is stopped close to its
 * timeout, not a hook check later. */
#include <signal.h>
#include <unistd.h>

#include "check.h"
#include "wire.h"

#define CAP_MIB 64

static stt_server_t S;

/* A field of /proc/<pid>/status in kB ("VmHWM"), or -1. */
static long proc_status_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long v = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, n) == 0 && line[n] == ':') v = strtol(line + n + 1, NULL, 10);
  fclose(f);
  return v;
}

/* CPU seconds process pid has used (user + system), or -1. */
static double proc_cpu_s(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')');
  unsigned long long ut, st;
  /* after "pid (comm)": state, then fields 4..13, then utime and stime */
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Calls ep without arguments; the reply in *m, the time it took in *ms. */
static int timed_call(rc_t *c, const char *ep, msg_t *m, double *ms) {
  double t0 = stt_now_ms();
  int rc = rk_call(c, ep, NULL, 0, m);
  *ms = stt_now_ms() - t0;
  return rc;
}

/* The state serves on: `ok` builds a small table and returns its size. */
static void check_serves(rc_t *c) {
  msg_t m;
  CHECK(rk_call(c, "ok", NULL, 0, &m) == 1);
  CHECK(!m.error);
  CHECK_EQ_INT(obj_int(m.result ? obj_get(m.result, "value") : NULL), 1000);
  msg_free(&m);
}

/* ep fails with OUT_OF_MEMORY naming the cap and its key, within 8 s
 * (well before any timeout), and the worker serves the next call. */
static void check_out_of_memory(rc_t *c, const char *ep) {
  msg_t m;
  double ms = 0;
  CHECK(timed_call(c, ep, &m, &ms) == 1);
  CHECK_REPLY(&m, ST_ERR_OUT_OF_MEMORY, NULL);
  CHECK_CONTAINS(msg_errmsg(&m), "out of memory: the Lua state reached its limit of 67108864 "
                                 "bytes (64 MiB)");
  CHECK_CONTAINS(msg_errmsg(&m), "limits.lua_memory_bytes");
  char where[64];
  snprintf(where, sizeof where, "%s.lua:", ep);
  CHECK_CONTAINS(msg_errmsg(&m), where);
  msg_free(&m);
  if (ms > 8000) fprintf(stderr, "   %s took %.0f ms\n", ep, ms);
  CHECK(ms < 8000);
  check_serves(c);
}

TEST(memory_bombs_fail_with_out_of_memory) {
  OPEN_RC(c, S.socket);
  check_serves(&c);
  long hwm0 = proc_status_kb(S.pid, "VmHWM");
  CHECK(hwm0 > 0);
  check_out_of_memory(&c, "strbomb");     /* s = s .. s, with timeout = 5 */
  check_out_of_memory(&c, "tablebomb");   /* t[i] = {i} */
  check_out_of_memory(&c, "swallow");     /* the bomb inside pcall */
  check_out_of_memory(&c, "hoard");       /* kept in the file's upvalue */
  check_out_of_memory(&c, "hoard");       /* the rebuilt state starts empty */
  check_out_of_memory(&c, "strbomb");
  /* The server's peak resident memory grew by less than the cap twice
   * (the cap plus what the allocator keeps), not by gigabytes. */
  long hwm = proc_status_kb(S.pid, "VmHWM");
  if (hwm - hwm0 > 2 * CAP_MIB * 1024)
    fprintf(stderr, "   peak RSS grew from %ld to %ld kB\n", hwm0, hwm);
  CHECK(hwm - hwm0 <= 2 * CAP_MIB * 1024);
  /* Other connections were served all along. */
  OPEN_RC(d, S.socket);
  CHECK(stt_ping(d.fd, 3) == 0);
  rc_close(&d);
  rc_close(&c);
}

TEST(no_timeout_declared_means_the_default) {
  OPEN_RC(c, S.socket);
  msg_t m;
  double ms = 0;
  CHECK(timed_call(&c, "forever", &m, &ms) == 1);
  CHECK_REPLY(&m, ST_ERR_TIMEOUT, NULL);
  CHECK_CONTAINS(msg_errmsg(&m), "forever.lua:2: timed out after 1 s (endpoint 'forever' "
                                 "declares no timeout: limits.default_timeout_s = 1 s applies)");
  msg_free(&m);
  CHECK(ms >= 900 && ms < 5000);
  check_serves(&c);
  rc_close(&c);
}

/* A body whose every few instructions allocate and fill 48 MiB: the
 * deadline is checked by the allocator too, so the call stops within one
 * such instruction of its 1 s timeout, not 1000 instructions (tens of
 * gigabytes written) later. CPU time, not wall time, is what the server
 * spent: a busy machine cannot make this pass or fail. Its own server,
 * with a 256 MiB cap. */
static void churn_stops_at_its_timeout(stt_server_t *t) {
  OPEN_RC(c, t->socket);
  double cpu0 = proc_cpu_s(t->pid);
  msg_t m;
  double ms = 0;
  CHECK(timed_call(&c, "churn", &m, &ms) == 1);
  double cpu = proc_cpu_s(t->pid) - cpu0;
  CHECK_REPLY(&m, ST_ERR_TIMEOUT, NULL);
  CHECK_CONTAINS(msg_errmsg(&m), "timed out after 1 s (endpoint 'churn', timeout 1 s)");
  msg_free(&m);
  if (cpu > 2.5) fprintf(stderr, "   churn used %.2f s of CPU (%.0f ms)\n", cpu, ms);
  CHECK(cpu0 >= 0 && cpu <= 2.5);
  rc_close(&c);
}

static const stt_endpoint_t churn_endpoints[] = {
    {"churn.lua",
     "return st.endpoint{ name = 'churn', timeout = 1, build = function()\n"
     "  local s = string.rep('x', 2^20) while true do local t = s:rep(48) end end }\n"},
    {NULL, NULL},
};

TEST(allocating_body_stops_at_its_timeout) {
  stt_server_t t;
  stt_server_prepare(&t, "workers = 1, limits = { lua_memory_bytes = 256 * 2^20 },", churn_endpoints);
  CHECK(stt_server_run(&t, churn_stops_at_its_timeout) == 0);
  stt_server_cleanup(&t);
}

static const stt_endpoint_t endpoints[] = {
    {"ok.lua",
     "return st.endpoint{ name = 'ok', timeout = 30, build = function()\n"
     "  local t = {} for i = 1, 1000 do t[i] = i end return #t end }\n"},
    {"strbomb.lua",
     "return st.endpoint{ name = 'strbomb', timeout = 20, build = function()\n"
     "  local s = 'x' while true do s = s .. s end end }\n"},
    {"tablebomb.lua",
     "return st.endpoint{ name = 'tablebomb', timeout = 30, build = function()\n"
     "  local t, i = {}, 0 while true do i = i + 1; t[i] = {i} end end }\n"},
    {"swallow.lua",
     "return st.endpoint{ name = 'swallow', timeout = 30, build = function()\n"
     "  for _ = 1, 3 do pcall(function() local s = 'x' while true do s = s .. s end end) end\n"
     "  return 'swallowed' end }\n"},
    {"hoard.lua",
     "local keep = {}\n"
     "return st.endpoint{ name = 'hoard', timeout = 30, build = function()\n"
     "  while true do keep[#keep + 1] = string.rep('k', 4096) .. #keep end end }\n"},
    {"forever.lua",
     "return st.endpoint{ name = 'forever', build = function()\n"
     "  while true do end end }\n"},
    {NULL, NULL},
};

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S,
                   "workers = 1, limits = { lua_memory_bytes = 64 * 2^20, "
                   "default_timeout_s = 1 },",
                   endpoints);
  RUN(memory_bombs_fail_with_out_of_memory);
  RUN(no_timeout_declared_means_the_default);
  RUN(allocating_body_stops_at_its_timeout);
  return stt_server_finish(&S);
}
