/* Named buffers and streams (docs/streams.md) through libstclient against
 * a real stserver, CPU memory, readers and writers in processes of their
 * own (the CUDA path is test_gpu_buffer.c):
 *   - create, open, write and read across processes; write_sequence and
 *     write_time;
 *   - a writer hammering checksummed frames while two readers verify every
 *     frame they read: no torn read, with 1 slot and with a ring of 4;
 *   - read_new wakes on the next write (read-write and read-only handles)
 *     and times out cleanly;
 *   - the writer lock of a SIGKILLed owner is freed by the server;
 *   - the writer lock is re-entrant per handle with balanced releases
 *     (threads of one handle share it, another handle neither shares
 *     nor frees it); clear zeroes every slot as one more write;
 *   - a read-only handle refuses writes, and a write through its mapping
 *     kills the writing process with SIGSEGV, not the server;
 *   - unlink while other connections hold mappings;
 *   - bad names, shapes, dtypes, sizes and parameters get clear errors;
 *   - limits and the memory budget refuse with messages naming their keys;
 *   - server descriptors, budget and arenas are back at the start after
 *     every buffer was closed and unlinked.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#include "buffer_kit.h"
#include "handoff_kit.h"
#include "wire.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

static const int64_t SHAPE[2] = {64, 64};   /* float32: 16 KiB frames */
#define FRAME (64u * 64u * 4u)

static int64_t now_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static st_buffer_t *make(const char *name, int slots) {
  st_buffer_t *b = NULL;
  if (stt_client_report(cli, name, st_buffer_create(cli, name, "cpu", ST_DTYPE_FLOAT32, 2, SHAPE,
                                                    slots, &b)) != ST_OK)
    return NULL;
  return b;
}

/* ------------------------------------------------------------ children */

typedef struct read_report {
  int rc;
  uint64_t seq;
  int64_t time_ns;
  int whole;
} read_report_t;

/* Opens `name` (read-only when arg), reads once and reports. */
static int child_read_once(const char *socket, const char *name, long arg, int out) {
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  read_report_t r = {-1000, 0, 0, 0};
  static uint8_t frame[FRAME];
  if (c && (r.rc = st_buffer_open(c, name, (int)arg, &b)) == ST_OK) {
    r.rc = st_buffer_read(b, frame, sizeof frame, 1000, &r.seq, &r.time_ns);
    r.whole = bk_whole(frame, FRAME, r.seq);
  }
  return bk_finish(out, &r, sizeof r, b, c);
}

TEST(create_open_write_read_across_processes) {
  st_buffer_t *b = make("cam", 1);
  CHECK(b != NULL);
  st_buffer_info_t in;
  CHECK_EQ_INT(st_buffer_info(b, &in), ST_OK);
  CHECK(in.frame_bytes == FRAME && in.slots == 1 && in.ndim == 2 && in.shape[1] == 64);
  CHECK(in.dtype == ST_DTYPE_FLOAT32 && in.device_index == -1 && !in.readonly);
  CHECK(st_buffer_write_sequence(b) == 0 && st_buffer_write_time(b) == 0);
  /* nothing written: the zero-filled frame, write 0 */
  static uint8_t frame[FRAME], zero[FRAME];
  uint64_t seq = 99;
  CHECK_EQ_INT(st_buffer_read(b, frame, sizeof frame, 0, &seq, NULL), ST_OK);
  CHECK(seq == 0 && memcmp(frame, zero, FRAME) == 0);
  bk_fill(frame, FRAME, 1);
  int64_t t0 = now_realtime_ns();
  CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, &seq), ST_OK);
  CHECK(seq == 1 && st_buffer_write_sequence(b) == 1);
  CHECK(st_buffer_write_time(b) >= t0 && st_buffer_write_time(b) <= now_realtime_ns());
  bk_child_t k;
  CHECK(bk_spawn(&k, srv.socket, "cam", 0, child_read_once) == 0);
  read_report_t r;
  CHECK(bk_report(&k, &r, sizeof r) == 0);
  CHECK_EQ_INT(bk_end(&k, 0), 0);
  CHECK_EQ_INT(r.rc, ST_OK);
  CHECK(r.seq == 1 && r.whole && r.time_ns == st_buffer_write_time(b));
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "cam"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* --------------------------------------------------------------- hammer */

