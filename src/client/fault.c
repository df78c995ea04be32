/* src/client: a clear message when this process faults on read-only memory
 * the library mapped (docs/client.md, "A write to read-only memory").
 *
 * A key got read-only, a live key bound by a process that is not its
 * publisher, a result called read-only and a buffer opened read-only are
 * mapped PROT_READ: a write there is a SIGSEGV, and without this file the
 * process dies with no word (rc 139). Here the library keeps a table of
 * those mappings, and a SIGSEGV / SIGBUS handler that, when the faulting
 * address lies in one, writes one line to stderr naming what it is (key
 * and version, live key, endpoint, buffer, or the arena) and what to do,
 * then hands the signal on exactly as it would have gone without us:
 *
 *   - to the handler installed before ours (sa_sigaction or sa_handler:
 *     Python's faulthandler, a program's own), which decides;
 *   - or, when that was SIG_DFL (or SIG_IGN, which the kernel does not
 *     honour for a fault), SIG_DFL is restored and the signal raised
 *     again: the process dies of the same signal, with a core where the
 *     system writes one, as before.
 *
 * Any other fault (an address outside the table, a SIGSEGV that is not an
 * access error) gets no message and is handed on the same way.
 *
 * The handler is installed once, when the library first maps read-only
 * memory (a process that never does keeps its handlers untouched), and not
 * at all when the environment has ST_NO_FAULT_HANDLER set to anything but
 * "" or "0" at that moment: then nothing is recorded either. A handler a
 * program installs after that replaces ours (its choice; ours chains to
 * whatever was there when it was installed).
 *
 * The table is bounded (ST__FAULT_SLOTS mappings); a mapping that does not
 * fit is not described, and its fault reads as before. Entries are written
 * under a mutex by normal code and read by the handler with no lock: each
 * has a sequence word (odd while it is written), and the handler takes a
 * copy only when the word is even and unchanged around the read. The
 * handler calls only async-signal-safe functions (write, sigaction, raise)
 * and formats its line in a stack buffer.
 *
 * Threads: any; the handler runs on the faulting thread (on its alternate
 * signal stack when it has one: SA_ONSTACK).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/client_internal.h"

#define TEXT_MAX 176

typedef struct fault_range {
  _Atomic uintptr_t start, end;   /* [start, end); both 0: a free slot */
  _Atomic unsigned seq;           /* odd while the entry is written    */
  _Atomic int kind;               /* st__fault_kind_t                  */
} fault_range_t;

static fault_range_t ranges[ST__FAULT_SLOTS];
static char texts[ST__FAULT_SLOTS][TEXT_MAX];
static _Atomic int used;           /* slots below this may be taken     */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static _Atomic int enabled;
static struct sigaction old_segv, old_bus;

/* ------------------------------------------------------------ the handler */

typedef struct line {
  char buf[640];
  size_t n;
} line_t;

static void put_str(line_t *l, const char *s) {
  while (*s && l->n < sizeof l->buf - 1) l->buf[l->n++] = *s++;
}

static void put_hex(line_t *l, uintptr_t v) {
  char tmp[2 * sizeof v + 1];
  size_t i = sizeof tmp;
  tmp[--i] = '\0';
  do {
    tmp[--i] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  put_str(l, "0x");
  put_str(l, tmp + i);
}

/* What to do, by kind: the second half of the line. */
static const char *advice(int kind) {
  switch (kind) {
  case ST__FAULT_KEY:
    return "the key is mapped read-only here (got read-only, or put read-only by another "
           "connection); write to a private copy (get_into, .clone()) or get it writable";
  case ST__FAULT_LIVE_KEY:
    return "a live key is mapped read-only on every connection but its publisher's (bind, "
           "live handles); it changes only through the publisher's update: train a private "
           "copy (get_into, .clone()) and publish it with update";
  case ST__FAULT_RESULT:
    return "the result of a call asked read-only (call_readonly, ST_CALL_READONLY) or of an "
           "endpoint declared readonly is mapped read-only; write to a private copy (.clone())";
  case ST__FAULT_BUFFER:
    return "the handle is open read-only; open the buffer writable to write it, or read into "
           "a copy (read(out=...))";
  default:
    return "the server's arena is mapped read-only here; write to a private copy";
  }
}

/* Copies entry i's kind and text into *kind and text (TEXT_MAX) when it
 * still holds `addr` and was not being written; 0 when it could not. */
static int read_entry(size_t i, uintptr_t addr, int *kind, char *text) {
  fault_range_t *r = &ranges[i];
  for (int tries = 0; tries < 8; tries++) {
    unsigned s1 = atomic_load_explicit(&r->seq, memory_order_acquire);
    if (s1 & 1) continue;
    uintptr_t a = atomic_load_explicit(&r->start, memory_order_relaxed),
              b = atomic_load_explicit(&r->end, memory_order_relaxed);
    int k = atomic_load_explicit(&r->kind, memory_order_relaxed);
    for (size_t j = 0; j < TEXT_MAX; j++) text[j] = ((volatile char *)texts[i])[j];
    text[TEXT_MAX - 1] = '\0';
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&r->seq, memory_order_relaxed) != s1) continue;
    if (addr < a || addr >= b) return 0;
    *kind = k;
    return 1;
  }
  return 0;
}

