/* Minimal test harness shared by every C test.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ_INT(a, b); CHECK_STR_EQ(s, "x"); }
 *   int main(void) { RUN(name); ...; return stt_summary(); }
 *
 * A failed check prints file:line and the values, marks the test failed and
 * returns from it. Error codes have checks of their own that print names:
 *
 *   CHECK_ERR(st__thing(x), ST_ERR_LIMIT);
 *   CHECK_ERR_MSG(st__parse(o, err, sizeof err), ST_OK, err);
 *   CHECK_RC(st_client_call(c, ...), ST_OK, c);            (client_kit.h)
 *
 *   test_x.c:123: st_client_call(c, ...) = ST_ERR_TIMEOUT (-12) "timed out
 *   after 200 ms", want ST_OK (0)
 *
 * The first failure of a test also prints the tail of the log of every
 * stserver the fixture runs (fixture.h), through stt_fail_hook.
 * stt_summary() prints "N passed, M failed" and returns the exit status.
 * stt_skip("why") prints the reason and exits with 77, which CTest reports
 * as skipped.
 */
#ifndef STT_CHECK_H
#define STT_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int stt_failed_now;
extern int stt_passed, stt_failed;

/* Called by the first failure of each test (and by stt_fail_main); the
 * fixture sets it to print server log tails. NULL: nothing more. */
extern void (*stt_fail_hook)(void);

/* Prints "file:line: <message>", marks the running test failed and, on its
 * first failure, calls stt_fail_hook. Main thread only (as is all of it). */
void stt_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The same for a failure outside any test (in main): counts one more
 * failed test. */
void stt_fail_main(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* "ST_OK", "ST_ERR_TIMEOUT", or "" for a value that is no error code.
 * Static string. */
const char *stt_err_label(long long code);

/* Fails (as stt_fail) with "<expr> = NAME (got) "msg", want NAME (want)".
 * `msg` may be NULL or "" (not printed). */
void stt_fail_err(const char *file, int line, const char *expr, long long got, long long want,
                  const char *msg);

#define STT_FAIL(...)                                                \
  do {                                                               \
    stt_fail(__FILE__, __LINE__, __VA_ARGS__);                       \
    return;                                                          \
  } while (0)

#define TEST(name) static void name(void)

#define RUN(name)                                                    \
  do {                                                               \
    stt_failed_now = 0;                                              \
    fprintf(stderr, "-- %s\n", #name);                               \
    name();                                                          \
    if (stt_failed_now) { stt_failed++; fprintf(stderr, "FAIL %s\n", #name); } \
    else { stt_passed++; fprintf(stderr, "ok   %s\n", #name); }      \
  } while (0)

#define CHECK(cond)                                                  \
  do {                                                               \
    if (!(cond)) STT_FAIL("check failed: %s", #cond);                \
  } while (0)

#define CHECK_EQ_INT(a, b)                                           \
  do {                                                               \
    long long stt_a_ = (long long)(a), stt_b_ = (long long)(b);      \
    if (stt_a_ != stt_b_)                                            \
      STT_FAIL("%s == %s failed: %lld != %lld", #a, #b, stt_a_, stt_b_); \
  } while (0)

#define CHECK_STR_EQ(a, b)                                           \
  do {                                                               \
    const char *stt_a_ = (a), *stt_b_ = (b);                         \
    if (!stt_a_ || !stt_b_ || strcmp(stt_a_, stt_b_) != 0)           \
      STT_FAIL("%s == %s failed: \"%s\" != \"%s\"", #a, #b,          \
               stt_a_ ? stt_a_ : "(null)", stt_b_ ? stt_b_ : "(null)"); \
  } while (0)

#define CHECK_CONTAINS(hay, needle)                                  \
  do {                                                               \
    const char *stt_h_ = (hay), *stt_n_ = (needle);                  \
    if (!stt_h_ || !strstr(stt_h_, stt_n_))                          \
      STT_FAIL("\"%s\" does not contain \"%s\"", stt_h_ ? stt_h_ : "(null)", stt_n_); \
  } while (0)

/* CHECK_CONTAINS for each of the needles that follow. */
#define CHECK_CONTAINS_ALL(hay, ...)                                 \
  do {                                                               \
    const char *const stt_all_[] = {__VA_ARGS__, NULL};              \
    for (size_t stt_k_ = 0; stt_all_[stt_k_]; stt_k_++)             \
      CHECK_CONTAINS((hay), stt_all_[stt_k_]);                       \
  } while (0)

/* An error code (ST_OK or ST_ERR_*), with a message read after the call
 * (an error buffer, st_client_error(c); NULL for none). */
#define CHECK_ERR_MSG(expr, want, msg)                               \
  do {                                                               \
    long long stt_g_ = (long long)(expr), stt_w_ = (long long)(want); \
    if (stt_g_ != stt_w_) {                                          \
      stt_fail_err(__FILE__, __LINE__, #expr, stt_g_, stt_w_, (msg)); \
      return;                                                        \
    }                                                                \
  } while (0)

#define CHECK_ERR(expr, want) CHECK_ERR_MSG(expr, want, NULL)

int stt_summary(void);
void stt_skip(const char *why) __attribute__((noreturn));

/* How many lines of text (each ended by a newline) contain part. */
int stt_lines_containing(const char *text, const char *part);

#endif
