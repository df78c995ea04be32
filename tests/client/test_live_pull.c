/* A live key followed across servers (docs/multihost.md, "Live
 * replication"): alpha's publisher updates a live key of two tensors as
 * fast as it can while beta, which pulled it live, brings every version
 * it can in place (UCX over TCP on lo, tests/peer/remote_kit.h):
 *   - the replica starts whole at the source's version number, and every
 *     read on beta that st_key_read_end calls consistent holds one
 *     version whole (each of its floats is that version's number), while
 *     the versions move; beta reaches the publisher's last version;
 *   - replicas() says who follows on alpha and what beta's key follows;
 *     a client's live put into the replica is refused while it follows;
 *   - a plain pull of a live key is refused, and a live pull of a key
 *     that is not live;
 *   - unsubscribe ends it: alpha lists no subscriber, beta keeps its last
 *     version while alpha's goes on;
 *   - a second replica, then alpha SIGKILLed: beta keeps its last whole
 *     version and says the source is lost;
 *   - the trainer's choice (peer.live_reads): with alpha's transfer helper
 *     stopped (SIGSTOP) while beta waits for a new version, the fenced
 *     default holds the publisher's next update until the helper goes on;
 *     "staged" copies the version first and drops the fence, so the
 *     update completes at once, and beta still gets every version whole. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "../peer/remote_kit.h"
#include "client_kit.h"

#define NA (256 * 1024)    /* floats of tensor a: 1 MiB */
#define NB (1024 * 1024)   /* floats of tensor b: 4 MiB */

static st_client_t *pubc;     /* alpha: the publisher's connection */
static st_key_t *pubk;
static atomic_int stop_updates;
static atomic_ullong last_version;

/* Fills every float of the key's tensors with `value`. */
static void fill(st_result_t *r, float value) {
  const char *names[2] = {"a", "b"};
  for (int i = 0; i < 2; i++) {
    const st_tensor_t *t = st_result_find(r, names[i]);
    float *p = t->data;
    for (int64_t k = 0; k < t->shape[0]; k++) p[k] = value;
  }
}

/* Puts live key `name` on alpha (every float 1, version 1) and opens its
 * publisher's handle: 1 when it worked. */
static int publish(const char *name) {
  char err[256];
  if (st_client_connect(ALPHA.socket, &pubc, err, sizeof err) != ST_OK) return 0;
  st_result_t *a = NULL, *b = NULL;
  int64_t na = NA, nb = NB;
  int ok = st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &na, &a, err, sizeof err) == ST_OK &&
           st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &nb, &b, err, sizeof err) == ST_OK;
  st_args_t *args = st_args_new();
  if (ok) {
    float *pa = st_result_tensor(a, 0)->data, *pb = st_result_tensor(b, 0)->data;
    for (int i = 0; i < NA; i++) pa[i] = 1.0f;
    for (int i = 0; i < NB; i++) pb[i] = 1.0f;
    ok = st_args_tensor(args, "a", st_result_tensor(a, 0), err, sizeof err) == ST_OK &&
         st_args_tensor(args, "b", st_result_tensor(b, 0), err, sizeof err) == ST_OK;
  }
  uint64_t v = 0;
  ok = ok && st_client_put(pubc, name, args, ST_KEY_PINNED, ST_PUT_LIVE, &v) == ST_OK && v == 1;
  ok = ok && st_key_open(pubc, name, 0, &pubk) == ST_OK && st_key_is_publisher(pubk);
  if (!ok) fprintf(stderr, "   publish %s: %s %s\n", name, err, st_client_error(pubc));
  st_args_free(args);
  st_result_free(a);
  st_result_free(b);
  return ok;
}

/* The publisher's thread: updates until stop_updates, each version's
 * floats its number. */
