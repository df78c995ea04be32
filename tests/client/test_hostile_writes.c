/* libstclient never writes through memory a hostile server made read-only
 * (docs/client.md, "What the client checks before it maps and writes";
 * docs/security.md, finding 5): every page or arena the library or its
 * caller is to write (a live key's page and tensors for its publisher, a
 * hand-off's page for both roles and its data for the producer, a writable
 * buffer's page and data, a result pool's page and slabs) must come
 * writable, or the call is ST_ERR_PROTOCOL with a message, never a SIGSEGV
 * later. And a read-only `get` is mapped read-only whatever the reply
 * says.
 *
 * The replies come from a scripted server on a real socket (fake_server.h)
 * whose descriptors are memfds made read-only in the three ways a server
 * can: reopened O_RDONLY through /proc/self/fd (with or without the
 * arena's `readonly: true`), or sealed with F_SEAL_FUTURE_WRITE /
 * F_SEAL_WRITE. Each client runs in a forked child that, should the call
 * succeed, does the write the handle promises: a SIGSEGV there is a
 * failed check of the parent, not a crashed test. */
#include <signal.h>
#include <sys/wait.h>

#include "check.h"
#include "client_kit.h"
#include "fake_server.h"
#include "shm/buffer_page.h"
#include "shm/handoff_page.h"
#include "shm/key_page.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

static fake_server_t fs;

/* How a descriptor is made read-only (RW: it is not). */
enum ro { RW, REOPEN, FUTURE_SEALED, WRITE_SEALED };

/* What the next request gets; set by the parent before it forks. */
static struct scenario {
  const char *name;
  enum ro ro[2];         /* of the reply's two descriptors              */
  int marked[2];         /* the arena says `readonly: true`             */
  int publisher;         /* live keys: the reply says publisher: true   */
  int consumer;          /* hand-offs: slot 0 rather than the producer  */
  int buffer_readonly;   /* buffers: the reply's `readonly`             */
} now;

static const float kData[4] = {1, 2, 3, 4};

/* A sealed 4096-byte memfd holding `data` (len bytes), made read-only as
 * `ro` says. */
static int make_fd(const void *data, size_t len, enum ro ro) {
  int fd = fake_memfd(4096, data, len, 1);
  if (ro == FUTURE_SEALED && fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0) {
    /* A kernel before 5.1: F_SEAL_WRITE is as read-only. */
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0) abort();
  }
  if (ro == WRITE_SEALED && fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) != 0) abort();
  if (ro == REOPEN) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int r = open(path, O_RDONLY | O_CLOEXEC);
    if (r < 0) abort();
    close(fd);
    fd = r;
  }
  return fd;
}

/* The arena entry of descriptor i, 4096 bytes of arena `id`. */
static void arena_text(char *out, size_t n, int i, unsigned id) {
  snprintf(out, n, "{fd: %d, bytes: 4096, device: 'cpu', backend: 'memfd', id: %u%s}", i, id,
           now.marked[i] ? ", readonly: true" : "");
}

static unsigned next_id = 100;   /* arena ids: each reply's are new */

static int reply_live(int conn, uint32_t id) {
  st__key_page_t page;
  memset(&page, 0, sizeof page);
  st__key_page_init(&page, 7);
  int fds[2] = {make_fd(kData, sizeof kData, now.ro[0]), make_fd(&page, sizeof page, now.ro[1])};
  char a0[160], a1[160];
  arena_text(a0, sizeof a0, 0, next_id++);
  arena_text(a1, sizeof a1, 1, next_id++);
  int rc = fake_replyf(conn, id, fds, 2,
                       "{value: {w: tensor(0, 0, 'float32', [4], [1])}, arenas: [%s, %s], key: "
                       "'k', version: 1, live: {page: 1, publisher: %s}}",
                       a0, a1, now.publisher ? "true" : "false");
  close(fds[0]);
  close(fds[1]);
  return rc;
}

