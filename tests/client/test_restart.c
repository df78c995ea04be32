/* Published state across a crash and restarts of the server under a
 * service manager (docs/lifecycle.md, "Restarts"): this test plays
 * systemd's part (tests/kit/svcmgr.h: a notify socket taking FDSTORE=1
 * messages and their descriptors, a re-launch with LISTEN_FDS and
 * LISTEN_FDNAMES). Through libstclient, across processes:
 *   - a multi-tensor key with three versions, two live keys (one left in
 *     the middle of an update), a buffer with three frames whose writer
 *     lock is held, a buffer unlinked, and a stream of puts from another
 *     process during which the server is SIGKILLed;
 *   - after the restart every acknowledged put is there with its bytes
 *     equal, a version past the last acknowledged one is whole or absent,
 *     the live key cut mid-update is TORN, the other has its version; the
 *     buffer has its frames, its lock is free, and a write after the
 *     restart is seen through the creator's old mapping; the unlinked
 *     buffer is gone;
 *   - the memory is the same (no copy): a reader's old mapping reads on,
 *     the publisher's write into its own allocation after the restart is
 *     what a new reader gets, the server maps the very memfd inode the
 *     publisher allocated, and info (and `stcli info`) says what was
 *     restored;
 *   - a clean restart keeps the state (the next generation), a delete
 *     before it lets the key's descriptors leave the store;
 *   - under churn (thousands of puts whose old versions go) the journal
 *     is rewritten and stays small, and what it says after is restored;
 *   - a descriptor in the store that is not what the journal says (a
 *     memfd shorter than recorded, one not sealed against shrinking) is
 *     refused with a log line naming the key, and the rest is served;
 *   - a journal whose bytes were changed is refused with a log line, and
 *     nothing of it is served.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_kit.h"
#include "proc.h"
#include "svcmgr.h"

static stt_server_t S;
static stt_svcmgr_t M;

#define N 256                 /* floats per tensor of the stream          */
#define MODEL_N 4096          /* floats of the model's weight             */
#define STREAM_ACKS 40        /* acknowledged puts before the SIGKILL     */

static const char CONFIG[] =
    "keys = { max_versions = 1000, max_keys = 64 },\n"
    "memory_budget = { cpu = 256 * 1024 * 1024 },\n";

/* What the publisher keeps across the crash. */
static st_result_t *model_w[3], *model_b[3];
static st_client_t *pub;           /* the publisher (its server dies)   */
static st_key_t *live_cut, *live_ok;
static st_buffer_t *frames;
static st_result_t *reader_v3;      /* a reader's mapping of model v3    */
static uint64_t acked[4096];
static int nacked;

/* Whether every float of tensor t is `value`. */
static int all_equal(const st_tensor_t *t, float value) {
  if (!t || t->dtype != ST_DTYPE_FLOAT32) return 0;
  const float *p = t->data;
  for (int64_t i = 0; i < t->numel; i++)
    if (p[i] != value) return 0;
  return 1;
}

/* Puts {weight: w, bias: b} (b may be NULL) under key; the version or 0. */
static uint64_t put2(st_client_t *c, const char *key, st_result_t *w, st_result_t *b,
                     int flags) {
  st_args_t *a = st_args_new();
  char err[256];
  uint64_t v = 0;
  int rc = st_args_tensor(a, "weight", st_result_tensor(w, 0), err, sizeof err);
  if (rc == ST_OK && b) rc = st_args_tensor(a, "bias", st_result_tensor(b, 0), err, sizeof err);
  if (rc == ST_OK) rc = stt_client_report(c, key, st_client_put(c, key, a, ST_KEY_PINNED, flags, &v));
  else fprintf(stderr, "args: %s\n", err);
  st_args_free(a);
  return rc == ST_OK ? v : 0;
}

/* SIGKILLs the server and waits for it. */
static void kill_server(void) {
  kill(S.pid, SIGKILL);
  int status;
  waitpid(S.pid, &status, 0);
  S.pid = -1;
}

/* Starts the server as the manager would, with what its store holds. */
static int start_managed(void) {
  stt_svcmgr_attach(&M, &S);
  return stt_server_start(&S);
}

