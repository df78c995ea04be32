/* src/client: named buffers, per frame (include/st/client.h, "buffers
 * and streams"; docs/streams.md, where the protocol of the page and its
 * memory orders are written down). Nothing here reaches the server:
 * writes, reads, waits and the writer lock are atomic operations on the
 * control page (shm/buffer_page.h) and futex waits.
 *
 * The page is not trusted for memory safety: a slot index is always
 * computed modulo the slots of the server's reply, and copies use the
 * frame size of the reply. A process that scribbles on the page can make
 * reads retry until their timeout or see frames it wrote, never make a
 * pointer leave the mappings.
 *
 * Threads: any, at once; close (buffer.c) must not run concurrently.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client/buffer.h"
#include "common/clock.h"
#include "common/spin.h"

#define fail st__client_handle_fail

/* Spins of a read that raced with a writer before it yields the CPU. */
#define SPINS 64

static int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t deadline_of(int timeout_ms) {
  return timeout_ms < 0 ? -1 : st__now_mono_ns() + (int64_t)timeout_ms * 1000000;
}

static int passed(int64_t deadline) { return deadline >= 0 && st__now_mono_ns() >= deadline; }

static uint8_t *slot_data(const st_buffer_t *b, uint32_t i) { return b->data + i * b->stride; }

static int writable(const st_buffer_t *b, const char *what) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  if (b->info.readonly)
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s' was opened read-only: it cannot %s",
                b->name, what);
  return ST_OK;
}

/* Copies n bytes between host memory and the buffer's memory (a device
 * address of a CUDA buffer), waited for. */
static int copy_in(st_buffer_t *b, void *slot, const void *src, uint64_t n) {
  if (b->info.device_index < 0) {
    memcpy(slot, src, n);
    return ST_OK;
  }
  int rc = st__client_cuda_from_host(slot, src, n, b->info.device_index);
  return rc == ST_OK ? rc : fail(rc, "buffer '%s': the copy to the device failed", b->name);
}

static int copy_out(const st_buffer_t *b, void *dst, const void *slot, uint64_t n) {
  if (b->info.device_index < 0) {
    memcpy(dst, slot, n);
    return ST_OK;
  }
  int rc = st__client_cuda_to_host(dst, slot, n, b->info.device_index);
  return rc == ST_OK ? rc : fail(rc, "buffer '%s': the copy from the device failed", b->name);
}

/* ------------------------------------------------------------- lock */

/* Takes the lock for this connection (0 -> me), waiting until deadline.
 * `what` says, when this connection holds it already, how. */
static int lock_take(st_buffer_t *b, int64_t deadline, int timeout_ms, const char *what) {
  st__buffer_page_t *p = b->page;
  for (;;) {
    uint32_t seen = atomic_load(&p->lock_futex);
    uint64_t owner = 0;
    if (atomic_compare_exchange_strong(&p->lock, &owner, b->me)) {
      atomic_store(&p->lock_pid, (int32_t)b->pid);
      return ST_OK;
    }
    if (owner == b->me)
      return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': this connection holds the writer lock "
                  "already (%s)", b->name, what);
    if (!st__shm_wait(&p->lock_futex, &p->lock_waiters, seen, deadline))
      return fail(ST_ERR_TIMEOUT,
                  "buffer '%s': the writer lock is held by connection %llu (pid %d) for more "
                  "than %d ms",
                  b->name, (unsigned long long)owner, (int)atomic_load(&p->lock_pid),
                  timeout_ms);
  }
}

/* One more hold of a lock this handle holds already; 0 when it holds none. */
static int hold_again(st_buffer_t *b) {
  int h = atomic_load(&b->holds);
  while (h > 0)
    if (atomic_compare_exchange_weak(&b->holds, &h, h + 1)) return 1;
  return 0;
}

/* See client.h. Re-entrant per handle: the first acquire takes the lock,
 * later ones count; one thread of the handle takes it while the others
 * wait on the lock's futex, which the taker moves once it is done. Any
 * thread. */
