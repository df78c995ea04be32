/* The page watch (src/server/page_watch.h): a thread that sleeps on futex
 * words of shared pages and wakes a loop. A word moved from another
 * process's mapping (here: another mapping of the same memfd, with the
 * waker's wake-only-when-waited rule of src/shm/futex.h) runs the
 * callback; the watcher counts itself among the waiters while it sleeps;
 * a page without a waiter count; a removed page moves nothing any more;
 * pages past the limit, unmappable or with words outside the page read by
 * the timer at its fast period. Skips where the kernel has no
 * futex_waitv. */
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

/* Runs the loop until no callback came for 100 ms (new pages are each
 * read once), at most 5 s. */
static void settle(void) {
  double end = stt_now_ms() + 5000;
  while (wait_calls(calls, 100) && stt_now_ms() < end) {
  }
}

/* Until the watcher sleeps on p (its waiter count is taken). */
static int wait_sleeping(const page_t *p) {
  double end = stt_now_ms() + 5000;
  while (!atomic_load(p->waiters) && stt_now_ms() < end) usleep(200);
  return atomic_load(p->waiters) != 0;
}

static st__pwatch_t *watch_new(double fast, double slow) {
  st__pwatch_t *w = NULL;
  if (st__pwatch_new(loop, "test pages", fast, slow, on_moved, NULL, &w) != ST_OK) abort();
  return w;
}

TEST(a_moved_word_wakes_the_loop) {
  st__pwatch_t *w = watch_new(10, 10);   /* the timer out of the way */
  page_t a = page_new(), b = page_new();
  CHECK_EQ_INT(st__pwatch_add(w, 1, a.fd, 4096, 64, 68), 1);
  CHECK_EQ_INT(st__pwatch_add(w, 2, b.fd, 4096, 64, ST__PWATCH_NO_WAITERS), 1);
  CHECK(wait_calls(0, 5000));          /* a new page is read once */
  CHECK(wait_sleeping(&a));
  for (int i = 0; i < 50; i++) {
    int before = calls;
    if (i % 2) {   /* b has no waiter count: its writer always wakes */
      atomic_fetch_add(b.word, 1);
      st__shm_futex_wake(b.word);
    } else {
      st__shm_notify(a.word, a.waiters);
    }
    CHECK(wait_calls(before, 5000));
  }
  CHECK_EQ_INT(atomic_load(b.waiters), 0);   /* never counted there */
  /* Removed: its moves wake nothing; the other still does. */
  st__pwatch_remove(w, 1);
  double end = stt_now_ms() + 5000;
  while (atomic_load(a.waiters) && stt_now_ms() < end) usleep(200);
  CHECK_EQ_INT(atomic_load(a.waiters), 0);
  ev_run(loop, EVRUN_NOWAIT);
  int before = calls;
  st__shm_notify(a.word, a.waiters);
  CHECK(!wait_calls(before, 100));
  atomic_fetch_add(b.word, 1);
  st__shm_futex_wake(b.word);
  CHECK(wait_calls(before, 5000));
  st__pwatch_free(w);
  close(a.fd);
  close(b.fd);
}

/* Past ST__PWATCH_MAX pages, or a page that cannot be mapped, the timer
 * reads it every `fast` seconds; once it goes, back to `slow`. */
TEST(pages_past_the_limit_go_to_the_timer) {
  st__pwatch_t *w = watch_new(0.02, 10);
  page_t p = page_new();
  for (int i = 0; i < ST__PWATCH_MAX; i++)
    CHECK_EQ_INT(st__pwatch_add(w, (uint64_t)i + 10, p.fd, 4096, 64, 68), 1);
  settle();
  int before = calls;
  CHECK(!wait_calls(before, 150));   /* all watched: the timer is slow */
  CHECK_EQ_INT(st__pwatch_add(w, 999, p.fd, 4096, 64, 68), 0);
  before = calls;
  CHECK(wait_calls(before + 2, 2000));   /* the fast timer, no word moved */
  st__pwatch_remove(w, 999);
  settle();
  before = calls;
  CHECK(!wait_calls(before, 150));
  CHECK_EQ_INT(st__pwatch_add(w, 1000, -1, 4096, 64, 68), 0);   /* no mapping */
  CHECK_EQ_INT(st__pwatch_add(w, 1001, p.fd, 4096, 4094, 68), 0);   /* outside */
  before = calls;
  CHECK(wait_calls(before + 2, 2000));
  st__pwatch_free(w);   /* unmaps every page, ends the thread and the timer */
  close(p.fd);
}

int main(void) {
  loop = ev_loop_new(EVFLAG_AUTO);
  st__pwatch_t *w = watch_new(10, 10);
  page_t p = page_new();
  int threaded = st__pwatch_add(w, 1, p.fd, 4096, 64, 68);
  st__pwatch_free(w);
  close(p.fd);
  if (!threaded) stt_skip("no futex_waitv in this kernel: pages are read on a timer alone");
  RUN(a_moved_word_wakes_the_loop);
  RUN(pages_past_the_limit_go_to_the_timer);
  ev_loop_destroy(loop);
  return stt_summary();
}