#define HAMMER_WRITES 20000
/* The most a hammer's writer goes on past HAMMER_WRITES waiting for its
 * readers to have read two writes each. */
#define HAMMER_MAX_MS 20000.0

/* Shared by a hammer's writer and readers (an anonymous shared mapping
 * made before they fork): each reader's distinct writes seen so far, and
 * the writer's last sequence once it is done. On a loaded host a reader
 * may first run after the writer's last write; the writer goes on until
 * both readers have read two of its writes, so that every run checks
 * reads that overlap writes. */
typedef struct hammer_pace {
  _Atomic uint64_t distinct[2];
  _Atomic uint64_t last;         /* 0 while the writer writes */
} hammer_pace_t;

static hammer_pace_t *pace;

/* Writes checksummed frames 1, 2, ...: HAMMER_WRITES at least, then on
 * until both readers saw two distinct writes (HAMMER_MAX_MS at most);
 * publishes its last sequence in the pace page. 0 when every write
 * worked. */
static int child_writer(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  int bad = !c || st_buffer_open(c, name, 0, &b) != ST_OK;
  static uint8_t frame[FRAME];
  double end = stt_now_ms() + HAMMER_MAX_MS;
  uint64_t i = 0;
  while (!bad && (i < HAMMER_WRITES || ((atomic_load(&pace->distinct[0]) < 2 ||
                                         atomic_load(&pace->distinct[1]) < 2) &&
                                        stt_now_ms() < end))) {
    i++;
    bk_fill(frame, FRAME, i);
    uint64_t seq;
    bad = st_buffer_write(b, frame, FRAME, 5000, &seq) != ST_OK || seq != i;
    if (bad) fprintf(stderr, "writer: %s\n", st_buffer_error(b));
  }
  atomic_store(&pace->last, bad ? UINT64_MAX : i);
  bk_finish(out, &bad, sizeof bad, b, c);
  return bad;
}

typedef struct hammer_report {
  int rc;
  uint64_t reads, distinct, torn, backwards;
} hammer_report_t;

/* Reader `arg` (0 or 1): reads until it saw the writer's last write,
 * checking every frame it read. */
static int child_reader(const char *socket, const char *name, long arg, int out) {
  hammer_report_t r = {-1000, 0, 0, 0, 0};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  static uint8_t frame[FRAME];
  if (c && (r.rc = st_buffer_open(c, name, 0, &b)) == ST_OK &&
      (r.rc = st_buffer_wait_new(b, 10000, NULL)) == ST_OK) {   /* the writer started */
    uint64_t last = 0, end;
    while ((end = atomic_load(&pace->last)) == 0 || last < end) {
      if (end == UINT64_MAX) break;    /* the writer failed: it says so */
      uint64_t seq;
      r.rc = st_buffer_read(b, frame, FRAME, 10000, &seq, NULL);
      if (r.rc != ST_OK) {
        fprintf(stderr, "reader: %s\n", st_buffer_error(b));
        break;
      }
      r.reads++;
      if (!bk_whole(frame, FRAME, seq)) r.torn++;
      if (seq < last) r.backwards++;
      if (seq > last) atomic_store(&pace->distinct[arg], ++r.distinct);
      last = seq;
    }
  }
  return bk_finish(out, &r, sizeof r, b, c);
}