static void *updater(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_updates)) {
    if (st_key_begin_update(pubk) != ST_OK) break;
    uint64_t next = st_key_version(pubk) + 1;
    fill(st_key_result(pubk), (float)next);
    if (st_key_end_update(pubk, NULL) != ST_OK) break;
    atomic_store(&last_version, next);
  }
  return NULL;
}

/* Pulls alpha's `key` live into beta; the task's result (the caller
 * frees it), or NULL (said). */
static st_result_t *pull_live(st_client_t *c, const char *key, char *status, size_t len) {
  st_pull_opts_t o = {.live = 1};
  uint64_t id = 0;
  if (st_client_pull(c, key, "alpha", &o, &id) != ST_OK) {
    fprintf(stderr, "   pull %s: %s\n", key, st_client_error(c));
    return NULL;
  }
  rk_wait_end(c, id, status, len);
  st_result_t *r = NULL;
  if (st_client_task_result(c, id, &r) != ST_OK) return NULL;
  return r;
}

/* Publishes live key `name` on alpha and pulls it live into beta: beta's
 * handle of the replica (its client in *c, closed by the caller), or NULL
 * (said). */
static st_key_t *follow(const char *name, st_client_t **c) {
  *c = NULL;
  if (!publish(name) || !(*c = stt_client_open(BETA.socket))) return NULL;
  char status[32];
  st_result_free(pull_live(*c, name, status, sizeof status));
  st_key_t *k = NULL;
  if (strcmp(status, "completed") || st_key_open(*c, name, 0, &k) != ST_OK) {
    fprintf(stderr, "   following %s: %s (%s)\n", name, status, st_client_error(*c));
    return NULL;
  }
  return k;
}

/* A consistent read of k: 1 and *version when every float is the
 * version's number, 0 for a read st_key_read_end calls torn, -1 for a
 * consistent read of mixed floats (the failure this test is about). */
static int read_whole(st_key_t *k, uint64_t *version) {
  uint64_t seq;
  if (st_key_read_begin(k, 5000, &seq) != ST_OK) return 0;
  st_result_t *r = st_key_result(k);
  float want = (float)(seq / 2);
  int mixed = 0;
  const char *names[2] = {"a", "b"};
  for (int i = 0; i < 2 && !mixed; i++) {
    const st_tensor_t *t = st_result_find(r, names[i]);
    const float *p = t->data;
    for (int64_t j = 0; j < t->shape[0]; j++)
      if (p[j] != want) {
        mixed = 1;
        break;
      }
  }
  int consistent = 0;
  if (st_key_read_end(k, seq, NULL, &consistent) != ST_OK || !consistent) return 0;
  *version = seq / 2;
  return mixed ? -1 : 1;
}

static const st_value_t *path(const st_value_t *v, const char *a, const char *b) {
  v = st_value_get(v, a);
  return b ? st_value_get(v, b) : v;
}

/* The versions beta's replica of `key` did not publish because the
 * source's read of them was overwritten (replicas' source.torn). */
static int64_t replica_torn(st_client_t *c, const char *key) {
  st_result_t *rep = NULL;
  if (st_client_replicas(c, key, &rep) != ST_OK) return -1;
  const st_value_t *t = path(st_result_value(rep), "source", "torn");
  int64_t n = t && t->kind == ST_VALUE_INT ? t->as.integer : -1;
  st_result_free(rep);
  return n;
}

/* What the reads of a hammer found: whole reads (of versions
 * first..last), reads retried, reads mixing two versions. */
typedef struct tally {
  int whole, retried, mixed;
  uint64_t first, last;
} tally_t;

/* Reads beta's replica k for `ms` while alpha's publisher updates as fast
 * as it can; adds what the reads found to *t. */
static void hammer(st_key_t *k, int ms, tally_t *t) {
  pthread_t th;
  atomic_store(&stop_updates, 0);
  if (pthread_create(&th, NULL, updater, NULL) != 0) return;
  double end = stt_now_ms() + ms;
  while (stt_now_ms() < end) {
    uint64_t v = 0;
    int r = read_whole(k, &v);
    if (r == 1) {
      t->whole++;
      if (!t->first) t->first = v;
      t->last = v;
    } else if (r == 0) {
      t->retried++;
    } else {
      t->mixed++;
    }
  }
  atomic_store(&stop_updates, 1);
  pthread_join(th, NULL);
}

