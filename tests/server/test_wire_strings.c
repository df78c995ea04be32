/* Wire strings are length-delimited (docs/protocol.md, "Strings"; docs/
 * security.md, "Wire strings"): a string that holds a NUL byte, or one
 * longer than the word it could be, never reaches C string code as a
 * shorter, different word. Over the real socket:
 *  - a method name, a parameter name and an argument name with a NUL are
 *    refused and named in full (\x00), never as their first part;
 *  - a key named "a\0b" is refused, and "a" stays absent;
 *  - a readers entry or key with a NUL is refused;
 *  - a device that is not exactly "cuda:" and 1 to 4 digits ("cuda: 0",
 *    "cuda:+0", "cuda:" and 27 digits whose first 26 are 0) is refused;
 *  - in endpoints, m:tensor(name), a constructor's option name and
 *    st.load_safetensors(path) take the whole Lua string: one with a NUL
 *    raises instead of naming its first part. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "wire.h"

static stt_server_t S;

/* The request's reply must be `want` with `part` in its message; a
 * failure is counted and the checks go on (each one is a finding). */
#define EXPECT(c, want, part, ...)                                   \
  do {                                                               \
    char why_[6000];                                                 \
    if (!rc_expect(c, want, part, why_, sizeof why_, __VA_ARGS__))   \
      stt_fail(__FILE__, __LINE__, "%s", why_);                      \
    rc_drop_fds(c);                                                  \
  } while (0)

static const char PICK_EP[] =
    "return st.endpoint{ name = \"pick\", params = { name = \"w\" },\n"
    "  build = function(a)\n"
    "    local m = st.module{ w = st.ones{2}, wx = st.zeros{3} }\n"
    "    return m:tensor(a.name)\n"
    "  end }\n";

/* A constructor's options table with one option name from the call. */
static const char OPT_EP[] =
    "return st.endpoint{ name = \"opt\", params = { key = \"dtype\" },\n"
    "  build = function(a)\n"
    "    local o = { 2 }\n"
    "    o[a.key] = \"float64\"\n"
    "    return st.zeros(o)\n"
    "  end }\n";

static const char LOAD_EP[] =
    "return st.endpoint{ name = \"load\", params = { path = \"model.safetensors\" },\n"
    "  build = function(a) return st.load_safetensors(a.path) end }\n";

/* A one-tensor checkpoint, <dir>/data/model.safetensors. */
static void write_checkpoint(const stt_server_t *s) {
  char path[600];
  snprintf(path, sizeof path, "%s/data", s->dir);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/data/model.safetensors", s->dir);
  const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  uint64_t hl = strlen(h);
  unsigned char lb[8], data[8] = {0};
  for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(hl >> (8 * i));
  fwrite(lb, 1, 8, f);
  fwrite(h, 1, hl, f);
  fwrite(data, 1, sizeof data, f);
  fclose(f);
}

static void methods_and_parameters(rc_t *c) {
  EXPECT(c, ST_ERR_UNKNOWN_METHOD, "unknown method 'ping\\x00x'", "[0, 1, 'ping\\x00x', []]");
  EXPECT(c, ST_ERR_UNKNOWN_METHOD, "unknown method 'ping\\x00'", "[0, 2, 'ping\\x00', []]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "ping: unknown parameter 'a\\x00b'",
         "[0, 3, 'ping', [{'a\\x00b': 1}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "unknown argument 'name\\x00x'",
         "[0, 4, 'call', [{endpoint: 'pick', args: {'name\\x00x': 'w'}}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'endpoint' holds a NUL byte",
         "[0, 5, 'call', [{endpoint: 'pick\\x00x'}]]");
}

