/* The pool's slab allocator and slot table (src/mem/slab_alloc.c): random
 * take/give sequences never hand out a page twice, coalescing brings the
 * slab back whole, and frees through the control page that do not match
 * what was handed out (forged slot, wrong generation, twice, garbage)
 * take nothing back. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "mem/slab_alloc.h"
#include "st/errors.h"

#define PG ST__SLAB_PAGE

typedef struct {
  uint64_t off, len;
} region_t;

/* Nonzero when [a, a+al) and [b, b+bl) overlap. */
static int overlap(uint64_t a, uint64_t al, uint64_t b, uint64_t bl) {
  return a < b + bl && b < a + al;
}

TEST(random_sequences_never_overlap) {
  srand(12345);
  st__slab_alloc_t s;
  CHECK_EQ_INT(st__slab_alloc_init(&s, 256 * PG), ST_OK);
  region_t held[512];
  size_t n = 0;
  for (int step = 0; step < 20000; step++) {
    if (n < 512 && (n == 0 || rand() % 3 != 0)) {
      uint64_t bytes = (uint64_t)(rand() % (12 * PG)) + (rand() % 4 == 0 ? 0 : 1);
      uint64_t off, len;
      uint64_t before = s.free_bytes;
      if (st__slab_alloc_take(&s, bytes, &off, &len) != ST_OK) {
        CHECK(before < (bytes ? bytes : 1) || s.nfree > 1);
        continue;
      }
      CHECK(off % PG == 0 && len % PG == 0 && len >= bytes && len < bytes + PG + (bytes == 0) * PG);
      CHECK(off + len <= s.size);
      for (size_t k = 0; k < n; k++) CHECK(!overlap(off, len, held[k].off, held[k].len));
      CHECK_EQ_INT(st__slab_alloc_held(&s, off, len), 1);
      held[n++] = (region_t){off, len};
    } else {
      size_t k = (size_t)rand() % n;
      CHECK_EQ_INT(st__slab_alloc_give(&s, held[k].off, held[k].len), ST_OK);
      CHECK_EQ_INT(st__slab_alloc_held(&s, held[k].off, held[k].len), 0);
      /* A second give of the same range is refused. */
      CHECK_EQ_INT(st__slab_alloc_give(&s, held[k].off, held[k].len), ST_ERR_INVALID_ARGUMENT);
      held[k] = held[--n];
    }
    /* The free list stays sorted, never adjacent, and sums right. */
    uint64_t sum = 0;
    for (size_t i = 0; i < s.nfree; i++) {
      sum += s.free[i].len;
      if (i) CHECK(s.free[i - 1].off + s.free[i - 1].len < s.free[i].off);
    }
    CHECK_EQ_INT(sum, s.free_bytes);
  }
  while (n) {
    CHECK_EQ_INT(st__slab_alloc_give(&s, held[n - 1].off, held[n - 1].len), ST_OK);
    n--;
  }
  CHECK_EQ_INT(s.nfree, 1);   /* everything coalesced */
  CHECK_EQ_INT(s.free_bytes, s.size);
  st__slab_alloc_destroy(&s);
}

TEST(bad_gives_are_refused) {
  st__slab_alloc_t s;
  CHECK_EQ_INT(st__slab_alloc_init(&s, 16 * PG), ST_OK);
  uint64_t off, len;
  CHECK_EQ_INT(st__slab_alloc_take(&s, 3 * PG, &off, &len), ST_OK);
  CHECK_EQ_INT(st__slab_alloc_give(&s, off + 1, len), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__slab_alloc_give(&s, off, len + PG), ST_ERR_INVALID_ARGUMENT); /* a free page */
  CHECK_EQ_INT(st__slab_alloc_give(&s, 15 * PG, 2 * PG), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__slab_alloc_give(&s, UINT64_MAX - PG + 1, PG), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__slab_alloc_give(&s, off, 0), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st__slab_alloc_take(&s, 14 * PG, &off, &len), ST_ERR_OUT_OF_MEMORY);
  CHECK_EQ_INT(st__slab_alloc_take(&s, 13 * PG, &off, &len), ST_OK);
  CHECK_EQ_INT(s.free_bytes, 0);
  CHECK_EQ_INT(st__slab_alloc_take(&s, 0, &off, &len), ST_ERR_OUT_OF_MEMORY);
  st__slab_alloc_destroy(&s);
}