/* The stream: puts "stream" versions 1, 2, ... (each a new allocation of
 * N floats equal to its number) until the server goes, writing each
 * acknowledged version to fd `out`. Runs in a process of its own. */
static void stream_puts(int out) {
  st_client_t *c = stt_client_open(S.socket);
  if (!c) _exit(2);
  for (uint64_t i = 1;; i++) {
    st_result_t *t = stt_tensor_filled(N, (float)i);
    if (!t) _exit(3);
    uint64_t v = 0;
    st_args_t *a = st_args_new();
    int rc = st_args_tensor(a, "x", st_result_tensor(t, 0), NULL, 0);
    if (rc == ST_OK) rc = st_client_put(c, "stream", a, ST_KEY_PINNED, 0, &v);
    st_args_free(a);
    st_result_free(t);
    if (rc != ST_OK) break;
    if (v != i) _exit(4);
    if (write(out, &v, sizeof v) != (ssize_t)sizeof v) _exit(5);
  }
  st_client_close(c);
  _exit(0);
}

TEST(publish_then_crash_during_puts) {
  st_client_t *p = pub = stt_client_open(S.socket);
  CHECK(p);
  if (!p) return;
  CHECK_EQ_INT(stt_info_int(p, "restart", "kept", NULL), 1);
  CHECK_EQ_INT(stt_info_int(p, "restart", "generation", NULL), 1);
  for (int i = 0; i < 3; i++) {
    model_w[i] = stt_tensor_filled(MODEL_N, 10.0f + (float)i);
    model_b[i] = stt_tensor_filled(16, 20.0f + (float)i);
    CHECK(model_w[i] && model_b[i]);
    if (!model_w[i] || !model_b[i]) return;
    CHECK_EQ_INT(put2(p, "model", model_w[i], model_b[i], 0), i + 1);
  }
  /* Two live keys: one left in the middle of an update, one at version 3. */
  st_result_t *l1 = stt_tensor_filled(64, 1.0f), *l2 = stt_tensor_filled(64, 1.0f);
  CHECK_EQ_INT(put2(p, "live/cut", l1, NULL, ST_PUT_LIVE), 1);
  CHECK_EQ_INT(put2(p, "live/ok", l2, NULL, ST_PUT_LIVE), 1);
  st_result_free(l1);
  st_result_free(l2);
  CHECK_EQ_INT(st_key_open(p, "live/cut", 0, &live_cut), ST_OK);
  CHECK_EQ_INT(st_key_open(p, "live/ok", 0, &live_ok), ST_OK);
  if (!live_cut || !live_ok) return;
  for (int v = 2; v <= 3; v++) {
    st_result_t *u = stt_tensor_filled(64, (float)v);
    st_tensor_t t = *st_result_tensor(u, 0);
    t.name = "weight";
    const st_tensor_t *ts[1] = {&t};
    CHECK_EQ_INT(st_key_update(live_ok, ts, 1), ST_OK);
    st_result_free(u);
  }
  CHECK_EQ_INT(st_key_version(live_ok), 3);
  CHECK_EQ_INT(st_key_begin_update(live_cut), ST_OK);
  float *cut = (float *)st_result_tensor(st_key_result(live_cut), 0)->data;
  cut[0] = 99.0f;   /* half written when the server dies */

  /* A buffer of three frames whose writer lock is held at the crash, and
   * one unlinked. */
  int64_t shape[1] = {64};
  CHECK_EQ_INT(st_buffer_create(p, "frames", "cpu", ST_DTYPE_FLOAT32, 1, shape, 4, &frames),
               ST_OK);
  if (!frames) return;
  for (int i = 1; i <= 3; i++) {
    float f[64];
    for (int k = 0; k < 64; k++) f[k] = (float)(100 * i + k);
    CHECK_EQ_INT(st_buffer_write(frames, f, sizeof f, 1000, NULL), ST_OK);
  }
  CHECK_EQ_INT(st_buffer_acquire(frames, 1000), ST_OK);
  st_buffer_t *gone = NULL;
  CHECK_EQ_INT(st_buffer_create(p, "gone", "cpu", ST_DTYPE_FLOAT32, 1, shape, 1, &gone), ST_OK);
  CHECK_EQ_INT(st_buffer_close(gone), ST_OK);
  CHECK_EQ_INT(st_buffer_unlink(p, "gone"), ST_OK);

  OPEN_CLIENT(r, S.socket);
  if (!r) return;
  CHECK_EQ_INT(st_client_get(r, "model", 3, 0, &reader_v3, NULL), ST_OK);
  st_client_close(r);

  int pipefd[2];
  CHECK(pipe(pipefd) == 0);
  pid_t child = fork();
  if (child == 0) {
    close(pipefd[0]);
    stream_puts(pipefd[1]);
  }
  close(pipefd[1]);
  uint64_t v;
  while (nacked < STREAM_ACKS && read(pipefd[0], &v, sizeof v) == (ssize_t)sizeof v)
    acked[nacked++] = v;
  kill_server();
  while (nacked < (int)(sizeof acked / sizeof *acked) &&
         read(pipefd[0], &v, sizeof v) == (ssize_t)sizeof v)
    acked[nacked++] = v;
  close(pipefd[0]);
  int status;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(nacked >= STREAM_ACKS);
  for (int i = 0; i < nacked; i++) CHECK_EQ_INT(acked[i], i + 1);
  stt_svcmgr_sync(&M);
  CHECK_EQ_INT(stt_svcmgr_count(&M, "st-journal-"), 1);
}

