/* src/lua: generation loading (every load error), worker vms, raised
 * errors, timeouts and cancellation. Drives st__generation_load,
 * st__vm_new and st__vm_build directly on files in a temp dir. */
#include <pthread.h>
#include <time.h>

#include "lua_kit.h"
#include "mpbuf.h"
#include "mem/arena.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Loads kit_dir expecting failure; returns the joined errors (owned). */
static char *load_fails(void) {
  st__generation_t *g = (st__generation_t *)1;
  char *errs = NULL;
  int rc = kit_load(&g, &errs);
  if (rc != ST_ERR_CONFIGURATION || g != NULL) {
    fprintf(stderr, "   expected CONFIGURATION, got %d\n", rc);
    st__generation_unref(g);
    free(errs);
    return NULL;
  }
  return errs;
}

#define EXPECT_LOAD_ERROR(needle)                 \
  do {                                            \
    char *e_ = load_fails();                      \
    CHECK(e_ != NULL);                            \
    int ok_ = strstr(e_, needle) != NULL;         \
    if (!ok_) fprintf(stderr, "   missing: %s\n", needle); \
    free(e_);                                     \
    CHECK(ok_);                                   \
  } while (0)

/* kit_dir loads with CONFIGURATION and every one of the NULL-terminated
 * parts in the errors. */
static void check_load_errors(const char *const *parts) {
  char *e = load_fails();
  CHECK(e != NULL);
  for (size_t i = 0; parts[i]; i++) CHECK_CONTAINS(e, parts[i]);
  free(e);
}

/* One file `name` holding `text`, loaded in a fresh dir: as
 * check_load_errors. */
static void expect_load_errors(const char *name, const char *text, const char *const *parts) {
  kit_fresh();
  kit_write(name, "%s", text);
  check_load_errors(parts);
}

TEST(syntax_error_names_file_and_line) {
  kit_fresh();
  kit_write("bad.lua", "return st.endpoint{\n  name = 'x',\n  build = function( end,\n}\n");
  EXPECT_LOAD_ERROR("bad.lua:3:");
}

TEST(runtime_error_at_top_level) {
  kit_fresh();
  kit_write("boom.lua", "local x = nil\nlocal y = x.field\nreturn st.endpoint{name='b', build=function() end}\n");
  EXPECT_LOAD_ERROR("boom.lua:2:");
}

TEST(unknown_option) {
  kit_fresh();
  kit_write("unk.lua", "-- comment\nreturn st.endpoint{\n  name = 'u', timout = 3,\n  build = function() end }\n");
  EXPECT_LOAD_ERROR("unk.lua:2: unknown option 'timout'");
}

TEST(wrong_types) {
  expect_load_errors(
      "types.lua",
      "return st.endpoint{ name = 'w', managed = 'yes', timeout = -1, doc = 3,\n"
      "  params = { n = function() end }, build = 'nope' }\n",
      (const char *const[]){"types.lua:1: option 'managed' must be a boolean",
                            "types.lua:1: option 'timeout' must be a number of seconds > 0",
                            "types.lua:1: option 'doc' must be a string",
                            "params.n: a default must be", "option 'build' must be a function",
                            NULL});
}

TEST(bad_enums) {
  expect_load_errors(
      "enum.lua",
      "return st.endpoint{ name = 'e', execution = 'later', concurrency = 'x',\n"
      "  ipc = 'shm', device = 'tpu', build = function() end }\n",
      (const char *const[]){
          "enum.lua:1: option 'execution' must be \"direct\" or \"task\", got \"later\"",
          "option 'concurrency' must be \"parallel\" or \"serialized\"",
          "option 'ipc' must be \"vmm\" or \"legacy\"",
          "option 'device' must be \"cpu\", \"cuda\" or \"cuda:N\", got \"tpu\"", NULL});
}