static int reply_get(int conn, uint32_t id) {
  int fd = make_fd(kData, sizeof kData, now.ro[0]);
  char a0[160];
  arena_text(a0, sizeof a0, 0, next_id++);
  int rc = fake_replyf(conn, id, &fd, 1,
                       "{value: {w: tensor(0, 0, 'float32', [4], [1])}, arenas: [%s], key: 'k', "
                       "version: 1}", a0);
  close(fd);
  return rc;
}

/* A hand-off of 2 chunks of 64 bytes: data (arena 0), page (arena 1). */
static int reply_handoff(int conn, uint32_t id) {
  union {
    st__handoff_page_t p;
    unsigned char bytes[512];
  } page;
  memset(&page, 0, sizeof page);
  page.p.magic = ST__HANDOFF_MAGIC;
  page.p.version = ST__HANDOFF_VERSION;
  page.p.chunks = 2;
  page.p.consumers = 1;
  page.p.chunk_bytes = page.p.stride = 64;
  int fds[2] = {make_fd(NULL, 0, now.ro[0]), make_fd(&page, sizeof page, now.ro[1])};
  char a0[160], a1[160];
  arena_text(a0, sizeof a0, 0, next_id++);
  arena_text(a1, sizeof a1, 1, next_id++);
  int rc = fake_replyf(conn, id, fds, 2,
                       "{value: {chunks: 2, consumers: 1, chunk_bytes: 64, stride: 64, slot: %d, "
                       "role: '%s', data: tensor(0, 0, 'uint8', [128], [1]), page: tensor(1, 0, "
                       "'uint8', [4096], [1])}, arenas: [%s, %s]}",
                       now.consumer ? 0 : -1, now.consumer ? "consumer" : "producer", a0, a1);
  close(fds[0]);
  close(fds[1]);
  return rc;
}

/* A buffer of 2 slots of float32[4]: data (arena 0), page (arena 1). */
static int reply_buffer(int conn, uint32_t id) {
  union {
    st__buffer_page_t p;
    unsigned char bytes[ST__BUFFER_PAGE_BYTES(2)];
  } page;
  memset(&page, 0, sizeof page);
  page.p.geometry.magic = ST__BUFFER_MAGIC;
  page.p.geometry.version = ST__BUFFER_VERSION;
  page.p.geometry.slots = 2;
  page.p.geometry.frame_bytes = 16;
  page.p.geometry.stride = 64;
  int fds[2] = {make_fd(NULL, 0, now.ro[0]), make_fd(&page, sizeof page, now.ro[1])};
  char a0[160], a1[160];
  arena_text(a0, sizeof a0, 0, next_id++);
  arena_text(a1, sizeof a1, 1, next_id++);
  int rc = fake_replyf(conn, id, fds, 2,
                       "{slots: 2, frame_bytes: 16, stride: 64, handle: 1, connection: 1, "
                       "readonly: %s, dtype: 'float32', shape: [4], arenas: [%s, %s]}",
                       now.buffer_readonly ? "true" : "false", a0, a1);
  close(fds[0]);
  close(fds[1]);
  return rc;
}

/* A pooled result: a region of slab (descriptor 0) and the pool's
 * control page (descriptor 1). */
static int reply_pooled(int conn, uint32_t id) {
  uint32_t page[16] = {0x4c505453u}; /* "STPL" */
  int fds[2] = {make_fd(kData, sizeof kData, now.ro[0]), make_fd(page, sizeof page, now.ro[1])};
  int rc = fake_replyf(conn, id, fds, 2,
                       "{value: tensor(0, 0, 'float32', [4], [1]), arenas: [{fd: 0, bytes: 4096, "
                       "device: 'cpu', backend: 'memfd', id: %u%s, pool: {slab: 0, offset: 0, "
                       "size: 4096, slot: 0, gen: 1}}], pool_page: {fd: 1, bytes: 4096, id: %u, "
                       "slots: 16}}",
                       next_id, now.marked[0] ? ", readonly: true" : "", next_id + 1);
  next_id += 2;
  close(fds[0]);
  close(fds[1]);
  return rc;
}

