/* tests/proto: a reference glob for the view spec's matcher (proto/viewspec.c),
 * shared by test_viewspec.c and the viewspec fuzz target: the plain
 * recursive definition ('*' any run, '?' any byte), memoized over
 * (pattern, name) positions so that it finishes on long inputs. */
#ifndef ST_TESTS_REF_GLOB_H
#define ST_TESTS_REF_GLOB_H

#include <stdlib.h>
#include <string.h>

static inline int ref_glob_at(const char *p, size_t np, const char *n, size_t nn, signed char *memo,
                              size_t ip, size_t in) {
  signed char *m = &memo[ip * (nn + 1) + in];
  if (*m >= 0) return *m;
  int r;
  if (ip == np) r = in == nn;
  else if (p[ip] == '*')
    r = ref_glob_at(p, np, n, nn, memo, ip + 1, in) ||
        (in < nn && ref_glob_at(p, np, n, nn, memo, ip, in + 1));
  else
    r = in < nn && (p[ip] == '?' || p[ip] == n[in]) &&
        ref_glob_at(p, np, n, nn, memo, ip + 1, in + 1);
  return *m = (signed char)r;
}

/* Whether pattern p (NUL-terminated) matches n[0..nn): 1 or 0; -1 when
 * out of memory. */
static inline int ref_glob(const char *p, const char *n, size_t nn) {
  size_t np = strlen(p);
  signed char *memo = malloc((np + 1) * (nn + 1));
  if (!memo) return -1;
  memset(memo, -1, (np + 1) * (nn + 1));
  int r = ref_glob_at(p, np, n, nn, memo, 0, 0);
  free(memo);
  return r;
}

#endif