TEST(bad_names) {
  expect_load_errors(
      "names.lua",
      "return { st.endpoint{ name = '9lives', build = function() end },\n"
      "         st.endpoint{ name = 'has space', build = function() end },\n"
      "         st.endpoint{ build = function() end } }\n",
      (const char *const[]){"names.lua:1: invalid endpoint name \"9lives\"",
                            "names.lua:2: invalid endpoint name \"has space\"",
                            "names.lua:3: missing option 'name'", NULL});
}

TEST(format_key_naming_no_param) {
  kit_fresh();
  kit_write("fk.lua",
            "return st.endpoint{ name = 'f', params = { a = 1 },\n"
            "  cache_format_key = 'k:{a}:{nope}', build = function() end }\n");
  EXPECT_LOAD_ERROR("fk.lua:1: cache_format_key \"k:{a}:{nope}\" names {nope}, which is not a parameter");
  kit_write("fk.lua",
            "return st.endpoint{ name = 'f', params = { a = 1 }, cache = false,\n"
            "  cache_format_key = 'k:{a}', build = function() end }\n");
  EXPECT_LOAD_ERROR("cache_format_key implies cache = true");
  kit_write("fk.lua", "return st.endpoint{ name = 'f', cache_format_key = 'k:{a', build = function() end }\n");
  EXPECT_LOAD_ERROR("'{' without '}'");
}

TEST(duplicate_names_name_both_files) {
  kit_fresh();
  kit_write("a.lua", "return st.endpoint{ name = 'dup', build = function() end }\n");
  kit_write("b.lua", "\n\nreturn st.endpoint{ name = 'dup', build = function() end }\n");
  check_load_errors((const char *const[]){"duplicate endpoint name 'dup'", "a.lua:1", "b.lua:3", NULL});
}

TEST(missing_build_and_bad_returns) {
  kit_fresh();
  kit_write("nobuild.lua", "return st.endpoint{ name = 'n' }\n");
  EXPECT_LOAD_ERROR("nobuild.lua:1: missing option 'build'");
  kit_fresh();
  kit_write("noreturn.lua", "st.endpoint{ name = 'n', build = function() end }\n");
  EXPECT_LOAD_ERROR("noreturn.lua: the file must return st.endpoint{...} or an array of them");
  kit_fresh();
  kit_write("plain.lua", "return { name = 'n', build = function() end }\n");
  EXPECT_LOAD_ERROR("plain.lua: the file must return st.endpoint");
}

TEST(every_error_is_collected) {
  kit_fresh();
  kit_write("a.lua", "return st.endpoint{ name = 'a', bogus = 1, build = function() end }\n");
  kit_write("b.lua", "return st.endpoint{ name = 'b', managed = 1, build = function() end }\n");
  kit_write("c.lua", "syntax error here\n");
  kit_write("ok.lua", "return st.endpoint{ name = 'ok', build = function() end }\n");
  check_load_errors((const char *const[]){"a.lua:1: unknown option 'bogus'",
                                          "b.lua:1: option 'managed'", "c.lua:1:", NULL});
}

TEST(endless_top_level_is_a_load_error_not_a_hang) {
  kit_fresh();
  /* the load limit is 10 s; use a short file to keep the test honest */
  kit_write("spin.lua", "local n = 0\nwhile true do n = n + 1 end\n");
  double t0 = now_s();
  EXPECT_LOAD_ERROR("spin.lua:2: timed out");
  CHECK(now_s() - t0 < 30);
}

