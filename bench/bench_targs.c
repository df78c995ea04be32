/* bench_targs: round-trip latency of a call that takes one tensor argument
 * (docs/protocol.md, "Tensor arguments") and returns a number, through
 * libstclient, against the same bytes passed as a msgpack argument.
 *
 *   bench_targs [--iters N]
 *
 * Starts its own stserver (a temp dir, the endpoints below, 2 workers) and
 * prints p50/p99 of:
 *   - ping, and a call with one integer argument: the floor of any call;
 *   - a call whose argument is a CPU tensor from st_tensor_alloc of 4 KiB,
 *     1 MiB and 64 MiB: one allocation per size, reused by every call, so
 *     after the first call the server's argument cache has it and only its
 *     id travels ("passed again"; zero-copy: the time must not grow with
 *     the size);
 *   - 4 KiB passed for the first time: each timed call gets an allocation
 *     this connection never passed (made before the clock starts, freed
 *     after it stops; its forget rides on the next call), so the
 *     descriptor travels and the server maps it;
 *   - the same with a CUDA tensor (cuda:0) when this process sees a GPU
 *     (first time: a VMM import and map in the server);
 *   - the same bytes as a string argument (the C API's byte-string setter;
 *     on the wire a str the size of the tensor, bound like a binary), where
 *     the request fits max_message_bytes (16 MiB by default): the bytes are
 *     packed, sent, parsed, bound and handed to Lua, i.e. copied.
 * The endpoint returns x:numel() (or #s), which the client checks. Timings
 * are printed, never asserted (shared machines are noisy).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "st/client.h"

#define KiB 1024ull
#define MiB (1024ull * 1024ull)
#define MAX_MESSAGE (16 * MiB)   /* the server's default max_message_bytes */

static const char *ENDPOINTS =
    "return {\n"
    "  st.endpoint{ name = 'numel', params = { x = st.tensor_param{} },\n"
    "               build = function(a) return a.x:numel() end },\n"
    "  st.endpoint{ name = 'len', params = { s = '' },\n"
    "               build = function(a) return #a.s end },\n"
    "  st.endpoint{ name = 'int', params = { n = 0 },\n"
    "               build = function(a) return a.n end },\n"
    "}\n";

static void die(st_client_t *c, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(c), st_client_error(c));
  exit(1);
}

static int64_t int_of(const st_result_t *r) {
  const st_value_t *v = st_result_value(r);
  if (v && v->kind == ST_VALUE_INT) return v->as.integer;
  if (v && v->kind == ST_VALUE_FLOAT) return (int64_t)v->as.number;
  return -1;
}

/* One timed figure: a call of `ep` with `args` that must return `want`
 * (ep NULL: ping). */
typedef struct bcase {
  char what[96];
  const char *ep;
  st_args_t *args;           /* owned */
  st_result_t *tensor;       /* owned: the allocation the args pass */
  const char *fresh;         /* a device: each call passes a new allocation */
  int64_t want;
  double *us;
} bcase_t;

#define MAX_CASES 16
#define ROUNDS 10
static bcase_t cases[MAX_CASES];
static int ncases;

static bcase_t *add_case(const char *what, const char *ep, int64_t want, int iters) {
  if (ncases == MAX_CASES) exit(1);
  bcase_t *b = &cases[ncases++];
  snprintf(b->what, sizeof b->what, "%s", what);
  b->ep = ep;
  b->args = ep ? st_args_new() : NULL;
  b->want = want;
  b->us = malloc(sizeof(double) * (size_t)iters);
  if (!b->us || (ep && !b->args)) exit(1);
  return b;
}

/* For a `fresh` case: a new allocation of b->want float32 in b->tensor,
 * passed by b->args, in place of the last one. */
static void renew_tensor(bcase_t *b) {
  char err[256];
  st_args_free(b->args);
  st_result_free(b->tensor);
  b->tensor = NULL;
  b->args = st_args_new();
  int64_t n = b->want;
  if (!b->args || st_tensor_alloc(b->fresh, ST_DTYPE_FLOAT32, 1, &n, &b->tensor, err,
                                  sizeof err) != ST_OK ||
      st_args_tensor(b->args, "x", st_result_tensor(b->tensor, 0), err, sizeof err) != ST_OK) {
    fprintf(stderr, "%s: %s\n", b->what, err);
    exit(1);
  }
}

/* One call of a case; its round-trip time in microseconds. */
static double run_case(st_client_t *c, bcase_t *b) {
  st_result_t *r = NULL;
  if (b->fresh) renew_tensor(b);
  double t0 = stt_now_ms();
  int rc = b->ep ? st_client_call(c, b->ep, b->args, &r) : st_client_ping(c, NULL);
  double t1 = stt_now_ms();
  if (rc != ST_OK) die(c, b->what);
  if (b->ep && int_of(r) != b->want) {
    fprintf(stderr, "%s: the endpoint returned %lld, expected %lld\n", b->what,
            (long long)int_of(r), (long long)b->want);
    exit(1);
  }
  st_result_free(r);
  return (t1 - t0) * 1e3;
}