static void hammer(int slots, const char *name) {
  pace = mmap(NULL, sizeof *pace, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(pace != MAP_FAILED);
  memset(pace, 0, sizeof *pace);
  st_buffer_t *b = make(name, slots);
  CHECK(b != NULL);
  bk_child_t rd[2], wr;
  for (int i = 0; i < 2; i++) CHECK(bk_spawn(&rd[i], srv.socket, name, i, child_reader) == 0);
  CHECK(bk_spawn(&wr, srv.socket, name, 0, child_writer) == 0);
  int wbad = 1, wreport = bk_report(&wr, &wbad, sizeof wbad), wend = bk_end(&wr, 0);
  hammer_report_t r[2];
  int report[2], ended[2];
  for (int i = 0; i < 2; i++) {
    report[i] = bk_report(&rd[i], &r[i], sizeof r[i]);
    ended[i] = bk_end(&rd[i], 0);
  }
  /* Everything is ended and closed before the checks: a failed one
   * leaves nothing open for the tests after it. */
  uint64_t last = atomic_load(&pace->last), written = st_buffer_write_sequence(b);
  int closed = st_buffer_close(b), unlinked = st_buffer_unlink(cli, name);
  munmap(pace, sizeof *pace);
  CHECK(wreport == 0);
  CHECK_EQ_INT(wend, 0);
  CHECK_EQ_INT(wbad, 0);
  for (int i = 0; i < 2; i++) {
    CHECK(report[i] == 0);
    CHECK_EQ_INT(ended[i], 0);
    fprintf(stderr, "   slots %d reader %d: %llu reads, %llu distinct writes, %llu torn\n", slots,
            i, (unsigned long long)r[i].reads, (unsigned long long)r[i].distinct,
            (unsigned long long)r[i].torn);
    CHECK_EQ_INT(r[i].rc, ST_OK);
    CHECK(r[i].reads >= 2 && r[i].distinct >= 2);
    CHECK(r[i].torn == 0 && r[i].backwards == 0);
  }
  CHECK(last >= HAMMER_WRITES && written == last);
  CHECK_EQ_INT(closed, ST_OK);
  CHECK_EQ_INT(unlinked, ST_OK);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

TEST(no_torn_read_with_one_slot) { hammer(1, "ham1"); }
TEST(no_torn_read_with_a_ring_of_four) { hammer(4, "ham4"); }

/* ------------------------------------------------------------ read_new */

typedef struct wait_report {
  int rc, rc_timeout;
  uint64_t seq;
  double timeout_ms;
  char why[160];
} wait_report_t;

/* Opens (read-only when arg & 1; polling for a whole second before it
 * sleeps when arg & 2), says ready, waits for the next write, then waits
 * 150 ms for another that never comes. */
static int child_waiter(const char *socket, const char *name, long arg, int out) {
  wait_report_t r = {-1000, -1000, 0, 0, ""};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  static uint8_t frame[FRAME];
  int ready = c && st_buffer_open(c, name, (int)(arg & 1), &b) == ST_OK &&
              st_buffer_set_spin(b, arg & 2 ? 1000000 : 0) == ST_OK;
  bk_send(out, &ready, sizeof ready);
  if (ready) {
    r.rc = st_buffer_read_new(b, frame, FRAME, 10000, &r.seq, NULL);
    if (r.rc == ST_OK && !bk_whole(frame, FRAME, r.seq)) r.rc = 1;
    double t0 = stt_now_ms();
    r.rc_timeout = st_buffer_read_new(b, frame, FRAME, 150, NULL, NULL);
    r.timeout_ms = stt_now_ms() - t0;
    snprintf(r.why, sizeof r.why, "%s", st_buffer_error(b));
  }
  return bk_finish(out, &r, sizeof r, b, c);
}

TEST(read_new_wakes_on_the_next_write_and_times_out) {
  st_buffer_t *b = make("nw", 2);
  CHECK(b != NULL);
  static uint8_t frame[FRAME];
  bk_fill(frame, FRAME, 1);
  CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, NULL), ST_OK);   /* before they open */
  /* read-write and read-only handles, each sleeping on the futex and
   * polling (the write comes within its second of polling; the timeout
   * ends the poll at 150 ms) */
  for (int mode = 0; mode < 4; mode++) {
    bk_child_t k;
    CHECK(bk_spawn(&k, srv.socket, "nw", mode, child_waiter) == 0);
    int ready = 0;
    CHECK(bk_report(&k, &ready, sizeof ready) == 0 && ready);
    uint64_t seq;
    bk_fill(frame, FRAME, 2 + (uint64_t)mode);
    CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, &seq), ST_OK);
    wait_report_t r;
    CHECK(bk_report(&k, &r, sizeof r) == 0);
    CHECK_EQ_INT(bk_end(&k, 0), 0);
    CHECK_EQ_INT(r.rc, ST_OK);
    CHECK(r.seq == seq);
    CHECK_EQ_INT(r.rc_timeout, ST_ERR_TIMEOUT);
    CHECK(r.timeout_ms >= 140 && r.timeout_ms < (mode & 2 ? 900 : 5000));
    CHECK_CONTAINS(r.why, "no write after");
    CHECK_CONTAINS(r.why, "within 150 ms");
  }
  /* this handle read nothing since write 1... it read nothing at all:
   * read_new returns the newest at once */
  uint64_t seq;
  CHECK_EQ_INT(st_buffer_read_new(b, frame, FRAME, 0, &seq, NULL), ST_OK);
  CHECK(seq == 5 && bk_whole(frame, FRAME, 5));
  CHECK_ERR(st_buffer_set_spin(b, -2), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_buffer_error(b), "spin -2 us");
  CHECK_ERR(st_buffer_set_spin(b, 1000001), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_buffer_set_spin(b, -1), ST_OK);
  CHECK_ERR(st_buffer_read_new(b, frame, FRAME, 0, &seq, NULL), ST_ERR_TIMEOUT);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "nw"), ST_OK, cli);
}