TEST(a_live_pull_follows_every_update_whole) {
  CHECK(publish("w/live"));
  OPEN_CLIENT(c, BETA.socket);
  char status[32];
  st_result_t *res = pull_live(c, "w/live", status, sizeof status);
  CHECK_STR_EQ(status, "completed");
  CHECK(res);
  if (!res) return;
  CHECK(path(st_result_value(res), "live", NULL)->as.boolean);
  CHECK_EQ_INT(path(st_result_value(res), "version", NULL)->as.integer, 1);
  st_result_free(res);
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(c, "w/live", 0, &k), ST_OK, c);
  if (!k) return;
  CHECK(!st_key_is_publisher(k));
  uint64_t v = 0;
  CHECK_EQ_INT(read_whole(k, &v), 1);
  CHECK_EQ_INT(v, 1);

  tally_t seen = {0};
  /* 3 s, and on a loaded host more (at most 20 s) until the replica's
   * versions moved while beta read. */
  for (int round = 0; round < 20 && (round < 3 || seen.last <= seen.first); round++)
    hammer(k, 1000, &seen);
  uint64_t final = atomic_load(&last_version);
  printf("   %llu updates on alpha; beta: %d whole reads (versions %llu..%llu), %d retried, "
         "%d mixed\n", (unsigned long long)final, seen.whole, (unsigned long long)seen.first,
         (unsigned long long)seen.last, seen.retried, seen.mixed);
  CHECK_EQ_INT(seen.mixed, 0);
  CHECK(seen.whole > 0);
  CHECK(final > 10);
  CHECK_EQ_INT(replica_torn(c, "w/live"), 0);   /* the fence kept every version whole */
  CHECK(seen.last > seen.first);   /* the versions moved on beta while it read */
  uint64_t got = 0;
  CHECK_EQ_INT(st_key_wait_version(k, final, 30000, &got), ST_OK);
  CHECK_EQ_INT(got, final);        /* the same numbers as alpha's */
  CHECK_EQ_INT(read_whole(k, &v), 1);
  CHECK_EQ_INT(v, final);

  /* Who follows what. */
  st_result_t *rep = NULL;
  CHECK_RC(st_client_replicas(c, "w/live", &rep), ST_OK, c);
  const st_value_t *src = path(st_result_value(rep), "source", NULL);
  CHECK(src && src->kind == ST_VALUE_MAP);
  if (src && src->kind == ST_VALUE_MAP) {
    CHECK_STR_EQ(st_value_get(src, "peer")->as.str.ptr, "alpha");
    CHECK_EQ_INT(st_value_get(src, "version")->as.integer, final);
    CHECK(!st_value_get(src, "lost")->as.boolean);
  }
  st_result_free(rep);
  CHECK_RC(st_client_replicas(pubc, "w/live", &rep), ST_OK, pubc);
  const st_value_t *subs = path(st_result_value(rep), "subscribers", NULL);
  CHECK(subs && subs->kind == ST_VALUE_ARRAY && subs->as.array.len == 1);
  if (subs && subs->as.array.len == 1)
    CHECK_STR_EQ(st_value_get(&subs->as.array.items[0], "peer")->as.str.ptr, "beta");
  st_result_free(rep);

  /* info counts both ends. */
  CHECK_EQ_INT(server_info_int(&ALPHA, "transfers.live_subscribers"), 1);
  CHECK_EQ_INT(server_info_int(&BETA, "transfers.live_replicas"), 1);
  /* Nobody here writes the replica while it follows. */
  st_args_t *a = st_args_new();
  st_result_t *t = NULL;
  int64_t na = NA;
  char err[256];
  CHECK(st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &na, &t, err, sizeof err) == ST_OK);
  CHECK(st_args_tensor(a, "a", st_result_tensor(t, 0), err, sizeof err) == ST_OK);
  uint64_t pv;
  CHECK_RC(st_client_put(c, "w/live", a, ST_KEY_PINNED, ST_PUT_LIVE, &pv),
           ST_ERR_INVALID_ARGUMENT, c);
  CHECK(strstr(st_client_error(c), "replica") != NULL);
  st_args_free(a);
  st_result_free(t);
  st_key_close(k);
  st_client_close(c);
}

