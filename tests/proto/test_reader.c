/* The frame reader (src/proto/reader.c): message shapes, byte-at-a-time
 * framing, refusal of garbage and of oversized frames before they are
 * buffered. */
#include "check.h"
#include "mpbuf.h"
#include "proto/proto.h"

static char why[256];
static char first_why[256];   /* reason of expect_fail's first failure */

/* Packs a request [0, id, method, [{"n": n}]] into sb. */
static void pack_req(msgpack_sbuffer *sb, uint32_t id, const char *method, int n) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  st__pack_request_head(&pk, id, method);
  msgpack_pack_array(&pk, 1);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "n");
  msgpack_pack_int(&pk, n);
}

/* Three messages: a request, a response and a notification. */
static void pack_three(msgpack_sbuffer *sb) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  pack_req(sb, 11, "call", -5);
  st__pack_response_head(&pk, 12);
  msgpack_pack_map(&pk, 1);
  st__pack_cstr(&pk, "value");
  msgpack_pack_bin(&pk, 3);
  msgpack_pack_bin_body(&pk, "\x00\x01\x02", 3);
  st__pack_notification_head(&pk, "note");
  msgpack_pack_array(&pk, 0);
}

static int method_is(const st__message_t *m, const char *s) {
  return m->method_len == strlen(s) && memcmp(m->method, s, m->method_len) == 0;
}

/* Checks that msgs[0..3) are the three of pack_three. */
static int three_ok(st__message_t *m) {
  if (m[0].type != ST_MSG_REQUEST || m[0].id != 11 || !method_is(&m[0], "call")) return 0;
  const msgpack_object *p = &m[0].params;
  if (p->type != MSGPACK_OBJECT_ARRAY || p->via.array.size != 1) return 0;
  const msgpack_object *n = st__map_get(&p->via.array.ptr[0], "n");
  if (!n || n->type != MSGPACK_OBJECT_NEGATIVE_INTEGER || n->via.i64 != -5) return 0;
  if (m[1].type != ST_MSG_RESPONSE || m[1].id != 12 || m[1].error.type != MSGPACK_OBJECT_NIL)
    return 0;
  const msgpack_object *v = st__map_get(&m[1].result, "value");
  if (!v || v->type != MSGPACK_OBJECT_BIN || v->via.bin.size != 3 ||
      memcmp(v->via.bin.ptr, "\x00\x01\x02", 3) != 0)
    return 0;
  if (m[2].type != ST_MSG_NOTIFICATION || !method_is(&m[2], "note") ||
      m[2].params.type != MSGPACK_OBJECT_ARRAY || m[2].params.via.array.size != 0)
    return 0;
  return 1;
}

/* After the bytes of pack_three: n is 3, m holds the three messages
 * (three_ok) and r nothing more. Destroys the messages and r. A check:
 * fails the test. */
static void check_three_then_destroy(st__reader_t *r, st__message_t *m, int n) {
  CHECK_EQ_INT(n, 3);
  CHECK(three_ok(m));
  CHECK_EQ_INT(st__reader_pending(r), 0);
  for (int i = 0; i < n; i++) st__message_destroy(&m[i]);
  st__reader_destroy(r);
}

/* Takes every complete message into m[*n...]. Returns the last rc. */
static int drain(st__reader_t *r, st__message_t *m, int *n, int max) {
  for (;;) {
    st__message_t x;
    int rc = st__reader_next(r, &x, why, sizeof why);
    if (rc != 1) return rc;
    if (*n < max) m[(*n)++] = x;
    else st__message_destroy(&x);
  }
}