/* ---------------------------------------------------------------- lock */

typedef struct lock_report {
  int rc;
  uint64_t conn;
  int pid;
} lock_report_t;

/* Takes the lock, reports, and waits to be killed. */
static int child_locker(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  lock_report_t r = {-1000, 0, (int)getpid()};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  if (c && (r.rc = st_buffer_open(c, name, 0, &b)) == ST_OK) {
    r.rc = st_buffer_acquire(b, 1000);
    st_buffer_info_t in;
    st_buffer_info(b, &in);
    r.conn = in.connection;
  }
  bk_send(out, &r, sizeof r);
  for (;;) pause();
  return 0;
}

TEST(the_lock_of_a_sigkilled_owner_is_freed) {
  st_buffer_t *b = make("lk", 1);
  CHECK(b != NULL);
  bk_child_t k;
  CHECK(bk_spawn(&k, srv.socket, "lk", 0, child_locker) == 0);
  lock_report_t r;
  CHECK(bk_report(&k, &r, sizeof r) == 0);
  CHECK_EQ_INT(r.rc, ST_OK);
  uint64_t owner;
  int pid, mine;
  CHECK_EQ_INT(st_buffer_locked(b, &owner, &pid, &mine), 1);
  CHECK(owner == r.conn && pid == r.pid && !mine);
  CHECK_ERR(st_buffer_acquire(b, 100), ST_ERR_TIMEOUT);
  CHECK_CONTAINS(st_buffer_error(b), "held by connection");
  static uint8_t frame[FRAME];
  bk_fill(frame, FRAME, 1);
  CHECK_ERR(st_buffer_write(b, frame, FRAME, 50, NULL), ST_ERR_TIMEOUT);
  CHECK(st_buffer_write_sequence(b) == 0);
  /* the owner dies holding it: the server frees it and wakes the waiter */
  double t0 = stt_now_ms();
  bk_end(&k, 1);
  CHECK_ERR_MSG(st_buffer_acquire(b, 5000), ST_OK, st_buffer_error(b));
  CHECK(stt_now_ms() - t0 < 5000);
  CHECK_EQ_INT(st_buffer_locked(b, &owner, &pid, &mine), 1);
  CHECK(mine && pid == (int)getpid());   /* the pid of the handle's opener */
  CHECK_EQ_INT(st_buffer_acquire(b, 0), ST_OK);   /* re-entrant: counts */
  CHECK_EQ_INT(st_buffer_held(b), 2);
  CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 0, NULL), ST_OK);   /* held: no wait */
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 1);   /* one acquire still open */
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_ERR(st_buffer_release(b), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_buffer_error(b), "does not hold the writer lock");
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "lk"), ST_OK, cli);
}

/* ------------------------------------------- re-entrant lock, clear */

static void *hold_and_release(void *arg) {
  st_buffer_t *b = arg;
  intptr_t bad = 0;
  for (int i = 0; i < 2000; i++) {
    if (st_buffer_acquire(b, 10000) != ST_OK) bad++;
    if (st_buffer_held(b) < 1) bad++;
    if (st_buffer_release(b) != ST_OK) bad++;
  }
  return (void *)bad;
}

