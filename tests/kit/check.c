/* Test harness state and summary; see check.h. */
#include "check.h"

int stt_failed_now;
int stt_passed, stt_failed;

int stt_summary(void) {
  printf("%d passed, %d failed\n", stt_passed, stt_failed);
  return stt_failed ? 1 : 0;
}

void stt_skip(const char *why) {
  printf("skipped: %s\n", why);
  exit(77);
}
