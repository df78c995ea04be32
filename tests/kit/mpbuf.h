/* Test helper: pack msgpack into a buffer, then decode what was packed.
 *
 *   mpbuf_t b; mpbuf_init(&b);
 *   msgpack_pack_int(&b.pk, 1);
 *   const msgpack_object *o = mpbuf_obj(&b);   // owned by b
 *   mpbuf_free(&b);
 */
#ifndef STT_MPBUF_H
#define STT_MPBUF_H

#include <msgpack.h>

typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_unpacked up;
} mpbuf_t;

void mpbuf_init(mpbuf_t *b);
/* The first object packed so far, or NULL if it is incomplete. Valid until
 * the next mpbuf_obj or mpbuf_free. */
const msgpack_object *mpbuf_obj(mpbuf_t *b);
void mpbuf_free(mpbuf_t *b);

#endif
