/* Live keys (docs/views.md, section 3) through libstclient against a real
 * stserver, CPU memory, publishers and readers in processes of their own:
 *   - a put with ST_PUT_LIVE, updates in place seen by a reader in another
 *     process at the same address, wait_version waking on the next update
 *     and timing out cleanly;
 *   - a writer process hammering checksummed updates while two reader
 *     processes verify every read the seqlock calls consistent; and the
 *     same readers skipping the sequence check do see torn frames (the
 *     check is what the first part tests);
 *   - the publisher SIGKILLed between begin and end: the key is TORN (get,
 *     reads and waits fail with STALE_HANDLE, `keys` says torn), and a new
 *     live put of the uid recovers it in place;
 *   - a reader SIGKILLed in the middle of a read changes nothing;
 *   - readers' page and memory are read-only: the descriptors cannot be
 *     mapped writable, a write kills the writer (SIGSEGV), not the server,
 *     and their handles refuse updates;
 *   - a second connection's live put takes the key over; the first one's
 *     handle then refuses to update;
 *   - bad inputs give clear errors; delete wakes waiters with NOT_FOUND;
 *   - a Lua endpoint's st.key gives the live version;
 *   - the server's descriptors, budget and arenas are back at the start.
 */
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "buffer_kit.h"
#include "handoff_kit.h"
#include "live_kit.h"
#include "wire.h"

static stt_server_t srv;
static st_client_t *cli;
static hk_figures_t baseline;

#define N 65536                  /* float32 elements: 256 KiB per state */
#define BYTES ((uint64_t)N * 4)
#define HAMMER_UPDATES 2000

/* A new CPU float32 tensor of N elements from st_tensor_alloc, filled as
 * checksummed frame `seq`. */
static st_result_t *alloc_frame(uint64_t seq) {
  st_result_t *r = stt_tensor_alloc_1d("cpu", ST_DTYPE_FLOAT32, N);
  if (!r) return NULL;
  bk_fill(st_result_tensor(r, 0)->data, BYTES, seq);
  return r;
}

/* The key's tensor w (borrowed from k). */
static const st_tensor_t *w_of(st_key_t *k) { return st_result_find(st_key_result(k), "w"); }

/* Copies frame `seq` into the key as one update (st_key_update). */
static int update_to(st_key_t *k, uint64_t seq) { return lk_update(k, alloc_frame(seq)); }

/* The end of a test: closes k, frees a, deletes key, and the server's
 * figures are back at the start. */
static void finish(st_key_t *k, st_result_t *a, const char *key) {
  st_key_close(k);
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, key), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* One consistent read of w into buf: ST_OK with *seq, or an error. */
static int read_consistent(st_key_t *k, void *buf, uint64_t *version) {
  for (;;) {
    uint64_t s;
    int ok = 0, rc = st_key_read_begin(k, 5000, &s);
    if (rc != ST_OK) return rc;
    memcpy(buf, w_of(k)->data, BYTES);
    if ((rc = st_key_read_end(k, s, NULL, &ok)) != ST_OK) return rc;
    if (ok) {
      *version = s / 2;
      return ST_OK;
    }
  }
}

static int open_key(st_client_t *c, const char *key, int flags, st_key_t **k) {
  int rc = st_key_open(c, key, flags, k);
  if (rc != ST_OK) fprintf(stderr, "st_key_open '%s': %s\n", key, st_key_error(NULL));
  return rc;
}

/* The start of a test: key put live by cli from frame 1 (*a) and, when
 * k is not NULL, opened to publish. 1 when done. */
static int start_key(const char *key, st_result_t **a, st_key_t **k) {
  *a = alloc_frame(1);
  if (k) *k = NULL;
  return *a && lk_put_live(cli, key, st_result_tensor(*a, 0), ST_KEY_PINNED, NULL) == ST_OK &&
         (!k || open_key(cli, key, 0, k) == ST_OK);
}

/* A publisher in a child: its client, its allocation (frame 1, put live
 * under the key) and its handle. */
typedef struct pub {
  st_client_t *c;
  st_result_t *a;
  st_key_t *k;
} pub_t;