TEST(each_message_type) {
  st__reader_t r;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  mpbuf_t mb;
  mpbuf_init(&mb);
  st__pack_request_head(&mb.pk, 7, "ping");
  msgpack_pack_array(&mb.pk, 0);
  st__pack_response_head(&mb.pk, 7);
  st__pack_cstr(&mb.pk, "pong");
  st__pack_error_response(&mb.pk, 0xffffffffu, ST_ERR_LIMIT, "too big");
  st__pack_notification_head(&mb.pk, "n");
  msgpack_pack_array(&mb.pk, 1);
  msgpack_pack_map(&mb.pk, 0);
  CHECK_ERR(st__reader_feed(&r, mb.sb.data, mb.sb.size), ST_OK);
  mpbuf_free(&mb);

  st__message_t m;
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.type, ST_MSG_REQUEST);
  CHECK_EQ_INT(m.id, 7);
  CHECK(method_is(&m, "ping"));
  CHECK_EQ_INT(m.params.via.array.size, 0);
  st__message_destroy(&m);

  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.type, ST_MSG_RESPONSE);
  CHECK_EQ_INT(m.id, 7);
  CHECK_EQ_INT(m.error.type, MSGPACK_OBJECT_NIL);
  CHECK(st__str_eq(&m.result, "pong"));
  st__message_destroy(&m);

  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.type, ST_MSG_RESPONSE);
  CHECK_EQ_INT(m.id, 0xffffffffu);
  CHECK_EQ_INT(m.error.type, MSGPACK_OBJECT_MAP);
  const msgpack_object *code = st__map_get(&m.error, "code");
  CHECK(code && code->type == MSGPACK_OBJECT_POSITIVE_INTEGER && code->via.u64 == 9);
  CHECK(st__str_eq(st__map_get(&m.error, "name"), "LIMIT"));
  CHECK(st__str_eq(st__map_get(&m.error, "message"), "too big"));
  CHECK_EQ_INT(m.result.type, MSGPACK_OBJECT_NIL);
  st__message_destroy(&m);

  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.type, ST_MSG_NOTIFICATION);
  CHECK(method_is(&m, "n"));
  CHECK_EQ_INT(m.params.via.array.size, 1);
  st__message_destroy(&m);

  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 0);
  CHECK_EQ_INT(st__reader_pending(&r), 0);
  st__message_destroy(&m);   /* harmless on an empty message */
  st__reader_destroy(&r);
}

TEST(split_at_every_byte) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  pack_three(&sb);
  for (size_t k = 0; k <= sb.size; k++) {
    st__reader_t r;
    st__message_t m[4];
    int n = 0;
    CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
    /* First part through reserve/commit, second through feed. */
    char *buf;
    size_t cap;
    CHECK_ERR(st__reader_reserve(&r, k, &buf, &cap), ST_OK);
    CHECK(cap >= k);
    memcpy(buf, sb.data, k);
    st__reader_commit(&r, k);
    CHECK_EQ_INT(drain(&r, m, &n, 4), 0);
    CHECK_ERR(st__reader_feed(&r, sb.data + k, sb.size - k), ST_OK);
    CHECK_EQ_INT(drain(&r, m, &n, 4), 0);
    check_three_then_destroy(&r, m, n);
    if (stt_failed_now) return;
  }
  msgpack_sbuffer_destroy(&sb);
}

TEST(one_byte_at_a_time_and_pending) {
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  pack_three(&sb);
  /* Message boundaries, to know what pending() must say. */
  msgpack_sbuffer one;
  msgpack_sbuffer_init(&one);
  pack_req(&one, 11, "call", -5);
  size_t first = one.size;
  msgpack_sbuffer_destroy(&one);

  st__reader_t r;
  st__message_t m[4];
  int n = 0;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  for (size_t i = 0; i < sb.size; i++) {
    CHECK_ERR(st__reader_feed(&r, sb.data + i, 1), ST_OK);
    CHECK_EQ_INT(drain(&r, m, &n, 4), 0);
    if (i + 1 < first) {
      CHECK_EQ_INT(n, 0);
      CHECK_EQ_INT(st__reader_pending(&r), i + 1);   /* a half frame */
    }
    if (i + 1 == first) {
      CHECK_EQ_INT(n, 1);
      CHECK_EQ_INT(st__reader_pending(&r), 0);
    }
  }
  check_three_then_destroy(&r, m, n);
  msgpack_sbuffer_destroy(&sb);
}

/* Feeds bytes, expects rc from the first next() and again (sticky). */
static int expect_fail(const void *bytes, size_t n, int rc, uint32_t id) {
  st__reader_t r;
  st__message_t m;
  if (st__reader_init(&r, 1 << 20) != ST_OK) return 0;
  st__reader_feed(&r, bytes, n);
  int got = st__reader_next(&r, &m, why, sizeof why);
  int ok = got == rc && m.type == -1 && m.id == id && why[0] != '\0';
  snprintf(first_why, sizeof first_why, "%s", why);
  if (!ok) fprintf(stderr, "rc %d (want %d) type %d id %u (want %u): %s\n", got, rc, m.type,
                   m.id, id, why);
  st__message_destroy(&m);
  st__reader_feed(&r, "\x90", 1);
  ok = ok && st__reader_next(&r, &m, why, sizeof why) == rc;   /* stays failed */
  st__reader_destroy(&r);
  return ok;
}

