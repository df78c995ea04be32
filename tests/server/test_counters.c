/* Counters that add up, over the real socket (docs/operations.md,
 * "Counters"): a known mix of requests (calls that succeed, fail, name no
 * endpoint, hit the cache, run as tasks, or are dropped with their
 * connection; an unknown method; tasks submitted, waited, cancelled,
 * failed; leases given, released and dropped) is tallied by the test from
 * the replies it got, and info must show exactly that, per method and in
 * total, with requests = ok + errors + dropped + in flight at every
 * snapshot; the leased bytes are those of leased objects only; the
 * `metrics` text shows the same numbers (errors by name, calls by
 * endpoint, a cumulative latency histogram); the stop log line agrees
 * with the last info. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "wire.h"

/* ------------------------------------------------------------- tally */

static const char *const methods[] = {"call",   "submit", "wait",   "result", "cancel",
                                      "status", "release", "info",  "metrics", NULL};
enum { NM = 9 };

typedef struct tally {
  int64_t ok[NM + 1], failed[NM + 1], dropped[NM + 1];   /* NM: unknown methods */
  int64_t errors[1 - ST_ERR_MIN];                         /* by -code */
} tally_t;

static tally_t T;
static int64_t final_requests, final_ok, final_errors, final_dropped;
static int64_t final_calls, final_calls_ok, final_calls_failed, final_calls_dropped;

static int method_index(const char *m) {
  for (int i = 0; i < NM; i++)
    if (strcmp(methods[i], m) == 0) return i;
  return NM;
}

/* Sends one request (text after the method: its params) and tallies the
 * reply; 1 on a reply (in *m, to free), else 0. */