ST_API int st_buffer_acquire(st_buffer_t *b, int timeout_ms) {
  int rc = writable(b, "take the writer lock");
  if (rc != ST_OK) return rc;
  st__buffer_page_t *p = b->page;
  int64_t deadline = deadline_of(timeout_ms);
  for (;;) {
    if (hold_again(b)) return ST_OK;
    uint32_t seen = atomic_load(&p->lock_futex);
    int idle = 0;
    if (atomic_compare_exchange_strong(&b->taking, &idle, 1)) {
      if (hold_again(b)) {
        rc = ST_OK;
      } else {
        rc = lock_take(b, deadline, timeout_ms,
                       "through another handle, or a write of this handle is under way");
        if (rc == ST_OK) atomic_store(&b->holds, 1);
      }
      atomic_store(&b->taking, 0);
      st__shm_notify(&p->lock_futex, &p->lock_waiters);
      return rc;
    }
    if (!st__shm_wait(&p->lock_futex, &p->lock_waiters, seen, deadline))
      return fail(ST_ERR_TIMEOUT, "buffer '%s': the writer lock was not taken within %d ms",
                  b->name, timeout_ms);
  }
}

/* See client.h. Balanced: the lock is freed by the release that matches
 * the first acquire. That last release holds `taking` while it drops the
 * count and frees the word, so that an acquire of another thread either
 * counts before it or takes the lock after it, never finds the word still
 * this connection's with no count to add to. A thread holds `taking` only
 * briefly while the count is above 0 (it finds the count and leaves), so
 * the wait for it is a yield. Any thread. */
ST_API int st_buffer_release(st_buffer_t *b) {
  int rc = writable(b, "release the writer lock");
  if (rc != ST_OK) return rc;
  for (;;) {
    int h = atomic_load(&b->holds);
    if (h <= 0)
      return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': this handle does not hold the writer "
                  "lock (release without a matching acquire)", b->name);
    if (h > 1) {
      if (atomic_compare_exchange_weak(&b->holds, &h, h - 1)) return ST_OK;
      continue;
    }
    int idle = 0;
    if (!atomic_compare_exchange_strong(&b->taking, &idle, 1)) {
      sched_yield();
      continue;
    }
    int freed = atomic_compare_exchange_strong(&b->holds, &h, 0);
    int unlocked = freed && st__buffer_unlock(b->page, b->me);
    atomic_store(&b->taking, 0);
    st__shm_notify(&b->page->lock_futex, &b->page->lock_waiters);
    if (!freed) continue;   /* another acquire counted meanwhile */
    if (!unlocked)
      return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': the writer lock was no longer this "
                  "connection's", b->name);
    return ST_OK;
  }
}

/* See client.h. Any thread. */
ST_API int st_buffer_held(const st_buffer_t *b) {
  return b ? atomic_load(&b->holds) : 0;
}

/* See client.h. Any thread. */
ST_API int st_buffer_locked(const st_buffer_t *b, uint64_t *owner, int *pid, int *mine) {
  uint64_t o = b ? atomic_load(&b->page->lock) : 0;
  if (owner) *owner = o;
  if (pid) *pid = o && b ? (int)atomic_load(&b->page->lock_pid) : 0;
  if (mine) *mine = o && b && o == b->me;
  return o != 0;
}

/* ------------------------------------------------------------ writes */

/* See client.h. Any thread. */
ST_API int st_buffer_write_begin(st_buffer_t *b, int timeout_ms, void **data) {
  int rc = writable(b, "be written");
  if (rc != ST_OK) return rc;
  int idle = 0;
  if (!atomic_compare_exchange_strong(&b->writing, &idle, 1))
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': a write is already begun on this handle",
                b->name);
  st__buffer_page_t *p = b->page;
  b->took_lock = 0;
  if (atomic_load(&p->lock) != b->me) {
    rc = lock_take(b, deadline_of(timeout_ms), timeout_ms, "a write is under way");
    if (rc != ST_OK) {
      atomic_store(&b->writing, 0);
      return rc;
    }
    b->took_lock = 1;
  }
  /* Only the lock's holder writes: write_sequence is ours to move. */
  uint64_t w = atomic_load(&p->write_sequence) + 1;
  uint32_t i = st__buffer_slot_of(w, b->slots);
  atomic_store_explicit(&p->slot[i].seq, 2 * w - 1, memory_order_relaxed);
  /* The odd word is visible before any byte of the frame changes. */
  atomic_thread_fence(memory_order_seq_cst);
  b->write_seq = w;
  if (data) *data = slot_data(b, i);
  return ST_OK;
}