TEST(the_lock_counts_per_handle_and_clear_zeroes_every_slot) {
  st_buffer_t *b = make("rc", 3), *o = NULL;
  CHECK(b != NULL);
  CHECK_RC(st_buffer_open(cli, "rc", 0, &o), ST_OK, cli);
  /* another handle of the same connection neither shares nor frees it */
  CHECK_EQ_INT(st_buffer_acquire(b, 0), ST_OK);
  CHECK_ERR(st_buffer_acquire(o, 0), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_buffer_error(o), "through another handle");
  CHECK_ERR(st_buffer_release(o), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 1);
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_EQ_INT(st_buffer_held(b), 0);
  /* threads of one handle share its hold: no acquire fails, none leaks */
  pthread_t th[4];
  for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, hold_and_release, b) == 0);
  for (int i = 0; i < 4; i++) {
    void *bad;
    pthread_join(th[i], &bad);
    CHECK_EQ_INT((int)(intptr_t)bad, 0);
  }
  CHECK_EQ_INT(st_buffer_held(b), 0);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);
  /* clear: one more write, of zeros, and no slot keeps an old frame */
  static uint8_t frame[FRAME], got[FRAME], zero[FRAME];
  for (int k = 1; k <= 4; k++) {
    bk_fill(frame, FRAME, k);
    CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, NULL), ST_OK);
  }
  uint64_t seq = 0;
  CHECK_EQ_INT(st_buffer_clear(b, 1000, &seq), ST_OK);
  CHECK(seq == 5 && st_buffer_write_sequence(o) == 5);
  CHECK_EQ_INT(st_buffer_read(o, got, FRAME, 1000, &seq, NULL), ST_OK);
  CHECK(seq == 5 && memcmp(got, zero, FRAME) == 0);
  for (int i = 0; i < 3; i++) CHECK(memcmp(st_buffer_slot(o, i), zero, FRAME) == 0);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);   /* its lock is gone */
  CHECK_RC(st_buffer_close(o), ST_OK, cli);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "rc"), ST_OK, cli);
}

/* ----------------------------------------------------------- read-only */

typedef struct ro_report {
  int write_rc, acquire_rc, read_rc, whole;
  char why[160];
} ro_report_t;

/* Opens read-only: the API refuses writes; then writes through the
 * mapping, which must kill this process with SIGSEGV. */
static int child_read_only(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  ro_report_t r = {-1000, -1000, -1000, 0, ""};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  static uint8_t frame[FRAME];
  if (!c || st_buffer_open(c, name, 1, &b) != ST_OK) return 2;
  r.write_rc = st_buffer_write(b, frame, FRAME, 0, NULL);
  if (r.write_rc == ST_ERR_INVALID_ARGUMENT) r.write_rc = st_buffer_clear(b, 0, NULL);
  snprintf(r.why, sizeof r.why, "%s", st_buffer_error(b));
  r.acquire_rc = st_buffer_acquire(b, 0);
  uint64_t seq;
  r.read_rc = st_buffer_read(b, frame, FRAME, 1000, &seq, NULL);
  r.whole = bk_whole(frame, FRAME, 1);
  bk_send(out, &r, sizeof r);
  volatile uint8_t *slot = st_buffer_slot(b, 0);
  slot[8] = 0x5a;   /* faults here */
  return 3;
}