static void names_and_readers(rc_t *c) {
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "put: 'key' holds a NUL byte",
         "[0, 10, 'put', [{key: 'a\\x00b', value: 1}]]");
  EXPECT(c, ST_ERR_NOT_FOUND, "no key 'a'", "[0, 11, 'get', [{key: 'a'}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'name' holds a NUL byte",
         "[0, 12, 'buffer_create', [{name: 'b\\x00c', shape: [4], dtype: 'float32'}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'dtype' holds a NUL byte",
         "[0, 13, 'buffer_create', [{name: 'b', shape: [4], dtype: 'float32\\x00x'}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'readers.uids' element 0 is not a uid/gid",
         "[0, 14, 'put', [{key: 'k', value: 1, readers: {uids: ['1\\x00']}}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'readers' takes the keys 'uids' and 'gids' only",
         "[0, 15, 'put', [{key: 'k', value: 1, readers: {'uids\\x00': [1]}}]]");
  EXPECT(c, ST_ERR_NOT_FOUND, "no key 'k'", "[0, 16, 'get', [{key: 'k'}]]");
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'prefix' holds a NUL byte",
         "[0, 17, 'keys', [{prefix: 'a\\x00'}]]");
}

static void devices(rc_t *c) {
  static const char *const bad[] = {
      "cuda: 0", "cuda:+0", "cuda:0 ", "cuda:", "cuda:00000", "cuda:x", "CUDA:0",
      "cuda:000000000000000000000000001",   /* its first 31 bytes read as cuda:0 */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'device' must be cpu, cuda or cuda:N",
           "[0, 20, 'buffer_create', [{name: 'dev', shape: [4], dtype: 'float32', "
           "device: '%s'}]]", bad[i]);
  EXPECT(c, ST_ERR_INVALID_ARGUMENT, "'device' holds a NUL byte",
         "[0, 21, 'buffer_create', [{name: 'dev', shape: [4], dtype: 'float32', "
         "device: 'cuda:0\\x00'}]]");
  /* cuda:N well formed: no device 4095 here, so CAPABILITY */
  EXPECT(c, ST_ERR_CAPABILITY, "cuda:4095 is unavailable",
         "[0, 22, 'handoff_create', [{name: 'dev', device: 'cuda:4095', chunk_bytes: 4096, "
         "chunks: 1, consumers: 1}]]");
}

static void endpoints(rc_t *c) {
  EXPECT(c, ST_OK, NULL, "[0, 30, 'call', [{endpoint: 'pick', args: {name: 'w'}}]]");
  EXPECT(c, ST_ERR_ENDPOINT, "tensor: the name must be a string without NUL bytes",
         "[0, 31, 'call', [{endpoint: 'pick', args: {name: 'w\\x00x'}}]]");
  EXPECT(c, ST_OK, NULL, "[0, 32, 'call', [{endpoint: 'opt', args: {key: 'dtype'}}]]");
  EXPECT(c, ST_ERR_ENDPOINT, "option names must be strings without NUL bytes",
         "[0, 33, 'call', [{endpoint: 'opt', args: {key: 'dtype\\x00x'}}]]");
  EXPECT(c, ST_OK, NULL, "[0, 34, 'call', [{endpoint: 'load'}]]");
  EXPECT(c, ST_ERR_ENDPOINT, "load_safetensors: the path holds a NUL byte",
         "[0, 35, 'call', [{endpoint: 'load', args: {path: 'model.safetensors\\x00.x'}}]]");
}

static void body(stt_server_t *s) {
  OPEN_RC(c, s->socket);
  methods_and_parameters(&c);
  names_and_readers(&c);
  devices(&c);
  endpoints(&c);
  EXPECT(&c, ST_OK, NULL, "[0, 40, 'ping', []]");
  rc_close(&c);
}

TEST(no_wire_string_is_read_as_a_shorter_one) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "pick.lua", PICK_EP);
  stt_write_endpoint(&S, "opt.lua", OPT_EP);
  stt_write_endpoint(&S, "load.lua", LOAD_EP);
  write_checkpoint(&S);
  char cfg[700];
  snprintf(cfg, sizeof cfg, "data_dirs = { '%s/data' }, workers = 1,", S.dir);
  stt_server_config(&S, cfg);
  CHECK_EQ_INT(stt_server_run(&S, body), 0);
  stt_server_cleanup(&S);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(no_wire_string_is_read_as_a_shorter_one);
  return stt_summary();
}