static void end_lock(st_buffer_t *b) {
  if (b->took_lock) st__buffer_unlock(b->page, b->me);
  b->took_lock = 0;
  atomic_store(&b->writing, 0);
}

/* See client.h. Any thread. */
ST_API int st_buffer_write_end(st_buffer_t *b, uint64_t *seq) {
  if (!b || !atomic_load(&b->writing))
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': no write is begun on this handle",
                b ? b->name : "?");
  st__buffer_page_t *p = b->page;
  uint64_t w = b->write_seq;
  uint32_t i = st__buffer_slot_of(w, b->slots);
  int64_t t = realtime_ns();
  atomic_store_explicit(&p->slot[i].time_ns, t, memory_order_relaxed);
  /* Release: the frame's bytes are visible before the even word. */
  atomic_store_explicit(&p->slot[i].seq, 2 * w, memory_order_release);
  atomic_store_explicit(&p->write_time, t, memory_order_relaxed);
  atomic_store_explicit(&p->write_sequence, w, memory_order_release);
  atomic_fetch_add(&p->write_futex, 1);
  if (atomic_load(&p->write_waiters) || atomic_load(&p->readonly_handles))
    st__shm_futex_wake(&p->write_futex);
  end_lock(b);
  if (seq) *seq = w;
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_buffer_write_abort(st_buffer_t *b) {
  if (!b || !atomic_load(&b->writing))
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': no write is begun on this handle",
                b ? b->name : "?");
  end_lock(b);
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_buffer_write(st_buffer_t *b, const void *src, uint64_t bytes, int timeout_ms,
                           uint64_t *seq) {
  int rc = writable(b, "be written");
  if (rc != ST_OK) return rc;
  if (bytes != b->info.frame_bytes || !src)
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': a write is %llu bytes (one frame), not %llu",
                b->name, (unsigned long long)b->info.frame_bytes, (unsigned long long)bytes);
  void *slot;
  rc = st_buffer_write_begin(b, timeout_ms, &slot);
  if (rc != ST_OK) return rc;
  rc = copy_in(b, slot, src, bytes);
  if (rc != ST_OK) {
    st_buffer_write_abort(b);
    return rc;
  }
  return st_buffer_write_end(b, seq);
}

/* Zeroes one slot's frame (a device memset of a CUDA buffer, as a copy
 * of host zeros: `zeros` is frame_bytes of them, or NULL on the CPU). */
static int zero_slot(st_buffer_t *b, void *slot, const void *zeros) {
  if (b->info.device_index < 0) {
    memset(slot, 0, b->info.frame_bytes);
    return ST_OK;
  }
  return copy_in(b, slot, zeros, b->info.frame_bytes);
}

/* See client.h: one write of zeros, and every other slot zeroed under its
 * odd word so that no reader takes a half-zeroed frame. Any thread. */
