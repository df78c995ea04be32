/* A put's per-tensor work never holds the loop thread (docs/views.md,
 * "What runs where"; src/server/put_job.h): a live key's take-over with
 * the most tensors max_message_bytes allows is checked on a worker (the
 * `puts_on_workers` counter moves) while another connection's ping is
 * answered before the put's reply, and the reply is the one the loop
 * would have given. Over the worker too: a take-over that recovers a torn
 * key (readers see the next version), a take-over whose tensor differs
 * (INVALID_ARGUMENT, the publisher stays), a plain put's adoption, and a
 * key deleted while its take-over is checked (the put then makes the key
 * again). A small put stays on the loop. Frames of 1 MiB or more are
 * decoded a slice per loop turn (counters.sliced_decodes), and the
 * requests after them are answered. */
#include <signal.h>
#include <sys/mman.h>

#include "check.h"
#include "shm/key_page.h"
#include "wire.h"

static stt_server_t S;

/* Names of 4 characters: tensor i of a value. */
static void name_of(int i, char out[5]) {
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._";
  for (int k = 3; k >= 0; k--, i /= 64) out[k] = abc[i % 64];
  out[4] = '\0';
}

static void pack_str(msgpack_packer *pk, const char *s) {
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* The frame of put {key, live?, value: n float32 [1] tensors at offset 0
 * of arena 0 (tensor `odd`, when >= 0, of shape [2]), arenas: [one memfd
 * of 4096 bytes]} into sb. */
static void put_frame(msgpack_sbuffer *sb, uint32_t id, const char *key, int live, int n, int odd) {
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, 0);
  msgpack_pack_uint32(&pk, id);
  pack_str(&pk, "put");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 3 + (uint32_t)live);
  pack_str(&pk, "key");
  pack_str(&pk, key);
  if (live) {
    pack_str(&pk, "live");
    msgpack_pack_true(&pk);
  }
  pack_str(&pk, "arenas");
  mpbuf_t e;
  mpbuf_text(&e, "[{fd: 0, bytes: 4096, device: 'cpu', backend: 'memfd', id: 1}]");
  msgpack_sbuffer_write(sb, e.sb.data, e.sb.size);
  mpbuf_free(&e);
  pack_str(&pk, "value");
  /* map32 whatever n, so that the frame grows by the same bytes per tensor */
  unsigned char head[5] = {0xdf, (unsigned char)(n >> 24), (unsigned char)(n >> 16),
                           (unsigned char)(n >> 8), (unsigned char)n};
  msgpack_sbuffer_write(sb, (const char *)head, sizeof head);
  for (int i = 0; i < n; i++) {
    char name[5];
    name_of(i, name);
    pack_str(&pk, name);
    st__tensor_desc_t d;
    memset(&d, 0, sizeof d);
    d.dtype = ST_DTYPE_FLOAT32;
    d.ndim = 1;
    d.shape[0] = i == odd ? 2 : 1;
    d.strides[0] = 1;
    st__pack_tensor(&pk, &d);
  }
}

/* Sends that put on c with a fresh memfd. 0 or -1. */
static int send_put(rc_t *c, uint32_t id, const char *key, int live, int n, int odd) {
  msgpack_sbuffer sb;
  put_frame(&sb, id, key, live, n, odd);
  int fd = rc_memfd_with(4096, 1.0, 0);
  int rc = fd >= 0 ? stt_send_fds(c->fd, sb.data, sb.size, &fd, 1) : -1;
  if (fd >= 0) close(fd);
  msgpack_sbuffer_destroy(&sb);
  return rc;
}

/* The most tensors a put frame of this shape may carry under
 * max_message_bytes. */
static int most_tensors(rc_t *c) {
  int64_t max = rc_info_int(c, "limits.max_message_bytes");
  msgpack_sbuffer a, b;
  put_frame(&a, 1, "big", 1, 1, -1);
  put_frame(&b, 1, "big", 1, 2, -1);
  size_t per = b.size - a.size, base = a.size - per;
  msgpack_sbuffer_destroy(&a);
  msgpack_sbuffer_destroy(&b);
  if (max <= 0) return -1;
  return (int)(((size_t)max - base) / per);
}

