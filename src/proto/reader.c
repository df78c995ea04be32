/* src/proto/reader.c: incremental msgpack-RPC frame reader.
 *
 * Bytes reach the reader through st__reader_reserve/commit (or feed). On
 * commit, a framing scan walks the new bytes' object headers before msgpack
 * sees them: it knows where each message ends, refuses the one byte that is
 * never msgpack (0xc1) and nesting deeper than msgpack's parser allows, and
 * keeps a lower bound of the current message's size (bytes so far + payload
 * still announced + one byte per object still due). When that bound passes
 * max_message the frame is refused with ST_ERR_LIMIT at once: a 5-byte
 * header announcing a 4-GiB array never reaches msgpack (which would try to
 * allocate for it), and no more than max_message bytes of one message are
 * ever buffered. msgpack decodes a message only once the scan has seen all
 * of it: msgpack sets aside room for every element a container header
 * announces, so decoding a half-sent frame would let a 14-byte header
 * announcing 8M elements take 200 MB of address space before a single
 * element arrived; a whole message's decoded form is bounded by its bytes.
 * Bytes after the first error are dropped; messages complete before it are
 * still delivered, then st__reader_next reports the error.
 *
 * Threads: a reader belongs to one thread at a time.
 */
#include "proto/proto.h"
#include "proto/scan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define READER_INIT_BUFFER (16u * 1024)
/* An idle reader whose buffer grew past this gives it back. */
#define READER_SHRINK_ABOVE (1u << 20)

static void set_err(char *err, size_t errlen, const char *why) {
  if (err && errlen) snprintf(err, errlen, "%s", why);
}

/* ------------------------------------------------------------ framing scan */

/* Bytes of an object's header, fixed-size scalar payloads included; 0 for
 * 0xc1 (never used). */
static int header_len(uint8_t b) {
  if (b <= 0xbf || b >= 0xe0) return 1;   /* fixint, fixmap/array/str, negfix */
  static const uint8_t len[32] = {
    /* c0 nil, c1 -, c2 false, c3 true */ 1, 0, 1, 1,
    /* c4-c6 bin8/16/32 */ 2, 3, 5,
    /* c7-c9 ext8/16/32 (type byte included) */ 3, 4, 6,
    /* ca float32, cb float64 */ 5, 9,
    /* cc-cf uint8..64 */ 2, 3, 5, 9,
    /* d0-d3 int8..64 */ 2, 3, 5, 9,
    /* d4-d8 fixext (type byte) */ 2, 2, 2, 2, 2,
    /* d9-db str8/16/32 */ 2, 3, 5,
    /* dc-dd array16/32, de-df map16/32 */ 3, 5, 3, 5,
  };
  return len[b - 0xc0];
}

