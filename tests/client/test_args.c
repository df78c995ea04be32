/* libstclient arguments: "key=value" typing, forced types, the JSON parser
 * (good and bad inputs, with messages), the nested builder (every value
 * type, nesting, its misuse and its errors), and the round trip of
 * arguments through msgpack: a scripted server echoes the argument map
 * back, and the decoded value must have the types and values the words or
 * builder calls asked for. */
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

/* Echo of a built map as compact JSON (owned), or NULL. */
static char *echo_json(const st_args_t *a) {
  st_result_t *r = echo(a);
  if (!r) return NULL;
  char *s = st_value_json(st_result_value(r), 0);
  st_result_free(r);
  return s;
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
  char *s = echo_json(a);
  st_args_free(a);
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
                         "h:float=inf",   "i:json=2.0",   "j:str=",       "k:hex=ff00",
                         "l:hex="};
  char *s = echo_words(words, sizeof words / sizeof *words);
  CHECK(s);
  CHECK_STR_EQ(s, "{\"a\":7,\"b\":3.0,\"c\":true,\"d\":false,\"e\":\"42\",\"f\":\"true\","
                  "\"g\":[1,\"x\",{\"k\":null}],\"h\":null,\"i\":2.0,\"j\":\"\","
                  "\"k\":{\"binary\":\"/wA=\"},\"l\":{\"binary\":\"\"}}");
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
      {"t:blob=1", "unknown type 'blob' (use int, float, bool, str, hex or json)"},
      {"h:hex=abc", "hex needs two digits a byte"},
      {"h:hex=zz", "'zz' is not a hex byte"},
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
  char *s = echo_json(a);
  st_args_free(a);
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

TEST(builder_round_trips_every_type) {
  st_args_t *a = st_args_new();
  CHECK_EQ_INT(st_args_int(a, "i", 42), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "neg", -7), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "min", INT64_MIN), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "max", INT64_MAX), ST_OK);
  CHECK_EQ_INT(st_args_float(a, "f", -0.5), ST_OK);
  CHECK_EQ_INT(st_args_bool(a, "b", 0), ST_OK);
  CHECK_EQ_INT(st_args_str(a, "s", "a\0b", 3), ST_OK);
  CHECK_EQ_INT(st_args_str(a, "e", NULL, 0), ST_OK);
  CHECK_EQ_INT(st_args_bytes(a, "bin", "\x00\xff", 2), ST_OK);
  CHECK_EQ_INT(st_args_nil(a, "n"), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "l"), ST_OK);        /* [1, nil, 3] */
  CHECK_EQ_INT(st_args_int(a, NULL, 1), ST_OK);
  CHECK_EQ_INT(st_args_nil(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_int(a, NULL, 3), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_map(a, "m"), ST_OK);         /* {"a": 1, "b": nil, ...} */
  CHECK_EQ_INT(st_args_int(a, "a", 1), ST_OK);
  CHECK_EQ_INT(st_args_nil(a, "b"), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "empty_list"), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_map(a, "empty_map"), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "deep"), ST_OK);
  CHECK_EQ_INT(st_args_begin_map(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_key(a, "k\0z", 3), ST_OK);
  CHECK_EQ_INT(st_args_string(a, NULL, "v"), ST_OK);
  CHECK_EQ_INT(st_args_str(a, "", "", 0), ST_OK);          /* "" is a key like any */
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_nil(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "one_nil"), ST_OK);  /* [nil] */
  CHECK_EQ_INT(st_args_nil(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  int64_t iv[3] = {-1, 0, INT64_MAX};
  double fv[2] = {0.25, -1e300};
  size_t lens[3] = {1, 0, 3};
  CHECK_EQ_INT(st_args_begin_list(a, "ints"), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, iv, 3), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "floats"), ST_OK);
  CHECK_EQ_INT(st_args_floats(a, fv, 2), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "strs"), ST_OK);
  CHECK_EQ_INT(st_args_strs(a, "xy\0z", lens, 3), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_map(a, "bulk_map"), ST_OK);   /* {"a": 1, "bc": 2, "": "s"} */
  size_t klens[3] = {1, 2, 0}, slen = 1;
  CHECK_EQ_INT(st_args_keys(a, "abc", klens, 3), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, iv + 1, 0), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, (int64_t[]){1, 2}, 2), ST_OK);
  CHECK_EQ_INT(st_args_strs(a, "s", &slen, 1), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, "none"), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, NULL, 0), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  CHECK_STR_EQ(st_args_error(a), "");
  st_result_t *r = echo(a);
  CHECK(r);
  char *s = st_value_json(st_result_value(r), 0);
  CHECK(s);
  CHECK_STR_EQ(s, "{\"i\":42,\"neg\":-7,\"min\":-9223372036854775808,\"max\":9223372036854775807,"
                  "\"f\":-0.5,\"b\":false,\"s\":\"a\\u0000b\",\"e\":\"\","
                  "\"bin\":{\"binary\":\"AP8=\"},"
                  "\"n\":null,\"l\":[1,null,3],\"m\":{\"a\":1,\"b\":null,\"empty_list\":[],"
                  "\"empty_map\":{}},\"deep\":[{\"k\\u0000z\":\"v\",\"\":\"\"},[null]],"
                  "\"one_nil\":[null],\"ints\":[-1,0,9223372036854775807],"
                  "\"floats\":[0.25,-1e+300],\"strs\":[\"x\",\"\",\"y\\u0000z\"],"
                  "\"bulk_map\":{\"a\":1,\"bc\":2,\"\":\"s\"},\"none\":[]}");
  free(s);
  /* The exact bytes and kinds, not only their JSON. */
  const st_value_t *m = st_result_value(r), *v;
  CHECK((v = st_value_get(m, "s")) && v->kind == ST_VALUE_STRING && v->as.str.len == 3);
  CHECK(memcmp(v->as.str.ptr, "a\0b", 3) == 0);
  CHECK((v = st_value_get(m, "bin")) && v->kind == ST_VALUE_BINARY && v->as.str.len == 2);
  CHECK((v = st_value_get(m, "l")) && v->kind == ST_VALUE_ARRAY && v->as.array.len == 3);
  CHECK(v->as.array.items[1].kind == ST_VALUE_NIL);
  CHECK((v = st_value_get(m, "m")) && v->kind == ST_VALUE_MAP && v->as.map.len == 4);
  CHECK((v = st_value_get(v, "empty_map")) && v->kind == ST_VALUE_MAP && v->as.map.len == 0);
  st_result_free(r);
  st_args_free(a);
}