TEST(good_generation) {
  kit_fresh();
  kit_write("one.lua",
            "-- a comment\n"
            "return st.endpoint{\n"
            "  name = 'zeta', doc = 'last one', execution = 'task', concurrency = 'serialized',\n"
            "  managed = true, cache_format_key = 'z:{n}', singleflight = true, timeout = 2.5,\n"
            "  device = 'cuda:1', ipc = 'legacy',\n"
            "  params = { n = 3, x = 1.5, s = 'hi', b = false, t = { 1, 2 }, r = st.required },\n"
            "  build = function(a) return a.n end }\n");
  kit_write("two.lua",
            "local function helper(a) return 1 end\n"
            "return {\n"
            "  st.endpoint{ name = 'alpha', build = helper },\n"
            "  st.endpoint{ name = 'mid.v-2', build = helper },\n"
            "}\n");
  kit_write("notes.txt", "not lua");
  kit_write(".hidden.lua", "syntax error");
  st__generation_t *g;
  char *errs;
  CHECK_ERR(kit_load(&g, &errs), ST_OK);
  CHECK(errs == NULL);
  CHECK_EQ_INT(g->refs, 1);
  CHECK_EQ_INT(g->number, 1);
  CHECK(g->loaded_at > 1e9);
  CHECK_EQ_INT(g->nsources, 2);
  CHECK_CONTAINS(g->sources[0].path, "one.lua");
  CHECK_CONTAINS(g->sources[1].path, "two.lua");
  CHECK_CONTAINS(g->sources[1].text, "helper");
  CHECK_EQ_INT(g->nendpoints, 3);
  CHECK_STR_EQ(g->endpoints[0].name, "alpha");
  CHECK_STR_EQ(g->endpoints[1].name, "mid.v-2");
  CHECK_STR_EQ(g->endpoints[2].name, "zeta");
  const st__endpoint_decl_t *a = st__generation_find(g, "alpha", 5);
  CHECK(a == &g->endpoints[0]);
  CHECK(st__generation_find(g, "alphabet", 8) == NULL);
  CHECK(st__generation_find(g, "alp", 3) == NULL);
  CHECK(st__generation_find(g, "zetaXX", 4) == &g->endpoints[2]);
  CHECK_EQ_INT(a->line, 3);
  CHECK_EQ_INT(a->execution, ST_EXEC_DIRECT);
  CHECK_EQ_INT(a->concurrency, ST_CONC_PARALLEL);
  CHECK_EQ_INT(a->cache, 0);
  CHECK_EQ_INT(a->nparams, 0);
  CHECK(a->device == NULL);
  CHECK(a->timeout_s == 0);
  CHECK_EQ_INT(g->endpoints[1].line, 4);

  const st__endpoint_decl_t *z = &g->endpoints[2];
  CHECK_CONTAINS(z->file, "one.lua");
  CHECK_EQ_INT(z->line, 2);
  CHECK_STR_EQ(z->doc, "last one");
  CHECK_EQ_INT(z->execution, ST_EXEC_TASK);
  CHECK_EQ_INT(z->concurrency, ST_CONC_SERIALIZED);
  CHECK_EQ_INT(z->managed, 1);
  CHECK_EQ_INT(z->cache, 1);
  CHECK_STR_EQ(z->cache_format_key, "z:{n}");
  CHECK_EQ_INT(z->singleflight, 1);
  CHECK(z->timeout_s == 2.5);
  CHECK_STR_EQ(z->device, "cuda:1");
  CHECK_EQ_INT(z->ipc, ST_IPC_LEGACY);
  CHECK_EQ_INT(z->nparams, 6);
  const char *names[] = {"b", "n", "r", "s", "t", "x"};
  st__param_type_t types[] = {ST_PARAM_BOOL, ST_PARAM_INTEGER, ST_PARAM_ANY,
                              ST_PARAM_STRING, ST_PARAM_TABLE, ST_PARAM_NUMBER};
  for (int i = 0; i < 6; i++) {
    CHECK_STR_EQ(z->params[i].name, names[i]);
    CHECK_EQ_INT(z->params[i].type, types[i]);
    CHECK_EQ_INT(z->params[i].required, i == 2);
    CHECK_EQ_INT(z->params[i].default_mp == NULL, i == 2);
  }
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  CHECK(msgpack_unpack_next(&up, z->params[1].default_mp, z->params[1].default_len, &off) ==
        MSGPACK_UNPACK_SUCCESS);
  CHECK_EQ_INT(kit_int(&up.data), 3);
  off = 0;
  CHECK(msgpack_unpack_next(&up, z->params[4].default_mp, z->params[4].default_len, &off) ==
        MSGPACK_UNPACK_SUCCESS);
  CHECK(up.data.type == MSGPACK_OBJECT_ARRAY && up.data.via.array.size == 2);
  off = 0;
  CHECK(msgpack_unpack_next(&up, z->params[5].default_mp, z->params[5].default_len, &off) ==
        MSGPACK_UNPACK_SUCCESS);
  CHECK(up.data.type == MSGPACK_OBJECT_FLOAT64 && up.data.via.f64 == 1.5);
  msgpack_unpacked_destroy(&up);

  /* fingerprints: stable across loads, changed by an edit of the file */
  uint64_t fa = g->endpoints[0].fingerprint, fz = z->fingerprint;
  CHECK(fa != fz && fa != g->endpoints[1].fingerprint);
  st__generation_t *g2;
  CHECK_ERR(kit_load(&g2, &errs), ST_OK);
  CHECK(g2->endpoints[0].fingerprint == fa);
  st__generation_unref(g2);
  kit_write("two.lua",
            "local function helper(a) return 2 end\n"
            "return { st.endpoint{ name = 'alpha', build = helper },\n"
            "  st.endpoint{ name = 'mid.v-2', build = helper } }\n");
  CHECK_ERR(kit_load(&g2, &errs), ST_OK);
  CHECK(g2->endpoints[0].fingerprint != fa);
  CHECK(g2->endpoints[2].fingerprint == fz);
  st__generation_unref(g2);

  st__generation_ref(g);
  st__generation_unref(g);
  CHECK_EQ_INT(g->refs, 1);
  st__generation_unref(g);
}