/* Fills p: ST_OK or the failure (p as far as made; pub_close frees it). */
static int publish(pub_t *p, const char *socket, const char *name) {
  p->c = stt_client_open(socket);
  p->a = alloc_frame(1);
  p->k = NULL;
  if (!p->c || !p->a) return -1000;
  int rc = lk_put_live(p->c, name, st_result_tensor(p->a, 0), ST_KEY_PINNED, NULL);
  return rc == ST_OK ? open_key(p->c, name, 0, &p->k) : rc;
}

static void pub_close(pub_t *p) {
  st_key_close(p->k);
  st_result_free(p->a);
  st_client_close(p->c);
}

/* A raw connection's get of key: 1 when it answered without an error. */
static int wire_get(rc_t *w, msg_t *m, const char *key) {
  return rc_open(w, srv.socket) == 0 && rc_rpcf(w, m, "[0, 1, 'get', [{key: '%s'}]]", key) == 1 &&
         msg_code(m) == 0;
}

/* ------------------------------------------------- updates and waits */

typedef struct wait_report {
  int rc, rc_timeout, whole, same_ptr;
  uint64_t got, version;
  double timeout_ms;
  char why[200];
} wait_report_t;

/* Opens the key, says ready, waits for version 2, reads it, then waits
 * 150 ms for a version 3 that never comes. */
static int child_waiter(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  wait_report_t r = {-1000, -1000, 0, 0, 0, 0, 0, ""};
  st_client_t *c = stt_client_open(socket);
  st_key_t *k = NULL;
  int ready = c && open_key(c, name, 0, &k) == ST_OK;
  void *before = ready ? w_of(k)->data : NULL;
  bk_send(out, &ready, sizeof ready);
  static uint8_t buf[BYTES];
  if (ready) {
    r.rc = st_key_wait_version(k, 2, 10000, &r.got);
    if (r.rc == ST_OK) r.rc = read_consistent(k, buf, &r.version);
    r.whole = bk_whole(buf, BYTES, 2);
    r.same_ptr = w_of(k)->data == before;
    double t0 = stt_now_ms();
    r.rc_timeout = st_key_wait_version(k, 3, 150, NULL);
    r.timeout_ms = stt_now_ms() - t0;
    snprintf(r.why, sizeof r.why, "%s", st_key_error(k));
  }
  bk_send(out, &r, sizeof r);
  st_key_close(k);
  st_client_close(c);
  return 0;
}

TEST(updates_in_place_are_seen_at_the_same_address_and_wake_waiters) {
  st_result_t *a = alloc_frame(1);
  CHECK(a != NULL);
  uint64_t v = 0;
  CHECK_RC(lk_put_live(cli, "lw", st_result_tensor(a, 0), ST_KEY_PINNED, &v), ST_OK, cli);
  CHECK_EQ_INT(v, 1);
  st_key_t *k = NULL;
  CHECK_EQ_INT(open_key(cli, "lw", 0, &k), ST_OK);
  CHECK(st_key_is_publisher(k));
  CHECK_EQ_INT(st_key_version(k), 1);
  bk_child_t w;
  CHECK(bk_spawn(&w, srv.socket, "lw", 0, child_waiter) == 0);
  int ready = 0;
  CHECK(bk_report(&w, &ready, sizeof ready) == 0 && ready);
  CHECK_EQ_INT(update_to(k, 2), ST_OK);
  CHECK_EQ_INT(st_key_version(k), 2);
  /* in place: the publisher's own allocation holds version 2 */
  CHECK(bk_whole(st_result_tensor(a, 0)->data, BYTES, 2));
  wait_report_t r;
  CHECK(bk_report(&w, &r, sizeof r) == 0);
  CHECK_EQ_INT(bk_end(&w, 0), 0);
  CHECK_EQ_INT(r.rc, ST_OK);
  CHECK_EQ_INT(r.got, 2);
  CHECK_EQ_INT(r.version, 2);
  CHECK(r.whole && r.same_ptr);
  CHECK_EQ_INT(r.rc_timeout, ST_ERR_TIMEOUT);
  CHECK_CONTAINS(r.why, "no version 3 within 150 ms");
  CHECK(r.timeout_ms >= 140 && r.timeout_ms < 5000);
  /* begin/end with writes of the publisher's own */
  CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
  bk_fill(w_of(k)->data, BYTES, 3);
  CHECK_EQ_INT(st_key_end_update(k, NULL), ST_OK);
  uint64_t got = 0;
  st_result_t *g = NULL;
  CHECK_RC(st_client_get(cli, "lw", 0, 0, &g, &got), ST_OK, cli);
  CHECK_EQ_INT(got, 3);
  CHECK(bk_whole(st_result_find(g, "w")->data, BYTES, 3));
  st_result_free(g);
  finish(k, a, "lw");
}