/* A list of n ints by one call or by n calls, echoed and checked. */
static int echo_list_of(size_t n, int bulk) {
  st_args_t *a = st_args_new();
  int64_t *v = malloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = (int64_t)i * 3 - 5;
  int rc = ST_OK;
  if (bulk) {
    rc = st_args_begin_list(a, "x");
    if (rc == ST_OK) rc = st_args_ints(a, v, n);
    if (rc == ST_OK) rc = st_args_end(a);
  } else {
    rc = st_args_begin_map(a, "x");          /* a map of n members, then a list */
    for (size_t i = 0; i < n && rc == ST_OK; i++) {
      char key[24];
      snprintf(key, sizeof key, "k%zu", i);
      rc = st_args_int(a, key, v[i]);
    }
    if (rc == ST_OK) rc = st_args_end(a);
    if (rc == ST_OK) rc = st_args_begin_list(a, "y");
    for (size_t i = 0; i < n && rc == ST_OK; i++) rc = st_args_int(a, NULL, v[i]);
    if (rc == ST_OK) rc = st_args_end(a);
  }
  st_result_t *r = rc == ST_OK ? echo(a) : NULL;
  int ok = r != NULL;
  const st_value_t *m = r ? st_result_value(r) : NULL;
  const st_value_t *x = m ? st_value_get(m, bulk ? "x" : "y") : NULL;
  ok = ok && x && x->kind == ST_VALUE_ARRAY && x->as.array.len == n;
  for (size_t i = 0; ok && i < n; i++) ok = x->as.array.items[i].as.integer == v[i];
  if (!bulk) {
    const st_value_t *mm = m ? st_value_get(m, "x") : NULL;
    ok = ok && mm && mm->kind == ST_VALUE_MAP && mm->as.map.len == n;
    char key[24];
    snprintf(key, sizeof key, "k%zu", n - 1);
    const st_value_t *last = ok && n ? st_value_get(mm, key) : NULL;
    ok = ok && (n == 0 || (last && last->as.integer == v[n - 1]));
  }
  st_result_free(r);
  st_args_free(a);
  free(v);
  return ok;
}

