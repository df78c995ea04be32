/* src/server: the `metrics` method's text (docs/protocol.md, "metrics";
 * docs/operations.md, "Monitoring"): the Prometheus text exposition
 * format 0.0.4, every family with HELP and TYPE (and UNIT, a comment to
 * 0.0.4 parsers, where it has one), names sharedtensor_*, counters ending
 * in _total. It reads what info reads: the counters, the request
 * accounting (stats.c), one walk of the objects per device and one of the
 * tasks, nothing more. Loop thread. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine/objects.h"
#include "mem/arena.h"
#include "mem/ledger.h"
#include "mem/pool.h"
#include "server/work.h"
#include "st/wire.h"

typedef struct text {
  msgpack_sbuffer *sb;
} text_t;

static void out(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(text_t *t, const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > 0) msgpack_sbuffer_write(t->sb, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* A label value with \, " and newline escaped, at most 200 bytes of it. */
static void escape(char *dst, size_t cap, const char *src) {
  size_t n = 0;
  for (; *src && n + 3 < cap && n < 200; src++) {
    if (*src == '\\' || *src == '"') {
      dst[n++] = '\\';
      dst[n++] = *src;
    } else if (*src == '\n') {
      dst[n++] = '\\';
      dst[n++] = 'n';
    } else {
      dst[n++] = *src;
    }
  }
  dst[n] = '\0';
}

/* HELP, TYPE and UNIT ("" for none) of family `name`. */
static void family(text_t *t, const char *name, const char *type, const char *unit,
                   const char *help) {
  out(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  if (*unit) out(t, "# UNIT %s %s\n", name, unit);
}

/* One sample; labels "" or `a="x",b="y"` (values already escaped). */
static void sample(text_t *t, const char *name, const char *labels, double v) {
  if (*labels) out(t, "%s{%s} %.17g\n", name, labels, v);
  else out(t, "%s %.17g\n", name, v);
}

/* A family of one unlabelled sample. */
static void single(text_t *t, const char *name, const char *type, const char *unit,
                   const char *help, double v) {
  family(t, name, type, unit, help);
  sample(t, name, "", v);
}

/* The method label of stats row i: its name, "(unknown)" for the row of
 * unknown method names; NULL for rows past the table. */
static const char *method_label(const st__stats_t *s, size_t i) {
  if (i < s->nmethods) return s->method_names[i];
  return i == ST__STATS_NMETHODS ? "(unknown)" : NULL;
}

static void requests(text_t *t, const st__stats_t *s) {
  char l[256], m[128];
  family(t, "sharedtensor_requests_total", "counter", "",
         "Requests by method and outcome: ok (a result was queued), error (an error reply was "
         "queued), dropped (the connection closed before the reply); method=\"(unknown)\" "
         "counts unknown method names. Received = the three outcomes + sharedtensor_requests_in_flight.");
  static const char *const outcome[3] = {"ok", "error", "dropped"};
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) {
    const st__method_stats_t *ms = &s->methods[i];
    if (!method_label(s, i)) continue;
    escape(m, sizeof m, method_label(s, i));
    const uint64_t v[3] = {ms->ok, ms->failed, ms->dropped};
    for (int k = 0; k < 3; k++) {
      snprintf(l, sizeof l, "method=\"%s\",outcome=\"%s\"", m, outcome[k]);
      sample(t, "sharedtensor_requests_total", l, (double)v[k]);
    }
  }
  family(t, "sharedtensor_requests_in_flight", "gauge", "",
         "Requests accepted and not answered yet, by method.");
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) {
    if (!method_label(s, i)) continue;
    escape(m, sizeof m, method_label(s, i));
    snprintf(l, sizeof l, "method=\"%s\"", m);
    sample(t, "sharedtensor_requests_in_flight", l, (double)s->methods[i].inflight);
  }
  family(t, "sharedtensor_errors_total", "counter", "",
         "Error replies to requests by error name (docs/errors.md).");
  for (size_t i = 0; i <= (size_t)-ST_ERR_MIN; i++) {
    snprintf(l, sizeof l, "name=\"%s\"", st_err_name(i ? -(int)i : 1));
    sample(t, "sharedtensor_errors_total", l, (double)s->errors_by_code[i]);
  }
  /* Latency: only methods asked at least once, so a scrape stays short. */
  family(t, "sharedtensor_request_duration_seconds", "histogram", "seconds",
         "Time from request accepted to reply queued, measured on the server's loop thread "
         "(building, queueing and waiting for a task included; not the client's socket), by "
         "method; dropped requests are not observed.");
  for (size_t i = 0; i <= ST__STATS_NMETHODS; i++) {
    const st__method_stats_t *ms = &s->methods[i];
    if (!ms->requests || !method_label(s, i)) continue;
    escape(m, sizeof m, method_label(s, i));
    uint64_t cum = 0;
    for (size_t b = 0; b <= ST__STATS_NBUCKETS; b++) {
      cum += ms->buckets[b];
      if (b < ST__STATS_NBUCKETS)
        snprintf(l, sizeof l, "method=\"%s\",le=\"%g\"", m, st__stats_bucket_bounds[b]);
      else snprintf(l, sizeof l, "method=\"%s\",le=\"+Inf\"", m);
      sample(t, "sharedtensor_request_duration_seconds_bucket", l, (double)cum);
    }
    snprintf(l, sizeof l, "method=\"%s\"", m);
    sample(t, "sharedtensor_request_duration_seconds_sum", l, ms->seconds);
    sample(t, "sharedtensor_request_duration_seconds_count", l, (double)cum);
  }
  family(t, "sharedtensor_calls_total", "counter", "",
         "Calls by endpoint and outcome (ok, error, dropped), for calls that named an endpoint "
         "of the generation serving; endpoint=\"(other)\" counts the names past the first 256.");
  for (size_t i = 0; i < s->nendpoints; i++) {
    const st__endpoint_stats_t *e = s->endpoints[i];
    escape(m, sizeof m, e->name[0] ? e->name : "(other)");
    const uint64_t v[3] = {e->ok, e->failed, e->dropped};
    for (int k = 0; k < 3; k++) {
      snprintf(l, sizeof l, "endpoint=\"%s\",outcome=\"%s\"", m, outcome[k]);
      sample(t, "sharedtensor_calls_total", l, (double)v[k]);
    }
  }
}

