/* bench_loopstall: another connection's ping while one connection sends
 * a request whose work grows with its tensors (docs/views.md, "What runs
 * where"; docs/security.md, finding 1), against a real stserver.
 *
 *   bench_loopstall [--mode view|takeover|put] [--tensors N] [--rounds N]
 *
 * view (default): the endpoint returns N tensors (default 3000) named
 * "<1990 a's>.<6 digits>"; the view has 10 rules `*a*a...*a*d` of about
 * 250 bytes (rule d narrows the names ending in digit d).
 *
 * takeover: a live key of N tensors (default 6000; float32 [4], one memfd
 * arena, names "model.layers.<i>.mlp.down_proj.weight") put by one
 * connection; the request is a live put of the same tensors from
 * connection A, which takes the key over (docs/views.md, section 3).
 *
 * put: the same tensors put again and again as new versions of a key
 * that is not live (each put adopts the arena: docs/keys.md, section 1).
 *
 * Each round, connection A sends its request; connection B pings back to
 * back until A's reply arrives. It prints the request's time, B's ping
 * p50/p99 meanwhile, and B's pings answered per request. Timings are
 * printed, never asserted.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "kit.h"
#include "wire.h"

/* The rounds: A sends its request (send(round)), B pings back to back
 * until A's reply came; req[] gets each request's time, ping[] each
 * ping's (us). Returns the pings, or -1. */
static long rounds_with_pings(rc_t *a, rc_t *b, int rounds, int (*send)(rc_t *a, int round),
                              double *req, double *ping, size_t cap) {
  size_t np = 0;
  msg_t m;
  for (int r = 0; r < rounds; r++) {
    double t0 = stt_now_ms();
    if (send(a, r) != 0) return -1;
    int done = 0;
    while (!done) {
      double p0 = stt_now_ms();
      if (rc_rpcf(b, &m, "[0, 2, 'ping', []]") != 1 || m.error) return -1;
      msg_free(&m);
      if (np < cap) ping[np++] = (stt_now_ms() - p0) * 1000.0;
      while (rc_read(a, 0) > 0) {
      }
      if (rc_take(a, &m)) {
        if (m.error) {
          fprintf(stderr, "request: %s\n", msg_errmsg(&m));
          return -1;
        }
        msg_free(&m);
        rc_drop_fds(a);
        done = 1;
      }
    }
    req[r] = (stt_now_ms() - t0) * 1000.0;
  }
  return (long)np;
}

/* ------------------------------------------------------------ view */

static char view_spec[4096];

static int send_view(rc_t *a, int round) {
  return rc_sendf(a, "[0, %d, 'call', [{endpoint: 'wide', args: {}, view: '%s'}]]", 10 + round,
                  view_spec);
}

/* ------------------------------------------------------------ takeover */

static int live_tensors;
static int live_fd = -1;
static int put_live = 1;

/* A put of the key 'big' (live unless --mode put): live_tensors float32
 * [4] tensors of one memfd (sent with the frame). */
static int send_live_put(rc_t *a, int id) {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, 0);
  msgpack_pack_uint32(&pk, (uint32_t)id);
  msgpack_pack_str(&pk, 3);
  msgpack_pack_str_body(&pk, "put", 3);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 3 + (uint32_t)put_live);
  msgpack_pack_str(&pk, 3);
  msgpack_pack_str_body(&pk, "key", 3);
  msgpack_pack_str(&pk, 3);
  msgpack_pack_str_body(&pk, "big", 3);
  if (put_live) {
    msgpack_pack_str(&pk, 4);
    msgpack_pack_str_body(&pk, "live", 4);
    msgpack_pack_true(&pk);
  }
  msgpack_pack_str(&pk, 5);
  msgpack_pack_str_body(&pk, "value", 5);
  msgpack_pack_map(&pk, (uint32_t)live_tensors);
  for (int i = 0; i < live_tensors; i++) {
    char name[64];
    int n = snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", i);
    msgpack_pack_str(&pk, (size_t)n);
    msgpack_pack_str_body(&pk, name, (size_t)n);
    st__tensor_desc_t d;
    memset(&d, 0, sizeof d);
    d.dtype = ST_DTYPE_FLOAT32;
    d.ndim = 1;
    d.shape[0] = 4;
    d.strides[0] = 1;
    d.offset = (uint64_t)i * 16;
    st__pack_tensor(&pk, &d);
  }
  msgpack_pack_str(&pk, 6);
  msgpack_pack_str_body(&pk, "arenas", 6);
  mpbuf_t e;
  mpbuf_text(&e, "[{fd: 0, bytes: %llu, device: 'cpu', backend: 'memfd', id: 1}]",
             (unsigned long long)(((size_t)live_tensors * 16 + 4095) / 4096 * 4096));
  msgpack_sbuffer_write(&sb, e.sb.data, e.sb.size);
  mpbuf_free(&e);
  int rc = stt_send_fds(a->fd, sb.data, sb.size, &live_fd, 1);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