/* One page of freed[] words as the client would write them. */
static _Atomic uint32_t page[64];
static uint32_t freed_count;

static void client_free(uint32_t slot, uint32_t gen) {
  atomic_store(&page[slot], gen);
  freed_count++;
}

TEST(slots_take_back_only_what_was_handed_out) {
  st__slots_t t;
  uint32_t out[64];
  CHECK_EQ_INT(st__slots_init(&t, 64), ST_OK);
  int64_t a = st__slots_take(&t, 0, 0, PG);
  int64_t b = st__slots_take(&t, 0, PG, PG);
  CHECK(a == 0 && b == 1);
  uint32_t ga = t.slot[a].gen, gb = t.slot[b].gen;
  CHECK(ga != 0 && gb != 0);
  st__slots_hand_out(&t, (uint32_t)a);
  st__slots_hand_out(&t, (uint32_t)b);
  CHECK_EQ_INT(st__slots_server_done(&t, (uint32_t)a), 0);   /* the client holds it */
  CHECK_EQ_INT(st__slots_server_done(&t, (uint32_t)b), 0);

  /* Forged: wrong generation, a slot never given, garbage everywhere. */
  client_free((uint32_t)a, ga + 1);
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  client_free(7, 1);
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  for (int i = 2; i < 64; i++) atomic_store(&page[i], 0xdeadbeefu);
  freed_count += 1000;
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  CHECK(t.slot[a].live && t.slot[b].live);
  /* Unchanged count: no scan, even if the page says so. */
  atomic_store(&page[a], ga);
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  /* The real free. */
  freed_count++;
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 1);
  CHECK_EQ_INT(out[0], a);
  st__slots_release(&t, out[0]);
  CHECK(!t.slot[a].live);
  /* Twice: the generation moved on, the same word frees nothing again. */
  int64_t a2 = st__slots_take(&t, 0, 0, PG);
  CHECK_EQ_INT(a2, a);
  CHECK(t.slot[a].gen != ga);
  st__slots_hand_out(&t, (uint32_t)a2);
  client_free((uint32_t)a, ga);
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  CHECK(t.slot[a].live);
  st__slots_destroy(&t);
}

TEST(server_references_outlive_a_client_free) {
  st__slots_t t;
  uint32_t out[8];
  memset((void *)page, 0, sizeof page);
  freed_count = 0;
  CHECK_EQ_INT(st__slots_init(&t, 8), ST_OK);
  int64_t a = st__slots_take(&t, 0, 0, PG);
  st__slots_hand_out(&t, (uint32_t)a);
  client_free((uint32_t)a, t.slot[a].gen);
  /* The client is done, the server still holds it: nothing comes back... */
  CHECK_EQ_INT(st__slots_scan(&t, page, freed_count, out), 0);
  CHECK(t.slot[a].live);
  /* ...until the server's last reference goes. */
  CHECK_EQ_INT(st__slots_server_done(&t, (uint32_t)a), 1);
  /* A region never handed out comes back with the server's reference. */
  int64_t b = st__slots_take(&t, 0, PG, PG);
  CHECK_EQ_INT(st__slots_server_done(&t, (uint32_t)b), 1);
  /* All slots live: take says so. */
  st__slots_release(&t, (uint32_t)a);
  st__slots_release(&t, (uint32_t)b);
  for (int i = 0; i < 8; i++) CHECK(st__slots_take(&t, 0, 0, PG) >= 0);
  CHECK_EQ_INT(st__slots_take(&t, 0, 0, PG), -1);
  st__slots_destroy(&t);
}

int main(void) {
  RUN(random_sequences_never_overlap);
  RUN(bad_gives_are_refused);
  RUN(slots_take_back_only_what_was_handed_out);
  RUN(server_references_outlive_a_client_free);
  return stt_summary();
}
