/* src/server: the loop threads' profile (loopprof.h). Loop threads only. */
#include "server/loopprof.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "engine/job.h"
#include "server/server.h"

_Thread_local st__loopprof_t *st__loopprof;
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

/* The profiles of the loops (index = loop), and where the table goes;
 * path is NULL when profiling is off. */
static st__loopprof_t *profiles[ST__CONFIG_MAX_LOOP_THREADS];
static char *path;

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

/* A profile for loop `index` on this thread, with watchers around its
 * poll: they run at the ends (priorities), so that the server's own
 * prepare watchers count as OTHER. */
static void profile_loop(struct ev_loop *loop, int index) {
  if (!path || index < 0 || index >= ST__CONFIG_MAX_LOOP_THREADS || profiles[index]) return;
  st__loopprof_t *p = calloc(1, sizeof *p);
  if (!p) {
    ST_LOG_W("server", "ST_LOOP_PROFILE: out of memory; loop %d not profiled", index);
    return;
  }
  p->loop = loop;
  ev_prepare_init(&p->before_poll, on_before_poll);
  ev_set_priority(&p->before_poll, EV_MINPRI);
  ev_prepare_start(loop, &p->before_poll);
  ev_check_init(&p->after_poll, on_after_poll);
  ev_set_priority(&p->after_poll, EV_MAXPRI);
  ev_check_start(loop, &p->after_poll);
  profiles[index] = p;
  st__loopprof = p;
  st__prof_begin(ST_PROF_OTHER);
}

/* Ends this thread's phases and stops its watchers; the figures stay. */
static void unprofile(void) {
  st__loopprof_t *p = st__loopprof;
  if (!p) return;
  while (p->depth > 0) st__prof_end();
  ev_prepare_stop(p->loop, &p->before_poll);
  ev_check_stop(p->loop, &p->after_poll);
  st__loopprof = NULL;
}

/* See loopprof.h. Loop thread, at start. */
void st__loopprof_start(st__server_t *srv) {
  const char *env = getenv("ST_LOOP_PROFILE");
  if (!env || !env[0] || path) return;
  if (!(path = strdup(env))) {
    ST_LOG_W("server", "ST_LOOP_PROFILE: out of memory; not profiling");
    return;
  }
  const char *clk = getenv("ST_LOOP_PROFILE_CLOCK");
  st__loopprof_clock = clk && !strcmp(clk, "thread") ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
  profile_loop(srv->loop, 0);
  ST_LOG_I("server", "profiling the loop threads into %s (ST_LOOP_PROFILE, %s clock)", path,
           st__loopprof_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU");
}

/* See loopprof.h. lp's thread. */
void st__loopprof_thread_start(st__loop_t *lp) {
  profile_loop(lp->ev, lp->index);
}

/* See loopprof.h. lp's thread. */
void st__loopprof_thread_stop(st__loop_t *lp) {
  (void)lp;
  unprofile();
}

/* See loopprof.h. Loop thread, at exit. */
void st__loopprof_stop(st__server_t *srv) {
  (void)srv;
  if (!path) return;
  unprofile();
  st__loopprof_t sum;
  memset(&sum, 0, sizeof sum);
  int nloops = 0;
  for (int l = 0; l < ST__CONFIG_MAX_LOOP_THREADS; l++) {
    st__loopprof_t *p = profiles[l];
    if (!p) continue;
    nloops++;
    for (int i = 0; i < ST_PROF_NPHASES; i++) {
      sum.ns[i] += p->ns[i];
      sum.count[i] += p->count[i];
    }
    sum.messages += p->messages;
    sum.builds += p->builds;
    sum.queue_s += p->queue_s;
    sum.run_s += p->run_s;
    sum.back_s += p->back_s;
    sum.spins += p->spins;
    sum.spin_s += p->spin_s;
    free(p);
    profiles[l] = NULL;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    ST_LOG_W("server", "ST_LOOP_PROFILE: cannot write %s", path);
  } else {
    uint64_t busy = 0;
    for (int i = 0; i < ST_PROF_NPHASES; i++)
      if (i != ST_PROF_POLL) busy += sum.ns[i];
    double per = sum.messages ? (double)sum.messages : 1.0;
    fprintf(f,
            "# loop thread profile (%s clock, %d loop threads added up): %llu messages, "
            "%.3f s busy (poll excluded)\n",
            st__loopprof_clock == CLOCK_MONOTONIC ? "wall" : "thread CPU", nloops,
            (unsigned long long)sum.messages, (double)busy / 1e9);
    fprintf(f, "# phase calls own_ns calls_per_message ns_per_message what\n");
    for (int i = 0; i < ST_PROF_NPHASES; i++)
      fprintf(f, "%s %llu %llu %.3f %.1f %s\n", phase_names[i],
              (unsigned long long)sum.count[i], (unsigned long long)sum.ns[i],
              (double)sum.count[i] / per, (double)sum.ns[i] / per, phase_what[i]);
    fprintf(f, "busy %llu %llu 1 %.1f all phases but poll\n", (unsigned long long)sum.messages,
            (unsigned long long)busy, (double)busy / per);
    double nb = sum.builds ? (double)sum.builds : 1.0;
    fprintf(f, "# builds (wall clock, not phases): name builds total_ns ns_per_build what\n");
    fprintf(f, "build_queue %llu %.0f %.1f submitted to taken by a worker\n",
            (unsigned long long)sum.builds, sum.queue_s * 1e9, sum.queue_s * 1e9 / nb);
    fprintf(f, "build_run %llu %.0f %.1f run by the worker\n", (unsigned long long)sum.builds,
            sum.run_s * 1e9, sum.run_s * 1e9 / nb);
    fprintf(f, "build_back %llu %.0f %.1f finished to handled by the loop\n",
            (unsigned long long)sum.builds, sum.back_s * 1e9, sum.back_s * 1e9 / nb);
    fprintf(f, "spin %llu %.0f %.1f polls for completions (spin_us; inside other and poll)\n",
            (unsigned long long)sum.spins, sum.spin_s * 1e9,
            sum.spins ? sum.spin_s * 1e9 / (double)sum.spins : 0.0);
    fclose(f);
  }
  free(path);
  path = NULL;
}
