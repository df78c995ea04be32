/* src/proto/scan.h: the framing scan of reader.c, for payloads that arrive
 * whole (ext values). Private to src/proto.
 */
#ifndef ST_PROTO_SCAN_H
#define ST_PROTO_SCAN_H

#include <stddef.h>

/* ST_OK if the n bytes at `data` are msgpack whose headers announce no more
 * than n bytes in total (so decoding them allocates in proportion to n);
 * ST_ERR_PROTOCOL otherwise. Does not check that they form exactly one
 * object: the decoder's consumed size does. Any thread. */
int st__scan_bounded(const void *data, size_t n);

#endif