TEST(garbage_is_protocol) {
  CHECK(expect_fail("\xc1", 1, ST_ERR_PROTOCOL, 0));
  CHECK(expect_fail("\x94\x00\x05\xc1", 4, ST_ERR_PROTOCOL, 5));   /* id readable */
  CHECK(expect_fail("\x94\x00\xc1", 3, ST_ERR_PROTOCOL, 0));
  /* A good message before the garbage is still delivered. */
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  st__reader_feed(&r, "\x94\x00\x01\xa1x\x90\xc1\x94", 8);
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.id, 1);
  st__message_destroy(&m);
  CHECK_ERR_MSG(st__reader_next(&r, &m, why, sizeof why), ST_ERR_PROTOCOL, why);
  CHECK_CONTAINS(why, "msgpack");
  st__reader_destroy(&r);
}

TEST(bad_shapes_are_protocol) {
  CHECK(expect_fail("\x05", 1, ST_ERR_PROTOCOL, 0));                   /* 5 */
  CHECK(expect_fail("\xa3" "abc", 4, ST_ERR_PROTOCOL, 0));             /* "abc" */
  CHECK(expect_fail("\x80", 1, ST_ERR_PROTOCOL, 0));                   /* {} */
  CHECK(expect_fail("\x90", 1, ST_ERR_PROTOCOL, 0));                   /* [] */
  CHECK(expect_fail("\x91\xa1x", 3, ST_ERR_PROTOCOL, 0));              /* ["x"] */
  CHECK(expect_fail("\x94\x03\x09\xa1m\x90", 6, ST_ERR_PROTOCOL, 0));  /* type 3 */
  CHECK(expect_fail("\x94\xff\x09\xa1m\x90", 6, ST_ERR_PROTOCOL, 0));  /* type -1 */
  CHECK(expect_fail("\x93\x00\x09\xa1m", 5, ST_ERR_PROTOCOL, 9));      /* short request */
  CHECK(expect_fail("\x95\x00\x09\xa1m\x90\xc0", 7, ST_ERR_PROTOCOL, 9));  /* long */
  CHECK(expect_fail("\x94\x00\xff\xa1m\x90", 6, ST_ERR_PROTOCOL, 0));  /* id -1 */
  CHECK(expect_fail("\x94\x00\xcf\x00\x00\x00\x01\x00\x00\x00\x00\xa1m\x90", 14,
                    ST_ERR_PROTOCOL, 0));                                /* id 2^32 */
  CHECK(expect_fail("\x94\x00\xa1x\xa1m\x90", 7, ST_ERR_PROTOCOL, 0)); /* id "x" */
  CHECK(expect_fail("\x94\x00\x05\x07\x90", 5, ST_ERR_PROTOCOL, 5));   /* method 7 */
  CHECK(expect_fail("\x94\x00\x05\xc4\x01m\x90", 7, ST_ERR_PROTOCOL, 5));  /* method bin */
  CHECK(expect_fail("\x94\x00\x05\xa1m\x80", 6, ST_ERR_PROTOCOL, 5));  /* params {} */
  CHECK(expect_fail("\x94\x00\x05\xa1m\xc0", 6, ST_ERR_PROTOCOL, 5));  /* params nil */
  CHECK(expect_fail("\x94\x01\x06\xa3" "err\xc0", 8, ST_ERR_PROTOCOL, 6));  /* error str */
  CHECK(expect_fail("\x94\x01\x06\x90\xc0", 5, ST_ERR_PROTOCOL, 6));   /* error [] */
  CHECK(expect_fail("\x93\x01\x06\xc0", 4, ST_ERR_PROTOCOL, 6));       /* short response */
  CHECK(expect_fail("\x93\x02\x05\x90", 4, ST_ERR_PROTOCOL, 0));       /* notif method 5 */
  CHECK(expect_fail("\x93\x02\xa1m\x80", 5, ST_ERR_PROTOCOL, 0));      /* notif params {} */
  CHECK(expect_fail("\x94\x02\xa1m\x90\xc0", 6, ST_ERR_PROTOCOL, 0));  /* long notif */
  /* A response with a map error is fine. */
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  st__reader_feed(&r, "\x94\x01\x06\x80\xc0", 5);
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(m.error.type, MSGPACK_OBJECT_MAP);
  st__message_destroy(&m);
  st__reader_destroy(&r);
}

