/* Unit tests of the workers (src/engine/workers.c) with a fake runner:
 * completion order and notification, errors, taking a queued job back,
 * cancellation of running jobs and of everything, generation switches (eager rebuild, old generations
 * released, in-flight jobs keep their own), and shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "engine/job.h"
#include "engine/workers.h"
#include "st/errors.h"

/* ------------------------------------------------------------- fake runner */

struct st__vm {
  st__generation_t *gen;
};

static int vm_news, vm_frees;     /* atomic */

static int fake_new(st__generation_t *gen, int worker_id, const st__vm_limits_t *limits,
                    st__vm_t **out, char *err, size_t errlen) {
  (void)worker_id;
  (void)limits;
  if (gen->dir && strcmp(gen->dir, "broken") == 0) {
    snprintf(err, errlen, "cannot compile");
    return ST_ERR_CONFIGURATION;
  }
  st__vm_t *vm = calloc(1, sizeof *vm);
  st__generation_ref(gen);
  vm->gen = gen;
  *out = vm;
  __atomic_add_fetch(&vm_news, 1, __ATOMIC_RELAXED);
  return ST_OK;
}

static void fake_free(st__vm_t *vm) {
  if (!vm) return;
  st__generation_unref(vm->gen);
  free(vm);
  __atomic_add_fetch(&vm_frees, 1, __ATOMIC_RELAXED);
}

static st__generation_t *fake_generation(const st__vm_t *vm) {
  return vm->gen;
}

static double stt_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* "ok": value = generation number * 1000 + first byte of args;
 * "fail": ENDPOINT error; "slow": runs until cancelled (5 s at most). */
static int fake_build(st__vm_t *vm, const st__endpoint_decl_t *ep, const char *args,
                      size_t args_len, const volatile int *cancel, st__progress_t *progress,
                      st__build_result_t *res, char *err, size_t errlen) {
  (void)progress;
  st__build_result_init(res);
  if (strcmp(ep->name, "fail") == 0) {
    snprintf(err, errlen, "fail.lua:3: boom");
    return ST_ERR_ENDPOINT;
  }
  if (strcmp(ep->name, "slow") == 0) {
    for (int i = 0; i < 5000; i++) {
      if (__atomic_load_n(cancel, __ATOMIC_RELAXED)) {
        snprintf(err, errlen, "cancelled");
        return ST_ERR_CANCELLED;
      }
      sleep_ms(1);
    }
  }
  msgpack_packer pk;
  msgpack_packer_init(&pk, &res->value, msgpack_sbuffer_write);
  msgpack_pack_uint64(&pk, vm->gen->number * 1000 + (args_len ? (unsigned char)args[0] : 0));
  return ST_OK;
}

static const st__workers_runner_t RUNNER = {fake_new, fake_free, fake_generation, fake_build,
                                         {0, 0}};

/* ------------------------------------------------------------- fixtures */

static int notify_pipe[2];

static void notify(void *ud, int home) {
  (void)ud;
  (void)home;
  char b = 1;
  ssize_t n = write(notify_pipe[1], &b, 1);
  (void)n;
}

static st__generation_t *make_gen(uint64_t number, const char *dir) {
  st__generation_t *g = calloc(1, sizeof *g);
  g->refs = 1;
  g->number = number;
  g->dir = strdup(dir);
  g->nendpoints = 3;
  g->endpoints = calloc(3, sizeof *g->endpoints);
  g->endpoints[0].name = strdup("fail");
  g->endpoints[1].name = strdup("ok");
  g->endpoints[2].name = strdup("slow");
  return g;
}

static const st__endpoint_decl_t *ep_of(st__generation_t *g, const char *name) {
  return st__generation_find(g, name, strlen(name));
}

/* Collects `want` completions (waiting on the notify pipe, 5 s deadline)
 * into out[] in completion order. Returns how many arrived. */
static int collect(st__workers_t *p, st__job_t **out, int want) {
  int got = 0;
  double end = stt_now() + 5.0;
  while (got < want && stt_now() < end) {
    struct pollfd pf = {.fd = notify_pipe[0], .events = POLLIN};
    if (poll(&pf, 1, 50) == 1) {
      char buf[256];
      ssize_t n = read(notify_pipe[0], buf, sizeof buf);
      (void)n;
    }
    for (st__job_t *j = st__workers_take_done(p, 0); j;) {
      st__job_t *next = j->next;
      if (got < want) out[got++] = j;
      else st__job_free(j);
      j = next;
    }
  }
  return got;
}

static int64_t value_of(const st__job_t *j) {
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  size_t off = 0;
  int64_t v = -1;
  if (msgpack_unpack_next(&u, j->result.value.data, j->result.value.size, &off) ==
      MSGPACK_UNPACK_SUCCESS)
    v = (int64_t)u.data.via.u64;
  msgpack_unpacked_destroy(&u);
  return v;
}

static int refs_of(st__generation_t *g) {
  return __atomic_load_n(&g->refs, __ATOMIC_RELAXED);
}