/* ------------------------------------------------------------ hammer */

typedef struct hammer_report {
  int rc;
  uint64_t reads, distinct, torn;
} hammer_report_t;

/* The writer starts hammering when a byte comes through here (the
 * readers are ready). */
static int go_pipe[2] = {-1, -1};

/* Publishes the key live over its own connection, says so, waits for the
 * go, then makes HAMMER_UPDATES checksummed updates in place (begin,
 * fill, end). */
static int child_writer(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  pub_t p;
  int rc = publish(&p, socket, name);
  st_key_t *k = p.k;
  bk_send(out, &rc, sizeof rc);
  char go;
  if (rc == ST_OK && read(go_pipe[0], &go, 1) != 1) rc = -1001;
  for (uint64_t s = 2; rc == ST_OK && s <= HAMMER_UPDATES; s++) {
    if ((rc = st_key_begin_update(k)) != ST_OK) break;
    bk_fill(w_of(k)->data, BYTES, s);
    rc = st_key_end_update(k, NULL);
    /* Pacing, not a wait for anything: readers start their checks while
     * the version is complete, and the next update lands inside them. */
    for (double t0 = stt_now_ms(); stt_now_ms() - t0 < 0.05;) {
    }
  }
  bk_send(out, &rc, sizeof rc);
  pub_close(&p);
  return 0;
}

/* Checks the key's frame in place until it saw the last update. arg 0:
 * between st_key_read_begin and st_key_read_end (the seqlock), and every
 * check the seqlock calls consistent must find the frame whole and of
 * that version; arg 1: no sequence check, counting the torn frames it
 * sees. */
static int child_reader(const char *socket, const char *name, long arg, int out) {
  hammer_report_t r = {-1000, 0, 0, 0};
  st_client_t *c = stt_client_open(socket);
  st_key_t *k = NULL;
  int ready = c && (r.rc = open_key(c, name, 0, &k)) == ST_OK;
  bk_send(out, &ready, sizeof ready);
  uint64_t last = 0;
  while (ready && last < HAMMER_UPDATES && r.rc == ST_OK) {
    const uint64_t *frame = w_of(k)->data;
    uint64_t seq = 0;
    int ok = 1;
    if (!arg && (r.rc = st_key_read_begin(k, 5000, &seq)) != ST_OK) break;
    uint64_t v = arg ? frame[0] : seq / 2;
    int whole = bk_whole(frame, BYTES, arg ? UINT64_MAX : v);
    if (!arg && (r.rc = st_key_read_end(k, seq, NULL, &ok)) != ST_OK) break;
    if (!ok) continue;   /* torn, and told so: read again */
    r.reads++;
    r.torn += !whole;
    r.distinct += v > last;
    if (v > last) last = v;
  }
  bk_send(out, &r, sizeof r);
  st_key_close(k);
  st_client_close(c);
  return 0;
}