static int64_t puts_on_workers(rc_t *c) { return rc_info_int(c, "counters.puts_on_workers"); }

/* The reply to request id on c (60 s at most); 1 when it came. */
static int reply_of(rc_t *c, msg_t *m) { return rc_next(c, m, 60000) == 1; }

TEST(the_largest_takeover_runs_on_a_worker) {
  OPEN_RC(p, S.socket);
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  int n = most_tensors(&b);
  CHECK(n > 100000);
  int64_t before = puts_on_workers(&b);
  int64_t sliced = rc_info_int(&b, "counters.sliced_decodes");
  CHECK(before >= 0 && sliced >= 0);
  if (n <= 0 || before < 0) return;
  /* The key, put live by p: its adoption goes to a worker too. */
  msg_t m;
  CHECK(send_put(&p, 1, "big", 1, n, -1) == 0);
  CHECK(reply_of(&p, &m) && !m.error);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), 1);
  msg_free(&m);
  CHECK_EQ_INT(puts_on_workers(&b), before + 1);
  /* a takes it over; the loop answers b meanwhile. */
  CHECK(send_put(&a, 2, "big", 1, n, -1) == 0);
  CHECK(rc_wait_info(&b, "counters.puts_on_workers", before + 2, 60000) == 0);
  CHECK(rc_rpcf(&b, &m, "[0, 100, 'ping', []]") == 1 && !m.error);
  msg_free(&m);
  CHECK(rc_read(&a, 0) == 0);   /* nothing from a yet */
  CHECK(reply_of(&a, &m) && !m.error);
  /* Both frames (about 14 MiB each) were decoded a slice per loop turn. */
  CHECK_EQ_INT(rc_info_int(&b, "counters.sliced_decodes"), sliced + 2);
  if (m.result) {
    CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), 1);
    CHECK(obj_get(m.result, "taken") && obj_get(m.result, "taken")->via.boolean);
    CHECK(obj_get(m.result, "live") && obj_get(m.result, "live")->via.boolean);
  }
  msg_free(&m);
  /* p was the publisher: a publisher's get is writable, anyone else's is
   * read-only. */
  CHECK(rc_rpcf(&b, &m, "[0, 101, 'keys', [{prefix: 'big'}]]") == 1 && !m.error);
  if (m.result && m.result->type == MSGPACK_OBJECT_ARRAY && m.result->via.array.size == 1)
    CHECK(strcmp(obj_str(obj_get(&m.result->via.array.ptr[0], "state")), "live") == 0);
  msg_free(&m);
  /* The key deleted while a's next take-over is checked: the put then
   * makes it again (an adoption, on a worker again), a its publisher. */
  CHECK(send_put(&a, 3, "big", 1, n, -1) == 0);
  CHECK(rc_wait_info(&b, "counters.puts_on_workers", before + 3, 60000) == 0);
  CHECK(rc_rpcf(&p, &m, "[0, 4, 'delete', [{key: 'big'}]]") == 1 && !m.error);
  msg_free(&m);
  CHECK(reply_of(&a, &m) && !m.error);
  if (m.result) {
    CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), 1);
    CHECK(!obj_get(m.result, "taken"));
  }
  msg_free(&m);
  CHECK_EQ_INT(puts_on_workers(&b), before + 4);
  CHECK(rc_rpcf(&b, &m, "[0, 102, 'delete', [{key: 'big'}]]") == 1 && !m.error);
  msg_free(&m);
  rc_close(&p);
  rc_close(&a);
  rc_close(&b);
}

/* The page of live key `key` from a get on c (its last arena), mapped
 * read-write (c publishes it), or NULL. */
static st__key_page_t *page_of(rc_t *c, uint32_t id, const char *key) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, %u, 'get', [{key: '%s'}]]", id, key) != 1 || m.error || c->nfds < 2) {
    if (m.error) fprintf(stderr, "get: %s\n", msg_errmsg(&m));
    msg_free(&m);
    return NULL;
  }
  const msgpack_object *live = obj_get(m.result, "live");
  int publisher = live && obj_get(live, "publisher") && obj_get(live, "publisher")->via.boolean;
  msg_free(&m);
  void *p = publisher ? mmap(NULL, ST__KEY_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED,
                             c->fds[c->nfds - 1], 0)
                      : MAP_FAILED;
  rc_drop_fds(c);
  return p == MAP_FAILED ? NULL : p;
}