static int on_request(fake_server_t *f, int conn, uint32_t id, const char *method,
                      const msgpack_object *params) {
  (void)f;
  (void)params;
  if (strcmp(method, "hello") == 0)
    return fake_replyf(conn, id, NULL, 0,
                       "{protocol: 1, version: '0.0.0-fake', server_id: 'fake-%d', pid: %d, "
                       "device: 0, devices: [], limits: {}, features: ['pool']}",
                       (int)getpid(), (int)getpid());
  if (strcmp(method, "get") == 0)
    return now.publisher >= 0 ? reply_live(conn, id) : reply_get(conn, id);
  if (strcmp(method, "handoff_create") == 0 || strcmp(method, "handoff_open") == 0)
    return reply_handoff(conn, id);
  if (strcmp(method, "buffer_create") == 0 || strcmp(method, "buffer_open") == 0)
    return reply_buffer(conn, id);
  if (strcmp(method, "call") == 0) return reply_pooled(conn, id);
  if (strstr(method, "_close")) return fake_replyf(conn, id, NULL, 0, "true");
  return fake_error(conn, id, 16, "UNKNOWN_METHOD", method);
}

/* ---------------------------------------------------------- the children */

/* The child's verdict: 0 for a PROTOCOL refusal with a message; 1 for
 * another failure; 2 when the call succeeded and the write it promises
 * did not fault either. */
static int refused(int rc, const char *msg) {
  fprintf(stderr, "   %s: %s: %s\n", now.name, stt_err_label(rc), msg ? msg : "");
  return rc == ST_ERR_PROTOCOL && msg && *msg ? 0 : 1;
}

static int child_live(void) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) return 3;
  st_key_t *k = NULL;
  int rc = st_key_open(c, "k", 0, &k);
  if (rc != ST_OK) return refused(rc, st_key_error(NULL));
  /* What a publisher does: its page and its tensors are written. */
  const st_tensor_t *t = st_result_find(st_key_result(k), "w");
  float v[4] = {5, 6, 7, 8};
  st_tensor_t src = *t;
  src.data = v;
  const st_tensor_t *list[1] = {&src};
  rc = st_key_update(k, list, 1);
  fprintf(stderr, "   %s: the update wrote (%s)\n", now.name, stt_err_label(rc));
  return 2;
}

static int child_handoff(void) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) return 3;
  st_handoff_t *h = NULL;
  int rc = now.consumer ? st_handoff_open(c, "h", &h)
                        : st_handoff_create(c, "h", "cpu", 64, 2, 1, &h);
  if (rc != ST_OK) return refused(rc, st_client_error(c));
  if (now.consumer) {
    st_handoff_read(h, 0, 1, 50, NULL, NULL);   /* counts itself a waiter in the page */
  } else {
    int chunk = -1;
    void *data = NULL;
    if (st_handoff_acquire(h, 1000, &chunk, &data) == ST_OK) {
      memset(data, 1, 64);
      st_handoff_publish(h, chunk, 64, NULL);
    }
  }
  fprintf(stderr, "   %s: the hand-off wrote\n", now.name);
  return 2;
}

static int child_buffer(void) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) return 3;
  st_buffer_t *b = NULL;
  int64_t shape[1] = {4};
  int rc = st_buffer_create(c, "b", "cpu", ST_DTYPE_FLOAT32, 1, shape, 2, &b);
  if (rc != ST_OK) return refused(rc, st_client_error(c));
  rc = st_buffer_write(b, kData, sizeof kData, 1000, NULL);
  fprintf(stderr, "   %s: the write returned %s\n", now.name, stt_err_label(rc));
  return 2;
}

static int child_pool(void) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) return 3;
  st_result_t *r = NULL;
  int rc = st_client_call(c, "e", NULL, &r);
  if (rc != ST_OK) return refused(rc, st_client_error(c));
  /* A plain result is the caller's to write; its free writes the page. */
  ((float *)st_result_find(r, "")->data)[0] = 9;
  st_result_free(r);
  fprintf(stderr, "   %s: the result and the page were written\n", now.name);
  return 2;
}