/* Request [0, id, "m", [<nest> levels of [..[1]..]]]: the envelope holds 2
 * open containers, so nest 30 reaches msgpack's limit of 32. */
static size_t pack_nested(unsigned char *b, int nest) {
  size_t n = 0;
  b[n++] = 0x94; b[n++] = 0x00; b[n++] = 0x21; b[n++] = 0xa1; b[n++] = 'm'; b[n++] = 0x91;
  for (int i = 0; i < nest; i++) b[n++] = 0x91;
  b[n++] = 0x01;
  return n;
}

TEST(nesting_limit) {
  unsigned char b[64];
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  st__reader_feed(&r, b, pack_nested(b, 30));
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  st__message_destroy(&m);
  st__reader_destroy(&r);
  CHECK(expect_fail(b, pack_nested(b, 31), ST_ERR_PROTOCOL, 0x21));
  CHECK_CONTAINS(first_why, "deep");
}

TEST(limit_on_declared_size) {
  /* [0, 3, "call", [<str32 header announcing 1 GiB>...]]: refused on the
   * header, before any payload is buffered. */
  const unsigned char head[] = {0x94, 0x00, 0x03, 0xa4, 'c', 'a', 'l', 'l', 0x91,
                                0xdb, 0x40, 0x00, 0x00, 0x00};
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  st__reader_feed(&r, head, sizeof head - 1);
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 0);
  st__reader_feed(&r, head + sizeof head - 1, 1);
  CHECK_ERR_MSG(st__reader_next(&r, &m, why, sizeof why), ST_ERR_LIMIT, why);
  CHECK_EQ_INT(m.id, 3);
  CHECK_CONTAINS(why, "limit");
  /* Slow bytes that follow are dropped, not buffered. */
  char junk[4096];
  memset(junk, 'x', sizeof junk);
  for (int i = 0; i < 1024; i++) st__reader_feed(&r, junk, sizeof junk);
  CHECK(r.up.used + r.up.free < (64u << 10));
  CHECK_ERR_MSG(st__reader_next(&r, &m, why, sizeof why), ST_ERR_LIMIT, why);
  st__reader_destroy(&r);

  /* An array32 announcing 2^32-1 elements: 5 bytes, refused at once (msgpack
   * itself would try to allocate ~100 GB for it). */
  CHECK(expect_fail("\xdd\xff\xff\xff\xff", 5, ST_ERR_LIMIT, 0));
  CHECK(expect_fail("\xdf\xff\xff\xff\xff", 5, ST_ERR_LIMIT, 0));
  CHECK(expect_fail("\x94\x00\x08\xa1m\x91\xc6\x7f\xff\xff\xff", 11, ST_ERR_LIMIT, 8));
}

/* The process's address space (VmSize), in bytes. */
static uint64_t vm_size(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %llu kB", &kb) == 1) break;
  if (f) fclose(f);
  return (uint64_t)kb << 10;
}

TEST(no_room_set_aside_for_a_half_sent_frame) {
  /* [0, 5, "call", [<array32 announcing 16M elements>...]] within a 64 MiB
   * limit: until the elements arrive, the reader holds the 14 bytes, not
   * the ~400 MB msgpack sets aside for 16M decoded elements. */
  const unsigned char head[] = {0x94, 0x00, 0x05, 0xa4, 'c', 'a', 'l', 'l', 0x91,
                                0xdd, 0x01, 0x00, 0x00, 0x00};
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 64u << 20), ST_OK);
  uint64_t before = vm_size();
  st__reader_feed(&r, head, sizeof head);
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 0);
  uint64_t after = vm_size();
  CHECK(after < before + (64u << 20));
  CHECK_EQ_INT(st__reader_pending(&r), sizeof head);
  st__reader_destroy(&r);
}