static void *cont_later(void *arg) {
  stt_sleep_ms(1500);
  kill((pid_t)(intptr_t)arg, SIGCONT);
  return NULL;
}

/* One update by the publisher: its milliseconds. */
static double timed_update(float value) {
  double t0 = stt_now_ms();
  if (st_key_begin_update(pubk) != ST_OK) return -1;
  fill(st_key_result(pubk), value);
  if (st_key_end_update(pubk, NULL) != ST_OK) return -1;
  return stt_now_ms() - t0;
}

/* Alpha's helper stopped while beta waits for version 2 of a new live
 * key `name`: *ms is how long the publisher's update to version 3 took
 * (with `staged`, alpha made the copy before it; else a thread lets the
 * helper go on after 1.5 s; -1: it could not run). Then beta reaches
 * version 3 whole. */
static void update_with_helper_stopped(const char *name, int staged, double *ms) {
  *ms = -1;
  st_client_t *c;
  st_key_t *k = follow(name, &c);
  CHECK(k != NULL);
  pid_t helper = (pid_t)server_info_int(&ALPHA, "transfers.helper_pid");
  int64_t staged0 = server_info_int(&ALPHA, "transfers.lends_staged");
  CHECK(helper > 0 && kill(helper, SIGSTOP) == 0);
  CHECK(timed_update(2.0f) >= 0);
  /* Until alpha holds the fence for beta's transfer of version 2 (and,
   * staged, has made the copy and dropped it). */
  double end = stt_now_ms() + 10000;
  if (staged)
    while (server_info_int(&ALPHA, "transfers.lends_staged") <= staged0 && stt_now_ms() < end)
      stt_sleep_ms(10);
  else
    while (server_info_int(&ALPHA, "transfers.lends") < 1 && stt_now_ms() < end)
      stt_sleep_ms(10);
  stt_sleep_ms(100);
  pthread_t th;
  int later = !staged && pthread_create(&th, NULL, cont_later, (void *)(intptr_t)helper) == 0;
  *ms = timed_update(3.0f);
  if (later) pthread_join(th, NULL);
  else kill(helper, SIGCONT);
  uint64_t got = 0, v = 0;
  CHECK_EQ_INT(st_key_wait_version(k, 3, 30000, &got), ST_OK);
  CHECK_EQ_INT(got, 3);
  CHECK_EQ_INT(read_whole(k, &v), 1);
  CHECK_EQ_INT(v, 3);
  CHECK_EQ_INT(replica_torn(c, name), 0);
  st_key_close(k);
  st_client_close(c);
  st_key_close(pubk);
  st_client_close(pubc);
  pubk = NULL;
  pubc = NULL;
}

TEST(fenced_a_stalled_transfer_holds_the_publisher) {
  st_client_t *keep_c = pubc;   /* w/live's publisher, for the tests after */
  st_key_t *keep_k = pubk;
  double ms;
  update_with_helper_stopped("w/held", 0, &ms);
  pubc = keep_c;
  pubk = keep_k;
  printf("   fenced: the update waited %.0f ms for the stopped helper\n", ms);
  CHECK(ms >= 1000);
}

