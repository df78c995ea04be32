/* libstclient arguments: "key=value" typing, forced types, the JSON parser
 * (good and bad inputs, with messages), and the round trip of arguments
 * through msgpack: a scripted server echoes the argument map back, and the
 * decoded value must have the types and values the words asked for. */
#include <math.h>
#include <st/client.h>

#include "check.h"
#include "fake_server.h"

static fake_server_t fs;
static st_client_t *cl;

/* Sends the arguments to "echo" and returns the echoed map (owned). */
static st_result_t *echo(const st_args_t *a) {
  st_result_t *r = NULL;
  int rc = st_client_rpc(cl, "echo", a, &r);
  if (rc != ST_OK) fprintf(stderr, "echo failed: %s\n", st_client_error(cl));
  return r;
}

/* Echo of parsed words; returns the compact JSON of the echoed map. */
static char *echo_words(const char *const *words, size_t n) {
  st_args_t *a = st_args_new();
  char err[200];
  for (size_t i = 0; i < n; i++)
    if (st_args_parse_kv(a, words[i], err, sizeof err) != ST_OK) {
      fprintf(stderr, "parse '%s': %s\n", words[i], err);
      st_args_free(a);
      return NULL;
    }
  st_result_t *r = echo(a);
  st_args_free(a);
  if (!r) return NULL;
  char *s = st_value_json(st_result_value(r), 0);
  st_result_free(r);
  return s;
}