/* Writes the line for a fault at `addr` when it lies in a mapping of the
 * table. Async-signal-safe. */
static void describe(int sig, uintptr_t addr, const struct sigaction *old) {
  int n = atomic_load_explicit(&used, memory_order_acquire);
  for (int i = 0; i < n; i++) {
    uintptr_t a = atomic_load_explicit(&ranges[i].start, memory_order_relaxed),
              b = atomic_load_explicit(&ranges[i].end, memory_order_relaxed);
    if (!a || addr < a || addr >= b) continue;
    int kind = ST__FAULT_ARENA;
    char text[TEXT_MAX];
    if (!read_entry((size_t)i, addr, &kind, text)) continue;
    line_t l = {.n = 0};
    if (sig == SIGSEGV) {
      put_str(&l, "sharedtensor: write to read-only memory of ");
      put_str(&l, text);
      put_str(&l, " at ");
      put_hex(&l, addr);
      put_str(&l, ": ");
      put_str(&l, advice(kind));
      put_str(&l, ".");
    } else {
      put_str(&l, "sharedtensor: SIGBUS at ");
      put_hex(&l, addr);
      put_str(&l, " in the read-only mapping of ");
      put_str(&l, text);
      put_str(&l, ": the memory behind it could not be read.");
    }
    int dfl = !(old->sa_flags & SA_SIGINFO) &&
              (old->sa_handler == SIG_DFL || old->sa_handler == SIG_IGN);
    put_str(&l, dfl ? (sig == SIGSEGV ? " Re-raising SIGSEGV.\n" : " Re-raising SIGBUS.\n")
                    : " Passing the signal to the previous handler.\n");
    const char *p = l.buf;
    size_t left = l.n;
    while (left > 0) {
      ssize_t w = write(STDERR_FILENO, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      p += w;
      left -= (size_t)w;
    }
    return;
  }
}

/* Hands the signal to `old` as the kernel would have. */
static void chain(int sig, siginfo_t *si, void *ctx, const struct sigaction *old) {
  if (old->sa_flags & SA_SIGINFO) {
    if (old->sa_sigaction) {
      old->sa_sigaction(sig, si, ctx);
      return;
    }
  } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN) {
    old->sa_handler(sig);
    return;
  }
  /* Sent by kill() to a process that ignored it: ignored still. */
  if (!(old->sa_flags & SA_SIGINFO) && old->sa_handler == SIG_IGN && si && si->si_code <= 0)
    return;
  /* The default action: the signal is blocked while this handler runs,
   * so the raise is delivered, to SIG_DFL, as it returns (and a fault
   * that returns faults again there). */
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  raise(sig);
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
  int saved = errno;
  const struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;
  /* A write to a PROT_READ page is SEGV_ACCERR; SIGBUS has its own
   * codes. A signal sent by kill() (si_code <= 0) has no address. */
  if (si && si->si_code > 0 && (sig != SIGSEGV || si->si_code == SEGV_ACCERR))
    describe(sig, (uintptr_t)si->si_addr, old);
  errno = saved;
  chain(sig, si, ctx, old);
  errno = saved;
}