static void counters(text_t *t, const st__server_t *srv) {
  const st__counters_t *c = &srv->counters;
  const st__objects_t *o = &srv->objects;
  static const struct {
    const char *name, *unit, *help;
    size_t off;
  } rows[] = {
#define C(n, field, unit, help) {"sharedtensor_" n "_total", unit, help, offsetof(st__counters_t, field)}
      C("builds", builds, "", "Endpoint bodies handed to the workers."),
      C("cache_hits", cache_hits, "", "Calls answered from the cache."),
      C("cache_misses", cache_misses, "", "Calls of caching endpoints that had to build."),
      C("singleflight_joins", joins, "", "Calls that joined a build already in flight."),
      C("invalidations", invalidations, "", "Cache entries dropped by invalidate_call/_endpoint."),
      C("tasks_submitted", tasks_submitted, "", "Tasks created (submit, and calls of task endpoints)."),
      C("tasks_expired", tasks_expired, "", "Finished tasks dropped (tasks.ttl_s, tasks.capacity)."),
      C("connections", connections, "", "Connections admitted."),
      C("protocol_errors", protocol_errors, "",
        "Connections closed for a message the server could not take."),
      C("frame_timeouts", timeouts, "", "Connections closed for a frame left half-sent."),
      C("read_pauses", read_pauses, "", "Times reading a connection paused: its replies piled up."),
      C("sliced_decodes", sliced_decodes, "",
        "Large messages decoded a slice per loop turn (1 MiB or more)."),
      C("notifications", notifications, "", "Notification messages received (release; others ignored)."),
      C("received_bytes", bytes_received, "bytes", "Bytes read from clients."),
      C("sent_bytes", bytes_sent, "bytes", "Bytes written to clients."),
      C("sent_descriptors", fds_sent, "", "Descriptors sent with replies."),
      C("received_descriptors", fds_received, "", "Descriptors received with tensor arguments."),
#undef C
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    family(t, rows[i].name, "counter", rows[i].unit, rows[i].help);
    sample(t, rows[i].name, "", (double)*(const uint64_t *)((const char *)c + rows[i].off));
  }
  family(t, "sharedtensor_connections_refused_total", "counter", "",
         "Connections refused: reason=auth (the peer credential check), limit (max_connections).");
  sample(t, "sharedtensor_connections_refused_total", "reason=\"auth\"", (double)c->auth_refused);
  sample(t, "sharedtensor_connections_refused_total", "reason=\"limit\"", (double)c->limit_refused);
  family(t, "sharedtensor_tasks_ended_total", "counter", "", "Tasks that ended, by status.");
  sample(t, "sharedtensor_tasks_ended_total", "status=\"completed\"", (double)c->tasks_completed);
  sample(t, "sharedtensor_tasks_ended_total", "status=\"failed\"", (double)c->tasks_failed);
  sample(t, "sharedtensor_tasks_ended_total", "status=\"cancelled\"", (double)c->tasks_cancelled);
  family(t, "sharedtensor_reloads_total", "counter", "",
         "Endpoint reloads (SIGHUP, `reload`) by result.");
  sample(t, "sharedtensor_reloads_total", "result=\"ok\"", (double)c->reloads);
  sample(t, "sharedtensor_reloads_total", "result=\"failed\"", (double)c->reload_failures);
  single(t, "sharedtensor_leases_granted_total", "counter", "", "Leases given with replies.",
         (double)o->leases_granted);
  family(t, "sharedtensor_leases_returned_total", "counter", "",
         "Leases given back: how=release (the release method), dropped (the connection closed, "
         "or the reply carrying it could not be sent). Granted - returned = sharedtensor_leases.");
  sample(t, "sharedtensor_leases_returned_total", "how=\"release\"", (double)c->releases);
  sample(t, "sharedtensor_leases_returned_total", "how=\"dropped\"", (double)c->leases_dropped);
  single(t, "sharedtensor_evictions_total", "counter", "",
         "Cache entries evicted for a memory budget or the descriptor cap.", (double)o->evictions);
  st__ledger_stats_t l;
  st__ledger_stats(-1, &l);
  single(t, "sharedtensor_budget_refusals_total", "counter", "",
         "Allocations refused by a memory budget or the descriptor cap.", (double)l.refusals);
  single(t, "sharedtensor_objects_created_total", "counter", "", "Objects registered.",
         (double)o->created);
}

