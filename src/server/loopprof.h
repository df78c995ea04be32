/* src/server: where the loop thread spends its time (docs/pool.md,
 * section 7). Off unless the environment names a file:
 *
 *   ST_LOOP_PROFILE=/path/to/file stserver ...
 *
 * Then the loop thread adds up, per phase, the nanoseconds it spent and how
 * many times it entered the phase, and writes the table to that file when
 * the server is destroyed (st__loopprof_stop). Phases nest (a reply is
 * packed inside the handling of a request, a sendmsg inside the reply):
 * each phase counts its own time only, without the phases inside it, so
 * the rows add up to the loop thread's time. POLL is the time spent
 * waiting in the poll (epoll_wait) and OTHER what libev and the watcher
 * code around the measured phases took between two polls.
 *
 * Cost when off: one test of a pointer per phase. When on: two
 * clock_gettime per phase (below), counted in the phases.
 * With several loop threads (loops.c) each keeps its own profile; the
 * table adds them up (LOCK is the time they waited for the server lock).
 * Loop threads only.
 */
#ifndef ST_SERVER_LOOPPROF_H
#define ST_SERVER_LOOPPROF_H

#include <ev.h>
#include <stdint.h>
#include <time.h>

#define ST__LOOPPROF_PHASES(X)                                                 \
  X(POLL, "poll", "waiting in epoll_wait (idle included)")                     \
  X(READ, "read", "recvmsg of a connection")                                   \
  X(DECODE, "decode", "frame reader: one message split off and parsed")        \
  X(DISPATCH, "dispatch", "method row, parameter checks, argument binding")    \
  X(CACHE, "cache", "build start: device, cache key, object lookup, lease")    \
  X(PACK, "pack", "reply packing, limits, accounting")                         \
  X(DUP, "dup", "dup of an arena descriptor for a reply")                      \
  X(SEND, "send", "sendmsg of queued replies")                                 \
  X(CLOSE, "close", "close of sent descriptors")                               \
  X(IOCTL, "ioctl", "SIOCOUTQ: has the client read its replies")               \
  X(LOCK, "lock", "waiting for the server lock (loop_threads > 1)")           \
  X(OTHER, "other", "libev and watcher code between two polls")

typedef enum {
#define ST__LOOPPROF_ENUM(id, name, what) ST_PROF_##id,
  ST__LOOPPROF_PHASES(ST__LOOPPROF_ENUM)
#undef ST__LOOPPROF_ENUM
  ST_PROF_NPHASES
} st__prof_phase_t;

#define ST__LOOPPROF_DEPTH 16

typedef struct st__loopprof {
  uint64_t ns[ST_PROF_NPHASES];       /* own time of each phase          */
  uint64_t count[ST_PROF_NPHASES];    /* times each phase was entered    */
  uint64_t messages;                  /* messages decoded                */
  /* Builds that came back (st__loopprof_build), their wall time in three
   * parts, and the loop's polls for completions (spin_us): not phases of
   * the table, they overlap them. */
  uint64_t builds, spins;
  double queue_s, run_s, back_s, spin_s;
  int depth;
  struct {
    int phase;
    uint64_t start, inner;            /* inner: time of nested phases    */
  } stack[ST__LOOPPROF_DEPTH];
  ev_prepare before_poll;             /* the poll sits between these two */
  ev_check after_poll;
  struct ev_loop *loop;
} st__loopprof_t;

/* The profile of this thread's loop, NULL when off or on other threads.
 * Set by st__loopprof_start and st__loopprof_thread_start. */
extern _Thread_local st__loopprof_t *st__loopprof;

/* The clock of the profile: CLOCK_MONOTONIC (wall time, a vDSO call), or
 * with ST_LOOP_PROFILE_CLOCK=thread the loop thread's CPU time (a system
 * call of its own: docs/benchmarks.md, "Loop threads"; but blind to the time the thread waited
 * for a CPU: for machines with fewer cores than busy processes). */
extern clockid_t st__loopprof_clock;

static inline uint64_t st__loopprof_now(void) {
  struct timespec ts;
  clock_gettime(st__loopprof_clock, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Enters phase `ph` (a no-op when profiling is off). */
static inline void st__prof_begin(int ph) {
  st__loopprof_t *p = st__loopprof;
  if (!p) return;
  if (p->depth < ST__LOOPPROF_DEPTH) {
    p->stack[p->depth].phase = ph;
    p->stack[p->depth].start = st__loopprof_now();
    p->stack[p->depth].inner = 0;
  }
  p->depth++;
  p->count[ph]++;
}

/* Leaves the phase entered last: its own time is added to it, its whole
 * time to the phase around it. */
static inline void st__prof_end(void) {
  st__loopprof_t *p = st__loopprof;
  if (!p || p->depth == 0) return;
  p->depth--;
  if (p->depth >= ST__LOOPPROF_DEPTH) return;
  uint64_t d = st__loopprof_now() - p->stack[p->depth].start;
  uint64_t own = d > p->stack[p->depth].inner ? d - p->stack[p->depth].inner : 0;
  p->ns[p->stack[p->depth].phase] += own;
  if (p->depth > 0 && p->depth - 1 < ST__LOOPPROF_DEPTH) p->stack[p->depth - 1].inner += d;
}

/* One message was decoded. */
static inline void st__prof_message(void) {
  if (st__loopprof) st__loopprof->messages++;
}

struct st__server;
struct st__job;

/* A build came back to the loop: adds its time queued (submitted to
 * taken by a worker), running (its body, argument imports, result) and
 * coming back (finished to handled here). No-op when off. */
void st__loopprof_build(const struct st__job *job);

/* The loop polled `s` seconds for completions (spin_us). No-op when off. */
static inline void st__loopprof_spin(double s) {
  if (!st__loopprof) return;
  st__loopprof->spins++;
  st__loopprof->spin_s += s;
}
struct st__loop;

/* Turns profiling on when ST_LOOP_PROFILE names a file, with watchers
 * around the poll of loop 0. Loop thread, at start. */
void st__loopprof_start(struct st__server *srv);

/* The same for loop lp (1..N-1) on its own thread, when profiling is on;
 * _stop ends its phases and keeps its figures for the table. */
void st__loopprof_thread_start(struct st__loop *lp);
void st__loopprof_thread_stop(struct st__loop *lp);

/* Writes the table, every loop's figures added up, to the file (one line
 * per phase: name, count, own ns, ns per message) and turns profiling
 * off. Loop thread, at exit (the other loops' threads have stopped). */
void st__loopprof_stop(struct st__server *srv);

#endif