TEST(limit_on_a_split_header) {
  /* [0, 1, "callcallcall", [<uint64>]] is 26 bytes; under a 20-byte limit
   * the uint64's header passes it: refused on its first bytes, not once
   * all 9 are buffered. */
  const unsigned char msg[] = {0x94, 0x00, 0x01, 0xac, 'c', 'a', 'l', 'l', 'c', 'a', 'l', 'l', 'c',
                               'a', 'l', 'l', 0x91, 0xcf, 1, 2, 3, 4, 5, 6, 7, 8};
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 20), ST_OK);
  st__reader_feed(&r, msg, 22);
  CHECK_ERR_MSG(st__reader_next(&r, &m, why, sizeof why), ST_ERR_LIMIT, why);
  CHECK_EQ_INT(m.id, 1);
  CHECK(st__reader_pending(&r) <= 20);
  st__reader_destroy(&r);
}

TEST(limit_on_buffered_bytes) {
  /* [0, 4, "m", [15 strings of 1000 bytes]]: the announced size grows with
   * each string; the frame is refused before max_message bytes arrive. */
  const size_t max = 4096;
  mpbuf_t mb;
  mpbuf_init(&mb);
  st__pack_request_head(&mb.pk, 4, "m");
  msgpack_pack_array(&mb.pk, 1);
  msgpack_pack_array(&mb.pk, 15);
  char s[1000];
  memset(s, 'a', sizeof s);
  for (int i = 0; i < 15; i++) {
    msgpack_pack_str(&mb.pk, sizeof s);
    msgpack_pack_str_body(&mb.pk, s, sizeof s);
  }
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, max), ST_OK);
  size_t fed = 0;
  int rc = 0;
  while (fed < mb.sb.size && rc == 0) {
    st__reader_feed(&r, mb.sb.data + fed, 7);
    fed += 7;
    rc = st__reader_next(&r, &m, why, sizeof why);
    if (rc == 0) CHECK(st__reader_pending(&r) <= max);
  }
  CHECK_ERR(rc, ST_ERR_LIMIT);
  CHECK_EQ_INT(m.id, 4);
  CHECK(fed <= max);
  st__reader_destroy(&r);
  mpbuf_free(&mb);
}

TEST(limit_boundary) {
  /* [0, 1, "m", [bin of k bytes]] with the whole frame exactly max bytes
   * passes; one byte more fails, even when it all arrives at once. */
  for (int extra = 0; extra <= 1; extra++) {
    const size_t max = 1000;
    size_t k = max - 9 + (size_t)extra;   /* 9 = envelope + bin16 header */
    mpbuf_t mb;
    mpbuf_init(&mb);
    st__pack_request_head(&mb.pk, 1, "m");
    msgpack_pack_array(&mb.pk, 1);
    msgpack_pack_bin(&mb.pk, k);
    char body[1000] = {0};
    msgpack_pack_bin_body(&mb.pk, body, k);
    CHECK_EQ_INT(mb.sb.size, max + (size_t)extra);
    st__reader_t r;
    st__message_t m;
    CHECK_ERR(st__reader_init(&r, max), ST_OK);
    st__reader_feed(&r, mb.sb.data, mb.sb.size);
    CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), extra ? ST_ERR_LIMIT : 1);
    st__message_destroy(&m);
    st__reader_destroy(&r);
    mpbuf_free(&mb);
  }
}

TEST(messages_outlive_buffer_changes) {
  /* A large message is taken, the reader then gives its big buffer back
   * (and is destroyed): the message's bytes must stay valid. */
  const size_t big = 3u << 20;
  mpbuf_t mb;
  mpbuf_init(&mb);
  st__pack_request_head(&mb.pk, 2, "big");
  msgpack_pack_array(&mb.pk, 1);
  msgpack_pack_bin(&mb.pk, big);
  char *body = malloc(big);
  CHECK(body != NULL);
  memset(body, 'z', big);
  msgpack_pack_bin_body(&mb.pk, body, big);
  free(body);
  st__reader_t r;
  st__message_t m, m2;
  CHECK_ERR(st__reader_init(&r, 4u << 20), ST_OK);
  for (size_t off = 0; off < mb.sb.size; off += 65536) {
    size_t n = mb.sb.size - off < 65536 ? mb.sb.size - off : 65536;
    st__reader_feed(&r, mb.sb.data + off, n);
  }
  CHECK_EQ_INT(st__reader_next(&r, &m, why, sizeof why), 1);
  CHECK_EQ_INT(st__reader_next(&r, &m2, why, sizeof why), 0);   /* shrinks */
  CHECK(r.up.used + r.up.free < (1u << 20));
  st__reader_feed(&r, "\x94\x00\x03\xa1m\x90", 6);
  CHECK_EQ_INT(st__reader_next(&r, &m2, why, sizeof why), 1);
  CHECK_EQ_INT(m2.id, 3);
  st__reader_destroy(&r);
  const msgpack_object *bin = &m.params.via.array.ptr[0];
  CHECK_EQ_INT(bin->type, MSGPACK_OBJECT_BIN);
  CHECK_EQ_INT(bin->via.bin.size, big);
  CHECK(bin->via.bin.ptr[0] == 'z' && bin->via.bin.ptr[big - 1] == 'z');
  CHECK(method_is(&m2, "m"));
  st__message_destroy(&m);
  st__message_destroy(&m2);
  mpbuf_free(&mb);
}