/* A get on c: its error (ST_ERR_*; ST_OK: a result) and version. */
static int get_code(rc_t *c, uint32_t id, const char *key, int64_t *version) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, %u, 'get', [{key: '%s', readonly: true}]]", id, key) != 1) return -1;
  int code = -msg_code(&m);   /* ST_ERR_* */
  if (!m.error && version) *version = obj_int(obj_get(m.result, "version"));
  msg_free(&m);
  rc_drop_fds(c);
  return code;
}

TEST(a_torn_key_recovers_through_a_takeover_on_a_worker) {
  OPEN_RC(p, S.socket);
  OPEN_RC(a, S.socket);
  OPEN_RC(reader, S.socket);
  const int n = 2000;   /* past ST__PUT_LOOP_OBJECTS */
  int64_t before = puts_on_workers(&reader);
  msg_t m;
  CHECK(send_put(&p, 1, "torn", 1, n, -1) == 0);
  CHECK(reply_of(&p, &m) && !m.error);
  msg_free(&m);
  /* p leaves in the middle of an update: the key is torn. */
  st__key_page_t *pg = page_of(&p, 2, "torn");
  CHECK(pg != NULL);
  if (!pg) return;
  st__key_page_begin(pg);
  munmap(pg, ST__KEY_PAGE_BYTES);
  rc_close(&p);
  int64_t v = 0;
  double end = stt_now_ms() + 5000;
  while (get_code(&reader, 3, "torn", &v) != ST_ERR_STALE_HANDLE && stt_now_ms() < end)
    stt_sleep_ms(5);
  CHECK_EQ_INT(get_code(&reader, 4, "torn", &v), ST_ERR_STALE_HANDLE);
  /* A take-over whose tensor 7 differs: INVALID_ARGUMENT naming it,
   * nothing changes. */
  CHECK(send_put(&a, 5, "torn", 1, n, 7) == 0);
  CHECK(reply_of(&a, &m) && -msg_code(&m) == ST_ERR_INVALID_ARGUMENT);
  if (m.error) CHECK(strstr(msg_errmsg(&m), "tensor 'AAAH'") != NULL);
  msg_free(&m);
  CHECK_EQ_INT(get_code(&reader, 6, "torn", &v), ST_ERR_STALE_HANDLE);
  /* The matching take-over: a publishes, its update clears TORN, and the
   * reader sees the next version. */
  CHECK(send_put(&a, 7, "torn", 1, n, -1) == 0);
  CHECK(reply_of(&a, &m) && !m.error);
  if (m.result) {
    CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), 1);
    CHECK(obj_get(m.result, "taken") != NULL);
  }
  msg_free(&m);
  CHECK_EQ_INT(puts_on_workers(&reader), before + 3);
  pg = page_of(&a, 8, "torn");
  CHECK(pg != NULL);
  if (pg) {
    CHECK(atomic_load(&pg->flags) & ST__KEY_TORN);
    st__key_page_end(pg, st__key_page_begin(pg));
    CHECK(!(atomic_load(&pg->flags) & ST__KEY_TORN));
    munmap(pg, ST__KEY_PAGE_BYTES);
  }
  CHECK_EQ_INT(get_code(&reader, 9, "torn", &v), 0);
  CHECK_EQ_INT(v, 2);
  rc_close(&a);
  rc_close(&reader);
}

