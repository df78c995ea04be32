/* The fence of a live key's page (src/shm/key_page.h; docs/multihost.md,
 * "Live replication"), the part of a replication's read that runs on the
 * source host, with threads standing in for the publisher and for the
 * transfer helper that reads the key's memory as one version:
 *   - with the fence, every copy the reader takes is one version whole,
 *     while the publisher updates as fast as it can;
 *   - without it (the publisher begins as before fences existed), copies
 *     tear, and the reader's check says so every time: a torn copy is
 *     never taken for a version;
 *   - a fence that is never dropped holds an update back until its
 *     deadline only; the update then goes ahead and the check fails;
 *   - a cleared fence (a restored page) lets a waiting update go at once;
 *   - a replica's page ends its updates under the source's numbers.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "fixture.h"
#include "shm/key_page.h"

#define WORDS (256 * 1024 / 8)   /* the key's memory: 256 KiB */

static st__key_page_t *page;
static uint64_t *mem;
static atomic_int stop;
static int fenced_publisher;
static atomic_ullong updates;

static void *publisher(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    int overran = 0;
    uint64_t s = fenced_publisher ? st__key_page_begin_fenced(page, &overran)
                                  : st__key_page_begin(page);
    uint64_t v = (s + 1) / 2;
    for (size_t i = 0; i < WORDS; i++) mem[i] = v;
    st__key_page_end(page, s);
    atomic_fetch_add(&updates, 1);
  }
  return NULL;
}

static void setup(void) {
  page = mmap(NULL, ST__KEY_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  mem = mmap(NULL, WORDS * 8, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(page != MAP_FAILED && mem != MAP_FAILED);
  st__key_page_init(page, 1);
  for (size_t i = 0; i < WORDS; i++) mem[i] = 1;
  atomic_store(&stop, 0);
  atomic_store(&updates, 0);
}

static void teardown(void) {
  munmap(page, ST__KEY_PAGE_BYTES);
  munmap(mem, WORDS * 8);
}

/* One read as the helper does it: the fence, a copy, the check. 1: a
 * whole version (*torn 0); 0: the check failed (*torn says whether the
 * copy mixed versions); -1: an update ran, no fence taken. */
static int read_once(uint64_t *copy, int *torn) {
  uint64_t v;
  if (!st__key_page_fence_take(page, st__key_page_mono_ns() + 1000000000, &v)) return -1;
  memcpy(copy, mem, WORDS * 8);
  int whole = st__key_page_fence_check(page, v);
  st__key_page_fence_drop(page);
  *torn = 0;
  for (size_t i = 0; i < WORDS; i++)
    if (copy[i] != v) {
      *torn = 1;
      break;
    }
  return whole;
}

/* Copies for `seconds`, or until `until_torn` torn copies were caught;
 * counts. */
static void hammer(double seconds, int until_torn, int *whole, int *torn, int *caught) {
  uint64_t *copy = malloc(WORDS * 8);
  *whole = *torn = *caught = 0;
  double end = stt_now_ms() + seconds * 1e3;
  while (stt_now_ms() < end && (!until_torn || *caught < until_torn)) {
    int t = 0, r = read_once(copy, &t);
    if (r < 0) continue;
    if (r == 1) {
      (*whole)++;
      if (t) (*torn)++;   /* taken for a version, yet mixed: the failure */
    } else if (t) {
      (*caught)++;
    }
  }
  free(copy);
}

TEST(fenced_reads_are_whole_versions) {
  setup();
  fenced_publisher = 1;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, publisher, NULL) == 0);
  int whole, torn, caught;
  hammer(1.5, 0, &whole, &torn, &caught);
  atomic_store(&stop, 1);
  pthread_join(th, NULL);
  printf("   fenced: %d whole copies, %d torn, %d caught; %llu updates\n", whole, torn, caught,
         (unsigned long long)atomic_load(&updates));
  CHECK(whole > 10);
  CHECK_EQ_INT(torn, 0);
  CHECK_EQ_INT(caught, 0);   /* the fence held every update back */
  CHECK(atomic_load(&updates) > 10);
  teardown();
}

TEST(without_the_fence_copies_tear_and_the_check_says_so) {
  setup();
  fenced_publisher = 0;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, publisher, NULL) == 0);
  int whole, torn, caught;
  hammer(10, 3, &whole, &torn, &caught);
  atomic_store(&stop, 1);
  pthread_join(th, NULL);
  printf("   unfenced: %d whole copies, %d torn and caught, %d torn and missed\n", whole, caught,
         torn);
  CHECK(caught >= 1);        /* the fence is what keeps copies whole */
  CHECK_EQ_INT(torn, 0);     /* and a torn copy is never taken as a version */
  teardown();
}