ST_API int st_buffer_clear(st_buffer_t *b, int timeout_ms, uint64_t *seq) {
  int rc = writable(b, "be cleared");
  if (rc != ST_OK) return rc;
  void *zeros = NULL;
  if (b->info.device_index >= 0 && b->info.frame_bytes) {
    zeros = calloc(1, b->info.frame_bytes);
    if (!zeros)
      return fail(ST_ERR_OUT_OF_MEMORY, "buffer '%s': no host memory for %llu bytes of zeros",
                  b->name, (unsigned long long)b->info.frame_bytes);
  }
  void *slot;
  rc = st_buffer_write_begin(b, timeout_ms, &slot);
  if (rc != ST_OK) {
    free(zeros);
    return rc;
  }
  st__buffer_page_t *p = b->page;
  uint32_t mine = st__buffer_slot_of(b->write_seq, b->slots);
  rc = zero_slot(b, slot, zeros);
  for (uint32_t i = 0; i < b->slots && rc == ST_OK; i++) {
    if (i == mine) continue;
    /* Odd while it is zeroed: a reader of the write it holds retries. */
    uint64_t s = atomic_load_explicit(&p->slot[i].seq, memory_order_relaxed) & ~(uint64_t)1;
    atomic_store_explicit(&p->slot[i].seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    rc = zero_slot(b, slot_data(b, i), zeros);
    atomic_store_explicit(&p->slot[i].seq, s, memory_order_release);
  }
  free(zeros);
  if (rc != ST_OK) {
    st_buffer_write_abort(b);
    return rc;
  }
  return st_buffer_write_end(b, seq);
}

/* ------------------------------------------------------------- reads */

/* See client.h. Any thread. */
ST_API int st_buffer_read_begin(st_buffer_t *b, int timeout_ms, const void **data,
                                uint64_t *seq) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  st__buffer_page_t *p = b->page;
  int64_t deadline = -2;
  for (int spins = 0;; spins++) {
    uint64_t w = atomic_load_explicit(&p->write_sequence, memory_order_acquire);
    uint32_t i = st__buffer_slot_of(w, b->slots);
    if (atomic_load_explicit(&p->slot[i].seq, memory_order_acquire) == 2 * w) {
      if (data) *data = slot_data(b, i);
      if (seq) *seq = w;
      return ST_OK;
    }
    /* A write of that slot is under way (slots = 1), or a newer one
     * lapped it: look again. */
    if (spins < SPINS) continue;
    if (deadline == -2) deadline = deadline_of(timeout_ms);
    if (passed(deadline) || timeout_ms == 0)
      return fail(ST_ERR_TIMEOUT,
                  "buffer '%s': no complete write to read within %d ms (a writer keeps "
                  "rewriting the newest slot, or died in the middle of a write; more slots "
                  "help)",
                  b->name, timeout_ms);
    sched_yield();
  }
}

/* See client.h. Any thread. */
ST_API int st_buffer_read_check(st_buffer_t *b, uint64_t seq, int64_t *time_ns) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  st__buffer_page_t *p = b->page;
  uint32_t i = st__buffer_slot_of(seq, b->slots);
  /* The copy's loads complete before the word is read again. */
  atomic_thread_fence(memory_order_acquire);
  int64_t t = atomic_load_explicit(&p->slot[i].time_ns, memory_order_relaxed);
  if (atomic_load_explicit(&p->slot[i].seq, memory_order_relaxed) != 2 * seq)
    return fail(ST_ERR_STALE_HANDLE, "buffer '%s': write %llu was overwritten while it was read",
                b->name, (unsigned long long)seq);
  uint64_t last = atomic_load(&b->last_read);
  while (seq > last && !atomic_compare_exchange_weak(&b->last_read, &last, seq)) {
  }
  if (time_ns) *time_ns = seq ? t : 0;
  return ST_OK;
}

/* See client.h. Any thread. */
ST_API int st_buffer_read(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
                          uint64_t *seq, int64_t *time_ns) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  if (!dst || bytes < b->info.frame_bytes)
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': a read needs %llu bytes (one frame), not "
                "%llu", b->name, (unsigned long long)b->info.frame_bytes,
                (unsigned long long)bytes);
  int64_t deadline = deadline_of(timeout_ms);
  for (;;) {
    const void *slot;
    uint64_t w;
    int rc = st_buffer_read_begin(b, timeout_ms, &slot, &w);
    if (rc == ST_OK) rc = copy_out(b, dst, slot, b->info.frame_bytes);
    if (rc == ST_OK) rc = st_buffer_read_check(b, w, time_ns);
    if (rc == ST_OK && seq) *seq = w;
    if (rc != ST_ERR_STALE_HANDLE) return rc;
    if (passed(deadline))
      return fail(ST_ERR_TIMEOUT, "buffer '%s': every copy within %d ms was torn by a writer "
                  "(more slots help)", b->name, timeout_ms);
  }
}

