/* src/lua: config.lua loading, good and bad files. */
#include "lua_kit.h"
#include "server/config.h"

static char cfg_path[600];

static int load_cfg(const char *text, st__config_t *c, char **errs) {
  kit_fresh();
  kit_write("config.lua", "%s", text);
  snprintf(cfg_path, sizeof cfg_path, "%s/config.lua", kit_dir);
  st__config_defaults(c);
  st__errlist_t l = {0};
  int rc = st__config_load(cfg_path, c, &l);
  *errs = st__errlist_join(&l);
  if (*errs) fprintf(stderr, "   config errors:\n%s\n", *errs);
  st__errlist_clear(&l);
  return rc;
}

TEST(every_key) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("-- comment\n"
                     "local base = '/tmp/st-test'\n"
                     "return {\n"
                     "  base_path = base .. '-x',\n"
                     "  devices = { 0, 2 },\n"
                     "  workers = 8,\n"
                     "  endpoints = 'eps',\n"
                     "  log_level = 'debug',\n"
                     "  socket_mode = '0660',\n"
                     "  socket_group = 'wheel',\n"
                     "  allow_uids = { 1000, 1001 },\n"
                     "  allow_gids = { 27 },\n"
                     "  limits = { max_message_bytes = 1024, max_connections = 10, max_inflight = 3,\n"
                     "             frame_timeout_ms = 500, max_object_bytes = 4096 },\n"
                     "  shutdown_grace_s = 2.5,\n"
                     "  tasks = { ttl_s = 0.5, capacity = 20 },\n"
                     "  memory_budget = { cpu = 4096, ['cuda:1'] = 0 },\n"
                     "  default_device = 'cpu',\n"
                     "  data_dirs = { 'models', '/srv/weights' },\n"
                     "  loader_threads = 8,\n"
                     "  staging_bytes = 64 * 1024 * 1024,\n"
                     "}\n", &c, &errs), ST_OK);
  CHECK(errs == NULL);
  CHECK_STR_EQ(c.path, cfg_path);
  CHECK_STR_EQ(c.base_path, "/tmp/st-test-x");
  CHECK_EQ_INT(c.ndevices, 2);
  CHECK_EQ_INT(c.devices[1], 2);
  CHECK_EQ_INT(c.workers, 8);
  char want[700];
  snprintf(want, sizeof want, "%s/eps", kit_dir);
  CHECK_STR_EQ(c.endpoints_dir, want);
  CHECK_EQ_INT(c.log_level, ST_LOG_DEBUG);
  CHECK_EQ_INT(c.socket_mode, 0660);
  CHECK_STR_EQ(c.socket_group, "wheel");
  CHECK_EQ_INT(c.nallow_uids, 2);
  CHECK_EQ_INT(c.allow_uids[1], 1001);
  CHECK_EQ_INT(c.nallow_gids, 1);
  CHECK_EQ_INT(c.allow_gids[0], 27);
  CHECK_EQ_INT(c.max_message_bytes, 1024);
  CHECK_EQ_INT(c.max_connections, 10);
  CHECK_EQ_INT(c.max_inflight, 3);
  CHECK_EQ_INT(c.frame_timeout_ms, 500);
  CHECK_EQ_INT(c.max_object_bytes, 4096);
  CHECK(c.shutdown_grace_s == 2.5);
  CHECK(c.task_ttl_s == 0.5);
  CHECK_EQ_INT(c.task_capacity, 20);
  CHECK_EQ_INT(c.nbudgets, 2);
  CHECK_STR_EQ(c.budgets[0].device, "cpu");
  CHECK_EQ_INT(c.budgets[0].bytes, 4096);
  CHECK_STR_EQ(c.budgets[1].device, "cuda:1");
  CHECK_EQ_INT(c.budgets[1].bytes, 0);
  CHECK_STR_EQ(c.default_device, "cpu");
  CHECK_EQ_INT(c.ndata_dirs, 2);
  snprintf(want, sizeof want, "%s/models", kit_dir);
  CHECK_STR_EQ(c.data_dirs[0], want);
  CHECK_STR_EQ(c.data_dirs[1], "/srv/weights");
  CHECK_EQ_INT(c.loader_threads, 8);
  CHECK_EQ_INT(c.staging_bytes, 64 << 20);
  st__config_free(&c);
}

TEST(defaults_stay_and_short_forms) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("return { devices = 3, socket_mode = 384, endpoints = '/abs/eps' }\n", &c, &errs),
            ST_OK);
  CHECK_EQ_INT(c.ndevices, 1);
  CHECK_EQ_INT(c.devices[0], 3);
  CHECK_EQ_INT(c.socket_mode, 0600);
  CHECK_STR_EQ(c.endpoints_dir, "/abs/eps");
  CHECK_EQ_INT(c.workers, 4);                       /* untouched default */
  CHECK_EQ_INT(c.max_inflight, ST_DEFAULT_MAX_INFLIGHT);
  CHECK(c.task_ttl_s == 600.0);
  CHECK_EQ_INT(c.task_capacity, 10000);
  CHECK_EQ_INT(c.nbudgets, 1);
  CHECK_EQ_INT(c.budgets[0].bytes, st__config_default_cpu_budget());
  CHECK(c.budgets[0].bytes > 0);
  CHECK_STR_EQ(c.default_device, "socket");
  CHECK_EQ_INT(c.loader_threads, 4);
  CHECK_EQ_INT(c.staging_bytes, 256 << 20);
  /* The default data directory is the config file's directory. */
  char want[700];
  snprintf(want, sizeof want, "%s/.", kit_dir);
  CHECK_EQ_INT(c.ndata_dirs, 1);
  CHECK_STR_EQ(c.data_dirs[0], want);
  st__config_free(&c);
  CHECK_ERR(load_cfg("return {}\n", &c, &errs), ST_OK);
  st__config_free(&c);
}

