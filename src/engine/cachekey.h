/* src/engine: cache keys (docs/protocol.md, "Objects, leases and caching").
 *
 * The key of a call is the endpoint's cache_format_key with every {param}
 * replaced by the bound argument, or, without a format key, the canonical
 * JSON of all bound arguments. Keys are compared per endpoint; the same
 * arguments always give the same bytes.
 *
 * Rendering of one value (every key is printable UTF-8 with no NUL, and
 * a string never renders as a binary of the same bytes):
 *   integer          decimal ("-3", "18446744073709551615")
 *   float            shortest text that reads back to the same double
 *                    ("0.1", "3" for 3.0, "1e+21"); NaN, Infinity,
 *                    -Infinity for the non-finite ones
 *   string (str)     in a format key: its text as it is, with \\ for a
 *                    backslash, \" for a quote and \xNN for a control
 *                    byte or DEL; in JSON: a JSON string (quote,
 *                    backslash and control characters escaped as \n \t
 *                    \r \b \f or \u00XX); in both, a byte that is not
 *                    part of valid UTF-8 as \xNN
 *   binary (bin)     b"..." (format key and JSON alike): printable ASCII
 *                    as it is (\" and \\ escaped), every other byte \xNN:
 *                    b'ab' gives b"ab" where 'ab' gives ab (or "ab")
 *   boolean, nil     true / false / null
 *   array, map       canonical JSON: no spaces, map keys sorted by their
 *                    bytes (shorter first when one is a prefix)
 * Pure functions: any thread.
 */
#ifndef ST_ENGINE_CACHEKEY_H
#define ST_ENGINE_CACHEKEY_H

#include <msgpack.h>
#include <stddef.h>

#include "engine/generation.h"

/* Appends the canonical JSON of `o` to `out`. ST_OK, or
 * ST_ERR_OUT_OF_MEMORY. */
int st__canonical_json(const msgpack_object *o, msgpack_sbuffer *out);

/* The cache key of a call of `ep` whose bound arguments are the msgpack
 * map `bound` (st__bind_args output). On ST_OK *out is a NUL-terminated
 * string owned by the caller (free) and *outlen its length (a key has no
 * NUL: see the rendering above). Errors:
 * ST_ERR_INVALID_ARGUMENT (bound is not a map), ST_ERR_OUT_OF_MEMORY; a
 * message goes to err. */
int st__cache_key(const st__endpoint_decl_t *ep, const char *bound, size_t bound_len,
                  char **out, size_t *outlen, char *err, size_t errlen);

#endif
