/* src/xfer/wire.h: the messages between the server and its transfer
 * helper (wire.c; docs/multihost.md, "The transfer helper").
 *
 * A SOCK_SEQPACKET socketpair: one record is one msgpack message, the
 * notification shape of the project's RPC, [2, method, [params-map]],
 * with the arenas' descriptors attached to the record as SCM_RIGHTS.
 * Neither side trusts the other's bytes: every record is checked for its
 * shape and sizes, and descriptors that arrive with a record that is
 * refused are closed.
 */
#ifndef ST_XFER_WIRE_H
#define ST_XFER_WIRE_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

/* The longest record either side sends or accepts. */
#define ST_XFER_MSG_MAX (64 * 1024)
/* Descriptors one record carries (the kernel's limit is 253); a start
 * with more arenas sends them in `arenas` records first. */
#define ST_XFER_FDS_PER_MSG 128
/* Most transfers one helper runs at once. */
#define ST_XFER_MAX_TRANSFERS 64

/* Sends one record with fds[0..nfds) attached (borrowed: the caller
 * closes them). `nonblock`: MSG_DONTWAIT. ST_OK, ST_ERR_BUSY
 * (EAGAIN: nothing was sent), ST_ERR_IO (the other end went away or
 * another failure, with errno's text in err). Any thread. */
int st__xfer_send(int sock, const void *data, size_t len, const int *fds, size_t nfds,
                  int nonblock, char *err, size_t errlen);

/* Receives one record into buf[0..cap) (cap >= ST_XFER_MSG_MAX) and the
 * descriptors that came with it into fds (close-on-exec, owned by the
 * caller; at most ST_XFER_FDS_PER_MSG). Returns the record's length
 * (> 0); 0 when the other end closed; ST_ERR_BUSY (EAGAIN);
 * ST_ERR_PROTOCOL for a record or control data that did not fit (its
 * descriptors are closed); ST_ERR_IO otherwise. */
long st__xfer_recv(int sock, void *buf, size_t cap, int *fds, size_t *nfds, char *err,
                   size_t errlen);

/* Parses a record as [2, method, [map]]: *method / *method_len point
 * into `up` (which owns the memory), *params the map. ST_OK or
 * ST_ERR_PROTOCOL with the reason. */
int st__xfer_parse(const void *data, size_t len, msgpack_unpacked *up, const char **method,
                   size_t *method_len, const msgpack_object **params, char *err, size_t errlen);

/* Typed reads of a params map: ST_OK and the value; ST_ERR_NOT_FOUND
 * when the key is absent or nil (*out untouched); ST_ERR_PROTOCOL
 * ("'key' must be ...") when it has another type. Strings and bins point
 * into the message. */
int st__xfer_get_uint(const msgpack_object *map, const char *key, uint64_t *out, char *err,
                      size_t errlen);
int st__xfer_get_bool(const msgpack_object *map, const char *key, int *out, char *err,
                      size_t errlen);
int st__xfer_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len,
                     char *err, size_t errlen);
int st__xfer_get_bin(const msgpack_object *map, const char *key, const uint8_t **b,
                     size_t *len, char *err, size_t errlen);

/* Nonzero when method[0..len) is the NUL-terminated `name`. */
int st__xfer_is(const char *method, size_t len, const char *name);

/* Packs bytes as a msgpack bin. */
void st__xfer_pack_bin(msgpack_packer *pk, const void *b, size_t len);

#endif