static int req(rc_t *c, msg_t *m, const char *method, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int req(rc_t *c, msg_t *m, const char *method, const char *fmt, ...) {
  char params[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(params, sizeof params, fmt, ap);
  va_end(ap);
  if (rc_rpcf(c, m, "[0, 7, '%s', [%s]]", method, params) != 1) return 0;
  rc_drop_fds(c);
  int k = method_index(method);
  if (m->error) {
    T.failed[k]++;
    T.errors[-st_err_from_name(msg_errname(m))]++;
  } else {
    T.ok[k]++;
  }
  return 1;
}

/* req() when only the outcome matters; the reply's error name or "". */
static const char *req_name(rc_t *c, const char *method, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *req_name(rc_t *c, const char *method, const char *fmt, ...) {
  static char name[64];
  char params[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(params, sizeof params, fmt, ap);
  va_end(ap);
  msg_t m;
  if (!req(c, &m, method, "%s", params)) return "(no reply)";
  snprintf(name, sizeof name, "%s", m.error ? msg_errname(&m) : "");
  msg_free(&m);
  return name;
}

/* ------------------------------------------------------------- info */

/* Info as a message; tallied as the info request it is. */
static int snapshot(rc_t *c, msg_t *m) {
  return req(c, m, "info", "%s", "");
}

static int64_t num(const msg_t *m, const char *path) {
  return obj_int(obj_path(m->result, path));
}

static int64_t method_num(const msg_t *m, const char *method, const char *field) {
  char path[96];
  snprintf(path, sizeof path, "methods.%s.%s", method, field);
  int64_t v = num(m, path);
  return v == INT64_MIN ? 0 : v;   /* a method never asked is not listed */
}

/* requests = ok + errors + dropped + in flight, in total and per method;
 * the in-flight gauges count only the info request itself (quiet). */
static void check_identities(const msg_t *m) {
  CHECK_EQ_INT(num(m, "counters.requests"),
               num(m, "counters.requests_ok") + num(m, "counters.errors") +
                   num(m, "counters.requests_dropped") + num(m, "counters.requests_inflight"));
  CHECK_EQ_INT(num(m, "counters.requests_inflight"), 1);
  CHECK_EQ_INT(num(m, "counters.calls"),
               num(m, "counters.calls_ok") + num(m, "counters.calls_failed") +
                   num(m, "counters.calls_dropped") + num(m, "counters.calls_inflight"));
  CHECK_EQ_INT(num(m, "counters.calls_inflight"), 0);
  const msgpack_object *ms = obj_get(m->result, "methods");
  CHECK(ms && ms->type == MSGPACK_OBJECT_MAP);
  int64_t sum[5] = {0};
  for (uint32_t i = 0; ms && i < ms->via.map.size; i++) {
    const msgpack_object *e = &ms->via.map.ptr[i].val;
    int64_t v[5] = {obj_int(obj_get(e, "requests")), obj_int(obj_get(e, "ok")),
                    obj_int(obj_get(e, "failed")), obj_int(obj_get(e, "dropped")),
                    obj_int(obj_get(e, "inflight"))};
    CHECK_EQ_INT(v[0], v[1] + v[2] + v[3] + v[4]);
    for (int k = 0; k < 5; k++) sum[k] += v[k];
  }
  CHECK_EQ_INT(sum[0], num(m, "counters.requests"));
  CHECK_EQ_INT(sum[1], num(m, "counters.requests_ok"));
  CHECK_EQ_INT(sum[2], num(m, "counters.errors"));
  CHECK_EQ_INT(sum[3], num(m, "counters.requests_dropped"));
  int64_t by_name = 0;
  const msgpack_object *en = obj_get(m->result, "errors_by_name");
  for (uint32_t i = 0; en && i < en->via.map.size; i++) by_name += obj_int(&en->via.map.ptr[i].val);
  CHECK_EQ_INT(by_name, num(m, "counters.errors"));
  /* Leases: granted - given back = held. */
  CHECK_EQ_INT(num(m, "objects.leases"), num(m, "counters.leases_granted") -
                                             num(m, "counters.releases") -
                                             num(m, "counters.leases_dropped"));
  /* Each object's bytes in exactly one state. */
  CHECK_EQ_INT(num(m, "memory.cpu.object_bytes"),
               num(m, "memory.cpu.cached_bytes") + num(m, "memory.cpu.leased_bytes") +
                   num(m, "memory.cpu.task_bytes"));
  /* Tasks: submitted = pending + running + ended; kept = submitted - expired. */
  CHECK_EQ_INT(num(m, "counters.tasks_submitted"),
               num(m, "tasks.pending") + num(m, "tasks.running") +
                   num(m, "counters.tasks_completed") + num(m, "counters.tasks_failed") +
                   num(m, "counters.tasks_cancelled"));
  CHECK_EQ_INT(num(m, "tasks.total"),
               num(m, "counters.tasks_submitted") - num(m, "counters.tasks_expired"));
}

/* ------------------------------------------------------------- metrics */

/* The value of the sample line that starts with `series` ("name{...}"),
 * or -1 when there is none. */
static double sample_of(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

static double sample_f(const char *text, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static double sample_f(const char *text, const char *fmt, ...) {
  char series[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(series, sizeof series, fmt, ap);
  va_end(ap);
  return sample_of(text, series);
}

/* Every sample line belongs to the family the last TYPE line named. */
static void check_typed(const char *text) {
  char family[128] = "";
  int samples = 0;
  for (const char *p = text; *p;) {
    const char *end = strchr(p, '\n');
    CHECK(end != NULL);
    if (!end) return;
    if (strncmp(p, "# TYPE ", 7) == 0) {
      sscanf(p + 7, "%127s", family);
    } else if (*p != '#') {
      CHECK(strncmp(p, family, strlen(family)) == 0 && family[0]);
      CHECK(strncmp(p, "sharedtensor_", 13) == 0);
      samples++;
    }
    p = end + 1;
  }
  CHECK(samples > 50);
}

/* ------------------------------------------------------------- workload */

static const stt_endpoint_t endpoints[] = {
    {"plain.lua", "return st.endpoint{ name = 'plain', build = function() return st.ones{3} end }\n"},
    {"fail.lua", "return st.endpoint{ name = 'fail', build = function() error('nope') end }\n"},
    {"lin.lua",
     "return st.endpoint{ name = 'lin', managed = true, cache_format_key = 'lin:{n}',\n"
     "  params = { n = 4 }, build = function(a) return st.arange{a.n, dtype = 'float32'} end }\n"},
    {"num.lua", "return st.endpoint{ name = 'num', build = function() return 7 end }\n"},
    {"loop.lua",
     "return st.endpoint{ name = 'loop', build = function()\n"
     "  while not st.cancelled() do end return 1 end }\n"},
    {"mtask.lua",
     "return st.endpoint{ name = 'mtask', execution = 'task', managed = true,\n"
     "  params = { n = 4 }, build = function(a) return st.ones{a.n} end }\n"},
    {NULL, NULL},
};

static uint64_t submit(rc_t *c, const char *ep, const char *args) {
  msg_t m;
  if (!req(c, &m, "submit", "{endpoint: '%s', args: %s}", ep, args)) return 0;
  uint64_t id = m.error ? 0 : (uint64_t)obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  return id;
}

/* The object id of a call reply, tallied; 0 on an error. */
static int64_t call_object(rc_t *c, const char *ep, int64_t n) {
  msg_t m;
  if (!req(c, &m, "call", "{endpoint: '%s', args: {n: %lld}}", ep, (long long)n)) return 0;
  int64_t id = m.error ? 0 : obj_field(&m, "id");
  msg_free(&m);
  return id;
}

static void workload(stt_server_t *s) {
  OPEN_RC(a, s->socket);
  msg_t before, after;
  CHECK(snapshot(&a, &before) == 1);
  check_identities(&before);

  /* Calls: ok, failing in the body, naming no endpoint; cache miss then hit. */
  for (int i = 0; i < 3; i++) CHECK_STR_EQ(req_name(&a, "call", "{endpoint: 'plain'}"), "");
  for (int i = 0; i < 2; i++) CHECK(req_name(&a, "call", "{endpoint: 'fail'}")[0]);
  CHECK_STR_EQ(req_name(&a, "call", "{endpoint: 'nope'}"), "UNKNOWN_ENDPOINT");
  CHECK_STR_EQ(req_name(&a, "frobnicate", "%s", ""), "UNKNOWN_METHOD");
  int64_t lin = call_object(&a, "lin", 5);
  CHECK(lin > 0);
  CHECK_EQ_INT(call_object(&a, "lin", 5), lin);   /* a hit: a second lease */
  CHECK_STR_EQ(req_name(&a, "release", "{object_id: %lld}", (long long)lin), "");

  /* Tasks: completed and fetched, cancelled, failed; a task endpoint's call. */
  uint64_t t1 = submit(&a, "num", "{}");
  CHECK(t1 > 0);
  CHECK_STR_EQ(req_name(&a, "wait", "{task_id: %llu}", (unsigned long long)t1), "");
  CHECK_STR_EQ(req_name(&a, "result", "{task_id: %llu}", (unsigned long long)t1), "");
  uint64_t t2 = submit(&a, "loop", "{}");
  CHECK(rk_wait_status(&a, t2, "running", 5000) == 0);   /* status requests: untallied */
  CHECK_STR_EQ(req_name(&a, "cancel", "{task_id: %llu}", (unsigned long long)t2), "");
  CHECK_STR_EQ(req_name(&a, "wait", "{task_id: %llu}", (unsigned long long)t2), "");
  uint64_t t3 = submit(&a, "fail", "{}");
  CHECK_STR_EQ(req_name(&a, "wait", "{task_id: %llu}", (unsigned long long)t3), "");
  CHECK(req_name(&a, "result", "{task_id: %llu}", (unsigned long long)t3)[0]);
  CHECK_STR_EQ(req_name(&a, "status", "{task_id: 999999}"), "NOT_FOUND");
  int64_t mt = call_object(&a, "mtask", 4);
  CHECK(mt > 0);
  /* A task's unfetched object: kept by the task, not leased. */
  uint64_t t4 = submit(&a, "mtask", "{n: 64}");
  CHECK_STR_EQ(req_name(&a, "wait", "{task_id: %llu}", (unsigned long long)t4), "");

  /* Connection b: a lease, and a call in flight, both dropped with it. */
  {
    OPEN_RC(b, s->socket);
    CHECK(call_object(&b, "lin", 7) > 0);
    CHECK(rc_sendf(&b, "[0, 8, 'call', [{endpoint: 'loop'}]]") == 0);
    /* Accepted once the server read it (it answers nothing until cancelled). */
    CHECK(rc_wait_drained(&b, 5000) == 0);
    CHECK(rc_wait_info(&a, "counters.calls_inflight", 1, 5000) == 0);
    rc_close(&b);
    T.dropped[method_index("call")]++;
  }
  CHECK(rc_wait_info(&a, "counters.calls_dropped", num(&before, "counters.calls_dropped") + 1,
                     5000) == 0);
  /* Everything answered: no lease left but the task's object bytes. */
  CHECK_STR_EQ(req_name(&a, "release", "{object_id: %lld}", (long long)lin), "");
  CHECK_STR_EQ(req_name(&a, "release", "{object_id: %lld}", (long long)mt), "");

  CHECK(snapshot(&a, &after) == 1);
  check_identities(&after);
  /* The deltas are what the test did, request by request. The polls of
   * rk_wait_status and rc_wait_info are info/status requests, all ok. */
  int64_t polls = method_num(&after, "status", "ok") - method_num(&before, "status", "ok") -
                  T.ok[method_index("status")];
  int64_t info_polls = method_num(&after, "info", "ok") - method_num(&before, "info", "ok") -
                       (T.ok[method_index("info")] - 1);   /* `after` is still in flight */
  CHECK(polls >= 1 && info_polls >= 2);
  for (int k = 0; k < NM; k++) {
    const char *mn = methods[k];
    int64_t extra = strcmp(mn, "status") == 0 ? polls : strcmp(mn, "info") == 0 ? info_polls - 1 : 0;
    CHECK_EQ_INT(method_num(&after, mn, "ok") - method_num(&before, mn, "ok"), T.ok[k] + extra);
    CHECK_EQ_INT(method_num(&after, mn, "failed") - method_num(&before, mn, "failed"),
                 T.failed[k]);
    CHECK_EQ_INT(method_num(&after, mn, "dropped") - method_num(&before, mn, "dropped"),
                 T.dropped[k]);
  }
  int c = method_index("call");
  CHECK_EQ_INT(num(&after, "counters.calls") - num(&before, "counters.calls"),
               T.ok[c] + T.failed[c] + T.dropped[c]);
  CHECK_EQ_INT(num(&after, "counters.calls_ok") - num(&before, "counters.calls_ok"), T.ok[c]);
  CHECK_EQ_INT(num(&after, "counters.calls_failed") - num(&before, "counters.calls_failed"),
               T.failed[c]);
  CHECK_EQ_INT(num(&after, "counters.calls_ok"), 7);   /* 3 plain, 2 lin, mtask, lin on b */
  CHECK_EQ_INT(num(&after, "counters.calls_failed"), 3);
  CHECK_EQ_INT(num(&after, "counters.calls_dropped"), 1);
  for (int e = 1; e <= -ST_ERR_MIN; e++) {
    char path[64];
    snprintf(path, sizeof path, "errors_by_name.%s", st_err_name(-e));
    int64_t v = num(&after, path);
    CHECK_EQ_INT(v == INT64_MIN ? 0 : v, T.errors[e]);
  }
  CHECK_EQ_INT(num(&after, "counters.tasks_submitted"), 5);   /* 4 submits, mtask's call */
  CHECK_EQ_INT(num(&after, "counters.tasks_completed"), 3);
  CHECK_EQ_INT(num(&after, "counters.tasks_failed"), 1);
  CHECK_EQ_INT(num(&after, "counters.tasks_cancelled"), 1);
  CHECK_EQ_INT(num(&after, "counters.leases_granted"), 4);    /* lin twice, mtask, lin on b */
  CHECK_EQ_INT(num(&after, "counters.releases"), 3);
  CHECK_EQ_INT(num(&after, "counters.leases_dropped"), 1);
  CHECK_EQ_INT(num(&after, "objects.leases"), 0);
  CHECK_EQ_INT(num(&after, "memory.cpu.leased_bytes"), 0);    /* no lease: no leased bytes */
  CHECK(num(&after, "memory.cpu.task_bytes") >= 64 * 4);      /* t4's object */
  CHECK_EQ_INT(num(&after, "counters.cache_hits"), 1);
  final_requests = num(&after, "counters.requests");
  final_ok = num(&after, "counters.requests_ok");
  final_errors = num(&after, "counters.errors");
  final_dropped = num(&after, "counters.requests_dropped");
  final_calls = num(&after, "counters.calls");
  final_calls_ok = num(&after, "counters.calls_ok");
  final_calls_failed = num(&after, "counters.calls_failed");
  final_calls_dropped = num(&after, "counters.calls_dropped");

  /* The metrics text: the same numbers. */
  msg_t mm;
  CHECK(rc_rpcf(&a, &mm, "[0, 9, 'metrics', []]") == 1 && !mm.error);
  CHECK(mm.result && mm.result->type == MSGPACK_OBJECT_STR);
  char *text = strndup(mm.result->via.str.ptr, mm.result->via.str.size);
  msg_free(&mm);
  check_typed(text);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_total{method=\"call\",outcome=\"ok\"}"), 7);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_total{method=\"call\",outcome=\"error\"}"), 3);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_total{method=\"call\",outcome=\"dropped\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_total{method=\"(unknown)\",outcome=\"error\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_in_flight{method=\"metrics\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_requests_in_flight{method=\"call\"}"), 0);
  for (int e = 1; e <= -ST_ERR_MIN; e++)
    CHECK_EQ_INT((int64_t)sample_f(text, "sharedtensor_errors_total{name=\"%s\"}", st_err_name(-e)),
                 T.errors[e]);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_calls_total{endpoint=\"plain\",outcome=\"ok\"}"), 3);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_calls_total{endpoint=\"fail\",outcome=\"error\"}"), 2);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_calls_total{endpoint=\"lin\",outcome=\"ok\"}"), 3);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_calls_total{endpoint=\"loop\",outcome=\"dropped\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_calls_total{endpoint=\"mtask\",outcome=\"ok\"}"), 1);
  /* The histogram: cumulative buckets, +Inf last, = count = the calls answered. */
  const char *bucket = "sharedtensor_request_duration_seconds_bucket{method=\"call\",le=\"";
  double prev = 0, inf = -1;
  int nb = 0;
  for (const char *p = strstr(text, bucket); p; p = strstr(p + 1, bucket)) {
    const char *v = strchr(p, ' ');
    CHECK(v != NULL && inf < 0);   /* +Inf is the last bucket */
    double x = v ? strtod(v + 1, NULL) : -1;
    CHECK(x >= prev);
    prev = x;
    nb++;
    if (strncmp(p + strlen(bucket), "+Inf\"}", 6) == 0) inf = x;
  }
  CHECK(nb >= 10);
  CHECK_EQ_INT((int64_t)inf, 10);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_request_duration_seconds_count{method=\"call\"}"), 10);
  CHECK(sample_of(text, "sharedtensor_request_duration_seconds_sum{method=\"call\"}") > 0);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_leases"), 0);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_leases_granted_total"), 4);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_leases_returned_total{how=\"release\"}"), 3);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_leases_returned_total{how=\"dropped\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_object_bytes{device=\"cpu\",state=\"leased\"}"), 0);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_object_bytes{device=\"cpu\",state=\"task\"}"),
               num(&after, "memory.cpu.task_bytes"));
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_tasks_ended_total{status=\"cancelled\"}"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_tasks{status=\"completed\"}"), 3);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_open_connections"), 1);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_reloads_total{result=\"ok\"}"), 0);
  CHECK_EQ_INT((int64_t)sample_of(text, "sharedtensor_ready"), 1);
  free(text);
  msg_free(&before);
  msg_free(&after);
  rc_close(&a);
}