TEST(restored_after_the_crash) {
  CHECK_EQ_INT(start_managed(), 0);
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "from_generation"), 1);
  CHECK_EQ_INT(stt_info_int(c, "restart", "generation", NULL), 2);
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "keys"), 4);
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "refused"), 0);
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "torn"), 1);
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "buffers"), 1);
  CHECK_EQ_INT(stt_info_int(c, "keys", "count", NULL), 4);
  const char *cli = getenv("ST_CLI_BIN");
  if (cli) {
    static stt_proc_t out;
    CHECK_EQ_INT(stt_run(&out, cli, (const char *const[]){"--socket", S.socket, "info", NULL},
                         NULL, 0), 0);
    CHECK_CONTAINS(out.out, "restart      kept in the fd store: generation 2,");
    CHECK_CONTAINS(out.out, "restored     4 keys (");
    CHECK_CONTAINS(out.out, "1 buffers from generation 1; 0 refused, 1 torn");
  }

  /* The model: three versions, bytes equal. */
  for (int i = 0; i < 3; i++) {
    st_result_t *r = NULL;
    uint64_t got = 0;
    CHECK_EQ_INT(st_client_get(c, "model", (uint64_t)i + 1, 0, &r, &got), ST_OK);
    if (!r) continue;
    CHECK_EQ_INT(got, i + 1);
    CHECK(all_equal(st_result_find(r, "weight"), 10.0f + (float)i));
    CHECK(all_equal(st_result_find(r, "bias"), 20.0f + (float)i));
    st_result_free(r);
  }
  /* The stream: every acknowledged put, and at most the one in flight,
   * whole. */
  uint64_t latest = 0;
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_get(c, "stream", 0, 0, &r, &latest), ST_OK);
  st_result_free(r);
  CHECK(latest >= (uint64_t)nacked && latest <= (uint64_t)nacked + 1);
  for (uint64_t v = 1; v <= latest; v++) {
    r = NULL;
    if (st_client_get(c, "stream", v, 0, &r, NULL) != ST_OK) {
      STT_FAIL("stream version %" PRIu64 " is missing: %s", v, st_client_error(c));
    }
    if (!all_equal(st_result_find(r, "x"), (float)v))
      STT_FAIL("stream version %" PRIu64 " has other bytes", v);
    st_result_free(r);
  }
  /* Live keys: the one cut mid-update is torn, the other at version 3. */
  r = NULL;
  CHECK_EQ_INT(st_client_get(c, "live/cut", 0, 0, &r, NULL), ST_ERR_STALE_HANDLE);
  st_result_free(r);
  r = NULL;
  uint64_t got = 0;
  CHECK_EQ_INT(st_client_get(c, "live/ok", 0, 0, &r, &got), ST_OK);
  CHECK_EQ_INT(got, 3);
  if (r) CHECK(all_equal(st_result_find(r, "weight"), 3.0f));
  st_result_free(r);

  /* The same memory: the reader's old mapping reads on; the publisher's
   * write after the restart is what a new get maps; the server maps the
   * publisher's very memfd. */
  CHECK(all_equal(st_result_find(reader_v3, "weight"), 12.0f));
  float *mine = st_result_tensor(model_w[2], 0)->data;
  mine[7] = 1234.0f;
  r = NULL;
  CHECK_EQ_INT(st_client_get(c, "model", 3, 0, &r, NULL), ST_OK);
  if (r) CHECK(((const float *)st_result_find(r, "weight")->data)[7] == 1234.0f);
  st_result_free(r);
  CHECK(((const float *)st_result_find(reader_v3, "weight")->data)[7] == 1234.0f);
  unsigned long long ino = stt_proc_inode_at(getpid(), mine);
  CHECK(ino != 0);
  CHECK(stt_proc_maps_inode(S.pid, ino));
  /* The buffer: its frames, its lock free, the same memory. */
  st_buffer_t *b = NULL;
  CHECK_EQ_INT(st_buffer_open(c, "frames", 0, &b), ST_OK);
  if (b) {
    float f[64];
    uint64_t seq = 0;
    CHECK_EQ_INT(st_buffer_read(b, f, sizeof f, 1000, &seq, NULL), ST_OK);
    CHECK_EQ_INT(seq, 3);
    CHECK(f[0] == 300.0f && f[63] == 363.0f);
    CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);
    for (int k = 0; k < 64; k++) f[k] = (float)(400 + k);
    CHECK_EQ_INT(st_buffer_write(b, f, sizeof f, 1000, &seq), ST_OK);
    CHECK_EQ_INT(seq, 4);
    CHECK_EQ_INT(st_buffer_write_sequence(frames), 4);
    CHECK(((const float *)st_buffer_slot(frames, 3))[1] == 401.0f);
    CHECK_EQ_INT(st_buffer_close(b), ST_OK);
  }
  CHECK_EQ_INT(st_buffer_open(c, "gone", 1, &b), ST_ERR_NOT_FOUND);
  /* Nothing was copied: the server holds as many arenas as the keys and
   * the buffer do (model 3 x 2, two live keys with a page each, the
   * stream's, the buffer's data and page). */
  CHECK_EQ_INT(stt_info_int(c, "arenas", "count", NULL), 6 + 4 + (int64_t)latest + 2);

  /* The table goes on: the next version number, and a delete. */
  st_result_t *w4 = stt_tensor_filled(MODEL_N, 13.0f), *b4 = stt_tensor_filled(16, 23.0f);
  CHECK_EQ_INT(put2(c, "model", w4, b4, 0), 4);
  st_result_free(w4);
  st_result_free(b4);
  CHECK_EQ_INT(st_client_delete(c, "live/cut"), ST_OK);
  st_client_close(c);
}