/* A writer and two readers (arg for the readers: child_reader's). */
static void hammer(const char *name, long skip_check, hammer_report_t rep[2]) {
  bk_child_t wr = {0, -1}, rd[2] = {{0, -1}, {0, -1}};
  CHECK(pipe(go_pipe) == 0);
  CHECK(bk_spawn(&wr, srv.socket, name, 0, child_writer) == 0);
  int rc = -1;
  CHECK(bk_report(&wr, &rc, sizeof rc) == 0);
  CHECK_EQ_INT(rc, ST_OK);
  for (int i = 0; i < 2; i++) {
    int ready = 0;
    CHECK(bk_spawn(&rd[i], srv.socket, name, skip_check, child_reader) == 0);
    CHECK(bk_report(&rd[i], &ready, sizeof ready) == 0 && ready);
  }
  CHECK(write(go_pipe[1], "g", 1) == 1);
  close(go_pipe[0]);
  close(go_pipe[1]);
  CHECK(bk_report(&wr, &rc, sizeof rc) == 0);
  CHECK_EQ_INT(bk_end(&wr, 0), 0);
  CHECK_EQ_INT(rc, ST_OK);
  for (int i = 0; i < 2; i++) {
    CHECK(bk_report(&rd[i], &rep[i], sizeof rep[i]) == 0);
    CHECK_EQ_INT(bk_end(&rd[i], 0), 0);
    fprintf(stderr, "   reader %d (%s): %llu reads, %llu versions, %llu torn\n", i,
            skip_check ? "no check" : "seqlock", (unsigned long long)rep[i].reads,
            (unsigned long long)rep[i].distinct, (unsigned long long)rep[i].torn);
    CHECK_EQ_INT(rep[i].rc, ST_OK);
  }
  CHECK_RC(st_client_delete(cli, name), ST_OK, cli);
}