TEST(bad_values_are_all_reported) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("return {\n"
                     "  wrokers = 4,\n"
                     "  workers = 0,\n"
                     "  devices = { 0, -1 },\n"
                     "  log_level = 'loud',\n"
                     "  socket_mode = '0999',\n"
                     "  base_path = 5,\n"
                     "  allow_uids = 'me',\n"
                     "  limits = { max_inflight = 2.5, bogus = 1 },\n"
                     "  shutdown_grace_s = -1,\n"
                     "  tasks = { ttl_s = 0, capacity = 0, keep = 1 },\n"
                     "  memory_budget = { gpu = 1, cpu = -5, ['cuda:x'] = 1 },\n"
                     "  [1] = 'x',\n"
                     "  default_device = 'gpu',\n"
                     "  data_dirs = 'models',\n"
                     "  loader_threads = 0,\n"
                     "  staging_bytes = 1024,\n"
                     "}\n", &c, &errs), ST_ERR_CONFIGURATION);
  CHECK(errs != NULL);
  CHECK_CONTAINS_ALL(errs, "config.lua: unknown key 'wrokers'",
                           "config.lua: workers: expected an integer in 1..256, got 0",
                           "devices[2]: expected an integer in 0..4095, got -1",
                           "log_level: expected \"error\", \"warn\", \"info\" or \"debug\"",
                           "socket_mode: expected octal permission bits like \"0660\", got \"0999\"",
                           "base_path: expected a non-empty string, got number",
                           "allow_uids: expected an array of integers, got string",
                           "limits.max_inflight: expected an integer",
                           "limits: unknown key 'bogus'",
                           "shutdown_grace_s: expected a number of seconds >= 0, got -1",
                           "config.lua: keys must be strings",
                           "tasks.ttl_s: expected a number of seconds > 0, got 0",
                           "tasks.capacity: expected an integer in 1..10000000, got 0",
                           "tasks: unknown key 'keep' (ttl_s, capacity)",
                           "memory_budget: keys are \"cpu\" or \"cuda:N\", got 'gpu'",
                           "memory_budget: keys are \"cpu\" or \"cuda:N\", got 'cuda:x'",
                           "memory_budget.cpu: expected an integer in 0..",
                           "default_device: expected \"socket\" or \"cpu\"",
                           "data_dirs: expected an array of directory names, got string",
                           "loader_threads: expected an integer in 1..64, got 0",
                           "staging_bytes: expected an integer in 4194304..");
  free(errs);
  st__config_free(&c);
}

TEST(lua_errors_name_the_line) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("return {\n  workers = 4\n  endpoints = 'x',\n}\n", &c, &errs),
            ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(errs, "config.lua:3:");
  free(errs);
  st__config_free(&c);
  CHECK_ERR(load_cfg("local x = nil\nreturn { workers = x.n }\n", &c, &errs), ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(errs, "config.lua:2:");
  free(errs);
  st__config_free(&c);
  CHECK_ERR(load_cfg("return 42\n", &c, &errs), ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(errs, "config.lua: the file must return a table");
  free(errs);
  st__config_free(&c);
}

TEST(config_is_sandboxed) {
  static const char *const bodies[] = {
    "os.execute('touch /tmp/st-config-escaped') return {}\n",
    "return { base_path = io.read() }\n",
    "return { base_path = os.getenv('HOME') }\n",
    "return { workers = st.version }\n",
    "local ffi = require('ffi') return {}\n",
    "x = 1 return {}\n",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    st__config_t c;
    char *errs;
    CHECK_ERR(load_cfg(bodies[i], &c, &errs), ST_ERR_CONFIGURATION);
    CHECK_CONTAINS(errs, "config.lua:");
    free(errs);
    st__config_free(&c);
  }
  CHECK(access("/tmp/st-config-escaped", F_OK) != 0);
}

/* A file that builds more than a load may hold is an error naming the
 * limit, not an exhausted host. */
TEST(config_memory_is_bounded) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("local s = string.rep('d', 2^30)\nreturn { workers = 1 }\n", &c, &errs),
            ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(errs, "config.lua: the file went past the 64 MiB of Lua memory");
  free(errs);
  st__config_free(&c);
  CHECK_ERR(load_cfg("local t = {}\nfor i = 1, 1e9 do t[i] = i end\nreturn {}\n", &c, &errs),
            ST_ERR_CONFIGURATION);
  CHECK_CONTAINS(errs, "64 MiB of Lua memory");
  free(errs);
  st__config_free(&c);
}