/* Polls until refs_of(g) == want (2 s). */
static int wait_refs(st__generation_t *g, int want) {
  double end = stt_now() + 2.0;
  while (stt_now() < end) {
    if (refs_of(g) == want) return 0;
    sleep_ms(1);
  }
  return -1;
}

/* ------------------------------------------------------------- tests */

TEST(runs_many_jobs) {
  st__generation_t *g = make_gen(1, "gen1");
  st__workers_t *p;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(4, &RUNNER, g, notify, NULL, &p, err, sizeof err), ST_OK, err);
  enum { N = 200 };
  for (int i = 0; i < N; i++) {
    char arg = (char)(i % 100);
    st__job_t *j = st__job_new(1, (uint32_t)i, g, ep_of(g, "ok"), &arg, 1);
    CHECK(j != NULL);
    CHECK_ERR(st__workers_submit(p, j), ST_OK);
  }
  CHECK_EQ_INT(st__workers_outstanding(p, -1), N);
  static st__job_t *done[N];
  CHECK_EQ_INT(collect(p, done, N), N);
  int seen[N] = {0};
  for (int i = 0; i < N; i++) {
    CHECK_ERR(done[i]->status, ST_OK);
    CHECK_EQ_INT(value_of(done[i]), 1000 + (int64_t)(done[i]->request_id % 100));
    CHECK(done[i]->worker >= 0 && done[i]->worker < 4);
    CHECK(done[i]->finished_at >= done[i]->started_at);
    seen[done[i]->request_id]++;
    st__job_free(done[i]);
  }
  for (int i = 0; i < N; i++) CHECK_EQ_INT(seen[i], 1);
  CHECK_EQ_INT(st__workers_outstanding(p, -1), 0);
  uint64_t ok, failed;
  st__workers_stats(p, &ok, &failed);
  CHECK_EQ_INT(ok, N);
  CHECK_EQ_INT(failed, 0);
  CHECK_EQ_INT(st__workers_free(p, 5.0), 0);
  /* Only our reference is left once the workers' states are gone. */
  CHECK_EQ_INT(refs_of(g), 1);
  st__generation_unref(g);
}

TEST(errors_come_back) {
  st__generation_t *g = make_gen(1, "gen1");
  st__workers_t *p;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(2, &RUNNER, g, notify, NULL, &p, err, sizeof err), ST_OK, err);
  CHECK_ERR(st__workers_submit(p, st__job_new(1, 1, g, ep_of(g, "fail"), NULL, 0)), ST_OK);
  st__job_t *done[1];
  CHECK_EQ_INT(collect(p, done, 1), 1);
  CHECK_ERR(done[0]->status, ST_ERR_ENDPOINT);
  CHECK_STR_EQ(done[0]->error, "fail.lua:3: boom");
  CHECK_EQ_INT(done[0]->result.narenas, 0);
  st__job_free(done[0]);
  /* A generation that cannot be compiled fails its jobs with a reason. */
  st__generation_t *bad = make_gen(2, "broken");
  CHECK_ERR(st__workers_submit(p, st__job_new(1, 2, bad, ep_of(bad, "ok"), NULL, 0)), ST_OK);
  CHECK_EQ_INT(collect(p, done, 1), 1);
  CHECK_ERR(done[0]->status, ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(done[0]->error, "cannot compile");
  st__job_free(done[0]);
  CHECK_EQ_INT(st__workers_free(p, 5.0), 0);
  CHECK_EQ_INT(refs_of(bad), 1);
  st__generation_unref(bad);
  st__generation_unref(g);
}

TEST(remove_queued_and_cancel_running) {
  st__generation_t *g = make_gen(1, "gen1");
  st__workers_t *p;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(1, &RUNNER, g, notify, NULL, &p, err, sizeof err), ST_OK, err);
  /* One worker: the first job runs, the second waits in the queue. */
  st__job_t *running = st__job_new(7, 1, g, ep_of(g, "slow"), NULL, 0);
  st__job_t *queued = st__job_new(7, 2, g, ep_of(g, "ok"), NULL, 0);
  CHECK_ERR(st__workers_submit(p, running), ST_OK);
  CHECK_ERR(st__workers_submit(p, queued), ST_OK);
  double end = stt_now() + 2.0;
  while (st__job_state(running) != ST_JOB_RUNNING && stt_now() < end) sleep_ms(1);
  CHECK_EQ_INT(st__job_state(running), ST_JOB_RUNNING);
  CHECK_EQ_INT(st__job_state(queued), ST_JOB_QUEUED);
  CHECK(running->started_unix > 1e9);
  /* The queued job comes back out; the running one cannot. */
  CHECK_EQ_INT(st__workers_remove(p, queued), 1);
  CHECK_EQ_INT(st__workers_remove(p, queued), 0);
  CHECK_EQ_INT(st__workers_remove(p, running), 0);
  CHECK_EQ_INT(st__workers_outstanding(p, -1), 1);
  st__job_free(queued);
  st__job_cancel(running);
  st__job_t *done[1];
  CHECK_EQ_INT(collect(p, done, 1), 1);
  CHECK(done[0] == running);
  CHECK_ERR(done[0]->status, ST_ERR_CANCELLED);
  CHECK_EQ_INT(st__job_state(done[0]), ST_JOB_DONE);
  st__job_free(done[0]);
  CHECK_EQ_INT(st__workers_outstanding(p, -1), 0);
  /* cancel_all reaches queued and running jobs. */
  CHECK_ERR(st__workers_submit(p, st__job_new(8, 3, g, ep_of(g, "slow"), NULL, 0)), ST_OK);
  CHECK_ERR(st__workers_submit(p, st__job_new(8, 4, g, ep_of(g, "slow"), NULL, 0)), ST_OK);
  st__workers_cancel_all(p);
  st__job_t *two[2];
  CHECK_EQ_INT(collect(p, two, 2), 2);
  for (int i = 0; i < 2; i++) {
    CHECK_ERR(two[i]->status, ST_ERR_CANCELLED);
    st__job_free(two[i]);
  }
  CHECK_EQ_INT(st__workers_free(p, 5.0), 0);
  st__generation_unref(g);
}

