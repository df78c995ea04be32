/* Fuzz target: the frame reader (src/proto/reader.c), bytes in, whole
 * msgpack-RPC messages out, as a connection feeds it.
 *
 * Input: one control byte, then the byte stream. The control byte picks
 * how the stream arrives (bits 0-3: chunk size 1..15 times 7 bytes, 0 for
 * all at once; bit 4: through reserve/commit like the server's socket
 * reads, else st__reader_feed like the client; bit 5: max_message 256
 * bytes instead of 1 MiB), so frame boundaries split anywhere and the size
 * limit is crossed both ways. Every message taken gets the value checks
 * the server runs on params (st__params_map, st__check_value).
 *
 * Properties: a message's method and params lie inside its own memory;
 * st__reader_buffered never exceeds the bytes committed; an error is
 * sticky (the next call returns the same code).
 */
#include <string.h>

#include "fuzz.h"

static void take_messages(st__reader_t *r, int *failed) {
  for (;;) {
    st__message_t m;
    char err[256];
    int rc = st__reader_next(r, &m, err, sizeof err);
    if (rc < 0) {
      FUZZ_CHECK(rc == ST_ERR_PROTOCOL || rc == ST_ERR_LIMIT || rc == ST_ERR_OUT_OF_MEMORY);
      FUZZ_CHECK(m.type == -1);
      st__message_t again;
      FUZZ_CHECK(st__reader_next(r, &again, NULL, 0) == rc);
      *failed = 1;
      return;
    }
    if (rc == 0) return;
    FUZZ_CHECK(m.type == ST_MSG_REQUEST || m.type == ST_MSG_RESPONSE ||
               m.type == ST_MSG_NOTIFICATION);
    if (m.type == ST_MSG_RESPONSE) {
      FUZZ_CHECK(m.error.type == MSGPACK_OBJECT_NIL || m.error.type == MSGPACK_OBJECT_MAP);
      st__check_value(&m.result, 1, err, sizeof err);
    } else {
      FUZZ_CHECK(m.params.type == MSGPACK_OBJECT_ARRAY);
      /* Touch every byte of the method: ASan catches a name that is not
       * inside the message's memory. */
      unsigned sum = 0;
      for (size_t i = 0; i < m.method_len; i++) sum += (unsigned char)m.method[i];
      FUZZ_CHECK(sum <= 255u * m.method_len);
      const msgpack_object *params = NULL;
      if (st__params_map(&m.params, &params, err, sizeof err) == ST_OK && params) {
        static const char *const allowed[] = {"endpoint", "args", "arenas", NULL};
        st__params_check(params, allowed, err, sizeof err);
        st__check_value(params, 1, err, sizeof err);
        st__map_get(params, "endpoint");
      }
    }
    st__message_destroy(&m);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t ctl = data[0];
  data++;
  size--;
  size_t chunk = (size_t)(ctl & 0x0f) * 7;
  if (chunk == 0) chunk = size ? size : 1;
  int reserve = (ctl & 0x10) != 0;
  size_t max_message = (ctl & 0x20) ? 256 : (1u << 20);

  st__reader_t r;
  if (st__reader_init(&r, max_message) != ST_OK) return 0;
  int failed = 0;
  size_t committed = 0;
  for (size_t off = 0; off < size && !failed;) {
    size_t k = size - off < chunk ? size - off : chunk;
    if (reserve) {
      char *buf;
      size_t cap;
      if (st__reader_reserve(&r, k, &buf, &cap) != ST_OK) break;
      FUZZ_CHECK(cap >= k);
      memcpy(buf, data + off, k);
      st__reader_commit(&r, k);
    } else if (st__reader_feed(&r, data + off, k) != ST_OK) {
      break;
    }
    off += k;
    committed += k;
    take_messages(&r, &failed);
    if (!failed) {
      FUZZ_CHECK(st__reader_buffered(&r) <= committed);
      FUZZ_CHECK(st__reader_pending(&r) <= max_message);
    }
  }
  st__reader_destroy(&r);
  return 0;
}