TEST(a_plain_put_adopts_on_a_worker) {
  OPEN_RC(c, S.socket);
  int64_t before = puts_on_workers(&c);
  msg_t m;
  for (int k = 1; k <= 2; k++) {
    CHECK(send_put(&c, (uint32_t)k, "plain", 0, 2000, -1) == 0);
    CHECK(reply_of(&c, &m) && !m.error);
    if (m.result) CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), k);
    msg_free(&m);
  }
  CHECK_EQ_INT(puts_on_workers(&c), before + 2);
  CHECK(rc_rpcf(&c, &m, "[0, 3, 'get', [{key: 'plain'}]]") == 1 && !m.error);
  if (m.result) {
    const msgpack_object *value = obj_get(m.result, "value");
    CHECK(value && value->type == MSGPACK_OBJECT_MAP && value->via.map.size == 2000);
    CHECK_EQ_INT(obj_int(obj_get(m.result, "version")), 2);
  }
  msg_free(&m);
  rc_drop_fds(&c);
  rc_close(&c);
}

TEST(a_small_put_stays_on_the_loop) {
  OPEN_RC(c, S.socket);
  int64_t before = puts_on_workers(&c);
  msg_t m;
  CHECK(send_put(&c, 1, "small", 1, 100, -1) == 0);
  CHECK(reply_of(&c, &m) && !m.error);
  msg_free(&m);
  CHECK(send_put(&c, 2, "small", 1, 100, -1) == 0);
  CHECK(reply_of(&c, &m) && !m.error);
  if (m.result) CHECK(obj_get(m.result, "taken") != NULL);
  msg_free(&m);
  CHECK_EQ_INT(puts_on_workers(&c), before);
  rc_close(&c);
}

/* A large frame and a small one in one write on one connection: the
 * large one is decoded in slices (sliced_decodes moves), its value comes
 * back whole, and the small one after it is answered too. */
TEST(a_large_frame_is_decoded_in_slices) {
  OPEN_RC(a, S.socket);
  OPEN_RC(b, S.socket);
  int64_t sliced = rc_info_int(&b, "counters.sliced_decodes");
  enum { N = 3000000 };   /* small integers: about 3 MiB, 3 M objects */
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  msgpack_packer pk;
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, 0);
  msgpack_pack_uint32(&pk, 1);
  pack_str(&pk, "put");
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 2);
  pack_str(&pk, "key");
  pack_str(&pk, "dense");
  pack_str(&pk, "value");
  msgpack_pack_array(&pk, N);
  for (int i = 0; i < N; i++) msgpack_pack_int(&pk, i % 100);
  mpbuf_t ping;
  mpbuf_text(&ping, "[0, 2, 'ping', []]");
  msgpack_sbuffer_write(&sb, ping.sb.data, ping.sb.size);
  mpbuf_free(&ping);
  CHECK(rc_send(&a, sb.data, sb.size) == 0);
  msgpack_sbuffer_destroy(&sb);
  /* Both answered (the put on a worker: its reply may come second). */
  msg_t m;
  unsigned seen = 0;
  for (int k = 0; k < 2; k++) {
    CHECK(reply_of(&a, &m) && !m.error && (m.id == 1 || m.id == 2));
    if (m.error) fprintf(stderr, "   reply %u: %s\n", m.id, msg_errmsg(&m));
    seen |= 1u << m.id;
    msg_free(&m);
  }
  CHECK_EQ_INT(seen, 6);
  CHECK_EQ_INT(rc_info_int(&b, "counters.sliced_decodes"), sliced + 1);
  CHECK(rc_rpcf(&b, &m, "[0, 3, 'get', [{key: 'dense'}]]") == 1 && !m.error);
  const msgpack_object *v = m.result ? obj_get(m.result, "value") : NULL;
  CHECK(v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == N);
  if (v && v->type == MSGPACK_OBJECT_ARRAY && v->via.array.size == N)
    for (int i = 0; i < N; i += 99991) CHECK_EQ_INT(v->via.array.ptr[i].via.u64, i % 100);
  msg_free(&m);
  CHECK(rc_rpcf(&b, &m, "[0, 4, 'delete', [{key: 'dense'}]]") == 1 && !m.error);
  msg_free(&m);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  stt_server_setup(&S, "workers = 2,", NULL);
  RUN(the_largest_takeover_runs_on_a_worker);
  RUN(a_torn_key_recovers_through_a_takeover_on_a_worker);
  RUN(a_plain_put_adopts_on_a_worker);
  RUN(a_small_put_stays_on_the_loop);
  RUN(a_large_frame_is_decoded_in_slices);
  return stt_server_finish(&S);
}
