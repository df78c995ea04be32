/* src/common: CRC-32C (crc32c.h). */
#include "common/crc32c.h"

#include <pthread.h>

static uint32_t table[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    table[i] = c;
  }
}

/* See crc32c.h. Any thread. */
uint32_t st__crc32c(uint32_t crc, const void *data, size_t len) {
  pthread_once(&once, build);
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < len; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}
