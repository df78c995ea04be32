/* Test helper: msgpack frames from text, into a buffer, and decoded again.
 *
 *   mpbuf_t b; mpbuf_init(&b);
 *   stt_pack(&b.pk, "[0, %u, 'call', [{endpoint: 'e', args: {n: 3}}]]", id);
 *   const msgpack_object *o = mpbuf_obj(&b);   // owned by b
 *   mpbuf_free(&b);
 *
 * stt_pack is the one frame builder of the tests: the format is expanded as
 * by printf, then read as msgpack text and packed onto `pk`:
 *
 *   nil true false     the constants
 *   12  -3             integers, in the smallest encoding (as msgpack-c packs
 *                      every integer type)
 *   2.5  1e3  10.0     float64 (a number with '.', 'e' or 'E'; print doubles
 *                      with "%#.17g" to keep them doubles); f32(1.5) float32
 *   'text'  "text"     strings; escapes \\ \' \" \n \t \0 \xNN
 *   [a, b]             arrays
 *   {k: v, 3: nil}     maps; a bare word key (endpoint) is a string
 *   bin('ab')          binary: the bytes of a string; bin(64) 64 zero bytes,
 *   bin(64, 1, 2)      the first bytes given
 *   ext(2, v)          extension type 2 whose payload is the packing of v
 *   tensor(a, off, 'float32', [4], [1])
 *                      the tensor extension: ext(1, {arena: a, offset: off,
 *                      dtype: 'float32', shape: [4], strides: [1]})
 *
 * Several values separated by commas pack one after the other (pipelined
 * frames). A syntax error is a bug in the test: it is printed with the text
 * and the program aborts.
 */
#ifndef STT_MPBUF_H
#define STT_MPBUF_H

#include <msgpack.h>
#include <stdarg.h>

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

/* Packs the values of the text `fmt` (after printf expansion) onto pk. */
void stt_pack(msgpack_packer *pk, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same with a va_list. */
void stt_vpack(msgpack_packer *pk, const char *fmt, va_list ap);
/* mpbuf_init, then the values of the text fmt packed into b. */
void mpbuf_text(mpbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mpbuf_vtext(mpbuf_t *b, const char *fmt, va_list ap);

#endif