TEST(a_read_only_handle_refuses_writes_and_faults_in_the_writer) {
  st_buffer_t *b = make("ro", 1);
  CHECK(b != NULL);
  static uint8_t frame[FRAME];
  bk_fill(frame, FRAME, 1);
  CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, NULL), ST_OK);
  bk_child_t k;
  CHECK(bk_spawn(&k, srv.socket, "ro", 0, child_read_only) == 0);
  ro_report_t r;
  CHECK(bk_report(&k, &r, sizeof r) == 0);
  int st = bk_end(&k, 0);
  CHECK_EQ_INT(r.write_rc, ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(r.why, "opened read-only");
  CHECK_EQ_INT(r.acquire_rc, ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(r.read_rc, ST_OK);
  CHECK(r.whole);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
  /* the server lives and the frame is untouched */
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
  CHECK_EQ_INT(st_buffer_read(b, frame, FRAME, 1000, NULL, NULL), ST_OK);
  CHECK(bk_whole(frame, FRAME, 1));
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "ro"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* -------------------------------------------------------------- unlink */

TEST(unlink_while_others_hold_mappings) {
  hk_figures_t with_o = baseline;
  with_o.fds++;   /* o's socket */
  OPEN_CLIENT(o, srv.socket);
  st_buffer_t *b = make("ul", 2), *x = NULL, *again = NULL;
  CHECK(b != NULL);
  CHECK_RC(st_buffer_open(o, "ul", 0, &x), ST_OK, o);
  static uint8_t frame[FRAME];
  bk_fill(frame, FRAME, 1);
  CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, NULL), ST_OK);
  int64_t used = hk_info(cli, "memory", "cpu", "used_bytes");
  CHECK_RC(st_buffer_unlink(o, "ul"), ST_OK, o);
  CHECK_RC(st_buffer_unlink(o, "ul"), ST_ERR_NOT_FOUND, o);
  CHECK_RC(st_buffer_open(o, "ul", 0, &again), ST_ERR_NOT_FOUND, o);
  CHECK_CONTAINS(st_client_error(o), "no buffer named 'ul'");
  /* both handles still share the memory */
  uint64_t seq;
  CHECK_EQ_INT(st_buffer_read(x, frame, FRAME, 1000, &seq, NULL), ST_OK);
  CHECK(seq == 1 && bk_whole(frame, FRAME, 1));
  bk_fill(frame, FRAME, 2);
  CHECK_EQ_INT(st_buffer_write(x, frame, FRAME, 1000, NULL), ST_OK);
  CHECK_EQ_INT(st_buffer_read(b, frame, FRAME, 1000, &seq, NULL), ST_OK);
  CHECK(seq == 2 && bk_whole(frame, FRAME, 2));
  CHECK(hk_info(cli, "memory", "cpu", "used_bytes") == used);
  /* the name is free for a new buffer */
  again = make("ul", 1);
  CHECK(again != NULL);
  CHECK(st_buffer_write_sequence(again) == 0);
  CHECK_RC(st_buffer_close(again), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "ul"), ST_OK, cli);
  /* the memory goes with the last handle */
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK(hk_info(cli, "memory", "cpu", "used_bytes") == used);
  CHECK_RC(st_buffer_close(x), ST_OK, o);
  CHECK(hk_back_to(cli, srv.pid, "cpu", with_o));
  st_client_close(o);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* -------------------------------------------------------- bad requests */

static const frame_case_t refused[] = {
    {"[0, 1, 'buffer_create', [{name: 'w', shape: 5, dtype: 'float32'}]]",
     ST_ERR_INVALID_ARGUMENT, "'shape' must be a list of at most 16 integers >= 1"},
    {"[0, 2, 'buffer_create', [{name: 'w', shape: [2, 'x'], dtype: 'float32'}]]",
     ST_ERR_INVALID_ARGUMENT, "'shape' element 1 is not an integer"},
    {"[0, 3, 'buffer_create', [{name: 'w', shape: [2]}]]", ST_ERR_INVALID_ARGUMENT,
     "'dtype' (a string) is required"},
    {"[0, 4, 'buffer_create', [{name: 'w', shape: [2], dtype: 'float32', device: 'tpu'}]]",
     ST_ERR_INVALID_ARGUMENT, "'device' must be cpu, cuda or cuda:N"},
    {"[0, 5, 'buffer_create', [{name: 'w', shape: [2], dtype: 'float32', device: 'cuda:7'}]]",
     ST_ERR_CAPABILITY, "no CUDA device"},
    {"[0, 6, 'buffer_create', [{name: 'w', shape: [2], dtype: 'float32', slots: -1}]]",
     ST_ERR_INVALID_ARGUMENT, "'slots'"},
    {"[0, 7, 'buffer_open', [{name: 'w', readonly: 'yes'}]]", ST_ERR_INVALID_ARGUMENT,
     "'readonly' must be true or false"},
    {"[0, 8, 'buffer_close', [{name: 'w', handle: 12345}]]", ST_ERR_NOT_FOUND,
     "no handle 12345 of a buffer named 'w'"},
    {"[0, 9, 'buffer_close', [{name: 'w'}]]", ST_ERR_INVALID_ARGUMENT, "'handle'"},
    {"[0, 10, 'buffer_unlink', [{}]]", ST_ERR_INVALID_ARGUMENT, "'name'"},
};

