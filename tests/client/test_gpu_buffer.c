/* Named buffers of CUDA memory (one VMM allocation) between processes
 * through a real stserver (docs/streams.md; the CPU path and the refusals
 * are test_buffer.c). Other handles run in programs of their own (this one
 * run again: a child forked from a process that used the driver cannot
 * use it):
 *   - a writer hammers 300 checksummed 1000x1000 float32 frames through a
 *     ring of 2 slots while a reader process verifies every frame it
 *     reads (a synchronous copy to the host, then the seqlock check);
 *   - read_new wakes the reader on the next write;
 *   - a read-only handle refuses writes through the API, and a device
 *     write into its mapping fails in that process, not in the server;
 *   - the writer lock of a SIGKILLed owner is freed;
 *   - clear zeroes every device slot under a counted lock, and a uint16
 *     buffer round-trips its values;
 *   - afterwards the server's cuda:0 budget, descriptors and arenas are
 *     back to their start.
 * Exit 77 without a CUDA device. */
#include "buffer_kit.h"
#include "handoff_kit.h"
#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA

static stt_server_t srv;
static st_client_t *cli;
static const char *self;

static const int64_t SHAPE[2] = {1000, 1000};
#define FRAME (1000u * 1000u * 4u)
#define WRITES 300

enum { MODE_READER = 1, MODE_READ_ONLY = 2, MODE_LOCKER = 3 };

typedef struct gpu_report {
  int rc, extra_rc;
  uint64_t reads, distinct, torn;
} gpu_report_t;

/* A child program: opens `name` and does what `mode` says. */
static int child(int mode, const char *socket, const char *name, int out) {
  gpu_report_t r = {-1000, -1000, 0, 0, 0};
  st_client_t *c = stt_client_open(socket);
  st_buffer_t *b = NULL;
  uint8_t *frame = malloc(FRAME);
  if (!c || !frame) return 2;
  r.rc = st_buffer_open(c, name, mode == MODE_READ_ONLY, &b);
  if (r.rc == ST_OK && mode == MODE_READER) {
    bk_send(out, &r, sizeof r);   /* open: the writer may start */
    uint64_t last = 0, seq;
    while (last < WRITES && (r.rc = st_buffer_read_new(b, frame, FRAME, 20000, &seq, NULL)) ==
                                ST_OK) {
      r.reads++;
      r.distinct += seq > last;
      r.torn += !bk_whole(frame, FRAME, seq);
      last = seq;
    }
  } else if (r.rc == ST_OK && mode == MODE_READ_ONLY) {
    r.rc = st_buffer_write(b, frame, FRAME, 0, NULL);
    r.extra_rc = st__cuda_copy_to_device((uint64_t)(uintptr_t)st_buffer_slot(b, 0), frame, 4096,
                                         0, NULL, 0);
  } else if (r.rc == ST_OK && mode == MODE_LOCKER) {
    r.rc = st_buffer_acquire(b, 1000);
    bk_send(out, &r, sizeof r);
    for (;;) pause();
  }
  return bk_finish(out, &r, sizeof r, b, c);
}

static int spawn(bk_child_t *k, int mode, const char *name) {
  return bk_spawn_exec(k, self, srv.socket, name, mode);
}

static st_buffer_t *make(const char *name, int slots) {
  st_buffer_t *b = NULL;
  if (stt_client_report(cli, name, st_buffer_create(cli, name, "cuda:0", ST_DTYPE_FLOAT32, 2,
                                                    SHAPE, slots, &b)) != ST_OK)
    return NULL;
  return b;
}

TEST(a_reader_process_never_sees_a_torn_frame) {
  hk_figures_t start = hk_figures(cli, srv.pid, "cuda:0");
  st_buffer_t *b = make("gcam", 2);
  CHECK(b != NULL);
  st_buffer_info_t in;
  CHECK_EQ_INT(st_buffer_info(b, &in), ST_OK);
  CHECK_EQ_INT(in.device_index, 0);
  bk_child_t k;
  CHECK(spawn(&k, MODE_READER, "gcam") == 0);
  gpu_report_t r;
  CHECK(bk_report(&k, &r, sizeof r) == 0 && r.rc == ST_OK);
  uint8_t *frame = malloc(FRAME);
  CHECK(frame);
  for (uint64_t i = 1; i <= WRITES; i++) {
    bk_fill(frame, FRAME, i);
    uint64_t seq;
    CHECK_ERR_MSG(st_buffer_write(b, frame, FRAME, 10000, &seq), ST_OK, st_buffer_error(b));
    CHECK(seq == i);
  }
  free(frame);
  CHECK(bk_report(&k, &r, sizeof r) == 0);
  CHECK_EQ_INT(bk_end(&k, 0), 0);
  fprintf(stderr, "   %llu reads, %llu distinct, %llu torn\n", (unsigned long long)r.reads,
          (unsigned long long)r.distinct, (unsigned long long)r.torn);
  CHECK_EQ_INT(r.rc, ST_OK);
  CHECK(r.distinct >= 1 && r.torn == 0);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "gcam"), ST_OK, cli);
  CHECK(hk_back_to(cli, srv.pid, "cuda:0", start));
}