static const char *size_name(uint64_t bytes, char *buf, size_t len) {
  if (bytes >= MiB) snprintf(buf, len, "%llu MiB", (unsigned long long)(bytes / MiB));
  else snprintf(buf, len, "%llu KiB", (unsigned long long)(bytes / KiB));
  return buf;
}

/* A tensor argument of `bytes` (float32) on `device`, allocated once and
 * passed by every call, or (fresh) a new one for each call. 0, or -1 when
 * the allocation fails (reason in err). */
static int add_tensor_case(const char *device, uint64_t bytes, int fresh, int iters, char *err,
                           size_t errlen) {
  int64_t n = (int64_t)(bytes / sizeof(float));
  st_result_t *x = NULL;
  if (st_tensor_alloc(device, ST_DTYPE_FLOAT32, 1, &n, &x, err, errlen) != ST_OK) return -1;
  char sz[32], what[96];
  snprintf(what, sizeof what, "%s tensor argument %s, %s", device,
           size_name(bytes, sz, sizeof sz), fresh ? "first time" : "passed again");
  bcase_t *b = add_case(what, "numel", n, iters);
  b->tensor = x;
  b->fresh = fresh ? device : NULL;
  if (st_args_tensor(b->args, "x", st_result_tensor(x, 0), err, errlen) != ST_OK) {
    fprintf(stderr, "st_args_tensor: %s\n", err);
    exit(1);
  }
  return 0;
}

/* The same bytes as a string argument, when the request fits. */
static void add_copy_case(uint64_t bytes, int iters) {
  char sz[32], what[96];
  snprintf(what, sizeof what, "string argument %s (copied)", size_name(bytes, sz, sizeof sz));
  if (bytes + 256 > MAX_MESSAGE) {
    printf("%-44s n/a: a request of %s exceeds max_message_bytes (%llu MiB)\n", what, sz,
           (unsigned long long)(MAX_MESSAGE / MiB));
    return;
  }
  char *s = malloc(bytes + 1);
  if (!s) exit(1);
  memset(s, 'x', bytes);
  s[bytes] = '\0';
  bcase_t *b = add_case(what, "len", (int64_t)bytes, iters);
  if (st_args_string(b->args, "s", s) != ST_OK) exit(1);
  free(s);
}

int main(int argc, char **argv) {
  int iters = 2000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_targs [--iters N]\n");
      return 2;
    }
  }
  if (iters < 1) iters = 1;
  bk_setup();

  stt_server_t s;
  stt_server_init(&s);
  stt_write_endpoint(&s, "bench.lua", ENDPOINTS);
  stt_server_config(&s, "log_level = 'warn', workers = 2,");
  if (stt_server_start(&s) != 0) return 1;
  st_client_t *c = bk_connect(s.socket);
  st_client_set_timeout(c, 60000);

  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  printf("bench_targs: %ld CPUs, %d iterations per figure\n", ncpu, iters);

  add_case("ping", NULL, 0, iters);
  st_args_int(add_case("call, one integer argument", "int", 7, iters)->args, "n", 7);
  static const uint64_t sizes[] = {4 * KiB, 1 * MiB, 64 * MiB};
  const size_t nsizes = sizeof sizes / sizeof sizes[0];
  char err[256];
  static const char *const devices[] = {"cpu", "cuda:0"};
  for (size_t d = 0; d < 2; d++) {
    /* 4 KiB first time, then every size passed again */
    int rc = add_tensor_case(devices[d], sizes[0], 1, iters, err, sizeof err);
    for (size_t i = 0; rc == 0 && i < nsizes; i++)
      rc = add_tensor_case(devices[d], sizes[i], 0, iters, err, sizeof err);
    if (rc != 0 && d == 0) {
      fprintf(stderr, "st_tensor_alloc cpu: %s\n", err);
      return 1;
    }
    if (rc != 0) printf("%-44s skipped: %s\n", "cuda:0 tensor arguments", err);
  }
  for (size_t i = 0; i < nsizes; i++) add_copy_case(sizes[i], iters);

  /* Rounds: each case runs a block of consecutive calls in turn (5
   * untimed first), ROUNDS times over, so that the noise of a shared
   * machine spreads over every figure alike while no case follows another
   * call by call (a large copy slows the call right after it). */
  const int rounds = iters >= ROUNDS ? ROUNDS : 1;
  for (int k = 0; k < ncases; k++)
    for (int i = 0; i < 50; i++) run_case(c, &cases[k]);
  int done = 0;
  for (int round = 0; round < rounds; round++) {
    int block = (iters - done) / (rounds - round);
    for (int k = 0; k < ncases; k++) {
      for (int i = 0; i < 5; i++) run_case(c, &cases[k]);
      for (int i = 0; i < block; i++) cases[k].us[done + i] = run_case(c, &cases[k]);
    }
    done += block;
  }
  for (int k = 0; k < ncases; k++) {
    bk_report(cases[k].what, cases[k].us, iters);
    free(cases[k].us);
    st_args_free(cases[k].args);
    st_result_free(cases[k].tensor);
  }

  st_client_close(c);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc == 0 ? 0 : 1;
}