TEST(kept_across_a_clean_restart) {
  CHECK_EQ_INT(stt_server_stop(&S), 0);
  stt_svcmgr_sync(&M);
  /* The deleted key's arena and page left the store. */
  int64_t arenas = stt_svcmgr_count(&M, "st-arena-");
  CHECK_EQ_INT(stt_svcmgr_count(&M, "st-journal-"), 1);
  CHECK_EQ_INT(start_managed(), 0);
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "from_generation"), 2);
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "keys"), 3);
  CHECK_EQ_INT(stt_info_int(c, "arenas", "count", NULL), arenas);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_get(c, "live/cut", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  uint64_t got = 0;
  CHECK_EQ_INT(st_client_get(c, "model", 0, 0, &r, &got), ST_OK);
  CHECK_EQ_INT(got, 4);
  if (r) CHECK(all_equal(st_result_find(r, "weight"), 13.0f));
  st_result_free(r);
  st_client_close(c);
}

TEST(the_journal_is_compacted_under_churn) {
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  int64_t before = stt_info_int(c, "restart", "compactions", NULL);
  st_result_t *t = stt_tensor_filled(16, 0.0f);
  if (!t) return;
  float *p = st_result_tensor(t, 0)->data;
  enum { PUTS = 5000 };
  for (int i = 1; i <= PUTS; i++) {
    p[0] = (float)i;
    st_args_t *a = st_args_new();
    uint64_t v = 0;
    int rc = st_args_tensor(a, "x", st_result_tensor(t, 0), NULL, 0);
    if (rc == ST_OK) rc = st_client_put(c, "churn", a, ST_KEY_PINNED, 0, &v);
    st_args_free(a);
    if (rc != ST_OK || v != (uint64_t)i) STT_FAIL("put %d: %s", i, st_client_error(c));
  }
  st_result_free(t);
  CHECK(stt_info_int(c, "restart", "compactions", NULL) > before);
  /* 1000 versions kept, each a record of about 200 bytes; without
   * compaction the journal would hold every put and its drop. */
  CHECK(stt_info_int(c, "restart", "journal_bytes", NULL) < 3 * 1024 * 1024);
  st_client_close(c);
  CHECK_EQ_INT(stt_server_stop(&S), 0);
  stt_svcmgr_sync(&M);
  CHECK_EQ_INT(stt_svcmgr_count(&M, "st-journal-"), 1);
  /* One allocation put 5000 times is one descriptor in the store (a
   * service manager keeps one descriptor per open file). */
  CHECK_EQ_INT(M.duplicates, 0);
  CHECK_EQ_INT(start_managed(), 0);
  st_client_t *d = stt_client_open(S.socket);
  CHECK(d);
  if (!d) return;
  CHECK_EQ_INT(stt_info_int(d, "restart", "restored", "refused"), 0);
  uint64_t got = 0;
  st_result_t *r = NULL;
  /* The key's memory is the one allocation put again and again. */
  CHECK_EQ_INT(st_client_get(d, "churn", 0, 0, &r, &got), ST_OK);
  CHECK_EQ_INT(got, PUTS);
  if (r) CHECK(((const float *)st_result_find(r, "x")->data)[0] == (float)PUTS);
  st_result_free(r);
  r = NULL;
  CHECK_EQ_INT(st_client_get(d, "churn", PUTS - 999, 0, &r, &got), ST_OK);
  st_result_free(r);
  r = NULL;
  CHECK_EQ_INT(st_client_get(d, "churn", PUTS - 1000, 0, &r, &got), ST_ERR_NOT_FOUND);
  st_client_close(d);
}