TEST(read_only_handles_and_the_lock_of_a_killed_owner) {
  st_buffer_t *b = make("gro", 1);
  CHECK(b != NULL);
  bk_child_t k;
  gpu_report_t r;
  CHECK(spawn(&k, MODE_READ_ONLY, "gro") == 0);
  CHECK(bk_report(&k, &r, sizeof r) == 0);
  bk_end(&k, 0);
  CHECK_EQ_INT(r.rc, ST_ERR_INVALID_ARGUMENT);
  CHECK(r.extra_rc != ST_OK);   /* the device refused the write */
  CHECK_RC(st_client_ping(cli, NULL), ST_OK, cli);
  CHECK(spawn(&k, MODE_LOCKER, "gro") == 0);
  CHECK(bk_report(&k, &r, sizeof r) == 0 && r.rc == ST_OK);
  CHECK_ERR(st_buffer_acquire(b, 50), ST_ERR_TIMEOUT);
  bk_end(&k, 1);
  CHECK_ERR_MSG(st_buffer_acquire(b, 10000), ST_OK, st_buffer_error(b));
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "gro"), ST_OK, cli);
}

/* clear on the device: every slot of a ring of 3 reads zeros afterwards,
 * under a counted lock; a uint16 buffer round-trips its top value. */
TEST(clear_zeroes_device_slots_and_unsigned_frames) {
  st_buffer_t *b = make("gcl", 3);
  CHECK(b != NULL);
  uint8_t *frame = malloc(FRAME), *got = malloc(FRAME), *zero = calloc(1, FRAME);
  CHECK(frame && got && zero);
  for (uint64_t k = 1; k <= 4; k++) {
    bk_fill(frame, FRAME, k);
    CHECK_EQ_INT(st_buffer_write(b, frame, FRAME, 1000, NULL), ST_OK);
  }
  CHECK_EQ_INT(st_buffer_acquire(b, 1000), ST_OK);
  CHECK_EQ_INT(st_buffer_acquire(b, 1000), ST_OK);
  uint64_t seq = 0;
  CHECK_ERR_MSG(st_buffer_clear(b, 1000, &seq), ST_OK, st_buffer_error(b));
  CHECK(seq == 5);
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_EQ_INT(st_buffer_release(b), ST_OK);
  CHECK_EQ_INT(st_buffer_locked(b, NULL, NULL, NULL), 0);
  for (int i = 0; i < 3; i++) {
    CHECK_EQ_INT(st__cuda_copy_to_host(got, (uint64_t)(uintptr_t)st_buffer_slot(b, i), FRAME, 0,
                                       NULL, 0),
                 ST_OK);
    CHECK(memcmp(got, zero, FRAME) == 0);
  }
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "gcl"), ST_OK, cli);
  const int64_t four[1] = {4};
  uint16_t u[4] = {65535, 1, 0, 40000}, back[4] = {0};
  CHECK_RC(st_buffer_create(cli, "gu16", "cuda:0", ST_DTYPE_UINT16, 1, four, 1, &b), ST_OK, cli);
  CHECK_EQ_INT(st_buffer_write(b, u, sizeof u, 1000, NULL), ST_OK);
  CHECK_EQ_INT(st_buffer_read(b, back, sizeof back, 1000, NULL, NULL), ST_OK);
  CHECK(memcmp(u, back, sizeof u) == 0);
  CHECK_RC(st_buffer_close(b), ST_OK, cli);
  CHECK_RC(st_buffer_unlink(cli, "gu16"), ST_OK, cli);
  free(frame);
  free(got);
  free(zero);
}

#endif

int main(int argc, char **argv) {
#ifdef ST_HAVE_CUDA
  if (argc == 6 && strcmp(argv[1], "--child") == 0)   /* bk_spawn_exec */
    return child(atoi(argv[2]), argv[3], argv[4], atoi(argv[5]));
  self = argv[0];
  cli = hk_gpu_start(&srv);
  if (!cli) return 1;
  RUN(a_reader_process_never_sees_a_torn_frame);
  RUN(read_only_handles_and_the_lock_of_a_killed_owner);
  RUN(clear_zeroes_device_slots_and_unsigned_frames);
  return stt_client_finish(cli, &srv);
#else
  (void)argc;
  (void)argv;
  stt_skip("no CUDA device: built without CUDA support");
  return stt_summary();
#endif
}
