/* The page watch (src/server/page_watch.h): a thread that sleeps on futex
 * words of shared pages and wakes a loop. A word moved from another
 * process's mapping (here: another mapping of the same memfd, with the
 * waker's wake-only-when-waited rule of src/shm/futex.h) runs the
 * callback; the watcher counts itself among the waiters while it sleeps;
 * a removed page moves nothing any more; the limit of pages; words
 * outside the page refused. Skips where the kernel has no futex_waitv. */
#include <ev.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "server/page_watch.h"
#include "shm/futex.h"
#include "st/errors.h"

static struct ev_loop *loop;
static int calls;

static void on_moved(struct ev_loop *l, void *ud) {
  (void)l, (void)ud;
  calls++;
}

/* A page of 4096 bytes in a memfd: word at 64, waiters at 68. */
typedef struct page {
  int fd;
  _Atomic uint32_t *word, *waiters;
} page_t;

static page_t page_new(void) {
  page_t p;
  p.fd = memfd_create("watch-test", MFD_CLOEXEC);
  if (p.fd < 0 || ftruncate(p.fd, 4096) != 0) abort();
  char *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
  if (m == MAP_FAILED) abort();
  p.word = (_Atomic uint32_t *)(m + 64);
  p.waiters = (_Atomic uint32_t *)(m + 68);
  return p;
}

/* Runs the loop until `calls` exceeds `past` or ms pass; 1 when it did. */
static int wait_calls(int past, double ms) {
  double end = stt_now_ms() + ms;
  while (calls <= past && stt_now_ms() < end) ev_run(loop, EVRUN_NOWAIT), usleep(200);
  return calls > past;
}

/* Until the watcher sleeps on p (its waiter count is taken). */
static int wait_sleeping(const page_t *p) {
  double end = stt_now_ms() + 5000;
  while (!atomic_load(p->waiters) && stt_now_ms() < end) usleep(200);
  return atomic_load(p->waiters) != 0;
}

TEST(a_moved_word_wakes_the_loop) {
  st__pwatch_t *w = NULL;
  char err[200];
  CHECK_ERR(st__pwatch_new(loop, on_moved, NULL, &w, err, sizeof err), ST_OK);
  page_t a = page_new(), b = page_new();
  CHECK_ERR(st__pwatch_add(w, 1, a.fd, 4096, 64, 68, err, sizeof err), ST_OK);
  CHECK_ERR(st__pwatch_add(w, 2, b.fd, 4096, 64, 68, err, sizeof err), ST_OK);
  CHECK(wait_calls(0, 5000));          /* a new page is read once */
  CHECK(wait_sleeping(&a) && wait_sleeping(&b));
  for (int i = 0; i < 50; i++) {
    int before = calls;
    st__shm_notify(i % 2 ? b.word : a.word, i % 2 ? b.waiters : a.waiters);
    CHECK(wait_calls(before, 5000));
  }
  /* Removed: its moves wake nothing; the other still does. */
  st__pwatch_remove(w, 1);
  double end = stt_now_ms() + 5000;
  while (atomic_load(a.waiters) && stt_now_ms() < end) usleep(200);
  CHECK_EQ_INT(atomic_load(a.waiters), 0);
  ev_run(loop, EVRUN_NOWAIT);
  int before = calls;
  st__shm_notify(a.word, a.waiters);
  CHECK(!wait_calls(before, 100));
  st__shm_notify(b.word, b.waiters);
  CHECK(wait_calls(before, 5000));
  st__pwatch_free(w);
  close(a.fd);
  close(b.fd);
}

TEST(limits_and_refusals) {
  st__pwatch_t *w = NULL;
  char err[200];
  CHECK_ERR(st__pwatch_new(loop, on_moved, NULL, &w, err, sizeof err), ST_OK);
  page_t p = page_new();
  CHECK_ERR(st__pwatch_add(w, 1, p.fd, 4096, 4094, 68, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st__pwatch_add(w, 1, p.fd, 4096, 66, 68, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < ST__PWATCH_MAX; i++)
    CHECK_ERR(st__pwatch_add(w, (uint64_t)i + 10, p.fd, 4096, 64, 68, err, sizeof err), ST_OK);
  CHECK_ERR(st__pwatch_add(w, 999, p.fd, 4096, 64, 68, err, sizeof err), ST_ERR_LIMIT);
  CHECK_CONTAINS(err, "watched already");
  st__pwatch_free(w);   /* unmaps every page, ends the thread */
  close(p.fd);
}

int main(void) {
  loop = ev_loop_new(EVFLAG_AUTO);
  st__pwatch_t *w = NULL;
  char err[200];
  if (st__pwatch_new(loop, on_moved, NULL, &w, err, sizeof err) == ST_ERR_CAPABILITY)
    stt_skip(err);
  st__pwatch_free(w);
  RUN(a_moved_word_wakes_the_loop);
  RUN(limits_and_refusals);
  ev_loop_destroy(loop);
  return stt_summary();
}