static uint64_t be(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/* Value of a positive-integer header, or -1 when the header is not one. */
static int64_t head_uint(const uint8_t *h) {
  uint8_t b = h[0];
  if (b <= 0x7f) return b;
  if (b >= 0xcc && b <= 0xcf) {
    uint64_t v = be(h + 1, 1 << (b - 0xcc));
    return v > INT64_MAX ? INT64_MAX : (int64_t)v;
  }
  return -1;
}

static void scan_fail(st__frame_scan_t *s, int err, const char *why) {
  s->err = err;
  s->why = why;
}

/* The current object (header and payload) is complete. */
static void scan_object_done(st__frame_scan_t *s) {
  if (s->depth > 0) return;
  /* A whole message: remember it when it is large, and start over. */
  if (s->large_at && s->msg_bytes >= s->large_at && s->large_n < ST__SCAN_LARGE) {
    unsigned at = (s->large_head + s->large_n++) % ST__SCAN_LARGE;
    s->large[at].seq = s->done;
    s->large[at].bytes = s->msg_bytes;
  }
  s->done++;
  s->complete++;
  s->msg_bytes = 0;
  s->objects = 0;
  s->id_stage = 0;
}

/* Accounts for a complete header at h (in the new bytes, or gathered in
 * s->head when it came in pieces). 0, or -1 after scan_fail. */
static int scan_header(st__frame_scan_t *s, const uint8_t *h, uint64_t max) {
  uint8_t b = h[0];
  uint64_t count = 0, skip = 0;
  int container = 0;

  if (b >= 0x80 && b <= 0x8f) { container = 1; count = 2u * (b & 0x0f); }
  else if (b >= 0x90 && b <= 0x9f) { container = 1; count = b & 0x0f; }
  else if (b >= 0xa0 && b <= 0xbf) skip = b & 0x1f;
  else switch (b) {
  case 0xc4: case 0xc7: case 0xd9: skip = h[1]; break;
  case 0xc5: case 0xc8: case 0xda: skip = be(h + 1, 2); break;
  case 0xc6: case 0xc9: case 0xdb: skip = be(h + 1, 4); break;
  case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: skip = 1u << (b - 0xd4); break;
  case 0xdc: container = 1; count = be(h + 1, 2); break;
  case 0xdd: container = 1; count = be(h + 1, 4); break;
  case 0xde: container = 1; count = 2 * be(h + 1, 2); break;
  case 0xdf: container = 1; count = 2 * be(h + 1, 4); break;
  default: break;   /* scalars: all in the header */
  }

  /* The id of a request or response: object 2 of [0|1, id, ...]. */
  int array = (b >= 0x90 && b <= 0x9f) || b == 0xdc || b == 0xdd;
  if (s->objects == 0) s->id_stage = (array && count >= 2) ? 1 : 0;
  else if (s->objects == 1 && s->id_stage == 1) {
    int64_t t = head_uint(h);
    s->id_stage = (t == ST_MSG_REQUEST || t == ST_MSG_RESPONSE) ? 2 : 0;
  } else if (s->objects == 2 && s->id_stage == 2) {
    int64_t id = head_uint(h);
    if (id >= 0 && id <= (int64_t)UINT32_MAX) {
      s->id = (uint32_t)id;
      s->id_stage = 3;
    } else {
      s->id_stage = 0;
    }
  }
  s->objects++;

  if (s->depth > 0) {
    s->left[s->depth - 1]--;
    s->items--;
  }
  if (container && count > 0) {
    if (s->depth >= ST__SCAN_DEPTH) {
      scan_fail(s, ST_ERR_PROTOCOL, "message nested too deep");
      return -1;
    }
    s->left[s->depth++] = count;
    s->items += count;
  }
  s->skip = skip;
  /* Lower bound of the message's size: every due object takes a byte. */
  if (s->msg_bytes + s->skip + s->items > max) {
    scan_fail(s, ST_ERR_LIMIT, "message larger than the limit");
    return -1;
  }
  while (s->depth > 0 && s->left[s->depth - 1] == 0) s->depth--;
  s->head_len = 0;
  if (s->skip == 0) scan_object_done(s);
  return 0;
}

/* Bytes of a leaf object by its first byte, its header and payload (a
 * number, nil, a bool, a string of up to 31 bytes), 0 for any other
 * (containers, longer strings, bin, ext: scan_header's). */
static const uint8_t leaf_len[256] = {
    /* 00: positive fixint */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    /* 80: fixmap: no leaf */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* 90: fixarray: no leaf */
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* A0: fixstr 0-15 */
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    /* B0: fixstr 16-31 */
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32,
    /* C0: nil, -, false, true, bin, ext, float32/64, uint8-64 */
    1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 5, 9, 2, 3, 5, 9,
    /* D0: int8-64, fixext, str8-32, array16/32, map16/32 */
    2, 3, 5, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    /* E0: negative fixint */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* The leaves of an open container that lie whole in p[*at, n), past a
 * message's first three objects (its type and id: scan_header's), each
 * accounted for as scan_header and the payload's skip would. They are
 * taken a run at a time: the leaves due in the innermost open container,
 * counted in a tight loop, then accounted for together; the size bound
 * (bytes so far + one byte per object still due) only grows along a run,
 * so it is checked at the run's end, and a run that passes it is walked
 * again to its first leaf that does. Stops at anything else. 0, or -1
 * after scan_fail (*at is then the failing object's first byte). */
static int scan_leaves(st__frame_scan_t *s, uint64_t max, const uint8_t *p, size_t n,
                       size_t *at) {
  if (s->depth <= 0 || s->objects < 3) return 0;
  size_t i = *at;
  while (i < n && s->depth > 0) {
    uint64_t due = s->left[s->depth - 1], k = 0;
    size_t start = i;
    while (k < due && i < n) {
      size_t len = leaf_len[p[i]];
      if (!len || len > n - i) break;
      i += len;
      k++;
    }
    if (k == 0) break;
    uint64_t items = s->items - k;
    if (s->msg_bytes + (i - start) + items > max) {
      /* The first leaf of the run past the bound. */
      uint64_t bytes = s->msg_bytes;
      size_t j = start;
      for (uint64_t left = s->items;; ) {
        size_t len = leaf_len[p[j]];
        left--;
        if (bytes + len + left > max) break;
        bytes += len;
        j += len;
      }
      scan_fail(s, ST_ERR_LIMIT, "message larger than the limit");
      *at = j;
      return -1;
    }
    s->left[s->depth - 1] -= k;
    s->items = items;
    s->objects += (uint32_t)k;
    s->msg_bytes += i - start;
    while (s->depth > 0 && s->left[s->depth - 1] == 0) s->depth--;
    if (s->depth == 0) scan_object_done(s);   /* the message is whole */
  }
  *at = i;
  return 0;
}

/* Scans n new bytes. Returns how many of them msgpack may see: n, or fewer
 * when an error was found (the bytes from the failing header on are
 * withheld, so msgpack never completes that header). */
static size_t scan_bytes(st__frame_scan_t *s, uint64_t max, const uint8_t *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (s->skip) {
      uint64_t take = s->skip < n - i ? s->skip : n - i;
      s->skip -= take;
      s->msg_bytes += take;
      i += (size_t)take;
      if (!s->skip) scan_object_done(s);
      continue;
    }
    if (s->head_len == 0) {
      /* Most objects are numbers and short strings inside a map. */
      if (scan_leaves(s, max, p, n, &i) < 0) return i;
      if (i == n) break;
      int need = header_len(p[i]);
      if (need == 0) {
        scan_fail(s, ST_ERR_PROTOCOL, "bytes are not msgpack (0xc1)");
        return i;
      }
      if ((size_t)need <= n - i) {
        /* The whole header is here (nearly always): scanned in place. */
        if (s->msg_bytes + (uint64_t)need > max) {   /* a header that starts too late */
          scan_fail(s, ST_ERR_LIMIT, "message larger than the limit");
          return i;
        }
        s->msg_bytes += (uint64_t)need;
        i += (size_t)need;
        if (scan_header(s, p + i - need, max) < 0) return i - (size_t)need;
        continue;
      }
      s->head_need = (uint8_t)need;
    }
    /* A header split between two reads: gathered in s->head. */
    size_t take = (size_t)(s->head_need - s->head_len);
    if (take > n - i) take = n - i;
    if (s->msg_bytes + take > max) {   /* a header that starts too late */
      scan_fail(s, ST_ERR_LIMIT, "message larger than the limit");
      return i;
    }
    memcpy(s->head + s->head_len, p + i, take);
    s->head_len = (uint8_t)(s->head_len + take);
    s->msg_bytes += take;
    i += take;
    if (s->head_len < s->head_need) break;   /* i == n: wait for more */
    if (scan_header(s, s->head, max) < 0) return i - take;
  }
  return n;
}

/* ------------------------------------------------------------------ reader */

/* Initializes *r (caller-owned storage, which must not move until
 * st__reader_destroy: msgpack's unpacker points into itself). `max_message`
 * 0 means no limit. ST_OK or ST_ERR_OUT_OF_MEMORY (destroying the reader
 * then is harmless). Any thread. */
int st__reader_init(st__reader_t *r, size_t max_message) {
  memset(r, 0, sizeof *r);
  r->max_message = max_message;
  if (!msgpack_unpacker_init(&r->up, READER_INIT_BUFFER)) return ST_ERR_OUT_OF_MEMORY;
  return ST_OK;
}

/* Frees the reader's buffer. Messages already taken stay valid (they hold
 * their own reference to the bytes). The reader's thread. */
void st__reader_destroy(st__reader_t *r) {
  if (r->up.buffer) msgpack_unpacker_destroy(&r->up);
  if (r->slice) {
    msgpack_unpacker_destroy(r->slice);
    free(r->slice);
  }
  memset(r, 0, sizeof *r);
}

/* See proto.h. The space stays valid until the next call on r. */
int st__reader_reserve(st__reader_t *r, size_t want, char **buf, size_t *cap) {
  if (want == 0) want = 1;
  if (!r->up.buffer) return ST_ERR_OUT_OF_MEMORY;   /* a failed shrink */
  if (!msgpack_unpacker_reserve_buffer(&r->up, want)) return ST_ERR_OUT_OF_MEMORY;
  *buf = msgpack_unpacker_buffer(&r->up);
  *cap = msgpack_unpacker_buffer_capacity(&r->up);
  return ST_OK;
}

/* See proto.h. n must not exceed the capacity st__reader_reserve gave.
 * After an error has been found the bytes are dropped. */
void st__reader_commit(st__reader_t *r, size_t n) {
  if (r->failed || r->scan.err || n == 0 || !r->up.buffer) return;
  uint64_t max = r->max_message ? (uint64_t)r->max_message : UINT64_MAX;
  size_t ok = scan_bytes(&r->scan, max, (const uint8_t *)msgpack_unpacker_buffer(&r->up), n);
  msgpack_unpacker_buffer_consumed(&r->up, ok);
}

/* See proto.h. `data` is borrowed and copied. */
int st__reader_feed(st__reader_t *r, const void *data, size_t n) {
  const char *p = data;
  while (n > 0) {
    char *buf;
    size_t cap;
    int rc = st__reader_reserve(r, n, &buf, &cap);
    if (rc != ST_OK) return rc;
    size_t k = n < cap ? n : cap;
    memcpy(buf, p, k);
    st__reader_commit(r, k);
    p += k;
    n -= k;
  }
  return ST_OK;
}

/* See proto.h. */
size_t st__reader_pending(const st__reader_t *r) {
  return (size_t)r->scan.msg_bytes;
}

/* See proto.h. */
size_t st__reader_buffered(const st__reader_t *r) {
  return r->up.buffer ? r->up.used - r->up.off : 0;
}

/* Gives a large idle buffer back: called when no byte is buffered. The
 * unpacker is rebuilt in place (its context points into the struct, so a
 * msgpack_unpacker cannot be moved); messages already taken keep their own
 * reference to the old buffer. ST_OK, or ST_ERR_OUT_OF_MEMORY when the new
 * buffer cannot be had (the reader is then unusable). */
static int reader_shrink(st__reader_t *r) {
  msgpack_unpacker *up = &r->up;
  if (up->used != up->off || up->used + up->free <= READER_SHRINK_ABOVE) return ST_OK;
  msgpack_unpacker_destroy(up);
  memset(up, 0, sizeof *up);
  if (!msgpack_unpacker_init(up, READER_INIT_BUFFER)) {
    memset(up, 0, sizeof *up);
    return ST_ERR_OUT_OF_MEMORY;
  }
  return ST_OK;
}

static int is_id(const msgpack_object *o) {
  return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= UINT32_MAX;
}

/* Checks one of the three message shapes and fills msg. ST_OK, or
 * ST_ERR_PROTOCOL with msg->id set when the id could be read. */
static int message_shape(st__message_t *msg, const msgpack_object *o, char *err, size_t errlen) {
  if (o->type != MSGPACK_OBJECT_ARRAY) {
    set_err(err, errlen, "message is not an array");
    return ST_ERR_PROTOCOL;
  }
  const msgpack_object *it = o->via.array.ptr;
  uint32_t n = o->via.array.size;
  if (n == 0 || it[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || it[0].via.u64 > 2) {
    set_err(err, errlen, "message type is not 0, 1 or 2");
    return ST_ERR_PROTOCOL;
  }
  int type = (int)it[0].via.u64;
  if (type != ST_MSG_NOTIFICATION && n >= 2 && is_id(&it[1])) msg->id = (uint32_t)it[1].via.u64;
  if (n != (type == ST_MSG_NOTIFICATION ? 3u : 4u)) {
    set_err(err, errlen, type == ST_MSG_NOTIFICATION ? "notification is not [2, method, params]"
            : type == ST_MSG_REQUEST ? "request is not [0, id, method, params]"
                                     : "response is not [1, id, error, result]");
    return ST_ERR_PROTOCOL;
  }
  if (type != ST_MSG_NOTIFICATION && !is_id(&it[1])) {
    set_err(err, errlen, "message id is not an unsigned integer below 2^32");
    return ST_ERR_PROTOCOL;
  }
  if (type == ST_MSG_RESPONSE) {
    if (it[2].type != MSGPACK_OBJECT_NIL && it[2].type != MSGPACK_OBJECT_MAP) {
      set_err(err, errlen, "response error is neither nil nor a map");
      return ST_ERR_PROTOCOL;
    }
    msg->error = it[2];
    msg->result = it[3];
  } else {
    const msgpack_object *m = &it[type == ST_MSG_REQUEST ? 2 : 1];
    const msgpack_object *p = &it[type == ST_MSG_REQUEST ? 3 : 2];
    if (m->type != MSGPACK_OBJECT_STR) {
      set_err(err, errlen, "method is not a string");
      return ST_ERR_PROTOCOL;
    }
    if (p->type != MSGPACK_OBJECT_ARRAY) {
      set_err(err, errlen, "params is not an array");
      return ST_ERR_PROTOCOL;
    }
    msg->method = m->via.str.ptr;
    msg->method_len = m->via.str.size;
    msg->params = *p;
  }
  msg->type = type;
  return ST_OK;
}

/* Marks the reader failed with `rc` (sticky) and returns it. */
static int reader_fail(st__reader_t *r, int rc) {
  r->failed = rc;
  return rc;
}

/* *msg as st__reader_next leaves it when it holds no message: no memory,
 * type -1, nil params, error and result. */
static void message_clear(st__message_t *msg) {
  memset(msg, 0, sizeof *msg);
  msg->type = -1;
  msg->params.type = msg->error.type = msg->result.type = MSGPACK_OBJECT_NIL;
}

/* A decoded message u (owned) into *msg: its shape checked. 1, or the
 * reader failed with the reason. */
static int take_message(st__reader_t *r, st__message_t *msg, msgpack_unpacked *u, char *err,
                        size_t errlen) {
  int rc = message_shape(msg, &u->data, err, errlen);
  if (rc != ST_OK) {
    uint32_t id = msg->id;
    msgpack_unpacked_destroy(u);
    memset(msg, 0, sizeof *msg);
    msg->type = -1;
    msg->id = id;
    return reader_fail(r, rc);
  }
  msg->unpacked = *u;
  return 1;
}

/* See proto.h. *msg is always overwritten: after a return <= 0 it holds no
 * memory (st__message_destroy on it is a harmless no-op). */
int st__reader_next(st__reader_t *r, st__message_t *msg, char *err, size_t errlen) {
  message_clear(msg);
  if (r->failed) {
    set_err(err, errlen, "the connection already failed");
    return r->failed;
  }

  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  msgpack_unpack_return ret = MSGPACK_UNPACK_CONTINUE;
  if (r->scan.complete > 0) {
    ret = msgpack_unpacker_next(&r->up, &u);
    if (ret == MSGPACK_UNPACK_SUCCESS) {
      r->scan.complete--;
      r->taken++;
    }
  }
  if (ret == MSGPACK_UNPACK_CONTINUE) {
    msgpack_unpacked_destroy(&u);
    if (r->scan.err) {
      if (r->scan.id_stage == 3) msg->id = r->scan.id;
      set_err(err, errlen, r->scan.why);
      return reader_fail(r, r->scan.err);
    }
    if (r->scan.msg_bytes == 0 && reader_shrink(r) != ST_OK) {
      set_err(err, errlen, "out of memory");
      return reader_fail(r, ST_ERR_OUT_OF_MEMORY);
    }
    return 0;
  }
  if (ret != MSGPACK_UNPACK_SUCCESS) {
    msgpack_unpacked_destroy(&u);
    if (ret == MSGPACK_UNPACK_NOMEM_ERROR) {
      set_err(err, errlen, "out of memory decoding a message");
      return reader_fail(r, ST_ERR_OUT_OF_MEMORY);
    }
    set_err(err, errlen, "bytes are not msgpack");
    return reader_fail(r, ST_ERR_PROTOCOL);
  }

  return take_message(r, msg, &u, err, errlen);
}

/* See proto.h. */
void st__reader_set_slicing(st__reader_t *r, size_t large_bytes) {
  r->scan.large_at = large_bytes;
}

/* Whether the next message to take is whole and large: its size, or 0. */
static uint64_t next_large(st__reader_t *r) {
  st__frame_scan_t *s = &r->scan;
  while (s->large_n && s->large[s->large_head].seq < r->taken) {   /* taken whole */
    s->large_head = (s->large_head + 1) % ST__SCAN_LARGE;
    s->large_n--;
  }
  if (!s->complete || !s->large_n || s->large[s->large_head].seq != r->taken) return 0;
  return s->large[s->large_head].bytes;
}

static int slice_fail(st__reader_t *r, int rc, const char *why, char *err, size_t errlen) {
  msgpack_unpacker_destroy(r->slice);
  free(r->slice);
  r->slice = NULL;
  set_err(err, errlen, why);
  return reader_fail(r, rc);
}

/* See proto.h. The bytes of the message are copied, a slice per call,
 * into an unpacker of its own (the scan has seen the whole message, so
 * every container header its slices announce is backed by bytes already
 * here: decoding in parts allocates no more than decoding it whole). */
int st__reader_next_sliced(st__reader_t *r, st__message_t *msg, size_t slice, char *err,
                           size_t errlen) {
  if (!r->slice) {
    uint64_t bytes = r->failed ? 0 : next_large(r);
    if (!bytes || slice == 0 || bytes <= slice) return st__reader_next(r, msg, err, errlen);
    r->slice = malloc(sizeof *r->slice);
    if (!r->slice || !msgpack_unpacker_init(r->slice, (size_t)bytes)) {
      free(r->slice);
      r->slice = NULL;
      set_err(err, errlen, "out of memory");
      return reader_fail(r, ST_ERR_OUT_OF_MEMORY);
    }
    r->slice_bytes = bytes;
    r->slice_fed = 0;
  }
  message_clear(msg);
  /* The message starts at the main unpacker's offset (read afresh: a
   * read meanwhile may have moved the buffer, never these bytes). */
  uint64_t k = r->slice_bytes - r->slice_fed < slice ? r->slice_bytes - r->slice_fed : slice;
  if (!msgpack_unpacker_reserve_buffer(r->slice, (size_t)k))
    return slice_fail(r, ST_ERR_OUT_OF_MEMORY, "out of memory", err, errlen);
  memcpy(msgpack_unpacker_buffer(r->slice), r->up.buffer + r->up.off + r->slice_fed, (size_t)k);
  msgpack_unpacker_buffer_consumed(r->slice, (size_t)k);
  r->slice_fed += k;
  msgpack_unpacked u;
  msgpack_unpacked_init(&u);
  msgpack_unpack_return ret = msgpack_unpacker_next(r->slice, &u);
  if (ret == MSGPACK_UNPACK_CONTINUE && r->slice_fed < r->slice_bytes) {
    msgpack_unpacked_destroy(&u);
    return 2;
  }
  if (ret != MSGPACK_UNPACK_SUCCESS || r->slice->used != r->slice->off) {
    msgpack_unpacked_destroy(&u);
    return slice_fail(r, ret == MSGPACK_UNPACK_NOMEM_ERROR ? ST_ERR_OUT_OF_MEMORY : ST_ERR_PROTOCOL,
                      ret == MSGPACK_UNPACK_NOMEM_ERROR ? "out of memory decoding a message"
                                                        : "bytes are not msgpack",
                      err, errlen);
  }
  /* Done: the main unpacker passes over the message's bytes (its parser
   * is between messages here), and the slice's unpacker goes (the
   * message keeps its own reference to the bytes). */
  msgpack_unpacker_destroy(r->slice);
  free(r->slice);
  r->slice = NULL;
  r->up.off += (size_t)r->slice_bytes;
  r->scan.complete--;
  r->taken++;
  return take_message(r, msg, &u, err, errlen);
}

/* Frees the message's memory; its fields become invalid. A message left
 * empty by st__reader_next (or zeroed) is fine. */
void st__message_destroy(st__message_t *msg) {
  if (!msg) return;
  msgpack_unpacked_destroy(&msg->unpacked);
  memset(msg, 0, sizeof *msg);
  msg->type = -1;
}

/* See scan.h. */
int st__scan_bounded(const void *data, size_t n) {
  st__frame_scan_t s;
  memset(&s, 0, sizeof s);
  scan_bytes(&s, (uint64_t)n, (const uint8_t *)data, n);
  return s.err ? ST_ERR_PROTOCOL : ST_OK;
}
