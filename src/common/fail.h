/* src/common: the one helper that fills a caller's error buffer.
 *
 * Functions in this code base report failures as a negative ST_ERR_* plus a
 * message written into a caller-provided buffer (`err`, `errlen`; either may
 * be NULL/0). st__fail formats that message and returns `code`, so a check
 * reads `if (bad) return st__fail(ST_ERR_PROTOCOL, err, errlen, "...", ...);`.
 * Any thread.
 */
#ifndef ST_COMMON_FAIL_H
#define ST_COMMON_FAIL_H

#include <stddef.h>

int st__fail(int code, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