/* See buffer.h. */
int64_t st__buffer_default_spin_ns(void) {
  static _Atomic int64_t cached = -1;
  int64_t ns = atomic_load(&cached);
  if (ns >= 0) return ns;
  const char *e = getenv("ST_CLIENT_SPIN_US");
  char *end;
  long us = e && *e ? strtol(e, &end, 10) : -1;
  if (us < 0 || (e && *e && *end) || us > 1000000) {
    cpu_set_t set;
    us = sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) >= 4 ? 50 : 0;
  }
  atomic_store(&cached, (int64_t)us * 1000);
  return (int64_t)us * 1000;
}

/* See client.h. Any thread. */
ST_API int st_buffer_set_spin(st_buffer_t *b, int spin_us) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  if (spin_us < -1 || spin_us > 1000000)
    return fail(ST_ERR_INVALID_ARGUMENT, "buffer '%s': spin %d us is not -1 or 0 to 1000000",
                b->name, spin_us);
  atomic_store(&b->spin_ns,
               spin_us < 0 ? st__buffer_default_spin_ns() : (int64_t)spin_us * 1000);
  return ST_OK;
}

/* Polls the page for a write after `last` for up to the handle's spin
 * time (and never past deadline): the newer sequence, or 0. */
static uint64_t spin_new(st_buffer_t *b, uint64_t last, int64_t deadline) {
  int64_t spin = atomic_load_explicit(&b->spin_ns, memory_order_relaxed);
  if (spin <= 0) return 0;
  int64_t until = st__now_mono_ns() + spin;
  if (deadline >= 0 && deadline < until) until = deadline;
  const _Atomic uint64_t *ws = &b->page->write_sequence;
  for (;;) {
    for (int i = 0; i < 64; i++) {
      uint64_t w = atomic_load_explicit(ws, memory_order_acquire);
      if (w > last) return w;
      st__cpu_relax();
    }
    if (st__now_mono_ns() >= until) return 0;
  }
}

/* See client.h. Any thread. */
ST_API int st_buffer_wait_new(st_buffer_t *b, int timeout_ms, uint64_t *seq) {
  if (!b) return fail(ST_ERR_INVALID_ARGUMENT, "no buffer");
  st__buffer_page_t *p = b->page;
  int64_t deadline = deadline_of(timeout_ms);
  /* A read-only handle cannot count itself: writers wake every waiter
   * while the server counts read-only handles in the page. */
  _Atomic uint32_t *waiters = b->info.readonly ? NULL : &p->write_waiters;
  uint64_t last = atomic_load(&b->last_read);
  for (int spun = 0;; spun = 1) {
    uint32_t seen = atomic_load(&p->write_futex);
    uint64_t w = atomic_load_explicit(&p->write_sequence, memory_order_acquire);
    if (w <= last && !spun) w = spin_new(b, last, deadline);
    if (w > last) {
      if (seq) *seq = w;
      return ST_OK;
    }
    if (!st__shm_wait(&p->write_futex, waiters, seen, deadline))
      return fail(ST_ERR_TIMEOUT, "buffer '%s': no write after %llu within %d ms", b->name,
                  (unsigned long long)last, timeout_ms);
  }
}

/* See client.h. Any thread. */
ST_API int st_buffer_read_new(st_buffer_t *b, void *dst, uint64_t bytes, int timeout_ms,
                              uint64_t *seq, int64_t *time_ns) {
  int rc = st_buffer_wait_new(b, timeout_ms, NULL);
  return rc == ST_OK ? st_buffer_read(b, dst, bytes, timeout_ms, seq, time_ns) : rc;
}

/* ----------------------------------------------------------- figures */

/* See client.h. Any thread. */
ST_API void *st_buffer_slot(const st_buffer_t *b, int slot) {
  if (!b || slot < 0 || (uint32_t)slot >= b->slots) return NULL;
  return slot_data(b, (uint32_t)slot);
}

/* See client.h. Any thread. */
ST_API uint64_t st_buffer_write_sequence(const st_buffer_t *b) {
  return b ? atomic_load(&b->page->write_sequence) : 0;
}

/* See client.h. Any thread. */
ST_API int64_t st_buffer_write_time(const st_buffer_t *b) {
  return b ? atomic_load(&b->page->write_time) : 0;
}

/* See client.h. Any thread. */
ST_API const char *st_buffer_error(const st_buffer_t *b) {
  (void)b;
  return st__client_handle_error();
}
