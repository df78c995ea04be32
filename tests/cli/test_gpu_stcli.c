/* stcli and CUDA tensors: `call --values` prints the values and checksums
 * of tensors in device memory exactly as it prints those of the same
 * endpoint built on the CPU (a module, a strided view, several dtypes), in
 * text and in JSON, and names the device as "cuda:N (GPU-...)". Exit 77
 * without a CUDA device. */
#include "check.h"
#include "cli_run.h"
#include "mem/cuda.h"

static stt_server_t srv;

static const char ep[] =
    "return st.endpoint { name = 't_$DEVICE', device = '$DEVICE',\n"
    "  build = function(a)\n"
    "    return { m = st.module { r = st.rand { 1000, seed = 7 }, i = st.arange { 10 },\n"
    "                             h = st.arange { 5, dtype = 'float16' } },\n"
    "             v = st.rand { 6, 8, seed = 3 }:slice(1, 1, 8, 3) }\n"
    "  end }\n";

/* Copies the "  values: ..." and "  sum: ..." lines of `out` (the JSON of
 * a value that is not a tensor is indented too, and names the device). */
static void detail_lines(const char *out, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  for (const char *p = out; *p;) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
    if ((strncmp(p, "  values:", 9) == 0 || strncmp(p, "  sum:", 6) == 0) && used + n < len) {
      memcpy(buf + used, p, n);
      used += n;
      buf[used] = '\0';
    }
    p += n;
  }
}

static int count(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
  return n;
}

TEST(values_and_checksums_match_the_cpu) {
  static char gpu[16384], cpu[16384];
  CHECK_EQ_INT(STCLI("--socket", srv.socket, "call", "t_cuda", "--values=5"), 0);
  fprintf(stderr, "%s", R.out);
  CHECK_CONTAINS(R.out, "cuda:0 (GPU-");
  CHECK_EQ_INT(count(R.out, "fnv1a64: 0x"), 4);
  CHECK(!strstr(R.out, "not shown"));
  detail_lines(R.out, gpu, sizeof gpu);
  CHECK_EQ_INT(STCLI("--socket", srv.socket, "call", "t_cpu", "--values=5"), 0);
  detail_lines(R.out, cpu, sizeof cpu);
  CHECK_EQ_INT(count(gpu, "  sum: "), 4);
  CHECK_STR_EQ(gpu, cpu);
  /* Every value of the strided view (18), the first 20 of the others. */
  CHECK_EQ_INT(STCLI("--socket", srv.socket, "call", "t_cuda", "--values=20"), 0);
  detail_lines(R.out, gpu, sizeof gpu);
  CHECK_EQ_INT(STCLI("--socket", srv.socket, "call", "t_cpu", "--values=20"), 0);
  detail_lines(R.out, cpu, sizeof cpu);
  CHECK_STR_EQ(gpu, cpu);
}

TEST(json_values_match_the_cpu) {
  static char gpu[16384];
  CHECK_EQ_INT(STCLI("--json", "--socket", srv.socket, "call", "t_cuda", "--values=3"), 0);
  CHECK(json_ok(R.out));
  CHECK_CONTAINS(R.out, "\"device\": \"cuda:0\"");
  /* The top-level member (a module in the value has "tensors" too). */
  const char *tg = strstr(R.out, "\n  \"tensors\": ");
  CHECK(tg);
  snprintf(gpu, sizeof gpu, "%s", tg);
  CHECK_EQ_INT(STCLI("--json", "--socket", srv.socket, "call", "t_cpu", "--values=3"), 0);
  const char *tc = strstr(R.out, "\n  \"tensors\": ");
  CHECK(tc);
  CHECK_STR_EQ(gpu, tc);
  CHECK(!strstr(gpu, "\"sum\": null"));
}

int main(void) {
  char err[512];
  if (st__cuda_available(err, sizeof err) != ST_OK) stt_skip(err);
  cli_require_bin();
  stt_server_init(&srv);
  stt_write_endpoint_per_device(&srv, "t", ep);
  stt_server_start_or_exit(&srv);
  RUN(values_and_checksums_match_the_cpu);
  RUN(json_values_match_the_cpu);
  return stt_server_finish(&srv);
}