/* A request whose params hold one array of n small integers (i % 100)
 * and a map of n/4 short strings: many objects per byte, the hard case
 * for a decoder. */
static void pack_dense(msgpack_packer *pk, uint32_t id, uint32_t n) {
  st__pack_request_head(pk, id, "dense");
  msgpack_pack_array(pk, 2);
  msgpack_pack_array(pk, n);
  for (uint32_t i = 0; i < n; i++) msgpack_pack_int(pk, (int)(i % 100));
  msgpack_pack_map(pk, n / 4);
  for (uint32_t i = 0; i < n / 4; i++) {
    char k[16];
    snprintf(k, sizeof k, "k%u", i);
    st__pack_cstr(pk, k);
    st__pack_cstr(pk, "v");
  }
}

static int dense_ok(const st__message_t *m, uint32_t id, uint32_t n) {
  if (m->type != ST_MSG_REQUEST || m->id != id || !method_is(m, "dense")) return 0;
  const msgpack_object *a = &m->params.via.array.ptr[0];
  const msgpack_object *map = &m->params.via.array.ptr[1];
  if (m->params.via.array.size != 2 || a->type != MSGPACK_OBJECT_ARRAY ||
      a->via.array.size != n || map->type != MSGPACK_OBJECT_MAP || map->via.map.size != n / 4)
    return 0;
  for (uint32_t i = 0; i < n; i++)
    if (a->via.array.ptr[i].via.u64 != i % 100) return 0;
  char k[16];
  snprintf(k, sizeof k, "k%u", n / 4 - 1);
  const msgpack_object *last = &map->via.map.ptr[n / 4 - 1].key;
  return last->via.str.size == strlen(k) && !memcmp(last->via.str.ptr, k, strlen(k));
}

TEST(large_messages_decode_a_slice_at_a_time) {
  /* small, large, small, large in one buffer, fed in reads of 64 KiB
   * between the slices (the buffer moves under the slicing). */
  const uint32_t n = 1u << 20;   /* about 1.6 MiB of msgpack */
  mpbuf_t mb;
  mpbuf_init(&mb);
  pack_req(&mb.sb, 1, "a", 1);
  pack_dense(&mb.pk, 2, n);
  pack_req(&mb.sb, 3, "b", 3);
  pack_dense(&mb.pk, 4, n);
  st__reader_t r;
  CHECK_ERR(st__reader_init(&r, 4u << 20), ST_OK);
  st__reader_set_slicing(&r, 1u << 20);
  size_t fed = 0;
  uint32_t want[4] = {1, 2, 3, 4};
  int got = 0, slices = 0, max_slices_one = 0, this_one = 0;
  while (got < 4) {
    if (fed < mb.sb.size) {
      size_t k = mb.sb.size - fed < 65536 ? mb.sb.size - fed : 65536;
      CHECK_ERR(st__reader_feed(&r, mb.sb.data + fed, k), ST_OK);
      fed += k;
    }
    st__message_t m;
    int rc = st__reader_next_sliced(&r, &m, 128u << 10, why, sizeof why);
    if (rc == 0) continue;
    if (rc == 2) {
      slices++;
      this_one++;
      continue;
    }
    CHECK_EQ_INT(rc, 1);
    if (rc != 1) break;
    CHECK_EQ_INT(m.id, want[got]);
    if (m.id % 2 == 0) CHECK(dense_ok(&m, m.id, n));
    if (this_one > max_slices_one) max_slices_one = this_one;
    this_one = 0;
    st__message_destroy(&m);
    got++;
  }
  /* Each large one took about its size / 128 KiB calls; the small ones one. */
  CHECK(max_slices_one >= 10);
  CHECK(slices >= 20);
  st__message_t m;
  CHECK_EQ_INT(st__reader_next_sliced(&r, &m, 128u << 10, why, sizeof why), 0);
  CHECK_EQ_INT(st__reader_pending(&r), 0);
  CHECK_EQ_INT(st__reader_buffered(&r), 0);
  st__reader_destroy(&r);
  /* Destroyed in the middle of a slicing: nothing leaks (ASan, valgrind). */
  CHECK_ERR(st__reader_init(&r, 4u << 20), ST_OK);
  st__reader_set_slicing(&r, 1u << 20);
  CHECK_ERR(st__reader_feed(&r, mb.sb.data, mb.sb.size), ST_OK);
  CHECK_EQ_INT(st__reader_next_sliced(&r, &m, 1u << 20, why, sizeof why), 1);
  CHECK_EQ_INT(st__reader_next_sliced(&r, &m, 64u << 10, why, sizeof why), 2);
  st__reader_destroy(&r);
  mpbuf_free(&mb);
}

