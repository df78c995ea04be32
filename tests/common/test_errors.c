/* Error names, messages and codes (include/st/errors.h). */
#include <limits.h>

#include "check.h"
#include "st/errors.h"

TEST(every_code_has_a_name_and_message) {
#define ROW(name, code, msg)                                  \
  CHECK_EQ_INT(ST_ERR_##name, -(code));                       \
  CHECK_STR_EQ(st_err_name(ST_ERR_##name), #name);            \
  CHECK_STR_EQ(st_err_name(code), #name);                     \
  CHECK_STR_EQ(st_strerror(ST_ERR_##name), msg);              \
  CHECK_STR_EQ(st_strerror(code), msg);                       \
  CHECK_EQ_INT(st_err_from_name(#name), ST_ERR_##name);
  ST_ERRNO_MAP(ROW)
#undef ROW
}

TEST(codes_are_contiguous) {
  /* docs/errors.md lists 1..20; every value in [ST_ERR_MIN, -1] is named. */
  CHECK_EQ_INT(ST_ERR_MIN, -20);
  for (int e = ST_ERR_MIN; e <= -1; e++) CHECK(strcmp(st_err_name(e), "UNKNOWN") != 0);
}

TEST(stable_numbers) {
  CHECK_EQ_INT(ST_ERR_PROTOCOL, -1);
  CHECK_EQ_INT(ST_ERR_STALE_HANDLE, -8);
  CHECK_EQ_INT(ST_ERR_LIMIT, -9);
  CHECK_EQ_INT(ST_ERR_AUTH, -10);
  CHECK_EQ_INT(ST_ERR_INTERNAL, -20);
  CHECK_STR_EQ(st_err_name(ST_ERR_OUT_OF_MEMORY), "OUT_OF_MEMORY");
  CHECK_STR_EQ(st_strerror(ST_ERR_AUTH), "permission denied");
}

TEST(unknown_values) {
  const int bad[] = {0, 21, -21, 1000, -1000, INT_MAX, INT_MIN, INT_MIN + 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_STR_EQ(st_err_name(bad[i]), "UNKNOWN");
    CHECK_STR_EQ(st_strerror(bad[i]), "unknown error");
  }
  CHECK_EQ_INT(st_err_from_name("NOPE"), 0);
  CHECK_EQ_INT(st_err_from_name("limit"), 0);   /* names are case-sensitive */
  CHECK_EQ_INT(st_err_from_name(""), 0);
  CHECK_EQ_INT(st_err_from_name("UNKNOWN"), 0);
  CHECK_EQ_INT(st_err_from_name(NULL), 0);
}

int main(void) {
  RUN(every_code_has_a_name_and_message);
  RUN(codes_are_contiguous);
  RUN(stable_numbers);
  RUN(unknown_values);
  return stt_summary();
}