TEST(kv_inferred_types) {
  st_args_t *a = st_args_new();
  char err[200];
  const char *words[] = {"n=5", "neg=-12", "x=1.5", "e=1e3", "f=-2.5E-2", "t=true", "fa=false",
                         "v=null", "s=hello", "empty=", "ver=1.2.3", "hex=0x10", "dot=.5",
                         "pad= 5", "eq=a=b"};
  for (size_t i = 0; i < sizeof words / sizeof *words; i++)
    CHECK_EQ_INT(st_args_parse_kv(a, words[i], err, sizeof err), ST_OK);
  st_result_t *r = echo(a);
  st_args_free(a);
  CHECK(r);
  const st_value_t *m = st_result_value(r);
  CHECK_EQ_INT(m->kind, ST_VALUE_MAP);
  const st_value_t *v;
  CHECK((v = st_value_get(m, "n")) && v->kind == ST_VALUE_INT && v->as.integer == 5);
  CHECK((v = st_value_get(m, "neg")) && v->kind == ST_VALUE_INT && v->as.integer == -12);
  CHECK((v = st_value_get(m, "x")) && v->kind == ST_VALUE_FLOAT && v->as.number == 1.5);
  CHECK((v = st_value_get(m, "e")) && v->kind == ST_VALUE_FLOAT && v->as.number == 1000.0);
  CHECK((v = st_value_get(m, "f")) && v->kind == ST_VALUE_FLOAT && v->as.number == -0.025);
  CHECK((v = st_value_get(m, "t")) && v->kind == ST_VALUE_BOOL && v->as.boolean == 1);
  CHECK((v = st_value_get(m, "fa")) && v->kind == ST_VALUE_BOOL && v->as.boolean == 0);
  CHECK((v = st_value_get(m, "v")) && v->kind == ST_VALUE_NIL);
  CHECK((v = st_value_get(m, "s")) && v->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(v->as.str.ptr, "hello");
  CHECK((v = st_value_get(m, "empty")) && v->kind == ST_VALUE_STRING && v->as.str.len == 0);
  CHECK((v = st_value_get(m, "ver")) && v->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(v->as.str.ptr, "1.2.3");
  CHECK((v = st_value_get(m, "hex")) && v->kind == ST_VALUE_STRING);
  CHECK((v = st_value_get(m, "dot")) && v->kind == ST_VALUE_FLOAT && v->as.number == 0.5);
  CHECK((v = st_value_get(m, "pad")) && v->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(v->as.str.ptr, " 5");
  CHECK((v = st_value_get(m, "eq")) && v->kind == ST_VALUE_STRING);
  CHECK_STR_EQ(v->as.str.ptr, "a=b");
  st_result_free(r);
}

TEST(kv_forced_types) {
  const char *words[] = {"a:int=7",       "b:float=3",    "c:bool=1",     "d:bool=false",
                         "e:str=42",      "f:str=true",   "g:json=[1,\"x\",{\"k\":null}]",
                         "h:float=inf",   "i:json=2.0",   "j:str="};
  char *s = echo_words(words, sizeof words / sizeof *words);
  CHECK(s);
  CHECK_STR_EQ(s, "{\"a\":7,\"b\":3.0,\"c\":true,\"d\":false,\"e\":\"42\",\"f\":\"true\","
                  "\"g\":[1,\"x\",{\"k\":null}],\"h\":null,\"i\":2.0,\"j\":\"\"}");
  free(s);
}

TEST(kv_last_value_wins) {
  const char *words[] = {"n=1", "m=x", "n:str=2"};
  char *s = echo_words(words, 3);
  CHECK(s);
  CHECK_STR_EQ(s, "{\"n\":\"2\",\"m\":\"x\"}");
  free(s);
}

TEST(kv_errors) {
  st_args_t *a = st_args_new();
  char err[200];
  struct {
    const char *word, *msg;
  } bad[] = {
      {"novalue", "is not key=value"},
      {"=5", "empty key"},
      {":int=5", "empty key"},
      {"n:int=abc", "'abc' is not an integer"},
      {"n:int=1.5", "is not an integer"},
      {"n:int=99999999999999999999", "integer out of range"},
      {"n=99999999999999999999", "integer out of range"},
      {"x:float=abc", "'abc' is not a number"},
      {"x=1e999", "float out of range"},
      {"b:bool=maybe", "is not a boolean"},
      {"t:blob=1", "unknown type 'blob'"},
      {"t:=1", "unknown type"},
      {"j:json={", "unexpected end of input"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = '\0';
    CHECK_EQ_INT(st_args_parse_kv(a, bad[i].word, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(err, bad[i].msg);
  }
  CHECK_EQ_INT(st_args_parse_kv(a, "x=1", NULL, 0), ST_OK); /* err may be NULL */
  CHECK_EQ_INT(st_args_parse_kv(a, "bad", NULL, 0), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_int(a, "", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_string(a, "k", NULL), ST_ERR_INVALID_ARGUMENT);
  st_args_free(a);
  st_args_free(NULL);
}

TEST(typed_setters_round_trip) {
  st_args_t *a = st_args_new();
  CHECK_EQ_INT(st_args_nil(a, "nil"), ST_OK);
  CHECK_EQ_INT(st_args_bool(a, "yes", 1), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "big", INT64_MIN), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "max", INT64_MAX), ST_OK);
  CHECK_EQ_INT(st_args_float(a, "pi", 3.25), ST_OK);
  CHECK_EQ_INT(st_args_string(a, "utf", "gr\xc3\xbc\xc3\x9f \"q\"\n"), ST_OK);
  st_result_t *r = echo(a);
  st_args_free(a);
  CHECK(r);
  char *s = st_value_json(st_result_value(r), 0);
  st_result_free(r);
  CHECK_STR_EQ(s, "{\"nil\":null,\"yes\":true,\"big\":-9223372036854775808,"
                  "\"max\":9223372036854775807,\"pi\":3.25,"
                  "\"utf\":\"gr\xc3\xbc\xc3\x9f \\\"q\\\"\\n\"}");
  free(s);
}

/* JSON text -> args -> msgpack -> server -> value -> JSON text. */
static char *json_round_trip(const char *json) {
  st_args_t *a = st_args_new();
  char err[200];
  if (st_args_parse_json(a, json, err, sizeof err) != ST_OK) {
    fprintf(stderr, "parse %s: %s\n", json, err);
    st_args_free(a);
    return NULL;
  }
  st_result_t *r = echo(a);
  st_args_free(a);
  if (!r) return NULL;
  char *s = st_value_json(st_result_value(r), 0);
  st_result_free(r);
  return s;
}

TEST(json_good_inputs) {
  struct {
    const char *in, *out;
  } cases[] = {
      {"{}", "{}"},
      {" { \"a\" : 1 , \"b\":[ ] ,\"c\":{}}\n", "{\"a\":1,\"b\":[],\"c\":{}}"},
      {"{\"n\":-0,\"f\":0.5,\"e\":1E+2,\"g\":-1.25e-3}",
       "{\"n\":0,\"f\":0.5,\"e\":100.0,\"g\":-0.00125}"},
      {"{\"big\":18446744073709551615}", "{\"big\":1.8446744073709552e+19}"},
      {"{\"neg\":-9223372036854775808}", "{\"neg\":-9223372036854775808}"},
      {"{\"huge\":123456789012345678901234567890}", "{\"huge\":1.2345678901234568e+29}"},
      {"{\"s\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"}", "{\"s\":\"a\\\"b\\\\c/d\\b\\f\\n\\r\\t\"}"},
      {"{\"u\":\"\\u00e9\\u20ac\\ud83d\\ude00\"}",
       "{\"u\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"},
      {"{\"ctl\":\"\\u0001\"}", "{\"ctl\":\"\\u0001\"}"},
      {"{\"raw\":\"\xc3\xa9\"}", "{\"raw\":\"\xc3\xa9\"}"},
      {"{\"l\":[true,false,null,[1,[2,[3]]]]}", "{\"l\":[true,false,null,[1,[2,[3]]]]}"},
      {"{\"m\":{\"x\":{\"y\":\"z\"}}}", "{\"m\":{\"x\":{\"y\":\"z\"}}}"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char *s = json_round_trip(cases[i].in);
    CHECK(s);
    CHECK_STR_EQ(s, cases[i].out);
    free(s);
  }
}

TEST(json_bad_inputs) {
  struct {
    const char *in, *msg;
  } cases[] = {
      {"", "expected a JSON object"},
      {"[1]", "expected a JSON object but found '['"},
      {"{", "unexpected end of input"},
      {"{\"a\" 1}", "expected ':' after an object key but found '1' at line 1, column 6"},
      {"{\"a\":1,}", "trailing comma"},
      {"{\"a\":[1,]}", "trailing comma"},
      {"{\"a\":1 \"b\":2}", "expected ',' or '}'"},
      {"{\"a\":[1 2]}", "expected ',' or ']'"},
      {"{a:1}", "expected a string key or '}'"},
      {"{\"a\":01}", "leading zeros"},
      {"{\"a\":1.}", "a digit must follow the decimal point"},
      {"{\"a\":1e}", "a digit must follow the exponent"},
      {"{\"a\":-}", "invalid number"},
      {"{\"a\":+1}", "unexpected '+'"},
      {"{\"a\":NaN}", "unexpected 'N'"},
      {"{\"a\":tru}", "expected a value"},
      {"{\"a\":\"x}", "unterminated string"},
      {"{\"a\":\"\\q\"}", "invalid escape '\\q'"},
      {"{\"a\":\"\\u12\"}", "four hex digits"},
      {"{\"a\":\"\\udc00\"}", "lone low surrogate"},
      {"{\"a\":\"\\ud800x\"}", "not followed by a low one"},
      {"{\"a\":\"tab\there\"}", "control character 0x09"},
      {"{\"a\":\"\xff\"}", "invalid UTF-8"},
      {"{\"a\":\"\xc0\xaf\"}", "invalid UTF-8"},
      {"{\"a\":1,\"a\":2}", "duplicate key \"a\""},
      {"{\"a\":{\"b\":1,\"b\":2}}", "duplicate key \"b\""},
      {"{\"\":1}", "argument name cannot be empty"},
      {"{\"a\":1} x", "unexpected 'x' after the JSON value"},
      {"{\"a\":1e999}", "number out of range"},
      {"{\n  \"a\": 1,\n  \"b\" 2\n}", "at line 3, column 7"},
  };
  st_args_t *a = st_args_new();
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    char err[200] = "";
    CHECK_EQ_INT(st_args_parse_json(a, cases[i].in, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(err, cases[i].msg);
  }
  st_args_free(a);
}

/* "{\"a\":" + n '[' + n ']' + "}" into buf. */
static void nested_args(char *buf, int n) {
  size_t k = (size_t)sprintf(buf, "{\"a\":");
  for (int i = 0; i < n; i++) buf[k++] = '[';
  for (int i = 0; i < n; i++) buf[k++] = ']';
  buf[k++] = '}';
  buf[k] = '\0';
}

TEST(json_depth_limit) {
  /* 32 levels in all are allowed: the args object and 31 nested arrays. */
  char text[200], word[200];
  st_args_t *a = st_args_new();
  char err[200] = "";
  nested_args(text, ST_MAX_DEPTH - 1);
  CHECK_EQ_INT(st_args_parse_json(a, text, err, sizeof err), ST_OK);
  nested_args(text, ST_MAX_DEPTH);
  CHECK_EQ_INT(st_args_parse_json(a, text, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "nested deeper than 32 levels");
  /* key:json= values count from their own outermost container. */
  size_t k = (size_t)sprintf(word, "k:json=");
  for (int i = 0; i < ST_MAX_DEPTH; i++) word[k++] = '[';
  for (int i = 0; i < ST_MAX_DEPTH; i++) word[k++] = ']';
  word[k] = '\0';
  CHECK_EQ_INT(st_args_parse_kv(a, word, err, sizeof err), ST_OK);
  memmove(word + 8, word + 7, k - 7 + 1);
  word[7] = '[';
  memcpy(word + k + 1, "]", 2);
  CHECK_EQ_INT(st_args_parse_kv(a, word, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "nested deeper");
  st_args_free(a);
}

TEST(json_then_kv_override) {
  st_args_t *a = st_args_new();
  char err[200];
  CHECK_EQ_INT(st_args_parse_json(a, "{\"n\":1,\"s\":\"x\"}", err, sizeof err), ST_OK);
  CHECK_EQ_INT(st_args_parse_kv(a, "n=2", err, sizeof err), ST_OK);
  st_result_t *r = echo(a);
  st_args_free(a);
  CHECK(r);
  char *s = st_value_json(st_result_value(r), 0);
  st_result_free(r);
  CHECK_STR_EQ(s, "{\"n\":2,\"s\":\"x\"}");
  free(s);
}

TEST(value_json_pretty_and_specials) {
  st_args_t *a = st_args_new();
  st_args_float(a, "nan", NAN);
  st_args_float(a, "inf", -INFINITY);
  st_args_float(a, "tenth", 0.1);
  char err[100];
  st_args_parse_kv(a, "l:json=[1,{\"k\":[]}]", err, sizeof err);
  st_result_t *r = echo(a);
  st_args_free(a);
  CHECK(r);
  char *s = st_value_json(st_result_value(r), 1);
  st_result_free(r);
  CHECK_STR_EQ(s, "{\n  \"nan\": null,\n  \"inf\": null,\n  \"tenth\": 0.1,\n  \"l\": [\n    1,\n"
                  "    {\n      \"k\": []\n    }\n  ]\n}");
  free(s);
  CHECK(st_value_json(NULL, 0) == NULL);
}

int main(void) {
  fake_start(&fs);
  char err[256];
  if (st_client_connect(fs.path, &cl, err, sizeof err) != ST_OK) {
    fprintf(stderr, "cannot connect to the scripted server: %s\n", err);
    return 1;
  }
  RUN(kv_inferred_types);
  RUN(kv_forced_types);
  RUN(kv_last_value_wins);
  RUN(kv_errors);
  RUN(typed_setters_round_trip);
  RUN(json_good_inputs);
  RUN(json_bad_inputs);
  RUN(json_depth_limit);
  RUN(json_then_kv_override);
  RUN(value_json_pretty_and_specials);
  st_client_close(cl);
  fake_stop(&fs);
  return stt_summary();
}
