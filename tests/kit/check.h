/* Minimal test harness shared by every C test.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_EQ_INT(a, b); CHECK_STR_EQ(s, "x"); }
 *   int main(void) { RUN(name); ...; return stt_summary(); }
 *
 * A failed check prints file:line and the values, marks the test failed and
 * returns from it. stt_summary() prints "N passed, M failed" and returns the
 * exit status. stt_skip("why") prints the reason and exits with 77, which
 * CTest reports as skipped.
 */
#ifndef STT_CHECK_H
#define STT_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int stt_failed_now;
extern int stt_passed, stt_failed;

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
    if (!(cond)) {                                                   \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      stt_failed_now = 1;                                            \
      return;                                                        \
    }                                                                \
  } while (0)

#define CHECK_EQ_INT(a, b)                                           \
  do {                                                               \
    long long stt_a_ = (long long)(a), stt_b_ = (long long)(b);      \
    if (stt_a_ != stt_b_) {                                          \
      fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, \
              #a, #b, stt_a_, stt_b_);                               \
      stt_failed_now = 1;                                            \
      return;                                                        \
    }                                                                \
  } while (0)

#define CHECK_STR_EQ(a, b)                                           \
  do {                                                               \
    const char *stt_a_ = (a), *stt_b_ = (b);                         \
    if (!stt_a_ || !stt_b_ || strcmp(stt_a_, stt_b_) != 0) {         \
      fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, \
              #a, #b, stt_a_ ? stt_a_ : "(null)", stt_b_ ? stt_b_ : "(null)"); \
      stt_failed_now = 1;                                            \
      return;                                                        \
    }                                                                \
  } while (0)

#define CHECK_CONTAINS(hay, needle)                                  \
  do {                                                               \
    const char *stt_h_ = (hay), *stt_n_ = (needle);                  \
    if (!stt_h_ || !strstr(stt_h_, stt_n_)) {                        \
      fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n", __FILE__, __LINE__, \
              stt_h_ ? stt_h_ : "(null)", stt_n_);                   \
      stt_failed_now = 1;                                            \
      return;                                                        \
    }                                                                \
  } while (0)

int stt_summary(void);
void stt_skip(const char *why) __attribute__((noreturn));

#endif
