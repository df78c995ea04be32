/* src/client: small helpers of libstclient: buffers that remember an
 * allocation failure, per-client error recording, monotonic time. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/client_internal.h"

static int cbuf_write(void *data, const char *buf, size_t len) {
  st__cbuf_t *b = data;
  if (b->oom) return -1;
  if (msgpack_sbuffer_write(&b->sb, buf, len) != 0) {
    b->oom = 1;
    return -1;
  }
  return 0;
}

/* Prepares an empty buffer and its packer. Never fails: the first write
 * allocates. Caller destroys it. Any thread. */
void st__client_cbuf_init(st__cbuf_t *b) {
  msgpack_sbuffer_init(&b->sb);
  b->oom = 0;
  b->fds = NULL;
  b->nfds = 0;
  msgpack_packer_init(&b->pk, b, cbuf_write);
}

/* Frees the buffer's bytes. Any thread. */
void st__client_cbuf_destroy(st__cbuf_t *b) {
  msgpack_sbuffer_destroy(&b->sb);
  b->sb.data = NULL;
  b->sb.size = b->sb.alloc = 0;
}

/* Appends bytes that already are msgpack through any packer. */
void st__client_cbuf_raw(msgpack_packer *pk, const void *data, size_t len) {
  if (len) pk->callback(pk->data, data, len);
}

static int text_grow(st__text_t *t, size_t need) {
  if (t->oom) return -1;
  if (t->len + need + 1 <= t->cap) return 0;
  size_t cap = t->cap ? t->cap : 256;
  while (cap < t->len + need + 1) {
    if (cap > SIZE_MAX / 2) {
      t->oom = 1;
      return -1;
    }
    cap *= 2;
  }
  char *p = realloc(t->ptr, cap);
  if (!p) {
    t->oom = 1;
    return -1;
  }
  t->ptr = p;
  t->cap = cap;
  return 0;
}

/* Appends n bytes (text stays NUL-terminated). `s` may be NULL when n is
 * 0 (msgpack's empty strings have no bytes). Any thread. */
void st__client_text_put(st__text_t *t, const char *s, size_t n) {
  if (text_grow(t, n) != 0) return;
  if (n) memcpy(t->ptr + t->len, s, n);
  t->len += n;
  t->ptr[t->len] = '\0';
}

/* Appends a C string. */
void st__client_text_puts(st__text_t *t, const char *s) { st__client_text_put(t, s, strlen(s)); }

/* Appends formatted text. */
void st__client_text_printf(st__text_t *t, const char *fmt, ...) {
  char small[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof small) {
    st__client_text_put(t, small, (size_t)n);
    return;
  }
  if (text_grow(t, (size_t)n) != 0) return;
  va_start(ap, fmt);
  vsnprintf(t->ptr + t->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  t->len += (size_t)n;
}

/* Records a local failure on c: the stable name of err and a message.
 * Returns err. Thread of the client. */
int st__client_fail(st_client_t *c, int err, const char *fmt, ...) {
  c->err = err;
  snprintf(c->err_name, sizeof c->err_name, "%s", st_err_name(err));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
  va_end(ap);
  return err;
}

/* Records a failure as the server named it (name and message are counted,
 * not NUL-terminated). Returns err. */
int st__client_fail_remote(st_client_t *c, int err, const char *name, size_t name_len,
                           const char *msg, size_t msg_len) {
  c->err = err;
  if (!name || !name_len) {
    name = st_err_name(err);
    name_len = strlen(name);
  }
  snprintf(c->err_name, sizeof c->err_name, "%.*s", (int)name_len, name);
  snprintf(c->err_msg, sizeof c->err_msg, "%.*s", (int)msg_len, msg ? msg : "");
  return err;
}

/* Forgets the last failure. */
void st__client_clear_error(st_client_t *c) {
  c->err = 0;
  c->uncached = 0;
  c->err_name[0] = '\0';
  c->err_msg[0] = '\0';
}

/* Absolute deadline in ns for a limit in ms; -1 (none) for <= 0. */
int64_t st__client_deadline(int timeout_ms) {
  if (timeout_ms <= 0) return -1;
  return st__now_mono_ns() + (int64_t)timeout_ms * 1000000;
}

static _Thread_local char handle_err[320];

/* See client_internal.h. Any thread. */
int st__client_handle_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(handle_err, sizeof handle_err, fmt, ap);
  va_end(ap);
  return code;
}

/* See client_internal.h. Any thread. */
const char *st__client_handle_error(void) { return handle_err; }

/* See client_internal.h. Thread of the client. */
int st__client_named_params(st_client_t *c, const char *method, const char *kind,
                            const char *name, st__client_pack_fn extra, const void *arg,
                            uint32_t n, st__cbuf_t *b) {
  if (!name || !*name || strlen(name) > 64)
    return st__client_fail(c, ST_ERR_INVALID_ARGUMENT, "%s: a %s name is 1 to 64 bytes", method,
                           kind);
  st__client_cbuf_init(b);
  msgpack_pack_map(&b->pk, 1 + n);
  st__pack_kv_str(&b->pk, "name", name);
  if (extra) extra(&b->pk, arg);
  if (!b->oom) return ST_OK;
  st__client_cbuf_destroy(b);
  return st__client_fail(c, ST_ERR_OUT_OF_MEMORY, "out of memory packing '%s'", method);
}