TEST(a_fence_never_dropped_holds_an_update_back_until_its_deadline) {
  setup();
  uint64_t v;
  CHECK(st__key_page_fence_take(page, st__key_page_mono_ns() + 200000000, &v) == 1);
  CHECK_EQ_INT(v, 1);
  double t0 = stt_now_ms();
  int overran = 0;
  uint64_t s = st__key_page_begin_fenced(page, &overran);
  double waited = stt_now_ms() - t0;
  CHECK(overran);
  CHECK(waited >= 150);
  CHECK_EQ_INT(s, 3);
  CHECK(!st__key_page_fence_check(page, v));   /* the holder learns its read may be torn */
  CHECK_EQ_INT(st__key_page_end(page, s), 2);
  st__key_page_fence_drop(page);
  /* Dropped: the next update does not wait. */
  t0 = stt_now_ms();
  s = st__key_page_begin_fenced(page, &overran);
  CHECK(!overran);
  CHECK(stt_now_ms() - t0 < 100);
  st__key_page_end(page, s);
  teardown();
}

TEST(a_fence_raised_during_an_update_holds_the_version_after_it) {
  setup();
  uint64_t s = st__key_page_begin(page), v = 0;
  /* A holder that cannot wait gets nothing and leaves no fence. */
  CHECK(st__key_page_fence_take(page, st__key_page_mono_ns() + 1000000000, &v) == 0);
  CHECK_EQ_INT(atomic_load(&page->fence), 0);
  /* One that waits raises it: the running update goes on to its end ... */
  st__key_page_fence_raise(page, st__key_page_mono_ns() + 300000000);
  CHECK(!st__key_page_fence_settled(page, &v));
  st__key_page_end(page, s);
  CHECK(st__key_page_fence_settled(page, &v));
  CHECK_EQ_INT(v, 2);
  /* ... and the next one gives way until the fence drops. */
  int overran = 0;
  double t0 = stt_now_ms();
  s = st__key_page_begin_fenced(page, &overran);
  CHECK(overran);                            /* it waited until the deadline */
  CHECK(stt_now_ms() - t0 >= 200);
  CHECK(!st__key_page_fence_check(page, v));
  st__key_page_end(page, s);
  st__key_page_fence_drop(page);
  teardown();
}

static void *begin_and_end(void *arg) {
  int *overran = arg;
  st__key_page_end(page, st__key_page_begin_fenced(page, overran));
  return NULL;
}

/* A page restored after a restart keeps no fence of the old server's
 * lends: the restore clears them (engine/keys.c), and an update waiting
 * for one goes on at once, not overrun. */
TEST(a_cleared_fence_lets_a_waiting_update_go) {
  setup();
  uint64_t v;
  st__key_page_fence_raise(page, st__key_page_mono_ns() + 30000000000ll);   /* 30 s */
  CHECK(st__key_page_fence_settled(page, &v));
  int overran = -1;
  pthread_t th;
  CHECK(pthread_create(&th, NULL, begin_and_end, &overran) == 0);
  stt_sleep_ms(100);
  CHECK_EQ_INT(atomic_load(&page->seq), 2);   /* still giving way */
  double t0 = stt_now_ms();
  st__key_page_fence_clear(page);
  pthread_join(th, NULL);
  CHECK(stt_now_ms() - t0 < 5000);
  CHECK_EQ_INT(overran, 0);
  CHECK_EQ_INT(atomic_load(&page->seq), 4);
  CHECK_EQ_INT(atomic_load(&page->fence), 0);
  teardown();
}

TEST(a_replica_takes_its_sources_version_numbers) {
  setup();
  uint64_t s = st__key_page_begin(page);
  st__key_page_end_as(page, s, 7);
  CHECK_EQ_INT(atomic_load(&page->version), 7);
  CHECK_EQ_INT(atomic_load(&page->seq), 14);
  s = st__key_page_begin(page);
  CHECK_EQ_INT(s, 15);
  st__key_page_end_as(page, s, 12);   /* versions 8..11 skipped: the replica lagged */
  CHECK_EQ_INT(atomic_load(&page->version), 12);
  CHECK_EQ_INT(atomic_load(&page->seq), 24);
  teardown();
}

int main(void) {
  RUN(fenced_reads_are_whole_versions);
  RUN(without_the_fence_copies_tear_and_the_check_says_so);
  RUN(a_fence_never_dropped_holds_an_update_back_until_its_deadline);
  RUN(a_fence_raised_during_an_update_holds_the_version_after_it);
  RUN(a_cleared_fence_lets_a_waiting_update_go);
  RUN(a_replica_takes_its_sources_version_numbers);
  return stt_summary();
}