TEST(builder_container_sizes) {
  /* Headers are rewritten to their shortest form at each size boundary. */
  size_t sizes[] = {0, 1, 15, 16, 17, 65535, 65536, 65537};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    if (!echo_list_of(sizes[i], 1) || !echo_list_of(sizes[i], 0))
      fprintf(stderr, "   size %zu\n", sizes[i]);
    CHECK(echo_list_of(sizes[i], 1));
    CHECK(echo_list_of(sizes[i], 0));
  }
}

TEST(builder_depth_limit) {
  /* A request holds 32 levels of containers, 4 of them its own: an
   * argument nests 28 levels of lists and maps. */
  const int max = ST_MAX_DEPTH - 4;
  st_args_t *a = st_args_new();
  CHECK_EQ_INT(st_args_begin_list(a, "d"), ST_OK);
  for (int i = 2; i <= max; i++) CHECK_EQ_INT(st_args_begin_list(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_begin_list(a, NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "argument 'd': lists and maps nested deeper than 28 levels");
  int64_t one = 1;
  CHECK_EQ_INT(st_args_ints(a, &one, 1), ST_ERR_INVALID_ARGUMENT);
  /* Every end returns the failure; the last one drops the value. */
  for (int i = 0; i <= max; i++) CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "st_args_end with no list or map open");
  char *s = echo_json(a);
  CHECK_STR_EQ(s, "{}");
  free(s);
  /* 28 levels go. */
  CHECK_EQ_INT(st_args_begin_list(a, "d"), ST_OK);
  for (int i = 2; i <= max; i++) CHECK_EQ_INT(st_args_begin_list(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, &one, 1), ST_OK);
  for (int i = 1; i <= max; i++) CHECK_EQ_INT(st_args_end(a), ST_OK);
  s = echo_json(a);
  CHECK(s);
  CHECK_EQ_INT(strlen(s), strlen("{\"d\":}") + 2 * (size_t)max + 1);
  CHECK_CONTAINS(s, "[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]");
  free(s);
  st_args_free(a);
}

TEST(builder_misuse_is_reported) {
  st_args_t *a = st_args_new();
  struct {
    int rc;
    const char *msg;
  } got[8];
  int n = 0;
#define TRY(call) (got[n].rc = (call), got[n++].msg = st_args_error(a))
  /* Top level: each failure stands alone and changes nothing. */
  CHECK_EQ_INT(st_args_int(a, NULL, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "an argument needs a non-empty name");
  CHECK_EQ_INT(st_args_nil(a, ""), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_key(a, "k", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "st_args_keys outside a map");
  CHECK_EQ_INT(st_args_str(a, "s", NULL, 2), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "NULL data of 2 bytes");
  CHECK_EQ_INT(st_args_ints(a, &(int64_t){1}, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "st_args_ints places values in an open list or map");
  CHECK_EQ_INT(st_args_int(a, "ok", 1), ST_OK);
  /* A key inside a list: the failure sticks until the outermost end. */
  CHECK_EQ_INT(st_args_begin_list(a, "l"), ST_OK);
  CHECK_EQ_INT(st_args_begin_map(a, NULL), ST_OK);
  CHECK_EQ_INT(st_args_int(a, NULL, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "argument 'l': a map member needs a key");
  TRY(st_args_int(a, "later", 2));
  TRY(st_args_begin_list(a, "inner"));       /* still opens a level */
  TRY(st_args_end(a));
  TRY(st_args_end(a));
  for (int i = 0; i < n; i++) {
    CHECK_EQ_INT(got[i].rc, ST_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(got[i].msg, "a map member needs a key");
  }
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);   /* the outermost: dropped */
  CHECK_EQ_INT(st_args_int(a, "after", 3), ST_OK);          /* the map works again */
  /* Other misuse inside a value. */
  CHECK_EQ_INT(st_args_begin_list(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "x", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "argument 'k': a list element takes no key (pass NULL)");
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_begin_map(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_key(a, "a", 1), ST_OK);
  CHECK_EQ_INT(st_args_int(a, "a", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "1 queued keys (st_args_key) name the next members");
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_begin_map(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_key(a, "a", 1), ST_OK);
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "argument 'k': 1 queued map keys have no value");
  CHECK_EQ_INT(st_args_begin_map(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_keys(a, "ab", (size_t[]){1, 1}, 2), ST_OK);
  CHECK_EQ_INT(st_args_ints(a, (int64_t[]){1, 2, 3}, 3), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "3 map members need a key");
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_begin_list(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_key(a, "a", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "argument 'k': keys inside a list");
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_begin_list(a, "k"), ST_OK);
  CHECK_EQ_INT(st_args_strs(a, NULL, (size_t[]){2}, 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_args_error(a), "st_args_strs: string 0 is NULL or too long");
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  /* A failed top-level begin opens a lost level, so its members stay
   * inside it instead of landing on the top level. */
  CHECK_EQ_INT(st_args_begin_map(a, ""), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_int(a, "stray", 1), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_end(a), ST_ERR_INVALID_ARGUMENT);
  /* Text and tensors wait for the value to close; calls refuse it. */
  char err[200];
  CHECK_EQ_INT(st_args_begin_list(a, "open"), ST_OK);
  CHECK_EQ_INT(st_args_parse_kv(a, "x=1", err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "a list or map is open");
  CHECK_EQ_INT(st_args_parse_json(a, "{\"x\":1}", err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  st_tensor_t t = {.name = "", .dtype = ST_DTYPE_FLOAT32};
  CHECK_EQ_INT(st_args_tensor(a, "t", &t, err, sizeof err), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "not inside a list or map");
  st_result_t *r = NULL;
  CHECK_EQ_INT(st_client_rpc(cl, "echo", a, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(st_client_error(cl), "unfinished list or map");
  CHECK_EQ_INT(st_client_call(cl, "echo", a, &r), ST_ERR_INVALID_ARGUMENT);
  CHECK(r == NULL);
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  char *s = echo_json(a);
  CHECK_STR_EQ(s, "{\"ok\":1,\"after\":3,\"open\":[]}");
  free(s);
  CHECK_EQ_INT(st_args_nil(NULL, "x"), ST_ERR_INVALID_ARGUMENT);
  CHECK_EQ_INT(st_args_end(NULL), ST_ERR_INVALID_ARGUMENT);
  CHECK_STR_EQ(st_args_error(NULL), "");
  st_args_free(a);
#undef TRY
}

TEST(builder_last_value_wins_and_text_mixes) {
  st_args_t *a = st_args_new();
  char err[200];
  CHECK_EQ_INT(st_args_parse_json(a, "{\"x\":[1,null,3],\"m\":{\"a\":null}}", err, sizeof err),
               ST_OK);
  CHECK_EQ_INT(st_args_parse_kv(a, "k:json=[null]", err, sizeof err), ST_OK);
  CHECK_EQ_INT(st_args_parse_kv(a, "n=null", err, sizeof err), ST_OK);
  char *s = echo_json(a);
  CHECK_STR_EQ(s, "{\"x\":[1,null,3],\"m\":{\"a\":null},\"k\":[null],\"n\":null}");
  free(s);
  CHECK_EQ_INT(st_args_begin_list(a, "x"), ST_OK);   /* replaces the JSON value */
  CHECK_EQ_INT(st_args_end(a), ST_OK);
  s = echo_json(a);
  CHECK_STR_EQ(s, "{\"x\":[],\"m\":{\"a\":null},\"k\":[null],\"n\":null}");
  free(s);
  st_args_free(a);
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
  RUN(builder_round_trips_every_type);
  RUN(builder_container_sizes);
  RUN(builder_depth_limit);
  RUN(builder_misuse_is_reported);
  RUN(builder_last_value_wins_and_text_mixes);
  st_client_close(cl);
  fake_stop(&fs);
  return stt_summary();
}