/* Runs fn in a child process; checks it exited with 0 (no signal). */
#define CHECK_CHILD(fn)                                                            \
  do {                                                                             \
    fflush(stderr);                                                                \
    pid_t pid_ = fork();                                                           \
    CHECK(pid_ >= 0);                                                              \
    if (pid_ == 0) _exit(fn());                                                    \
    int st_ = 0;                                                                   \
    CHECK_EQ_INT(waitpid(pid_, &st_, 0), pid_);                                    \
    if (WIFSIGNALED(st_))                                                          \
      fprintf(stderr, "   %s: the client died of signal %d\n", now.name, WTERMSIG(st_)); \
    CHECK(WIFEXITED(st_));                                                         \
    CHECK_EQ_INT(WEXITSTATUS(st_), 0);                                             \
  } while (0)

/* ------------------------------------------------------------ the tests */

TEST(a_live_key_published_through_read_only_memory_is_refused) {
  static const struct scenario cases[] = {
      {"page reopened O_RDONLY, marked", {RW, REOPEN}, {0, 1}, 1, 0, 0},
      {"page sealed F_SEAL_FUTURE_WRITE, marked", {RW, FUTURE_SEALED}, {0, 1}, 1, 0, 0},
      {"page sealed F_SEAL_WRITE, marked", {RW, WRITE_SEALED}, {0, 1}, 1, 0, 0},
      {"page reopened O_RDONLY, unmarked", {RW, REOPEN}, {0, 0}, 1, 0, 0},
      {"tensors reopened O_RDONLY, marked", {REOPEN, RW}, {1, 0}, 1, 0, 0},
      {"tensors sealed F_SEAL_FUTURE_WRITE, marked", {FUTURE_SEALED, RW}, {1, 0}, 1, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    now = cases[i];
    CHECK_CHILD(child_live);
  }
}

TEST(a_hand_off_in_read_only_memory_is_refused) {
  static const struct scenario cases[] = {
      {"producer: page reopened O_RDONLY, marked", {RW, REOPEN}, {0, 1}, -1, 0, 0},
      {"producer: page sealed F_SEAL_FUTURE_WRITE, marked", {RW, FUTURE_SEALED}, {0, 1}, -1, 0, 0},
      {"producer: data reopened O_RDONLY, marked", {REOPEN, RW}, {1, 0}, -1, 0, 0},
      {"producer: data sealed F_SEAL_WRITE, marked", {WRITE_SEALED, RW}, {1, 0}, -1, 0, 0},
      {"producer: data reopened O_RDONLY, unmarked", {REOPEN, RW}, {0, 0}, -1, 0, 0},
      {"consumer: page reopened O_RDONLY, marked", {RW, REOPEN}, {0, 1}, -1, 1, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    now = cases[i];
    CHECK_CHILD(child_handoff);
  }
}

TEST(a_writable_buffer_in_read_only_memory_is_refused) {
  static const struct scenario cases[] = {
      {"buffer: both reopened O_RDONLY, reply read-only", {REOPEN, REOPEN}, {0, 0}, -1, 0, 1},
      {"buffer: page reopened O_RDONLY", {RW, REOPEN}, {0, 0}, -1, 0, 0},
      {"buffer: data sealed F_SEAL_FUTURE_WRITE", {FUTURE_SEALED, RW}, {0, 0}, -1, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    now = cases[i];
    CHECK_CHILD(child_buffer);
  }
}

TEST(a_result_pool_in_read_only_memory_is_refused) {
  static const struct scenario cases[] = {
      {"pool: page reopened O_RDONLY", {RW, REOPEN}, {0, 0}, -1, 0, 0},
      {"pool: page sealed F_SEAL_FUTURE_WRITE", {RW, FUTURE_SEALED}, {0, 0}, -1, 0, 0},
      {"pool: slab reopened O_RDONLY, marked", {REOPEN, RW}, {1, 0}, -1, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    now = cases[i];
    CHECK_CHILD(child_pool);
  }
}

/* The permissions /proc/self/maps gives the mapping that holds p ("" when
 * none does). */
static void perms_of(const void *p, char out[5]) {
  out[0] = '\0';
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return;
  char line[512];
  uintptr_t a = (uintptr_t)p;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[5];
    if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
      memcpy(out, perms, 5);
      break;
    }
  }
  fclose(f);
}

/* Writes the tensor's first element: the child dies of SIGSEGV when the
 * mapping is read-only. */
static int child_writes_read_only_get(void) {
  st_client_t *c = stt_client_open(fs.path);
  if (!c) return 3;
  st_result_t *r = NULL;
  if (st_client_get(c, "k", 0, ST_GET_READONLY, &r, NULL) != ST_OK) return 1;
  ((volatile float *)st_result_find(r, "w")->data)[0] = 9;
  return 0;
}

TEST(a_read_only_get_is_mapped_read_only_whatever_the_reply_says) {
  static const struct scenario cases[] = {
      {"get: a read-write memfd, unmarked", {RW, RW}, {0, 0}, -1, 0, 0},
      {"get: a read-write memfd, marked", {RW, RW}, {1, 0}, -1, 0, 0},
      {"get: reopened O_RDONLY, marked", {REOPEN, RW}, {1, 0}, -1, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    now = cases[i];
    OPEN_CLIENT(c, fs.path);
    st_result_t *r = NULL;
    CHECK_RC(st_client_get(c, "k", 0, ST_GET_READONLY, &r, NULL), ST_OK, c);
    const st_tensor_t *t = st_result_find(r, "w");
    CHECK(t != NULL);
    CHECK_EQ_INT(st_tensor_get(t, 2), 3);
    char perms[5];
    perms_of(t->data, perms);
    fprintf(stderr, "   %s: mapped %s\n", now.name, perms);
    CHECK_STR_EQ(perms, "r--s");
    st_result_free(r);
    st_client_close(c);
  }
  /* And a write through it faults in the process that makes it. */
  now = cases[0];
  fflush(stderr);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    _exit(child_writes_read_only_get());
  }
  int status = 0;
  CHECK_EQ_INT(waitpid(pid, &status, 0), pid);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
}

/* A buffer opened read-only stays read-only, whatever the reply says. */
TEST(a_read_only_buffer_handle_stays_read_only) {
  now = (struct scenario){"buffer: a writable reply to a read-only open", {RW, RW}, {0, 0},
                          -1, 0, 0};
  OPEN_CLIENT(c, fs.path);
  st_buffer_t *b = NULL;
  CHECK_RC(st_buffer_open(c, "b", 1, &b), ST_OK, c);
  st_buffer_info_t info;
  CHECK_ERR(st_buffer_info(b, &info), ST_OK);
  CHECK_EQ_INT(info.readonly, 1);
  CHECK_ERR(st_buffer_write(b, kData, sizeof kData, 1000, NULL), ST_ERR_INVALID_ARGUMENT);
  st_buffer_close(b);
  st_client_close(c);
}

/* A live key opened read-only never publishes, whatever the reply says. */
TEST(a_read_only_live_handle_never_publishes) {
  now = (struct scenario){"live: publisher to a read-only open", {RW, RW}, {0, 0}, 1, 0, 0};
  OPEN_CLIENT(c, fs.path);
  st_key_t *k = NULL;
  int rc = st_key_open(c, "k", ST_GET_READONLY, &k);
  fprintf(stderr, "   %s: %s: %s\n", now.name, stt_err_label(rc), st_key_error(NULL));
  CHECK_ERR(rc, ST_ERR_PROTOCOL);
  CHECK_CONTAINS(st_key_error(NULL), "publisher");
  st_key_close(k);
  st_client_close(c);
}

int main(void) {
  fs.on_request = on_request;
  fs.hello_custom = 1;
  fake_start(&fs);
  RUN(a_live_key_published_through_read_only_memory_is_refused);
  RUN(a_hand_off_in_read_only_memory_is_refused);
  RUN(a_writable_buffer_in_read_only_memory_is_refused);
  RUN(a_result_pool_in_read_only_memory_is_refused);
  RUN(a_read_only_get_is_mapped_read_only_whatever_the_reply_says);
  RUN(a_read_only_buffer_handle_stays_read_only);
  RUN(a_read_only_live_handle_never_publishes);
  fake_wait_idle(&fs, 2000);
  fake_stop(&fs);
  return stt_summary();
}
