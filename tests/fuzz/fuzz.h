/* tests/fuzz: what the libFuzzer targets share (docs/fuzzing.md).
 *
 * Each fuzz_<name>.c defines LLVMFuzzerTestOneInput (and, where a target
 * sets something up once, LLVMFuzzerInitialize). A target returns 0 for
 * every input; a broken property is reported with FUZZ_CHECK, which
 * aborts, so libFuzzer saves the input as a crash like any sanitizer
 * report.
 */
#ifndef ST_FUZZ_H
#define ST_FUZZ_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Aborts with the failed condition: the input broke a property. */
#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                    \
    }                                                                             \
  } while (0)

/* Decodes the whole input as one message through a fresh frame reader, as
 * a connection does (the framing scan refuses a frame announcing more bytes
 * than it holds before msgpack allocates). 1 with *msg filled (destroy
 * it), 0 when the bytes are not exactly one well-formed message. */
static inline int fuzz_one_message(const uint8_t *data, size_t size, st__message_t *msg) {
  st__reader_t r;
  int got = 0;
  if (st__reader_init(&r, size + 1) != ST_OK) return 0;
  if (st__reader_feed(&r, data, size) == ST_OK &&
      st__reader_next(&r, msg, NULL, 0) == 1) {
    got = st__reader_buffered(&r) == 0;
    if (!got) st__message_destroy(msg);
  }
  st__reader_destroy(&r);
  return got;
}

#endif
