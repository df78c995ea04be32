/* GPU test helpers shared by tests/server/test_gpu_*.c (CUDA builds only):
 * device 0's free memory, and waiting for it to come back to a baseline. */
#ifndef STT_GPU_KIT_H
#define STT_GPU_KIT_H

#include <stdint.h>
#include <stdio.h>

#include "fixture.h"
#include "mem/cuda.h"
#include "wire.h"

/* Free bytes of device 0, as this process sees them (0 on failure). */
static inline uint64_t gk_free(void) {
  uint64_t f = 0, t = 0;
  st__cuda_mem_info(0, &f, &t, NULL, 0);
  return f;
}

/* Waits up to timeout_ms until device 0's free memory is within one
 * allocation granule of `baseline`. 0 when it is, else -1 (both figures
 * printed). */
static inline int gk_wait_back_to(uint64_t baseline, int timeout_ms) {
  uint64_t gran = 0;
  st__cuda_granularity(0, &gran, NULL, 0);
  double end = stt_now_ms() + timeout_ms;
  uint64_t now = gk_free();
  while (now + gran <= baseline && stt_now_ms() < end) {
    stt_sleep_ms(10);
    now = gk_free();
  }
  if (now + gran > baseline) return 0;
  fprintf(stderr, "   free %llu, baseline %llu\n", (unsigned long long)now,
          (unsigned long long)baseline);
  return -1;
}

/* Skips the test (exit 77 through stt_skip) unless CUDA works here and
 * device 0 answers. It makes this process's context, so baselines taken
 * after it do not count the context. */
static inline void gk_require_device(void) {
  char err[512];
  uint64_t f;
  if (st__cuda_available(err, sizeof err) != ST_OK) stt_skip(err);
  if (st__cuda_mem_info(0, &f, NULL, err, sizeof err) != ST_OK) stt_skip(err);
}

#endif