/* Objects and bytes by device, budgets, leases. */
static void memory(text_t *t, const st__server_t *srv) {
  const st__objects_t *r = &srv->objects;
  st__budget_stats_t s[ST_OBJ_MAX_BUDGETS];
  char d[ST_OBJ_MAX_BUDGETS][64], l[160];
  for (int i = 0; i < r->nbudgets; i++) {
    st__objects_stats(r, r->budgets[i].device, &s[i]);
    escape(d[i], sizeof d[i], r->budgets[i].device);
  }
  family(t, "sharedtensor_objects", "gauge", "", "Objects the server holds, by device.");
  for (int i = 0; i < r->nbudgets; i++) {
    snprintf(l, sizeof l, "device=\"%.63s\"", d[i]);
    sample(t, "sharedtensor_objects", l, (double)s[i].objects);
  }
  family(t, "sharedtensor_object_bytes", "gauge", "bytes",
         "Bytes of objects by device and state: cached (only the cache holds them: evictable), "
         "leased (at least one lease), task (a finished task keeps them until fetched).");
  for (int i = 0; i < r->nbudgets; i++) {
    static const char *const state[3] = {"cached", "leased", "task"};
    const uint64_t v[3] = {s[i].cached_bytes, s[i].leased_bytes, s[i].task_bytes};
    for (int k = 0; k < 3; k++) {
      snprintf(l, sizeof l, "device=\"%.63s\",state=\"%s\"", d[i], state[k]);
      sample(t, "sharedtensor_object_bytes", l, (double)v[k]);
    }
  }
  family(t, "sharedtensor_memory_used_bytes", "gauge", "bytes",
         "Bytes charged to a device's budget: objects, results on their way, unread replies.");
  for (int i = 0; i < r->nbudgets; i++) {
    snprintf(l, sizeof l, "device=\"%.63s\"", d[i]);
    sample(t, "sharedtensor_memory_used_bytes", l, (double)s[i].used_bytes);
  }
  family(t, "sharedtensor_memory_budget_bytes", "gauge", "bytes",
         "The device's memory_budget (0: none).");
  for (int i = 0; i < r->nbudgets; i++) {
    snprintf(l, sizeof l, "device=\"%.63s\"", d[i]);
    sample(t, "sharedtensor_memory_budget_bytes", l, (double)s[i].budget);
  }
  single(t, "sharedtensor_leases", "gauge", "", "Leases held by all connections.",
         (double)r->leases);
}

