/* src/server: the loop thread's profile (loopprof.h). Loop thread only. */
#include "server/loopprof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "engine/job.h"
#include "server/server.h"

st__loopprof_t *st__loopprof;
clockid_t st__loopprof_clock = CLOCK_MONOTONIC;

static const char *const phase_names[] = {
#define ST__LOOPPROF_NAME(id, name, what) name,
    ST__LOOPPROF_PHASES(ST__LOOPPROF_NAME)
#undef ST__LOOPPROF_NAME
};

static const char *const phase_what[] = {
#define ST__LOOPPROF_WHAT(id, name, what) what,
    ST__LOOPPROF_PHASES(ST__LOOPPROF_WHAT)
#undef ST__LOOPPROF_WHAT
};

/* The poll sits between the last prepare watcher and the first check
 * watcher: these two run at the ends (priorities), so that the server's
 * own prepare watchers count as OTHER. */
static ev_prepare before_poll;
static ev_check after_poll;

static void on_before_poll(struct ev_loop *loop, ev_prepare *w, int revents) {
  (void)loop;
  (void)w;
  (void)revents;
  st__prof_end();                 /* OTHER */
  st__prof_begin(ST_PROF_POLL);
}

static void on_after_poll(struct ev_loop *loop, ev_check *w, int revents) {
  (void)loop;
  (void)w;
  (void)revents;
  st__prof_end();                 /* POLL */
  st__prof_begin(ST_PROF_OTHER);
}

/* See loopprof.h. Loop thread. */
void st__loopprof_build(const st__job_t *job) {
  st__loopprof_t *p = st__loopprof;
  if (!p || job->started_at <= 0) return;   /* never ran: cancelled while queued */
  p->builds++;
  p->queue_s += job->started_at - job->queued_at;
  p->run_s += job->finished_at - job->started_at;
  p->back_s += st__now_mono() - job->finished_at;
}

/* See loopprof.h. Loop thread, at start. */
void st__loopprof_start(st__server_t *srv) {
  const char *path = getenv("ST_LOOP_PROFILE");
  if (!path || !path[0] || st__loopprof) return;
  st__loopprof_t *p = calloc(1, sizeof *p);
  if (!p || !(p->path = strdup(path))) {
    free(p);
    ST_LOG_W("server", "ST_LOOP_PROFILE: out of memory; not profiling");
    return;
  }
  const char *clk = getenv("ST_LOOP_PROFILE_CLOCK");
  st__loopprof_clock = clk && !strcmp(clk, "thread") ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  st__loopprof = p;
  ev_prepare_init(&before_poll, on_before_poll);
  ev_set_priority(&before_poll, EV_MINPRI);
  ev_prepare_start(srv->loop, &before_poll);
  ev_check_init(&after_poll, on_after_poll);
  ev_set_priority(&after_poll, EV_MAXPRI);
  ev_check_start(srv->loop, &after_poll);
  st__prof_begin(ST_PROF_OTHER);
  ST_LOG_I("server", "profiling the loop thread into %s (ST_LOOP_PROFILE, %s clock)", path,
           st__loopprof_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU");
}

/* See loopprof.h. Loop thread, at exit. */
void st__loopprof_stop(st__server_t *srv) {
  st__loopprof_t *p = st__loopprof;
  if (!p) return;
  while (p->depth > 0) st__prof_end();
  ev_prepare_stop(srv->loop, &before_poll);
  ev_check_stop(srv->loop, &after_poll);
  st__loopprof = NULL;
  FILE *f = fopen(p->path, "w");
  if (!f) {
    ST_LOG_W("server", "ST_LOOP_PROFILE: cannot write %s", p->path);
  } else {
    uint64_t busy = 0;
    for (int i = 0; i < ST_PROF_NPHASES; i++)
      if (i != ST_PROF_POLL) busy += p->ns[i];
    double per = p->messages ? (double)p->messages : 1.0;
    fprintf(f, "# loop thread profile (%s clock): %llu messages, %.3f s busy (poll excluded)\n",
            st__loopprof_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU",
            (unsigned long long)p->messages, (double)busy / 1e9);
    fprintf(f, "# phase calls own_ns calls_per_message ns_per_message what\n");
    for (int i = 0; i < ST_PROF_NPHASES; i++)
      fprintf(f, "%s %llu %llu %.3f %.1f %s\n", phase_names[i], (unsigned long long)p->count[i],
              (unsigned long long)p->ns[i], (double)p->count[i] / per, (double)p->ns[i] / per,
              phase_what[i]);
    fprintf(f, "busy %llu %llu 1 %.1f all phases but poll\n", (unsigned long long)p->messages,
            (unsigned long long)busy, (double)busy / per);
    double nb = p->builds ? (double)p->builds : 1.0;
    fprintf(f, "# builds (wall clock, not phases): name builds total_ns ns_per_build what\n");
    fprintf(f, "build_queue %llu %.0f %.1f submitted to taken by a worker\n",
            (unsigned long long)p->builds, p->queue_s * 1e9, p->queue_s * 1e9 / nb);
    fprintf(f, "build_run %llu %.0f %.1f run by the worker\n", (unsigned long long)p->builds,
            p->run_s * 1e9, p->run_s * 1e9 / nb);
    fprintf(f, "build_back %llu %.0f %.1f finished to handled by the loop\n",
            (unsigned long long)p->builds, p->back_s * 1e9, p->back_s * 1e9 / nb);
    fprintf(f, "spin %llu %.0f %.1f polls for completions (spin_us; inside other and poll)\n",
            (unsigned long long)p->spins, p->spin_s * 1e9,
            p->spins ? p->spin_s * 1e9 / (double)p->spins : 0.0);
    fclose(f);
  }
  free(p->path);
  free(p);
}