TEST(no_reader_uses_a_torn_version) {
  hammer_report_t r[2];
  hammer("hammer", 0, r);
  for (int i = 0; i < 2; i++) CHECK(r[i].reads >= 2 && r[i].distinct >= 2 && r[i].torn == 0);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

TEST(readers_that_skip_the_sequence_check_see_torn_frames) {
  /* What the test above would see without the seqlock: the same hammer,
   * read without st_key_read_begin/end, tears (tried a few times: each
   * run is a race). */
  uint64_t torn = 0;
  for (int attempt = 0; attempt < 5 && torn == 0; attempt++) {
    hammer_report_t r[2];
    hammer("unchecked", 1, r);
    torn += r[0].torn + r[1].torn;
  }
  CHECK(torn > 0);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* --------------------------------------------------- torn and recovered */

/* Publishes the key live, begins an update, half writes it, says so and
 * waits to be killed. */
static int child_dies_mid_update(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  pub_t p;
  int rc = publish(&p, socket, name);
  if (rc == ST_OK && (rc = st_key_begin_update(p.k)) == ST_OK)
    memset(w_of(p.k)->data, 0xab, BYTES / 2);
  bk_send(out, &rc, sizeof rc);
  for (;;) pause();
  return 0;
}

/* The state `keys` lists for key, in buf. */
static const char *state_of(const char *key, char *buf, size_t n) {
  st_result_t *r = NULL;
  snprintf(buf, n, "?");
  if (st_client_keys(cli, key, &r) != ST_OK) return buf;
  const st_value_t *l = st_result_value(r);
  for (size_t i = 0; l && l->kind == ST_VALUE_ARRAY && i < l->as.array.len; i++) {
    const st_value_t *s = st_value_get(&l->as.array.items[i], "state");
    if (s && s->kind == ST_VALUE_STRING) snprintf(buf, n, "%s", s->as.str.ptr);
  }
  st_result_free(r);
  return buf;
}

TEST(a_publisher_killed_mid_update_leaves_the_key_torn_until_a_new_put) {
  bk_child_t p;
  CHECK(bk_spawn(&p, srv.socket, "torn", 0, child_dies_mid_update) == 0);
  int rc = -1;
  CHECK(bk_report(&p, &rc, sizeof rc) == 0);
  CHECK_EQ_INT(rc, ST_OK);
  st_key_t *reader = NULL;
  CHECK_EQ_INT(open_key(cli, "torn", 0, &reader), ST_OK);
  CHECK(!st_key_is_publisher(reader));
  uint64_t seq = 0;
  CHECK_EQ_INT(st_key_read_begin(reader, 50, &seq), ST_ERR_TIMEOUT);   /* it updates */
  bk_end(&p, 1);
  /* the server notices the connection close: poll with a deadline */
  CHECK_EQ_INT(lk_get_until_refused(cli, "torn"), ST_ERR_STALE_HANDLE);
  CHECK_CONTAINS(st_client_error(cli), "is torn");
  char state[32];
  CHECK(strcmp(state_of("torn", state, sizeof state), "torn") == 0);
  CHECK_EQ_INT(st_key_read_begin(reader, 1000, &seq), ST_ERR_STALE_HANDLE);
  CHECK_EQ_INT(st_key_wait_version(reader, 2, 1000, NULL), ST_ERR_STALE_HANDLE);
  CHECK_CONTAINS(st_key_error(reader), "left in the middle of an update");
  /* a new live put of the same uid: takes the key over, copies in place */
  st_result_t *b = alloc_frame(7);
  CHECK(b != NULL);
  uint64_t v = 0;
  CHECK_RC(lk_put_live(cli, "torn", st_result_tensor(b, 0), ST_KEY_PINNED, &v), ST_OK, cli);
  CHECK_EQ_INT(v, 2);
  CHECK(strcmp(state_of("torn", state, sizeof state), "live") == 0);
  static uint8_t buf[BYTES];
  uint64_t got = 0;
  CHECK_EQ_INT(read_consistent(reader, buf, &got), ST_OK);
  CHECK_EQ_INT(got, 2);
  CHECK(bk_whole(buf, BYTES, 7));
  st_result_t *g = NULL;
  CHECK_RC(st_client_get(cli, "torn", 0, 0, &g, &got), ST_OK, cli);
  CHECK(bk_whole(st_result_find(g, "w")->data, BYTES, 7));
  st_result_free(g);
  finish(reader, b, "torn");
}

/* Opens the key, begins a read, says so and waits to be killed. */
static int child_dies_mid_read(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  int rc = -1000;
  st_client_t *c = stt_client_open(socket);
  st_key_t *k = NULL;
  uint64_t seq;
  if (c && (rc = open_key(c, name, 0, &k)) == ST_OK) rc = st_key_read_begin(k, 1000, &seq);
  bk_send(out, &rc, sizeof rc);
  for (;;) pause();
  return 0;
}

TEST(a_reader_killed_mid_read_changes_nothing) {
  st_result_t *a;
  st_key_t *k;
  CHECK(start_key("rk", &a, &k));
  bk_child_t r;
  CHECK(bk_spawn(&r, srv.socket, "rk", 0, child_dies_mid_read) == 0);
  int rc = -1;
  CHECK(bk_report(&r, &rc, sizeof rc) == 0);
  CHECK_EQ_INT(rc, ST_OK);
  bk_end(&r, 1);
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
  CHECK_EQ_INT(update_to(k, 2), ST_OK);
  char state[32];
  CHECK(strcmp(state_of("rk", state, sizeof state), "live") == 0);
  static uint8_t buf[BYTES];
  uint64_t got = 0;
  CHECK_EQ_INT(read_consistent(k, buf, &got), ST_OK);
  CHECK(got == 2 && bk_whole(buf, BYTES, 2));
  finish(k, a, "rk");
}

/* ------------------------------------------------------------ read-only */

/* A reader: an update is refused, then a write into the key's memory. */
static int child_writes(const char *socket, const char *name, long arg, int out) {
  (void)arg;
  st_client_t *c = stt_client_open(socket);
  st_key_t *k = NULL;
  struct rlimit none = {0, 0};   /* dies of SIGSEGV: no core */
  setrlimit(RLIMIT_CORE, &none);
  int rc = c ? open_key(c, name, 0, &k) : -1000;
  if (rc == ST_OK) rc = st_key_begin_update(k);
  bk_send(out, &rc, sizeof rc);
  if (k) ((volatile float *)w_of(k)->data)[3] = 1.0f;
  return 0;
}

TEST(readers_map_the_key_and_its_page_read_only) {
  st_result_t *a;
  CHECK(start_key("ro", &a, NULL));
  /* the wire: another connection's get is read-only, with the page last */
  rc_t w;
  msg_t m;
  CHECK(wire_get(&w, &m, "ro"));
  CHECK_EQ_INT(obj_int(obj_get(m.result, "readonly")), 1);
  const msgpack_object *live = obj_get(m.result, "live");
  CHECK(live != NULL);
  CHECK_EQ_INT(obj_int(obj_get(live, "page")), 1);
  CHECK_EQ_INT(obj_int(obj_get(live, "publisher")), 0);
  CHECK_EQ_INT(w.nfds, 2);
  struct stat st_page;   /* the page cannot be reopened read-write by another uid */
  CHECK(fstat(w.fds[1], &st_page) == 0 && (st_page.st_mode & 0777) == 0400);
  for (int i = 0; i < 2; i++) {
    errno = 0;
    CHECK(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, w.fds[i], 0) == MAP_FAILED);
    CHECK_EQ_INT(errno, EACCES);
  }
  msg_free(&m);
  rc_close(&w);
  /* a reader's handle refuses to update, and its write kills it alone */
  bk_child_t k;
  CHECK(bk_spawn(&k, srv.socket, "ro", 0, child_writes) == 0);
  int rc = 0;
  CHECK(bk_report(&k, &rc, sizeof rc) == 0);
  int st = bk_end(&k, 0);
  CHECK_EQ_INT(rc, ST_ERR_INVALID_ARGUMENT);
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
  CHECK(bk_whole(st_result_tensor(a, 0)->data, BYTES, 1));
  st_result_free(a);
  CHECK_RC(st_client_delete(cli, "ro"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* ------------------------------------------------- take-over and errors */

TEST(a_second_connection_takes_the_key_over) {
  st_result_t *a = alloc_frame(1), *b = alloc_frame(5);
  CHECK(a && b);
  CHECK_RC(lk_put_live(cli, "to", st_result_tensor(a, 0), ST_KEY_PINNED, NULL), ST_OK, cli);
  st_key_t *k = NULL;
  CHECK_EQ_INT(open_key(cli, "to", 0, &k), ST_OK);
  st_client_t *c2 = stt_client_open(srv.socket);
  CHECK(c2 != NULL);
  uint64_t v = 0;
  CHECK_RC(lk_put_live(c2, "to", st_result_tensor(b, 0), ST_KEY_PINNED, &v), ST_OK, c2);
  CHECK_EQ_INT(v, 2);
  /* in place: the first publisher's allocation holds the new value */
  CHECK(bk_whole(st_result_tensor(a, 0)->data, BYTES, 5));
  CHECK_EQ_INT(st_key_begin_update(k), ST_ERR_STALE_HANDLE);
  CHECK_CONTAINS(st_key_error(k), "took it over");
  st_key_close(k);
  /* the first connection now maps it read-only, like any reader */
  CHECK_EQ_INT(open_key(cli, "to", 0, &k), ST_OK);
  CHECK(!st_key_is_publisher(k));
  st_key_close(k);
  /* a take-over with another shape changes nothing */
  st_result_t *small = NULL;
  char err[200];
  int64_t n = 16;
  CHECK(st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &small, err, sizeof err) == ST_OK);
  CHECK_RC(lk_put_live(cli, "to", st_result_tensor(small, 0), ST_KEY_PINNED, NULL),
           ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "tensor 'w' is float32 of 1 dims (first 65536)");
  CHECK(bk_whole(st_result_tensor(a, 0)->data, BYTES, 5));
  st_result_free(small);
  st_client_close(c2);
  st_result_free(a);
  st_result_free(b);
  CHECK_RC(st_client_delete(cli, "to"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

TEST(bad_inputs_give_clear_errors_and_delete_wakes_waiters) {
  st_result_t *a = alloc_frame(1);
  CHECK(a != NULL);
  CHECK_RC(lk_put_live(cli, "ev", st_result_tensor(a, 0), ST_KEY_EVICTABLE, NULL),
           ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "a live key is pinned");
  CHECK_RC(lk_put_live(cli, "e", st_result_tensor(a, 0), ST_KEY_PINNED, NULL), ST_OK, cli);
  /* not live over live, live over not live */
  st_args_t *p = st_args_new();
  char err[200];
  CHECK(st_args_tensor(p, "w", st_result_tensor(a, 0), err, sizeof err) == ST_OK);
  CHECK_RC(st_client_put(cli, "e", p, ST_KEY_PINNED, 0, NULL), ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "key 'e' is live");
  CHECK_RC(st_client_put(cli, "plain", p, ST_KEY_PINNED, 0, NULL), ST_OK, cli);
  CHECK_RC(st_client_put(cli, "plain", p, ST_KEY_PINNED, ST_PUT_LIVE, NULL),
           ST_ERR_INVALID_ARGUMENT, cli);
  CHECK_CONTAINS(st_client_error(cli), "key 'plain' is not live");
  st_args_free(p);
  st_key_t *k = NULL;
  CHECK_EQ_INT(st_key_open(cli, "plain", 0, &k), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_key_error(NULL), "is not live");
  CHECK_RC(st_client_delete(cli, "plain"), ST_OK, cli);
  /* versions: only the current one */
  st_result_t *g = NULL;
  CHECK_RC(st_client_get(cli, "e", 5, 0, &g, NULL), ST_ERR_NOT_FOUND, cli);
  CHECK_CONTAINS(st_client_error(cli), "has only its current version 1");
  /* updates by name, shape and dtype; nothing written on a mismatch */
  CHECK_EQ_INT(open_key(cli, "e", 0, &k), ST_OK);
  st_result_t *src = alloc_frame(9);
  st_tensor_t t = *st_result_tensor(src, 0);
  const st_tensor_t *list[1] = {&t};
  t.name = "nope";
  CHECK_EQ_INT(st_key_update(k, list, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_key_error(k), "has no tensor named 'nope'");
  t.name = "w";
  t.dtype = ST_DTYPE_INT32;
  CHECK_EQ_INT(st_key_update(k, list, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_key_error(k), "the update gives int32");
  CHECK_EQ_INT(st_key_version(k), 1);
  CHECK(bk_whole(w_of(k)->data, BYTES, 1));
  CHECK_EQ_INT(st_key_end_update(k, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_key_begin_update(k), ST_OK);
  CHECK_EQ_INT(st_key_begin_update(k), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_key_end_update(k, NULL), ST_OK);
  CHECK_EQ_INT(st_key_version(k), 2);
  /* delete: waiters learn that no version follows */
  CHECK_RC(st_client_delete(cli, "e"), ST_OK, cli);
  CHECK_EQ_INT(st_key_wait_version(k, 3, 1000, NULL), ST_ERR_NOT_FOUND);
  CHECK_CONTAINS(st_key_error(k), "was deleted");
  st_key_close(k);
  st_result_free(src);
  st_result_free(a);
  CHECK(hk_back_to(cli, srv.pid, "cpu", baseline));
}

/* st.key of a live key: its version and the first word of w. */
static const stt_endpoint_t endpoints[] = {
    {"livever.lua",
     "return st.endpoint{ name = \"livever\", params = { key = st.required },\n"
     "  build = function(a) return { version = select(2, assert(st.key(a.key))) } end }\n"},
    {NULL, NULL}};

TEST(an_endpoint_reads_a_live_key_and_its_version) {
  st_result_t *a;
  st_key_t *k;
  CHECK(start_key("lua", &a, &k));
  CHECK_EQ_INT(update_to(k, 2), ST_OK);
  CHECK_EQ_INT(update_to(k, 3), ST_OK);
  st_args_t *p = st_args_new();
  st_args_string(p, "key", "lua");
  st_result_t *r = NULL;
  CHECK_RC(st_client_call(cli, "livever", p, &r), ST_OK, cli);
  const st_value_t *v = st_value_get(st_result_value(r), "version");
  CHECK(v && v->kind == ST_VALUE_INT && v->as.integer == 3);
  st_result_free(r);
  st_args_free(p);
  finish(k, a, "lua");
}

int main(void) {
  cli = hk_start(&srv, "memory_budget = { cpu = 64 * 1024 * 1024 },", endpoints, &baseline);
  RUN(updates_in_place_are_seen_at_the_same_address_and_wake_waiters);
  RUN(no_reader_uses_a_torn_version);
  RUN(readers_that_skip_the_sequence_check_see_torn_frames);
  RUN(a_publisher_killed_mid_update_leaves_the_key_torn_until_a_new_put);
  RUN(a_reader_killed_mid_read_changes_nothing);
  RUN(readers_map_the_key_and_its_page_read_only);
  RUN(a_second_connection_takes_the_key_over);
  RUN(bad_inputs_give_clear_errors_and_delete_wakes_waiters);
  RUN(an_endpoint_reads_a_live_key_and_its_version);
  return stt_client_finish(cli, &srv);
}
