/* Fuzz target: the safetensors header parser (src/mem/safetensors_parse.c
 * with the JSON reader of src/common/json.c), bytes in, tensors out, as
 * st__safetensors_open calls it on each file.
 *
 * Input: a whole .safetensors file: an 8-byte little-endian header
 * length, the JSON header, the data buffer. A length past the end of the
 * input is refused before the parser, as the open does.
 *
 * Properties (the contract of safetensors.h): every tensor has a
 * non-empty name that no other tensor has, at most ST_MAX_NDIM
 * dimensions, numel the product of its shape, and [begin, end) inside the
 * data buffer with end - begin = numel * element size.
 */
#include <string.h>

#include "fuzz.h"
#include "mem/safetensors.h"

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8) return 0;
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
  if (hlen > size - 8 || hlen > ST_SAFETENSORS_MAX_HEADER) return 0;
  uint64_t data_bytes = size - 8 - hlen;
  st__safetensors_t s;
  memset(&s, 0, sizeof s);
  char err[512];
  int rc = st__safetensors_parse((const char *)data + 8, (size_t)hlen, data_bytes, "fuzz.safetensors",
                                 0, &s, err, sizeof err);
  FUZZ_CHECK(rc == ST_OK || rc == ST_ERR_INVALID_ARGUMENT || rc == ST_ERR_OUT_OF_MEMORY);
  if (rc == ST_OK) {
    char **names = malloc((s.ntensors ? s.ntensors : 1) * sizeof *names);
    FUZZ_CHECK(names);
    for (size_t i = 0; i < s.ntensors; i++) {
      const st__safetensors_tensor_t *t = &s.tensors[i];
      FUZZ_CHECK(t->name && t->name[0]);
      FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_NDIM);
      uint64_t numel = 1;
      for (int d = 0; d < t->ndim; d++) numel *= (uint64_t)t->shape[d];
      FUZZ_CHECK(numel == t->numel);
      FUZZ_CHECK(t->begin <= t->end && t->end <= data_bytes);
      FUZZ_CHECK(t->end - t->begin == t->numel * st_dtype_size(t->dtype));
      names[i] = t->name;
    }
    qsort(names, s.ntensors, sizeof *names, by_name);
    for (size_t i = 1; i < s.ntensors; i++) FUZZ_CHECK(strcmp(names[i - 1], names[i]) != 0);
    for (size_t i = 0; i < s.nmeta; i++) FUZZ_CHECK(s.meta_keys[i] && s.meta_values[i]);
    free(names);
  }
  st__safetensors_clear(&s);
  return 0;
}
