/* src/common/errors.c: names and messages of the ST_ERR_* codes.
 *
 * Everything comes from ST_ERRNO_MAP in include/st/errors.h, so a code added
 * there is named here without an edit. No state; any thread.
 */
#include "st/errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/fail.h"

typedef struct {
  int code;             /* positive wire code */
  const char *name;
  const char *message;
} err_entry_t;

static const err_entry_t err_table[] = {
#define ST__ERR_ROW(name, code, msg) {code, #name, msg},
  ST_ERRNO_MAP(ST__ERR_ROW)
#undef ST__ERR_ROW
};

#define ERR_TABLE_LEN (sizeof err_table / sizeof err_table[0])

/* Table row for a negative ST_ERR_* or a positive wire code; NULL for 0 and
 * anything outside the table. */
static const err_entry_t *err_lookup(int err) {
  /* -INT_MIN overflows: compare on the negative side instead. */
  int neg = err > 0 ? -err : err;
  if (neg == 0) return NULL;
  for (size_t i = 0; i < ERR_TABLE_LEN; i++)
    if (-err_table[i].code == neg) return &err_table[i];
  return NULL;
}

/* See include/st/errors.h. Static string; any thread. */
const char *st_err_name(int err) {
  const err_entry_t *e = err_lookup(err);
  return e ? e->name : "UNKNOWN";
}

/* See include/st/errors.h. Static string; any thread. */
const char *st_strerror(int err) {
  const err_entry_t *e = err_lookup(err);
  return e ? e->message : "unknown error";
}

/* See include/st/errors.h. Exact, case-sensitive match of the stable name;
 * 0 for NULL or an unknown name. Any thread. */
int st_err_from_name(const char *name) {
  if (!name) return 0;
  for (size_t i = 0; i < ERR_TABLE_LEN; i++)
    if (strcmp(err_table[i].name, name) == 0) return -err_table[i].code;
  return 0;
}

int st__fail(int code, char *err, size_t errlen, const char *fmt, ...) {
  if (err && errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return code;
}