TEST(ext_and_every_scalar_frame) {
  /* Every header kind in one params array, fed a byte at a time. */
  mpbuf_t mb;
  mpbuf_init(&mb);
  st__pack_request_head(&mb.pk, 77, "all");
  msgpack_pack_array(&mb.pk, 1);
  msgpack_pack_array(&mb.pk, 21);
  msgpack_pack_nil(&mb.pk);
  msgpack_pack_true(&mb.pk);
  msgpack_pack_false(&mb.pk);
  msgpack_pack_uint8(&mb.pk, 200);
  msgpack_pack_uint16(&mb.pk, 60000);
  msgpack_pack_uint32(&mb.pk, 4000000000u);
  msgpack_pack_uint64(&mb.pk, UINT64_MAX);
  msgpack_pack_int8(&mb.pk, -100);
  msgpack_pack_int16(&mb.pk, -30000);
  msgpack_pack_int32(&mb.pk, -2000000000);
  msgpack_pack_int64(&mb.pk, INT64_MIN);
  msgpack_pack_float(&mb.pk, 1.5f);
  msgpack_pack_double(&mb.pk, 2.5);
  for (size_t len = 1; len <= 16; len *= 2) {   /* fixext 1..16 */
    msgpack_pack_ext(&mb.pk, len, 5);
    msgpack_pack_ext_body(&mb.pk, "0123456789abcdef", len);
  }
  msgpack_pack_ext(&mb.pk, 3, 6);                  /* ext8 */
  msgpack_pack_ext_body(&mb.pk, "xyz", 3);
  msgpack_pack_str(&mb.pk, 40);                    /* str8 */
  msgpack_pack_str_body(&mb.pk, "0123456789012345678901234567890123456789", 40);
  msgpack_pack_map(&mb.pk, 16);                    /* map16 */
  for (int i = 0; i < 16; i++) {
    msgpack_pack_int(&mb.pk, i);
    msgpack_pack_array(&mb.pk, 0);
  }
  st__reader_t r;
  st__message_t m;
  CHECK_ERR(st__reader_init(&r, 1 << 20), ST_OK);
  for (size_t i = 0; i < mb.sb.size; i++) {
    st__reader_feed(&r, mb.sb.data + i, 1);
    int rc = st__reader_next(&r, &m, why, sizeof why);
    CHECK_EQ_INT(rc, i + 1 == mb.sb.size ? 1 : 0);
  }
  const msgpack_object *a = &m.params.via.array.ptr[0];
  CHECK_EQ_INT(a->via.array.size, 21);
  CHECK_EQ_INT(a->via.array.ptr[6].via.u64 == UINT64_MAX, 1);
  CHECK_EQ_INT(a->via.array.ptr[17].type, MSGPACK_OBJECT_EXT);
  CHECK_EQ_INT(a->via.array.ptr[20].via.map.size, 16);
  st__message_destroy(&m);
  CHECK_EQ_INT(st__reader_pending(&r), 0);
  st__reader_destroy(&r);
  mpbuf_free(&mb);
}