TEST(repository_config_loads) {
  const char *src = getenv("ST_SOURCE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/config.lua", src ? src : ".");
  st__config_t c;
  st__config_defaults(&c);
  st__errlist_t l = {0};
  int rc = st__config_load(path, &c, &l);
  char *errs = st__errlist_join(&l);
  if (errs) fprintf(stderr, "%s\n", errs);
  free(errs);
  st__errlist_clear(&l);
  CHECK_ERR(rc, ST_OK);
  CHECK_CONTAINS(c.endpoints_dir, "/endpoints");
  CHECK_EQ_INT(c.max_object_bytes, 0);   /* the budget bounds an arena */
  CHECK_EQ_INT(c.max_arena_fds, 0);      /* half of RLIMIT_NOFILE */
  st__config_free(&c);
  CHECK_ERR(load_cfg("return { socket_group = 27 }\n", &c, &errs), ST_OK);
  CHECK_STR_EQ(c.socket_group, "27");
  st__config_free(&c);
}

/* The peer table (src/peer): every form of peers, the defaults, and the
 * errors of each kind of bad value. */
TEST(peer_table) {
  st__config_t c;
  char *errs;
  CHECK_ERR(load_cfg("return { peer = {\n"
                     "  id = 'node-a', listen = '127.0.0.1:0', secret = 'k',\n"
                     "  peers = { ['node-b'] = '10.0.0.2:7070',\n"
                     "            c = { addr = '[::1]:7070', as_uid = 1000 }, d = {} },\n"
                     "  export = { 'weights/*', 'kv/*' }, connect_timeout_s = 2.5,\n"
                     "} }\n", &c, &errs), ST_OK);
  free(errs);
  CHECK_STR_EQ(c.peer.id, "node-a");
  CHECK(strstr(c.peer.secret, "/k") != NULL);
  CHECK_EQ_INT(c.peer.npeers, 3);
  CHECK_EQ_INT(c.peer.nexport, 2);
  CHECK_STR_EQ(c.peer.exports[1], "kv/*");
  CHECK(c.peer.connect_timeout_s == 2.5);
  CHECK_EQ_INT(c.peer.max_transfers_per_peer, 4);
  int seen = 0;
  for (int i = 0; i < c.peer.npeers; i++) {
    const st__peer_entry_t *e = &c.peer.peers[i];
    if (strcmp(e->id, "node-b") == 0) {
      seen++;
      CHECK_STR_EQ(e->addr, "10.0.0.2:7070");
      CHECK_EQ_INT(e->as_uid, -1);
    } else if (strcmp(e->id, "c") == 0) {
      seen++;
      CHECK_STR_EQ(e->addr, "[::1]:7070");
      CHECK_EQ_INT(e->as_uid, 1000);
    } else if (strcmp(e->id, "d") == 0) {
      seen++;
      CHECK(e->addr == NULL);
    }
  }
  CHECK_EQ_INT(seen, 3);
  st__config_free(&c);
  /* The default id is the host name. */
  CHECK_ERR(load_cfg("return {}\n", &c, &errs), ST_OK);
  free(errs);
  CHECK(c.peer.id && c.peer.id[0]);
  CHECK(c.peer.listen == NULL && c.peer.npeers == 0);
  st__config_free(&c);
  CHECK_ERR(load_cfg("return { peer = { peers = { ['a b'] = 'x:1', e = 5, f = { addr = 3, "
                     "as_uid = 0, bogus = 1 } }, export = 'x', max_transfers_per_peer = 0 } }\n",
                     &c, &errs),
            ST_ERR_CONFIGURATION);
  CHECK(errs && strstr(errs, "peer.peers: names are peer ids"));
  CHECK(errs && strstr(errs, "peer.peers.e: expected a string or a table"));
  CHECK(errs && strstr(errs, "peer.peers.f.addr"));
  CHECK(errs && strstr(errs, "peer.peers.f.as_uid"));
  CHECK(errs && strstr(errs, "unknown key 'bogus'"));
  CHECK(errs && strstr(errs, "peer.export: expected an array of strings"));
  CHECK(errs && strstr(errs, "peer.max_transfers_per_peer"));
  free(errs);
  st__config_free(&c);
}

TEST(missing_file) {
  st__config_t c;
  st__config_defaults(&c);
  st__errlist_t l = {0};
  CHECK_ERR(st__config_load("/nonexistent/config.lua", &c, &l), ST_ERR_CONFIGURATION);
  CHECK_EQ_INT(l.count, 1);
  CHECK_CONTAINS(l.items[0], "/nonexistent/config.lua: cannot read");
  st__errlist_clear(&l);
  st__config_free(&c);
}

int main(void) {
  RUN(every_key);
  RUN(defaults_stay_and_short_forms);
  RUN(bad_values_are_all_reported);
  RUN(lua_errors_name_the_line);
  RUN(config_is_sandboxed);
  RUN(config_memory_is_bounded);
  RUN(repository_config_loads);
  RUN(peer_table);
  RUN(missing_file);
  kit_rmdir();
  return stt_summary();
}