TEST(generation_switch) {
  st__generation_t *g1 = make_gen(1, "gen1");
  st__workers_t *p;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(3, &RUNNER, g1, notify, NULL, &p, err, sizeof err), ST_OK, err);
  /* Workers prepare eagerly: 3 states holding g1, plus the workers' ref. */
  CHECK_EQ_INT(wait_refs(g1, 1 + 1 + 3), 0);
  st__generation_t *g2 = make_gen(2, "gen2");
  st__workers_set_generation(p, g2);
  /* Idle workers move to g2; g1 is held by us alone. */
  CHECK_EQ_INT(wait_refs(g1, 1), 0);
  CHECK_EQ_INT(wait_refs(g2, 1 + 1 + 3), 0);
  /* A job dispatched on g1 before the reload still runs on g1. */
  st__job_t *done[2];
  CHECK_ERR(st__workers_submit(p, st__job_new(1, 1, g1, ep_of(g1, "ok"), NULL, 0)), ST_OK);
  CHECK_EQ_INT(collect(p, done, 1), 1);
  CHECK_EQ_INT(value_of(done[0]), 1000);
  st__job_free(done[0]);
  CHECK_ERR(st__workers_submit(p, st__job_new(1, 2, g2, ep_of(g2, "ok"), NULL, 0)), ST_OK);
  CHECK_EQ_INT(collect(p, done, 1), 1);
  CHECK_EQ_INT(value_of(done[0]), 2000);
  st__job_free(done[0]);
  CHECK_EQ_INT(wait_refs(g1, 1), 0);
  CHECK_EQ_INT(st__workers_free(p, 5.0), 0);
  CHECK_EQ_INT(refs_of(g2), 1);
  st__generation_unref(g1);
  st__generation_unref(g2);
  CHECK_EQ_INT(__atomic_load_n(&vm_news, __ATOMIC_RELAXED),
               __atomic_load_n(&vm_frees, __ATOMIC_RELAXED));
}

TEST(shutdown_drains_and_refuses) {
  st__generation_t *g = make_gen(1, "gen1");
  st__workers_t *p;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(1, &RUNNER, g, notify, NULL, &p, err, sizeof err), ST_OK, err);
  for (uint32_t i = 0; i < 5; i++)
    CHECK_ERR(st__workers_submit(p, st__job_new(1, i, g, ep_of(g, "ok"), NULL, 0)), ST_OK);
  st__workers_shutdown(p);
  st__job_t *late = st__job_new(1, 99, g, ep_of(g, "ok"), NULL, 0);
  CHECK_ERR(st__workers_submit(p, late), ST_ERR_SHUTTING_DOWN);
  st__job_free(late);
  /* Queued jobs still run to completion. */
  st__job_t *done[5];
  CHECK_EQ_INT(collect(p, done, 5), 5);
  for (int i = 0; i < 5; i++) {
    CHECK_ERR(done[i]->status, ST_OK);
    CHECK_EQ_INT(done[i]->request_id, i);   /* one worker: in order */
    st__job_free(done[i]);
  }
  CHECK_EQ_INT(st__workers_free(p, 5.0), 0);
  st__generation_unref(g);
}

TEST(bad_arguments) {
  st__workers_t *p = NULL;
  char err[128];
  CHECK_ERR_MSG(st__workers_start(0, &RUNNER, NULL, notify, NULL, &p, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK(p == NULL);
  st__workers_runner_t partial = RUNNER;
  partial.vm_build = NULL;
  CHECK_ERR_MSG(st__workers_start(1, &partial, NULL, notify, NULL, &p, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
}

int main(void) {
  if (pipe2(notify_pipe, O_NONBLOCK | O_CLOEXEC) != 0) return 1;
  RUN(runs_many_jobs);
  RUN(errors_come_back);
  RUN(remove_queued_and_cancel_running);
  RUN(generation_switch);
  RUN(shutdown_drains_and_refuses);
  RUN(bad_arguments);
  return stt_summary();
}