static void gauges(text_t *t, st__server_t *srv) {
  char l[200], id[40], v[40];
  escape(id, sizeof id, srv->server_id);
  escape(v, sizeof v, ST_VERSION_STRING);
  family(t, "sharedtensor_server_info", "gauge", "", "Always 1: the server's identity.");
  snprintf(l, sizeof l, "server_id=\"%s\",version=\"%s\"", id, v);
  sample(t, "sharedtensor_server_info", l, 1);
  single(t, "sharedtensor_start_time_seconds", "gauge", "seconds",
         "When the server started, seconds since the epoch.", srv->started_at);
  single(t, "sharedtensor_ready", "gauge", "", "1 while serving (endpoints loaded, not stopping).",
         srv->gen && !srv->shutting_down);
  single(t, "sharedtensor_generation", "gauge", "", "The generation of endpoints serving.",
         srv->gen ? (double)srv->gen->number : 0);
  single(t, "sharedtensor_open_connections", "gauge", "", "Connections open now.",
         srv->nconns);
  single(t, "sharedtensor_workers", "gauge", "", "Worker threads.",
         srv->workers ? st__workers_size(srv->workers) : 0);
  single(t, "sharedtensor_jobs_in_flight", "gauge", "",
         "Builds on the workers, queued or running.",
         srv->workers ? (double)st__workers_outstanding(srv->workers, -1) : 0);
  single(t, "sharedtensor_builds_waiting", "gauge", "",
         "Builds waiting for their serialized endpoint's turn.",
         srv->work ? (double)srv->work->nwaiting : 0);
  st__work_t *w = srv->work;
  st__tasks_refresh(srv);
  family(t, "sharedtensor_tasks", "gauge", "", "Tasks the server keeps, by status.");
  for (int s = 0; s < ST_TASK_NSTATES; s++) {
    snprintf(l, sizeof l, "status=\"%s\"", st__task_status_name((st__task_status_t)s));
    sample(t, "sharedtensor_tasks", l, w ? (double)w->nstatus[s] : 0);
  }
  uint64_t count = 0, bytes = 0;
  st__arena_stats(&count, &bytes);
  st__ledger_stats_t led;
  st__ledger_stats(-1, &led);
  single(t, "sharedtensor_arenas", "gauge", "", "Arenas alive (objects, results, replies).",
         (double)count);
  single(t, "sharedtensor_arena_bytes", "gauge", "bytes", "Bytes of the arenas alive.",
         (double)bytes);
  family(t, "sharedtensor_descriptors_held", "gauge", "",
         "Descriptors the server holds: holder=arenas (kept by arenas, at most "
         "sharedtensor_descriptors_max), connections (received and not claimed yet, or sent in "
         "replies not read yet).");
  sample(t, "sharedtensor_descriptors_held", "holder=\"arenas\"", (double)led.fds);
  sample(t, "sharedtensor_descriptors_held", "holder=\"connections\"", (double)srv->held_fds);
  single(t, "sharedtensor_descriptors_max", "gauge", "",
         "The arenas' descriptor cap (limits.max_arena_fds; 0: none).", (double)led.fd_cap);
  single(t, "sharedtensor_unread_reply_bytes", "gauge", "bytes",
         "Arena bytes pinned by replies the clients have not read yet.", (double)srv->held_bytes);
  st__mpool_stats_t ps;
  st__mpool_stats(&ps);
  single(t, "sharedtensor_pool_bytes", "gauge", "bytes",
         "Slab bytes of the connections' result pools (charged to the cpu budget).",
         (double)ps.bytes);
  single(t, "sharedtensor_pool_fallbacks_total", "counter", "",
         "Results that got an arena of their own because their connection's pool was full.",
         (double)ps.fallbacks);
}

/* Appends the exposition text to *sb (docs/operations.md lists the
 * families). Loop thread. */
void st__metrics_text(st__server_t *srv, msgpack_sbuffer *sb) {
  text_t t = {sb};
  requests(&t, &srv->stats);
  counters(&t, srv);
  memory(&t, srv);
  gauges(&t, srv);
}