static int send_takeover(rc_t *a, int round) { return send_live_put(a, 10 + round); }

/* ------------------------------------------------------------ main */

int main(int argc, char **argv) {
  int tensors = -1, rounds = 10;
  const char *mode = "view";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tensors")) tensors = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
  }
  int takeover = !strcmp(mode, "takeover") || !strcmp(mode, "put");
  put_live = strcmp(mode, "put") != 0;
  if (!takeover && strcmp(mode, "view")) {
    fprintf(stderr, "--mode view|takeover|put\n");
    return 2;
  }
  if (tensors < 0) tensors = takeover ? 6000 : 3000;
  bk_setup();
  stt_server_t s;
  stt_server_init(&s);
  bk_server_config(&s, -1);
  char ep[600];
  snprintf(ep, sizeof ep,
           "return st.endpoint{ name = 'wide', cache = true,\n"
           "  build = function()\n"
           "    local t, inner = st.arange{4}, {}\n"
           "    for i = 1, %d do inner[string.format('%%06d', i)] = t end\n"
           "    return { [string.rep('a', 1990)] = inner }\n"
           "  end }\n", takeover ? 1 : tensors);
  stt_write_endpoint(&s, "wide.lua", ep);
  if (stt_server_start(&s) != 0) return 1;
  rc_t a, b, p;
  if (rc_open(&a, s.socket) != 0 || rc_open(&b, s.socket) != 0 || rc_open(&p, s.socket) != 0)
    return 1;
  msg_t m;
  if (takeover) {
    /* The key, put by p (which stays connected). */
    live_tensors = tensors;
    live_fd = rc_memfd_with(((size_t)tensors * 16 + 4095) / 4096 * 4096, 1.0, 0);
    if (live_fd < 0 || send_live_put(&p, 1) != 0 || rc_next(&p, &m, 60000) != 1 || m.error) {
      fprintf(stderr, "the first put failed\n");
      return 1;
    }
    msg_free(&m);
  } else {
    size_t n = 0;
    for (int d = 0; d < 10; d++) {
      n += (size_t)snprintf(view_spec + n, sizeof view_spec - n, "%s", d ? ";" : "");
      for (int k = 0; k < 120; k++) n += (size_t)snprintf(view_spec + n, sizeof view_spec - n, "*a");
      n += (size_t)snprintf(view_spec + n, sizeof view_spec - n, "*%d:narrow(0,0,1)", d);
    }
    /* The build, once (cached): the rounds time the view alone. */
    if (rc_rpcf(&a, &m, "[0, 1, 'call', [{endpoint: 'wide', args: {}}]]") != 1 || m.error)
      return 1;
    msg_free(&m);
    rc_drop_fds(&a);
  }
  size_t cap = 1 << 20;
  double *ping = malloc(cap * sizeof *ping), *req = malloc((size_t)rounds * sizeof *req);
  long np = rounds_with_pings(&a, &b, rounds, takeover ? send_takeover : send_view, req, ping,
                              cap);
  if (np < 0) return 1;
  if (takeover && put_live)
    printf("live key takeover: a live put of %d tensors into a live key of them\n", tensors);
  else if (takeover)
    printf("put: a new version of %d tensors (one memfd arena) each time\n", tensors);
  else
    printf("worst view: %d tensors of 1997-byte names, 10 rules of 243-byte globs\n", tensors);
  printf("pings answered during the requests: %ld (%.1f per request)\n", np, (double)np / rounds);
  bk_report(!takeover ? "view (us)" : put_live ? "takeover (us)" : "put (us)", req, rounds);
  bk_report("another connection's ping during it (us)", ping, (int)np);
  if (takeover) {
    int64_t moved = rc_info_int(&b, "counters.puts_on_workers");
    printf("counters.puts_on_workers: %lld\n", (long long)moved);
  }
  rc_close(&a);
  rc_close(&b);
  rc_close(&p);
  if (live_fd >= 0) close(live_fd);
  int rc = stt_server_stop(&s);
  stt_server_cleanup(&s);
  return rc;
}
