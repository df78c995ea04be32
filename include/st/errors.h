/* sharedtensor: error codes shared by the server, the wire and the clients.
 *
 * Every failure is a negative ST_ERR_* value. The wire carries the positive
 * code (docs/design.md, section 4, decision 2: a stable numeric code, a
 * stable name and a message), so ST_ERR_X == -(wire code of X). Codes 1-8 keep the numbering
 * of the Python shared-tensor package; 9 and up are ours. Names and codes are
 * stable: docs/errors.md lists them and they never change meaning.
 */
#ifndef ST_ERRORS_H
#define ST_ERRORS_H

#include "st/api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_OK 0

#define ST_ERRNO_MAP(X)                                                         \
  X(PROTOCOL,          1, "protocol error")                                     \
  X(UNKNOWN_ENDPOINT,  2, "unknown endpoint")                                   \
  X(SERIALIZATION,     3, "value cannot be serialized")                         \
  X(CAPABILITY,        4, "capability not available")                           \
  X(TASK,              5, "task error")                                         \
  X(CONFIGURATION,     6, "configuration error")                                \
  X(ENDPOINT,          7, "endpoint error")                                     \
  X(STALE_HANDLE,      8, "stale handle")                                       \
  X(LIMIT,             9, "limit exceeded")                                     \
  X(AUTH,             10, "permission denied")                                  \
  X(BUSY,             11, "server busy")                                        \
  X(TIMEOUT,          12, "timed out")                                          \
  X(OUT_OF_MEMORY,    13, "out of memory")                                      \
  X(INVALID_ARGUMENT, 14, "invalid argument")                                   \
  X(IO,               15, "I/O error")                                          \
  X(UNKNOWN_METHOD,   16, "unknown method")                                     \
  X(NOT_FOUND,        17, "not found")                                          \
  X(CANCELLED,        18, "cancelled")                                          \
  X(SHUTTING_DOWN,    19, "server shutting down")                               \
  X(INTERNAL,         20, "internal error")

typedef enum {
#define ST__ERR_ENUM(name, code, msg) ST_ERR_##name = -(code),
  ST_ERRNO_MAP(ST__ERR_ENUM)
#undef ST__ERR_ENUM
} st_errno_t;

/* Smallest error value; every st_errno_t lies in [ST_ERR_MIN, -1]. */
#define ST_ERR_MIN ST_ERR_INTERNAL

/* Stable upper-case name of an error ("PROTOCOL", "LIMIT", ...), or
 * "UNKNOWN" for a value outside the table. Accepts the negative ST_ERR_*
 * value or the positive wire code. Returns a static string. Any thread. */
ST_API const char *st_err_name(int err);

/* Generic English description of an error; static string. Any thread. */
ST_API const char *st_strerror(int err);

/* Negative ST_ERR_* for a stable name ("LIMIT"), or 0 when unknown. */
ST_API int st_err_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