/* ------------------------------------------------------------- the table */

static int opted_out(void) {
  const char *e = getenv("ST_NO_FAULT_HANDLER");
  return e && *e && strcmp(e, "0") != 0;
}

/* A fork while another thread writes an entry: the child has no such
 * thread, so its lock starts unlocked and an entry left half-written is
 * closed (its text may be torn; the handler only prints it). Not taken
 * around fork: map.c's lock, held around fork, is taken before this one. */
static void fork_child(void) {
  pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
  memcpy(&table_lock, &fresh, sizeof fresh);
  for (int i = 0; i < ST__FAULT_SLOTS; i++)
    if (atomic_load_explicit(&ranges[i].seq, memory_order_relaxed) & 1)
      atomic_fetch_add_explicit(&ranges[i].seq, 1, memory_order_relaxed);
}

static void install(void) {
  if (opted_out()) return;
  pthread_atfork(NULL, NULL, fork_child);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sigemptyset(&sa.sa_mask);
  /* SA_ONSTACK: a thread with an alternate signal stack (a stack overflow
   * handler's) runs it there; without one the flag does nothing. */
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  if (sigaction(SIGSEGV, &sa, &old_segv) != 0) return;
  if (sigaction(SIGBUS, &sa, &old_bus) != 0) {
    sigaction(SIGSEGV, &old_segv, NULL);
    return;
  }
  atomic_store(&enabled, 1);
}

static void set_text(size_t i, int kind, const char *what) {
  snprintf(texts[i], TEXT_MAX, "%s", what);
  atomic_store_explicit(&ranges[i].kind, kind, memory_order_relaxed);
}

/* See client_internal.h. Any thread. */
int st__client_fault_add(const void *start, size_t len, int kind, const char *what) {
  if (!start || !len) return 0;
  pthread_once(&install_once, install);
  if (!atomic_load(&enabled)) return 0;
  int slot = 0;
  pthread_mutex_lock(&table_lock);
  int n = atomic_load_explicit(&used, memory_order_relaxed);
  for (int i = 0; i < ST__FAULT_SLOTS; i++) {
    if (i < n && atomic_load_explicit(&ranges[i].end, memory_order_relaxed)) continue;
    fault_range_t *r = &ranges[i];
    atomic_fetch_add_explicit(&r->seq, 1, memory_order_acq_rel);   /* odd */
    atomic_thread_fence(memory_order_release);
    set_text((size_t)i, kind, what);
    atomic_store_explicit(&r->end, (uintptr_t)start + len, memory_order_relaxed);
    atomic_store_explicit(&r->start, (uintptr_t)start, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->seq, 1, memory_order_release);   /* even */
    if (i >= n) atomic_store_explicit(&used, i + 1, memory_order_release);
    slot = i + 1;
    break;
  }
  pthread_mutex_unlock(&table_lock);
  return slot;
}

/* See client_internal.h. Any thread. */
void st__client_fault_describe(int slot, int kind, const char *what) {
  if (slot <= 0 || slot > ST__FAULT_SLOTS) return;
  fault_range_t *r = &ranges[slot - 1];
  pthread_mutex_lock(&table_lock);
  atomic_fetch_add_explicit(&r->seq, 1, memory_order_acq_rel);
  atomic_thread_fence(memory_order_release);
  set_text((size_t)(slot - 1), kind, what);
  atomic_fetch_add_explicit(&r->seq, 1, memory_order_release);
  pthread_mutex_unlock(&table_lock);
}

/* See client_internal.h. Any thread. */
void st__client_fault_remove(int slot) {
  if (slot <= 0 || slot > ST__FAULT_SLOTS) return;
  fault_range_t *r = &ranges[slot - 1];
  pthread_mutex_lock(&table_lock);
  atomic_fetch_add_explicit(&r->seq, 1, memory_order_acq_rel);
  atomic_store_explicit(&r->start, 0, memory_order_relaxed);
  atomic_store_explicit(&r->end, 0, memory_order_relaxed);
  atomic_fetch_add_explicit(&r->seq, 1, memory_order_release);
  pthread_mutex_unlock(&table_lock);
}
