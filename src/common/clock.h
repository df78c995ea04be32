/* src/common/clock.h: the clocks every part of the project reads, in one
 * place: the monotonic clock (timeouts, deadlines, durations) and the wall
 * clock (times shown to people and written into shared pages). Static
 * inline; any thread. */
#ifndef ST_COMMON_CLOCK_H
#define ST_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic clock in nanoseconds. */
static inline int64_t st__now_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Monotonic clock in seconds. */
static inline double st__now_mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall-clock unix time in seconds. */
static inline double st__now_unix(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