TEST(plain_and_live_pulls_of_the_wrong_kind_are_refused) {
  OPEN_CLIENT(c, BETA.socket);
  uint64_t id = 0;
  char status[32];
  CHECK_RC(st_client_pull(c, "w/live", "alpha", NULL, &id), ST_OK, c);
  rk_wait_end(c, id, status, sizeof status);
  CHECK_STR_EQ(status, "failed");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_task_result(c, id, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(c), "key 'w/live' is live (its bytes change in place)");
  CHECK(rk_put(ALPHA.socket, "w/plain", 3) == 1);
  st_result_t *res = pull_live(c, "w/plain", status, sizeof status);
  CHECK_STR_EQ(status, "failed");
  CHECK(res == NULL);
  CHECK_CONTAINS(st_client_error(c), "key 'w/plain' is not live: pull it without live");
  CHECK_EQ_INT(st_client_get(c, "w/plain", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  st_client_close(c);
}

TEST(unsubscribe_keeps_the_last_version) {
  OPEN_CLIENT(c, BETA.socket);
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(c, "w/live", 0, &k), ST_OK, c);
  if (!k) return;
  uint64_t at = 0;
  CHECK_RC(st_client_unsubscribe(c, "w/live", &at), ST_OK, c);
  CHECK_EQ_INT(at, st_key_version(k));
  CHECK_RC(st_client_unsubscribe(c, "w/live", NULL), ST_ERR_NOT_FOUND, c);
  /* alpha lets go of the subscriber; its updates no longer reach beta. */
  int none = 0;
  for (double end = stt_now_ms() + 5000; stt_now_ms() < end && !none; stt_sleep_ms(20)) {
    st_result_t *rep = NULL;
    if (st_client_replicas(pubc, "w/live", &rep) != ST_OK) break;
    none = path(st_result_value(rep), "subscribers", NULL)->as.array.len == 0;
    st_result_free(rep);
  }
  CHECK(none);
  CHECK_EQ_INT(server_info_int(&ALPHA, "transfers.live_subscribers"), 0);
  CHECK_EQ_INT(server_info_int(&BETA, "transfers.live_replicas"), 0);
  for (int i = 0; i < 5; i++) {
    CHECK_EQ_INT(st_key_begin_update(pubk), ST_OK);
    fill(st_key_result(pubk), (float)(st_key_version(pubk) + 1));
    CHECK_EQ_INT(st_key_end_update(pubk, NULL), ST_OK);
  }
  stt_sleep_ms(200);
  uint64_t v = 0;
  CHECK_EQ_INT(read_whole(k, &v), 1);
  CHECK_EQ_INT(v, at);
  st_key_close(k);
  st_client_close(c);
}

TEST(the_source_killed_leaves_the_last_version_and_says_lost) {
  OPEN_CLIENT(c, BETA.socket);
  st_pull_opts_t o = {.live = 1, .as = "w/live2"};
  uint64_t id = 0;
  char status[32];
  CHECK_RC(st_client_pull(c, "w/live", "alpha", &o, &id), ST_OK, c);
  rk_wait_end(c, id, status, sizeof status);
  CHECK_STR_EQ(status, "completed");
  st_key_t *k = NULL;
  CHECK_RC(st_key_open(c, "w/live2", 0, &k), ST_OK, c);
  if (!k) return;
  uint64_t at = st_key_version(pubk);
  CHECK_EQ_INT(st_key_wait_version(k, at, 10000, NULL), ST_OK);
  CHECK(kill(ALPHA.pid, SIGKILL) == 0);
  waitpid(ALPHA.pid, NULL, 0);
  ALPHA.pid = -1;
  int lost = 0;
  for (double end = stt_now_ms() + 15000; stt_now_ms() < end && !lost; stt_sleep_ms(50)) {
    st_result_t *rep = NULL;
    if (st_client_replicas(c, "w/live2", &rep) != ST_OK) break;
    const st_value_t *src = path(st_result_value(rep), "source", NULL);
    lost = src && src->kind == ST_VALUE_MAP && st_value_get(src, "lost")->as.boolean;
    st_result_free(rep);
  }
  CHECK(lost);
  uint64_t v = 0;
  CHECK_EQ_INT(read_whole(k, &v), 1);
  CHECK_EQ_INT(v, at);
  st_key_close(k);
  st_client_close(c);
}

/* Servers whose source reads without the fence (ST_LIVE_NO_FENCE, a
 * test's switch): the publisher overwrites versions while they are read,
 * and the check after each read catches it: those versions are not
 * published (counted torn) and no read on beta ever mixes two. */
TEST(without_the_fence_versions_are_overwritten_and_never_published) {
  setenv("ST_LIVE_NO_FENCE", "1", 1);
  int started = rk_start(512ull * RK_MIB) == 0;
  unsetenv("ST_LIVE_NO_FENCE");
  CHECK(started);
  if (!started) return;
  st_client_t *c;
  st_key_t *k = follow("w/bare", &c);
  CHECK(k != NULL);
  tally_t t = {0};
  int64_t torn = 0;
  /* Until a version was caught overwritten (a transfer on a loaded host
   * can take a while): at most 15 s. */
  for (int round = 0; round < 15 && torn <= 0; round++) {
    hammer(k, 1000, &t);
    torn = replica_torn(c, "w/bare");
  }
  printf("   without the fence: %lld versions overwritten while read; beta: %d whole reads "
         "(versions %llu..%llu), %d retried, %d mixed\n", (long long)torn, t.whole,
         (unsigned long long)t.first, (unsigned long long)t.last, t.retried, t.mixed);
  CHECK_EQ_INT(t.mixed, 0);
  CHECK(torn > 0);
  st_key_close(k);
  st_client_close(c);
}

/* peer.live_reads = "staged": the same stall, but the update completes at
 * once; then the hammer finds every read on beta whole. */
TEST(staged_the_publisher_goes_on_while_a_transfer_stalls) {
  int started = rk_start_with(512ull * RK_MIB, ", live_reads = 'staged'") == 0;
  CHECK(started);
  if (!started) return;
  double ms;
  update_with_helper_stopped("w/staged", 1, &ms);
  printf("   staged: the update took %.1f ms while the transfer stalled\n", ms);
  CHECK(ms >= 0 && ms < 1000);
  CHECK(server_info_int(&ALPHA, "transfers.lends_staged") >= 1);
  st_client_t *c;
  st_key_t *k = follow("w/staged2", &c);
  CHECK(k != NULL);
  tally_t t = {0};
  for (int round = 0; round < 15 && (round < 2 || t.last <= t.first); round++) hammer(k, 1000, &t);
  printf("   staged: beta %d whole reads (versions %llu..%llu), %d retried, %d mixed\n", t.whole,
         (unsigned long long)t.first, (unsigned long long)t.last, t.retried, t.mixed);
  CHECK_EQ_INT(t.mixed, 0);
  CHECK(t.last > t.first);
  CHECK_EQ_INT(replica_torn(c, "w/staged2"), 0);
  st_key_close(k);
  st_client_close(c);
}

int main(void) {
  rk_main_start();
  RUN(a_live_pull_follows_every_update_whole);
  RUN(plain_and_live_pulls_of_the_wrong_kind_are_refused);
  RUN(unsubscribe_keeps_the_last_version);
  RUN(fenced_a_stalled_transfer_holds_the_publisher);
  RUN(the_source_killed_leaves_the_last_version_and_says_lost);
  st_key_close(pubk);
  st_client_close(pubc);
  if (rk_stop_beta() != 0) return 1;
  RUN(without_the_fence_versions_are_overwritten_and_never_published);
  st_key_close(pubk);
  st_client_close(pubc);
  if (rk_stop() != 0) {
    fprintf(stderr, "a server did not exit cleanly\n");
    return 1;
  }
  RUN(staged_the_publisher_goes_on_while_a_transfer_stalls);
  return rk_main_end();
}