/* Replaces the store's descriptor of arena `name` by a memfd of `bytes`,
 * sealed against shrinking when `sealed`. */
static int substitute(const char *name, off_t bytes, int sealed) {
  int fd = memfd_create("substitute", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, bytes) != 0) return -1;
  if (sealed) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return stt_svcmgr_replace(&M, name, fd);
}

TEST(descriptors_that_are_not_what_the_journal_says_are_refused) {
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  st_result_t *a = stt_tensor_filled(N, 1.0f), *b = stt_tensor_filled(N, 2.0f), *k = stt_tensor_filled(N, 3.0f);
  uint64_t v;
  st_args_t *args[3];
  const char *keys[3] = {"short", "unsealed", "kept"};
  st_result_t *vals[3] = {a, b, k};
  for (int i = 0; i < 3; i++) {
    args[i] = st_args_new();
    CHECK_EQ_INT(st_args_tensor(args[i], "x", st_result_tensor(vals[i], 0), NULL, 0), ST_OK);
    CHECK_EQ_INT(st_client_put(c, keys[i], args[i], ST_KEY_PINNED, 0, &v), ST_OK);
    st_args_free(args[i]);
  }
  st_client_close(c);
  CHECK_EQ_INT(stt_server_stop(&S), 0);
  stt_svcmgr_sync(&M);
  /* The store's descriptors of the first two keys' memory (the files
   * this process allocated) are replaced. */
  char name[300];
  CHECK_EQ_INT(stt_svcmgr_name_of(&M, stt_proc_inode_at(getpid(), st_result_tensor(a, 0)->data),
                                  name, sizeof name), 0);
  CHECK_EQ_INT(substitute(name, 64, 1), 0);           /* too short: a SIGBUS later */
  CHECK_EQ_INT(stt_svcmgr_name_of(&M, stt_proc_inode_at(getpid(), st_result_tensor(b, 0)->data),
                                  name, sizeof name), 0);
  CHECK_EQ_INT(substitute(name, N * 4, 0), 0);        /* could shrink under the server */
  CHECK_EQ_INT(start_managed(), 0);
  st_client_t *d = stt_client_open(S.socket);
  CHECK(d);
  if (!d) return;
  CHECK_EQ_INT(stt_info_int(d, "restart", "restored", "refused"), 2);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_get(d, "short", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  CHECK_EQ_INT(st_client_get(d, "unsealed", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  CHECK_EQ_INT(st_client_get(d, "kept", 0, 0, &r, NULL), ST_OK);
  if (r) CHECK(all_equal(st_result_find(r, "x"), 3.0f));
  st_result_free(r);
  char *log = stt_server_log(&S);
  CHECK_CONTAINS(log, "key 'short' version 1 not restored");
  CHECK_CONTAINS(log, "key 'unsealed' version 1 not restored");
  free(log);
  st_client_close(d);
  st_result_free(a);
  st_result_free(b);
  st_result_free(k);
}

TEST(a_changed_journal_is_refused) {
  CHECK_EQ_INT(stt_server_stop(&S), 0);
  stt_svcmgr_sync(&M);
  int fd = stt_svcmgr_fd(&M, "st-journal-0");
  if (fd < 0) fd = stt_svcmgr_fd(&M, "st-journal-1");
  CHECK(fd >= 0);
  if (fd < 0) return;
  unsigned char byte;
  CHECK(pread(fd, &byte, 1, 64 + 24 + 5) == 1);
  byte ^= 0x40;
  CHECK(pwrite(fd, &byte, 1, 64 + 24 + 5) == 1);
  CHECK_EQ_INT(start_managed(), 0);
  OPEN_CLIENT(c, S.socket);
  if (!c) return;
  CHECK_EQ_INT(stt_info_int(c, "restart", "restored", "keys"), 0);
  CHECK_EQ_INT(stt_info_int(c, "keys", "count", NULL), 0);
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_get(c, "model", 0, 0, &r, NULL), ST_ERR_NOT_FOUND);
  char *log = stt_server_log(&S);
  CHECK_CONTAINS(log, "fails its checksum");
  CHECK_CONTAINS(log, "nothing restored");
  free(log);
  st_client_close(c);
  /* What the refused journal named left the store. */
  stt_svcmgr_sync(&M);
  CHECK_EQ_INT(stt_svcmgr_count(&M, "st-arena-"), 0);
  CHECK_EQ_INT(stt_svcmgr_count(&M, "st-journal-"), 1);
}

int main(void) {
  stt_server_prepare(&S, CONFIG, NULL);
  stt_svcmgr_start(&M, S.dir, 4096);
  if (start_managed() != 0) {
    stt_svcmgr_stop(&M);
    stt_server_cleanup(&S);
    return 1;
  }
  RUN(publish_then_crash_during_puts);
  RUN(restored_after_the_crash);
  RUN(kept_across_a_clean_restart);
  RUN(the_journal_is_compacted_under_churn);
  RUN(descriptors_that_are_not_what_the_journal_says_are_refused);
  RUN(a_changed_journal_is_refused);
  st_key_close(live_cut);
  st_key_close(live_ok);
  st_buffer_close(frames);
  st_client_close(pub);
  st_result_free(reader_v3);
  for (int i = 0; i < 3; i++) {
    st_result_free(model_w[i]);
    st_result_free(model_b[i]);
  }
  int status = S.pid > 0 ? stt_server_stop(&S) : 0;
  stt_svcmgr_stop(&M);
  return stt_server_end(&S, status);
}