TEST(counters_add_up_and_metrics_agree) {
  stt_server_t s;
  stt_server_prepare(&s, "workers = 2,", endpoints);
  CHECK(stt_server_run(&s, workload) == 0);
  /* The stop log: the last info's numbers, that info and the metrics
   * request answered since, nothing in flight. */
  char *log = stt_server_log(&s);
  const char *line = log ? strstr(log, "stopped after") : NULL;
  CHECK(line != NULL);
  long long n[8] = {0};
  CHECK(line && sscanf(line,
                       "stopped after %*f s: %*u connections, %lld requests (%lld ok, %lld "
                       "failed, %lld dropped), %lld calls (%lld ok, %lld failed, %lld dropped)",
                       &n[0], &n[1], &n[2], &n[3], &n[4], &n[5], &n[6], &n[7]) == 8);
  CHECK_EQ_INT(n[0], final_requests + 1);   /* metrics */
  CHECK_EQ_INT(n[1], final_ok + 2);         /* the last info, metrics */
  CHECK_EQ_INT(n[2], final_errors);
  CHECK_EQ_INT(n[3], final_dropped);
  CHECK_EQ_INT(n[0], n[1] + n[2] + n[3]);
  CHECK_EQ_INT(n[4], final_calls);
  CHECK_EQ_INT(n[5], final_calls_ok);
  CHECK_EQ_INT(n[6], final_calls_failed);
  CHECK_EQ_INT(n[7], final_calls_dropped);
  free(log);
  stt_server_cleanup(&s);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(counters_add_up_and_metrics_agree);
  return stt_summary();
}