TEST(bad_names_shapes_dtypes_and_sizes_get_clear_errors) {
  st_buffer_t *b = NULL;
  int64_t shape[17] = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2};
  char longname[80];
  memset(longname, 'a', 65);
  longname[65] = 0;
  int64_t zero[2] = {4, 0}, neg[1] = {-3};
  /* Each refused with INVALID_ARGUMENT and the message part (NULL: not
   * checked). */
  const struct {
    const char *name;
    st_dtype_t dtype;
    int ndim;
    const int64_t *shape;
    int slots;
    const char *part;
  } invalid[] = {
      {"bad/name", ST_DTYPE_FLOAT32, 1, shape, 1,
       "a buffer name is 1 to 64 characters of A-Z a-z 0-9"},
      {longname, ST_DTYPE_FLOAT32, 1, shape, 1, "a buffer name is 1 to 64 bytes"},
      {"", ST_DTYPE_FLOAT32, 1, shape, 1, NULL},
      {"w", ST_DTYPE_FLOAT32, 17, shape, 1, "0 to 16 dimensions"},
      {"w", ST_DTYPE_FLOAT32, 2, zero, 1, "'shape' dimension 1 is 0; a buffer's dimensions are >= 1"},
      {"w", ST_DTYPE_FLOAT32, 1, neg, 1, NULL},
      {"w", ST_DTYPE_INVALID, 1, shape, 1, "'dtype' 'invalid' is not a dtype"},
      {"w", ST_DTYPE_FLOAT32, 1, shape, 0, NULL},
      {"w", ST_DTYPE_FLOAT32, 1, shape, 1025, "'slots' must be 1 to 1024"},
  };
  for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
    CHECK_RC(st_buffer_create(cli, invalid[i].name, "cpu", invalid[i].dtype, invalid[i].ndim,
                              invalid[i].shape, invalid[i].slots, &b),
             ST_ERR_INVALID_ARGUMENT, cli);
    if (invalid[i].part) CHECK_CONTAINS(st_client_error(cli), invalid[i].part);
  }
  int64_t huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
  CHECK_RC(st_buffer_create(cli, "w", "cpu", ST_DTYPE_FLOAT32, 2, huge, 1, &b), ST_ERR_LIMIT,
           cli);
  CHECK_CONTAINS(st_client_error(cli), "too large");
  CHECK_RC(st_buffer_open(cli, "nope", 0, &b), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "no buffer named 'nope'");
  CHECK_RC(st_buffer_unlink(cli, "nope"), ST_ERR_NOT_FOUND, cli);
  /* a name in use; sizes of reads and writes */
  b = make("w", 1);
  CHECK(b != NULL);
  st_buffer_t *dup = NULL;
  CHECK_RC(st_buffer_create(cli, "w", "cpu", ST_DTYPE_UINT8, 1, shape, 1, &dup),
           ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "a buffer named 'w' exists");
  static uint8_t frame[FRAME];
  CHECK_ERR(st_buffer_write(b, frame, FRAME - 4, 0, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_buffer_error(b), "a write is 16384 bytes (one frame), not 16380");
  CHECK_ERR(st_buffer_read(b, frame, 100, 0, NULL, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_ERR(st_buffer_write_end(b, NULL), ST_ERR_INVALID_ARGUMENT);
  void *slot;
  CHECK_EQ_INT(st_buffer_write_begin(b, 0, &slot), ST_OK);
  CHECK_ERR(st_buffer_write_begin(b, 0, &slot), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_buffer_write_abort(b), ST_OK);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);   /* the abort freed it */
  CHECK(st_buffer_slot(b, 1) == NULL && st_buffer_slot(b, 0) != NULL);
  OPEN_RC(c, srv.socket);
  CHECK_RPC_TABLE(&c, refused, sizeof refused / sizeof refused[0]);
  rc_close(&c);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "w"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* --------------------------------------------------------------- limits */

TEST(limits_and_the_budget_refuse_with_their_keys) {
  st_buffer_t *b[5] = {NULL};
  char name[16];
  for (int i = 0; i < 4; i++) {
    snprintf(name, sizeof name, "n%d", i);
    CHECK((b[i] = make(name, 1)) != NULL);
  }
  CHECK_RC(st_buffer_create(cli, "n4", "cpu", ST_DTYPE_FLOAT32, 2, SHAPE, 1, &b[4]), ST_ERR_LIMIT,
           cli);
  CHECK_CONTAINS(st_client_error(cli), "limits.max_buffers = 4");
  /* an unlinked buffer that a handle holds still counts */
  CHECK_RC(st_buffer_unlink(cli, "n0"), ST_OK, cli);
  CHECK_RC(st_buffer_create(cli, "n4", "cpu", ST_DTYPE_FLOAT32, 2, SHAPE, 1, &b[4]), ST_ERR_LIMIT,
           cli);
  CHECK_RC(st_buffer_close(b[0]), ST_OK, cli);
  /* handles of one connection: 3 buffers open here, 6 allowed */
  st_buffer_t *h[3] = {NULL};
  for (int i = 0; i < 3; i++) CHECK_RC(st_buffer_open(cli, "n1", i == 2, &h[i]), ST_OK, cli);
  CHECK_RC(st_buffer_open(cli, "n1", 0, &b[0]), ST_ERR_LIMIT, cli);
  CHECK_CONTAINS(st_client_error(cli), "limits.max_buffer_handles_per_connection = 6");
  for (int i = 0; i < 3; i++) CHECK_RC(st_buffer_close(h[i]), ST_OK, cli);
  for (int i = 1; i < 4; i++) {
    snprintf(name, sizeof name, "n%d", i);
    CHECK_RC(st_buffer_close(b[i]), ST_OK, cli);
    CHECK_RC(st_buffer_unlink(cli, name), ST_OK, cli);
  }
  /* bytes of one buffer */
  int64_t big[1] = {9 << 20};
  CHECK_RC(st_buffer_create(cli, "big", "cpu", ST_DTYPE_UINT8, 1, big, 1, &b[0]), ST_ERR_LIMIT,
           cli);
  CHECK_CONTAINS(st_client_error(cli), "pass limits.max_buffer_bytes = 8388608");
  /* the memory budget (24 MiB): two of 8 MiB fit, the third does not */
  int64_t eight[1] = {8 << 20};
  CHECK_RC(st_buffer_create(cli, "m0", "cpu", ST_DTYPE_UINT8, 1, eight, 1, &b[0]), ST_OK, cli);
  CHECK_RC(st_buffer_create(cli, "m1", "cpu", ST_DTYPE_UINT8, 1, eight, 1, &b[1]), ST_OK, cli);
  CHECK_RC(st_buffer_create(cli, "m2", "cpu", ST_DTYPE_UINT8, 1, eight, 1, &b[2]),
           ST_ERR_OUT_OF_MEMORY, cli);
  CHECK_CONTAINS(st_client_error(cli), "memory_budget.cpu");
  for (int i = 0; i < 2; i++) {
    snprintf(name, sizeof name, "m%d", i);
    CHECK_RC(st_buffer_close(b[i]), ST_OK, cli);
    CHECK_RC(st_buffer_unlink(cli, name), ST_OK, cli);
  }
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

int main(void) {
  cli = hk_start(&srv,
                 "memory_budget = { cpu = 24 * 1024 * 1024 }, limits = { max_buffers = 4, "
                 "max_buffer_bytes = 8 * 1024 * 1024, max_buffer_handles_per_connection = 6 },",
                 NULL, &baseline);
  RUN(create_open_write_read_across_processes);
  RUN(no_torn_read_with_one_slot);
  RUN(no_torn_read_with_a_ring_of_four);
  RUN(read_new_wakes_on_the_next_write_and_times_out);
  RUN(the_lock_of_a_sigkilled_owner_is_freed);
  RUN(the_lock_counts_per_handle_and_clear_zeroes_every_slot);
  RUN(a_read_only_handle_refuses_writes_and_faults_in_the_writer);
  RUN(unlink_while_others_hold_mappings);
  RUN(bad_names_shapes_dtypes_and_sizes_get_clear_errors);
  RUN(limits_and_the_budget_refuse_with_their_keys);
  return stt_client_finish(cli, &srv);
}