/* A response like info's: a map of short keys and every kind of leaf
 * value (the framing scan takes these a run at a time), nested maps and
 * an array, a longer string among them. */
static void pack_leafy(msgpack_packer *pk, uint32_t id) {
  st__pack_response_head(pk, id);
  msgpack_pack_map(pk, 6);
  st__pack_kv_uint(pk, "small", 5);
  st__pack_kv_int(pk, "negative", -40000);
  st__pack_cstr(pk, "empty");
  msgpack_pack_map(pk, 0);
  st__pack_cstr(pk, "list");
  msgpack_pack_array(pk, 3);
  msgpack_pack_float(pk, 1.5f);
  msgpack_pack_int8(pk, -3);
  st__pack_cstr(pk, "");
  st__pack_kv_str(pk, "long", "a string of more than thirty-one bytes, a str8");
  /* Leaves to the end: the last bytes are the scan's run. */
  st__pack_cstr(pk, "counters");
  msgpack_pack_map(pk, 12);
  st__pack_kv_double(pk, "uptime_s", 12.5);
  st__pack_kv_bool(pk, "ready", 1);
  st__pack_kv_str(pk, "none", NULL);
  static const uint64_t v[] = {0, 127, 128, 255, 256, 65535, 65536, UINT32_MAX, UINT64_MAX};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    char k[16];
    snprintf(k, sizeof k, "c%zu", i);
    st__pack_kv_uint(pk, k, v[i]);
  }
}

/* How a reader with limit `max` takes `bytes`, fed in pieces of `step`
 * bytes (0: all at once, then -1 for a split at byte `at`): the messages
 * it gave, then 100 * the error it ended on. */
static int take_all(const char *bytes, size_t n, size_t max, size_t step, size_t at) {
  st__reader_t r;
  st__message_t m;
  if (st__reader_init(&r, max) != ST_OK) return -1;
  int got = 0, rc = 0;
  for (size_t i = 0; i < n && rc >= 0;) {
    size_t k = step ? step : at && i == 0 ? at : n - i;
    if (k > n - i) k = n - i;
    st__reader_feed(&r, bytes + i, k);
    i += k;
    while ((rc = st__reader_next(&r, &m, why, sizeof why)) == 1) {
      got++;
      st__message_destroy(&m);
    }
  }
  st__reader_destroy(&r);
  return rc < 0 ? got + 100 * -rc : got;
}

TEST(leaves_whole_and_in_pieces_agree) {
  /* Two such replies pipelined: at every limit around the first one's
   * size, and fed whole, a byte at a time or split at any byte, the
   * reader takes the same messages and fails with the same error. */
  mpbuf_t mb;
  mpbuf_init(&mb);
  pack_leafy(&mb.pk, 7);
  size_t first = mb.sb.size;
  pack_leafy(&mb.pk, 8);
  for (size_t max = first - 12; max <= first + 1; max++) {
    int whole = take_all(mb.sb.data, mb.sb.size, max, 0, 0);
    CHECK_EQ_INT(whole, max >= first ? 2 : 100 * -ST_ERR_LIMIT);
    CHECK_EQ_INT(take_all(mb.sb.data, mb.sb.size, max, 1, 0), whole);
    for (size_t at = 1; at < mb.sb.size; at++)
      CHECK_EQ_INT(take_all(mb.sb.data, mb.sb.size, max, 0, at), whole);
    if (stt_failed_now) break;
  }
  mpbuf_free(&mb);
}

int main(void) {
  RUN(each_message_type);
  RUN(split_at_every_byte);
  RUN(one_byte_at_a_time_and_pending);
  RUN(garbage_is_protocol);
  RUN(bad_shapes_are_protocol);
  RUN(nesting_limit);
  RUN(limit_on_declared_size);
  RUN(no_room_set_aside_for_a_half_sent_frame);
  RUN(limit_on_a_split_header);
  RUN(limit_on_buffered_bytes);
  RUN(limit_boundary);
  RUN(messages_outlive_buffer_changes);
  RUN(ext_and_every_scalar_frame);
  RUN(large_messages_decode_a_slice_at_a_time);
  RUN(leaves_whole_and_in_pieces_agree);
  return stt_summary();
}