TEST(metatables_on_declarations_run_no_code) {
  kit_fresh();
  kit_write("meta.lua",
            "local trap = { __index = function() while true do end end }\n"
            "return setmetatable(st.endpoint{ name = 'm', params = { t = setmetatable({ 1 }, trap) },\n"
            "  build = function() return 1 end }, trap)\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  CHECK_EQ_INT(k.gen->nendpoints, 1);
  CHECK_EQ_INT(k.gen->endpoints[0].line, 2);
  kit_vm_close(&k);
}

TEST(missing_dir) {
  st__generation_t *g;
  st__errlist_t l = {0};
  CHECK_ERR(st__generation_load("/nonexistent/endpoints", 1, NULL, &g, &l), ST_ERR_CONFIGURATION);
  CHECK(g == NULL);
  CHECK_EQ_INT(l.count, 1);
  CHECK_CONTAINS(l.items[0], "/nonexistent/endpoints: cannot open");
  st__errlist_clear(&l);
}

TEST(arguments_and_results) {
  kit_fresh();
  kit_write("args.lua",
            "return st.endpoint{ name = 'args', params = { n = 1, s = 'x', t = {} },\n"
            "  build = function(a)\n"
            "    return { twice = a.n * 2, s = a.s .. '!', t = a.t, nt = #a.t, frac = a.n / 4 }\n"
            "  end }\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  CHECK(st__vm_generation(k.vm) == k.gen);
  CHECK_EQ_INT(k.gen->refs, 2);
  mpbuf_t mb;
  mpbuf_init(&mb);
  msgpack_pack_map(&mb.pk, 3);
  st__pack_cstr(&mb.pk, "n");
  msgpack_pack_int(&mb.pk, 21);
  st__pack_cstr(&mb.pk, "s");
  st__pack_cstr(&mb.pk, "hey");
  st__pack_cstr(&mb.pk, "t");
  msgpack_pack_array(&mb.pk, 0);
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(kit_build(&k, "args", &mb.sb, NULL, &res, err, sizeof err), ST_OK, err);
  mpbuf_free(&mb);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_MAP);
  CHECK_EQ_INT(kit_int(st__map_get(v, "twice")), 42);
  CHECK(st__str_eq(st__map_get(v, "s"), "hey!"));
  CHECK_EQ_INT(kit_int(st__map_get(v, "nt")), 0);
  CHECK(st__map_get(v, "t")->type == MSGPACK_OBJECT_ARRAY);   /* empty array stays an array */
  CHECK(st__map_get(v, "frac")->type == MSGPACK_OBJECT_FLOAT64);
  CHECK(st__map_get(v, "frac")->via.f64 == 5.25);
  CHECK_EQ_INT(res.narenas, 0);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
  /* no args at all: an empty table */
  CHECK_ERR_MSG(kit_build(&k, "args", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT, err);
  CHECK_CONTAINS(err, "args.lua:3: attempt to perform arithmetic");
  kit_vm_close(&k);
}

TEST(raised_error_names_file_line_and_vm_survives) {
  kit_fresh();
  kit_write("err.lua",
            "return {\n"
            "  st.endpoint{ name = 'fails', build = function(a)\n"
            "    local x = 1\n"
            "    error('boom: ' .. x)\n"
            "  end },\n"
            "  st.endpoint{ name = 'obj', build = function() error({}) end },\n"
            "  st.endpoint{ name = 'nolevel', build = function() error('plain', 0) end },\n"
            "  st.endpoint{ name = 'arith', build = function() return nil + 1 end },\n"
            "  st.endpoint{ name = 'fine', build = function() return 'ok' end },\n"
            "}\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  for (int round = 0; round < 2; round++) {
    CHECK_ERR_MSG(kit_build(&k, "fails", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT, err);
    CHECK_CONTAINS(err, "err.lua:4: boom: 1");
    CHECK(strstr(err, "traceback") == NULL);
    CHECK(strstr(err, "\n") == NULL);
    CHECK_EQ_INT(res.narenas, 0);
    CHECK_ERR_MSG(kit_build(&k, "obj", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT, err);
    CHECK_CONTAINS(err, "err.lua:6: (error object is a table value)");
    CHECK_ERR_MSG(kit_build(&k, "nolevel", NULL, NULL, &res, err, sizeof err),
                  ST_ERR_ENDPOINT, err);
    CHECK_CONTAINS(err, "err.lua:7: plain");
    CHECK_ERR_MSG(kit_build(&k, "arith", NULL, NULL, &res, err, sizeof err), ST_ERR_ENDPOINT, err);
    CHECK_CONTAINS(err, "err.lua:8: attempt to perform arithmetic");
    CHECK_ERR_MSG(kit_build(&k, "fine", NULL, NULL, &res, err, sizeof err), ST_OK, err);
    msgpack_unpacked up;
    CHECK(st__str_eq(kit_value(&res, &up), "ok"));
    msgpack_unpacked_destroy(&up);
    st__build_result_destroy(&res);
  }
  kit_vm_close(&k);
}

TEST(timeout_fires_on_endless_loops) {
  kit_fresh();
  kit_write("spin.lua",
            "return {\n"
            "  st.endpoint{ name = 'spin', timeout = 0.2, build = function()\n"
            "    while true do end\n"
            "  end },\n"
            "  st.endpoint{ name = 'swallow', timeout = 0.2, build = function()\n"
            "    while true do pcall(function() while true do end end) end\n"
            "  end },\n"
            "  st.endpoint{ name = 'xswallow', timeout = 0.2, build = function()\n"
            "    while true do xpcall(function() while true do end end, function(e) return e end) end\n"
            "  end },\n"
            "  st.endpoint{ name = 'sleepy', timeout = 0.2, build = function()\n"
            "    st.sleep(30)\n"
            "  end },\n"
            "  st.endpoint{ name = 'quick', timeout = 5, build = function() return 1 end },\n"
            "}\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  const char *names[] = {"spin", "swallow", "xswallow", "sleepy"};
  for (int i = 0; i < 4; i++) {
    double t0 = now_s();
    CHECK_ERR_MSG(kit_build(&k, names[i], NULL, NULL, &res, err, sizeof err), ST_ERR_TIMEOUT, err);
    double dt = now_s() - t0;
    CHECK(dt >= 0.19 && dt < 5);
    CHECK_CONTAINS(err, "spin.lua:");
    CHECK_CONTAINS(err, "timed out after 0.2 s");
  }
  CHECK_ERR_MSG(kit_build(&k, "quick", NULL, NULL, &res, err, sizeof err), ST_OK, err);
  st__build_result_destroy(&res);
  kit_vm_close(&k);
}

typedef struct canceller {
  volatile int *flag;
  uint64_t arenas_before;
} canceller_t;

/* Sets the flag once the body has started (it makes an arena first). */
static void *cancel_when_started(void *arg) {
  canceller_t *c = arg;
  double end = now_s() + 10;
  for (;;) {
    uint64_t n;
    st__arena_stats(&n, NULL);
    if (n > c->arenas_before || now_s() > end) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  __atomic_store_n(c->flag, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* st.progress(fraction, note): the last report lands in the job's sink;
 * misuse raises with file:line; without a sink it does nothing. */
TEST(progress_reports_reach_the_sink) {
  kit_fresh();
  kit_write("p.lua",
            "return {\n"
            "  st.endpoint{ name = 'steps', build = function()\n"
            "    st.progress(0.25, 'loading')\n"
            "    st.progress(0.5)\n"
            "    return 1 end },\n"
            "  st.endpoint{ name = 'bad', params = { f = 0.5, note = 'x', n = 1 },\n"
            "    build = function(a)\n"
            "      if a.n == 1 then st.progress(a.f) end\n"
            "      if a.n == 2 then st.progress(0.5, 7) end\n"
            "      if a.n == 3 then st.progress(0.5, string.rep('x', 201)) end\n"
            "      if a.n == 4 then st.progress(0.5, string.rep('y', 200)) end\n"
            "      return 1 end },\n"
            "}\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  st__progress_t p, got;
  memset(&p, 0, sizeof p);
  pthread_mutex_init(&p.mu, NULL);
  CHECK_ERR_MSG(kit_build_p(&k, "steps", NULL, NULL, &p, &res, err, sizeof err), ST_OK, err);
  st__build_result_destroy(&res);
  CHECK(st__progress_get(&p, &got));
  CHECK(got.fraction == 0.5);
  CHECK(got.has_note);
  CHECK_STR_EQ(got.note, "loading");          /* a report without a note keeps the last one */
  /* Without a sink: nothing happens. */
  CHECK_ERR_MSG(kit_build(&k, "steps", NULL, NULL, &res, err, sizeof err), ST_OK, err);
  st__build_result_destroy(&res);
  static const struct { double f; int n; const char *msg; } bad[] = {
      {1.5, 1, "p.lua:8: st.progress: fraction must be in [0, 1], got 1.5"},
      {-0.5, 1, "fraction must be in [0, 1]"},
      {0.5, 2, "p.lua:9: st.progress: note must be a string, got number"},
      {0.5, 3, "p.lua:10: st.progress: note of 201 bytes is longer than 200"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    mpbuf_t mb;
    mpbuf_text(&mb, "{f: %#.17g, n: %d, note: 'x'}", bad[i].f, bad[i].n);
    int rc = kit_build_p(&k, "bad", &mb.sb, NULL, &p, &res, err, sizeof err);
    mpbuf_free(&mb);
    CHECK_ERR(rc, ST_ERR_ENDPOINT);
    CHECK_CONTAINS(err, bad[i].msg);
  }
  mpbuf_t mb;
  mpbuf_text(&mb, "{f: 0.5, n: 4, note: 'x'}");
  CHECK_ERR_MSG(kit_build_p(&k, "bad", &mb.sb, NULL, &p, &res, err, sizeof err), ST_OK, err);
  mpbuf_free(&mb);
  st__build_result_destroy(&res);
  st__progress_get(&p, &got);
  CHECK_EQ_INT(strlen(got.note), 200);
  pthread_mutex_destroy(&p.mu);
  kit_vm_close(&k);
}

TEST(cancel_flag_stops_the_body) {
  kit_fresh();
  kit_write("c.lua",
            "return {\n"
            "  st.endpoint{ name = 'loop', build = function()\n"
            "    local t = st.zeros{1}\n"
            "    while true do end\n"
            "  end },\n"
            "  st.endpoint{ name = 'sleeper', build = function()\n"
            "    local t = st.zeros{1}\n"
            "    while not st.cancelled() do st.sleep(0.001) end\n"
            "  end },\n"
            "  st.endpoint{ name = 'flag', build = function() return st.cancelled() end },\n"
            "}\n");
  kit_vm_t k;
  CHECK_ERR(kit_vm_open(&k), ST_OK);
  st__build_result_t res;
  char err[1024];
  const char *names[] = {"loop", "sleeper"};
  for (int i = 0; i < 2; i++) {
    volatile int flag = 0;
    canceller_t c = {&flag, 0};
    st__arena_stats(&c.arenas_before, NULL);
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, cancel_when_started, &c), 0);
    int rc = kit_build(&k, names[i], NULL, &flag, &res, err, sizeof err);
    pthread_join(th, NULL);
    CHECK_ERR(rc, ST_ERR_CANCELLED);
    CHECK_CONTAINS(err, "c.lua:");
    CHECK_CONTAINS(err, "cancelled");
  }
  volatile int set = 1, clear = 0;
  CHECK_ERR_MSG(kit_build(&k, "flag", NULL, &set, &res, err, sizeof err), ST_ERR_CANCELLED, err);
  CHECK_ERR_MSG(kit_build(&k, "flag", NULL, &clear, &res, err, sizeof err), ST_OK, err);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_BOOLEAN && !v->via.boolean);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
  kit_vm_close(&k);
}

TEST(print_and_require) {
  kit_fresh();
  kit_write("p.lua",
            "local st2 = require('st')\n"
            "return st.endpoint{ name = 'p', build = function()\n"
            "  print('hello from', 'lua', 42, nil, true)\n"
            "  return st2 == st\n"
            "end }\n");
  st__build_result_t res;
  char err[1024];
  CHECK_ERR_MSG(kit_build_once("p", &res, err, sizeof err), ST_OK, err);
  msgpack_unpacked up;
  const msgpack_object *v = kit_value(&res, &up);
  CHECK(v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean);
  msgpack_unpacked_destroy(&up);
  st__build_result_destroy(&res);
}

int main(void) {
  RUN(syntax_error_names_file_and_line);
  RUN(runtime_error_at_top_level);
  RUN(unknown_option);
  RUN(wrong_types);
  RUN(bad_enums);
  RUN(bad_names);
  RUN(format_key_naming_no_param);
  RUN(duplicate_names_name_both_files);
  RUN(missing_build_and_bad_returns);
  RUN(every_error_is_collected);
  RUN(endless_top_level_is_a_load_error_not_a_hang);
  RUN(good_generation);
  RUN(metatables_on_declarations_run_no_code);
  RUN(missing_dir);
  RUN(arguments_and_results);
  RUN(raised_error_names_file_line_and_vm_survives);
  RUN(timeout_fires_on_endless_loops);
  RUN(cancel_flag_stops_the_body);
  RUN(progress_reports_reach_the_sink);
  RUN(print_and_require);
  kit_rmdir();
  return stt_summary();
}
