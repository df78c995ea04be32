/* See mpbuf.h. */
#include "mpbuf.h"

void mpbuf_init(mpbuf_t *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
  msgpack_unpacked_init(&b->up);
}

const msgpack_object *mpbuf_obj(mpbuf_t *b) {
  size_t off = 0;
  msgpack_unpacked_destroy(&b->up);
  msgpack_unpacked_init(&b->up);
  if (msgpack_unpack_next(&b->up, b->sb.data, b->sb.size, &off) != MSGPACK_UNPACK_SUCCESS)
    return NULL;
  return &b->up.data;
}

void mpbuf_free(mpbuf_t *b) {
  msgpack_unpacked_destroy(&b->up);
  msgpack_sbuffer_destroy(&b->sb);
}
