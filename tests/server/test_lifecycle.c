/* The server's life: SIGTERM, a second server on the same path, stale and
 * foreign files at the socket path, long paths, --check, --help,
 * --version, bad flags, settings precedence, SIGHUP reloads (good and bad)
 * and the drain of in-flight calls on shutdown. */
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "check.h"
#include "proc.h"
#include "wire.h"

static const char A_EP[] =
    "return st.endpoint{ name = \"alpha\", build = function() return 1 end }\n";
static const char B_EP[] =
    "return st.endpoint{ name = \"beta\", params = { x = 2 },\n"
    "  build = function(a) return a.x * 2 end }\n";
static const char SLOW_EP[] =
    "return st.endpoint{ name = \"slow\", params = { s = 0.3 },\n"
    "  build = function(a) st.sleep(a.s); return \"done\" end }\n";

static void slurp(const char *path, char *buf, size_t cap) {
  buf[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
}

/* Runs stserver with argv (NULL-terminated, without the program name),
 * optionally with one extra environment variable, to its exit (30 s). */
static void run_server(const char *const *args, const char *env, stt_proc_t *r) {
  stt_run(r, getenv("ST_SERVER_BIN"), args, env, 0);
}

static void write_config(const char *path, const char *fields) {
  char text[4096];
  snprintf(text, sizeof text, "return {\n%s\n}\n", fields);
  stt_write_file(path, text);
}

static stt_server_t S;

TEST(sigterm_exits_fast_and_unlinks) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  if (stt_server_start(&S) != 0) {
    stt_server_cleanup(&S);
    CHECK(0);
  }
  rc_t c;
  CHECK(rc_open(&c, S.socket) == 0);   /* an idle client does not hold it up */
  CHECK(stt_ping(c.fd, 1) == 0);
  double t0 = stt_now_ms();
  int status = stt_server_stop(&S);    /* also checks the socket is gone */
  double took = stt_now_ms() - t0;
  msg_t m;
  int eof = rc_next(&c, &m, 2000);
  rc_close(&c);
  char *log = stt_server_log(&S);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(status, 0);
  CHECK(took < 1000);
  CHECK_EQ_INT(eof, 0);
  CHECK_CONTAINS(log, "SIGTERM");
  CHECK_CONTAINS(log, "stopped after");
  free(log);
}

/* The socket file appears only once the socket listens (bound under a
 * name of its own, renamed into place): a connect made as soon as the
 * file is there is accepted, start after start, though each listen is
 * made 200 ms slower than its bind (the fault shim's
 * ST_FAULT_LISTEN_DELAY_MS; without the shim the window is microseconds
 * wide and the test proves less). */
TEST(the_socket_file_appears_listening) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  /* Started and stopped once through the fixture, which writes the config. */
  CHECK_EQ_INT(stt_server_start(&S), 0);
  CHECK_EQ_INT(stt_server_stop(&S), 0);
  const char *shim = getenv("ST_FAULT_LIB");
  char env[600] = "";
  if (shim && shim[0])
    snprintf(env, sizeof env, "LD_PRELOAD=%s\nST_FAULT_LISTEN_DELAY_MS=200\n", shim);
  int refused = 0, starts = 0;
  for (int round = 0; round < 3; round++) {
    stt_proc_t p;
    const char *args[] = {"--config", S.config, NULL};
    if (stt_proc_start(&p, getenv("ST_SERVER_BIN"), args, env[0] ? env : NULL, 0) != 0) break;
    starts++;
    struct stat st;
    double end = stt_now_ms() + 20000;
    while (lstat(S.socket, &st) != 0 && stt_now_ms() < end) continue;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, S.socket, strlen(S.socket) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) refused++;
    else CHECK(stt_ping(fd, 1) == 0);
    close(fd);
    /* Serving (or, refused, soon): a SIGTERM is then a plain stop. */
    for (double until = stt_now_ms() + 5000; stt_now_ms() < until; stt_sleep_ms(10)) {
      int c = socket(AF_UNIX, SOCK_STREAM, 0);
      int ok = connect(c, (struct sockaddr *)&sa, sizeof sa) == 0 && stt_ping(c, 2) == 0;
      close(c);
      if (ok) break;
    }
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(stt_proc_finish(&p, 10000), 0);
  }
  stt_server_cleanup(&S);
  CHECK_EQ_INT(starts, 3);
  CHECK_EQ_INT(refused, 0);
}

static void second_server_body(stt_server_t *s) {
  stt_proc_t r;
  const char *args[] = {"--config", s->config, NULL};
  run_server(args, NULL, &r);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "another stserver is serving on");
  CHECK_CONTAINS(r.err, s->socket);
  /* The first one keeps its socket and keeps serving. */
  OPEN_RC(c, s->socket);
  CHECK(stt_ping(c.fd, 1) == 0);
  rc_close(&c);
}

TEST(second_server_refuses_to_start) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  int rc = stt_server_run(&S, second_server_body);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(rc, 0);
}

TEST(stale_socket_is_replaced) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  /* A socket file nobody listens on: what a crashed server leaves. */
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  CHECK(strlen(S.socket) < sizeof sa.sun_path);
  memcpy(sa.sun_path, S.socket, strlen(S.socket) + 1);
  CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  close(fd);
  struct stat st;
  CHECK(lstat(S.socket, &st) == 0 && S_ISSOCK(st.st_mode));
  int started = stt_server_start(&S);
  int status = started == 0 ? stt_server_stop(&S) : -1;
  char *log = stt_server_log(&S);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(started, 0);
  CHECK_EQ_INT(status, 0);
  CHECK_CONTAINS(log, "removed stale socket");
  free(log);
}

TEST(regular_file_is_refused) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  stt_write_file(S.socket, "not a socket\n");
  char fields[1024];
  snprintf(fields, sizeof fields, "base_path = \"%s\", endpoints = \"%s\",", S.base,
           S.endpoints);
  write_config(S.config, fields);
  stt_proc_t r;
  const char *args[] = {"--config", S.config, NULL};
  run_server(args, NULL, &r);
  char content[64];
  slurp(S.socket, content, sizeof content);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "is not a socket");
  CHECK_STR_EQ(content, "not a socket\n");   /* never deleted */
}

TEST(too_long_path_is_refused) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  char fields[1024];
  snprintf(fields, sizeof fields, "endpoints = \"%s\",", S.endpoints);
  write_config(S.config, fields);
  char base[600];
  snprintf(base, sizeof base, "%s/%0120d", S.dir, 0);
  const char *args[] = {"--config", S.config, "--base-path", base, NULL};
  stt_proc_t r;
  run_server(args, NULL, &r);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "bytes long");
  CHECK_CONTAINS(r.err, "at most 107");
}

TEST(missing_config_is_an_error) {
  stt_server_init(&S);
  char path[400];
  snprintf(path, sizeof path, "%s/nope.lua", S.dir);
  const char *args[] = {"--config", path, NULL};
  stt_proc_t r;
  run_server(args, NULL, &r);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "nope.lua");
}

TEST(check_mode) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  stt_write_endpoint(&S, "beta.lua", B_EP);
  char fields[1024];
  snprintf(fields, sizeof fields, "base_path = \"%s\", endpoints = \"%s\",", S.base,
           S.endpoints);
  write_config(S.config, fields);
  stt_proc_t r;
  const char *args[] = {"--config", S.config, "--check", NULL};
  run_server(args, NULL, &r);
  CHECK_EQ_INT(r.status, 0);
  CHECK_CONTAINS_ALL(r.out, "alpha", "beta", "2 endpoints", "0 errors");
  /* --check starts no socket. */
  CHECK(access(S.socket, F_OK) != 0);

  /* A syntax error and an unknown option: both reported as file:line. */
  stt_write_endpoint(&S, "bad.lua", "return st.endpoint{\n  name = \"bad\" +,\n}\n");
  stt_write_endpoint(&S, "odd.lua",
                     "return st.endpoint{\n  name = \"odd\",\n  colour = 1,\n"
                     "  build = function() return 1 end }\n");
  run_server(args, NULL, &r);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS_ALL(r.err, "bad.lua:2", "odd.lua:", "colour");
  stt_server_cleanup(&S);
}

/* --check finds what would fail at start: a device listed twice (two
 * sockets on one path) and a socket_group the host does not have. */
TEST(check_refuses_duplicate_devices_and_unknown_groups) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  char fields[1024];
  snprintf(fields, sizeof fields, "base_path = \"%s\", endpoints = \"%s\", devices = {0, 0},",
           S.base, S.endpoints);
  write_config(S.config, fields);
  stt_proc_t r;
  const char *args[] = {"--config", S.config, "--check", NULL};
  run_server(args, NULL, &r);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "devices: device 0 is listed twice");
  snprintf(fields, sizeof fields,
           "base_path = \"%s\", endpoints = \"%s\", socket_group = \"st-no-such-group\",",
           S.base, S.endpoints);
  write_config(S.config, fields);
  run_server(args, NULL, &r);
  CHECK_EQ_INT(r.status, 1);
  CHECK_CONTAINS(r.err, "socket_group 'st-no-such-group' is not a group of this host");
  stt_server_cleanup(&S);
}

TEST(help_version_and_bad_flags) {
  stt_server_init(&S);
  stt_proc_t r;
  const char *help[] = {"--help", NULL};
  run_server(help, NULL, &r);
  CHECK_EQ_INT(r.status, 0);
  CHECK_CONTAINS(r.out, "usage: stserver");
  CHECK_CONTAINS(r.out, "--base-path");
  const char *version[] = {"--version", NULL};
  run_server(version, NULL, &r);
  CHECK_EQ_INT(r.status, 0);
  CHECK_CONTAINS(r.out, "stserver 0.1.0");
  const char *unknown[] = {"--frobnicate", NULL};
  run_server(unknown, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  CHECK_CONTAINS(r.err, "--frobnicate");
  CHECK_CONTAINS(r.err, "--help");
  CHECK(strstr(r.err, "did you mean") == NULL); /* nothing is close to it */
  /* A near miss names the flag meant, with or without a value. */
  const char *typo[] = {"--workrs", "3", NULL};
  run_server(typo, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  CHECK_CONTAINS(r.err, "unknown option '--workrs'; did you mean '--workers'?");
  const char *typo_eq[] = {"--log-levle=debug", NULL};
  run_server(typo_eq, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  CHECK_CONTAINS(r.err, "unknown option '--log-levle'; did you mean '--log-level'?");
  const char *workers[] = {"--workers", "zero", NULL};
  run_server(workers, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  CHECK_CONTAINS(r.err, "--workers");
  /* the flag has the bound config.lua has */
  const char *too_many[] = {"--workers", "257", NULL};
  run_server(too_many, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  CHECK_CONTAINS(r.err, "--workers must be an integer from 1 to 256, not '257'");
  const char *level[] = {"--log-level", "loud", NULL};
  run_server(level, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  const char *missing[] = {"--config", NULL};
  run_server(missing, NULL, &r);
  CHECK_EQ_INT(r.status, 2);
  stt_server_cleanup(&S);
}

TEST(base_path_precedence) {
  /* flag > config > $SHARED_TENSOR_BASE_PATH > default, seen in --check. */
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  char fields[1024], env[400], want[400];
  snprintf(env, sizeof env, "SHARED_TENSOR_BASE_PATH=%s/fromenv", S.dir);
  stt_proc_t r;
  const char *args[] = {"--config", S.config, "--check", NULL};

  snprintf(fields, sizeof fields, "endpoints = \"%s\",", S.endpoints);
  write_config(S.config, fields);
  run_server(args, env, &r);
  CHECK_EQ_INT(r.status, 0);
  snprintf(want, sizeof want, "socket: %s/fromenv-0.sock", S.dir);
  CHECK_CONTAINS(r.out, want);
  run_server(args, NULL, &r);
  CHECK_CONTAINS(r.out, "socket: /tmp/shared-tensor-0.sock");

  snprintf(fields, sizeof fields, "endpoints = \"%s\", base_path = \"%s/fromconfig\",",
           S.endpoints, S.dir);
  write_config(S.config, fields);
  run_server(args, env, &r);
  snprintf(want, sizeof want, "socket: %s/fromconfig-0.sock", S.dir);
  CHECK_CONTAINS(r.out, want);

  char flag[400];
  snprintf(flag, sizeof flag, "%s/fromflag", S.dir);
  const char *args2[] = {"--config", S.config, "--check", "--base-path", flag, NULL};
  run_server(args2, env, &r);
  snprintf(want, sizeof want, "socket: %s/fromflag-0.sock", S.dir);
  CHECK_CONTAINS(r.out, want);
  stt_server_cleanup(&S);
}

/* The endpoint names the server lists now, comma-joined, into buf. */
static int endpoint_names(rc_t *c, char *buf, size_t cap) {
  msg_t m;
  if (rc_rpcf(c, &m, "[0, 50, 'endpoints', []]") != 1) return -1;
  buf[0] = '\0';
  for (uint32_t i = 0; m.result && m.result->type == MSGPACK_OBJECT_ARRAY &&
                       i < m.result->via.array.size;
       i++) {
    size_t used = strlen(buf);
    snprintf(buf + used, cap - used, "%s%s", i ? "," : "",
             obj_str(obj_get(&m.result->via.array.ptr[i], "name")));
  }
  msg_free(&m);
  return 0;
}

static void reload_body(stt_server_t *s) {
  OPEN_RC(c, s->socket);
  char names[256];
  CHECK(endpoint_names(&c, names, sizeof names) == 0);
  CHECK_STR_EQ(names, "alpha");

  /* A good new endpoint: SIGHUP adds it. */
  stt_write_endpoint(s, "beta.lua", B_EP);
  CHECK(kill(s->pid, SIGHUP) == 0);
  CHECK(rc_wait_info(&c, "generation.number", 2, 10000) == 0);
  CHECK(endpoint_names(&c, names, sizeof names) == 0);
  CHECK_STR_EQ(names, "alpha,beta");
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 1);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 2, 'call', [{endpoint: 'beta', args: {x: 21}}]]") == 1);
  CHECK(m.error == NULL);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 42);
  msg_free(&m);

  /* A syntax error: the old endpoints stay, info says why. */
  stt_write_endpoint(s, "gamma.lua", "return st.endpoint{\n  name = = \"gamma\",\n}\n");
  CHECK(kill(s->pid, SIGHUP) == 0);
  CHECK(rc_wait_info(&c, "counters.reload_failures", 1, 10000) == 0);
  CHECK_EQ_INT(rc_info_int(&c, "generation.last_reload.ok"), 0);
  CHECK_EQ_INT(rc_info_int(&c, "generation.number"), 2);
  CHECK(rc_info(&c, 3, &m) == 1);
  CHECK_CONTAINS(obj_str(obj_path(m.result, "generation.last_reload.error")), "gamma.lua:2");
  CHECK(obj_path(m.result, "ready")->via.boolean);
  msg_free(&m);
  CHECK(endpoint_names(&c, names, sizeof names) == 0);
  CHECK_STR_EQ(names, "alpha,beta");
  CHECK(rc_rpcf(&c, &m, "[0, 4, 'call', [{endpoint: 'beta', args: {}}]]") == 1);
  CHECK(m.error == NULL);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "value")), 4);
  msg_free(&m);
  rc_close(&c);
  char *log = stt_server_log(s);
  CHECK_CONTAINS(log, "gamma.lua:2");
  CHECK_CONTAINS(log, "reload failed");
  free(log);
}

TEST(sighup_reloads) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  int rc = stt_server_run(&S, reload_body);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(rc, 0);
}

static void drain_body(stt_server_t *s) {
  OPEN_RC(c, s->socket);
  CHECK(rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: 0.4}}]]") == 0);
  OPEN_RC(w, s->socket);
  int queued = rc_wait_info(&w, "inflight", 1, 5000);
  rc_close(&w);
  CHECK(queued == 0);
  CHECK(kill(s->pid, SIGTERM) == 0);
  /* The socket file goes first: from then on new calls are refused. */
  double end = stt_now_ms() + 5000;
  while (access(s->socket, F_OK) == 0 && stt_now_ms() < end) {
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  CHECK(access(s->socket, F_OK) != 0);
  CHECK(rc_sendf(&c, "[0, 2, 'call', [{endpoint: 'slow', args: {s: 0.01}}]]") == 0);
  int got1 = 0, got2 = 0;
  for (int i = 0; i < 2; i++) {
    msg_t m;
    CHECK(rc_next(&c, &m, 5000) == 1);
    if (m.id == 2) {
      CHECK_REPLY(&m, ST_ERR_SHUTTING_DOWN, NULL);
      got2 = 1;
    } else {
      CHECK_EQ_INT(m.id, 1);
      CHECK(m.error == NULL);
      CHECK_STR_EQ(obj_str(obj_get(m.result, "value")), "done");
      got1 = 1;
    }
    msg_free(&m);
  }
  CHECK(got1 && got2);
  rc_close(&c);
}

TEST(sigterm_drains_inflight_calls) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "slow.lua", SLOW_EP);
  int started = stt_server_start(&S);
  if (started == 0) drain_body(&S);
  /* The server was already told to stop: wait for its exit. */
  int status = started == 0 ? stt_server_wait_exit(&S, 10000) : -1;
  stt_server_cleanup(&S);
  CHECK_EQ_INT(started, 0);
  CHECK_EQ_INT(status, 0);
}

static void devices_body(stt_server_t *s) {
  char path3[400];
  snprintf(path3, sizeof path3, "%s-3.sock", s->base);
  OPEN_RC(c, path3);
  msg_t m;
  CHECK(rc_rpcf(&c, &m, "[0, 1, 'hello', []]") == 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "device")), 3);
  msg_free(&m);
  CHECK(rc_info(&c, 2, &m) == 1);
  const msgpack_object *socks = obj_get(m.result, "sockets");
  CHECK(socks && socks->type == MSGPACK_OBJECT_ARRAY && socks->via.array.size == 2);
  CHECK_STR_EQ(obj_str(obj_get(&socks->via.array.ptr[1], "path")), path3);
  msg_free(&m);
  rc_close(&c);
  CHECK(rc_open(&c, s->socket) == 0);
  CHECK(rc_rpcf(&c, &m, "[0, 3, 'hello', []]") == 1);
  CHECK_EQ_INT(obj_int(obj_get(m.result, "device")), 0);
  msg_free(&m);
  rc_close(&c);
}

TEST(one_socket_per_device) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "alpha.lua", A_EP);
  stt_server_config(&S, "devices = { 0, 3 },");
  int rc = stt_server_run(&S, devices_body);
  char path3[400];
  snprintf(path3, sizeof path3, "%s-3.sock", S.base);
  int left = access(path3, F_OK) == 0;
  stt_server_cleanup(&S);
  CHECK_EQ_INT(rc, 0);
  CHECK_EQ_INT(left, 0);
}

static void grace_body(stt_server_t *s) {
  OPEN_RC(c, s->socket);
  CHECK(rc_sendf(&c, "[0, 1, 'call', [{endpoint: 'slow', args: {s: 60.0}}]]") == 0);
  OPEN_RC(w, s->socket);
  int queued = rc_wait_info(&w, "inflight", 1, 5000);
  rc_close(&w);
  CHECK(queued == 0);
  double t0 = stt_now_ms();
  CHECK(kill(s->pid, SIGINT) == 0);
  msg_t m;
  CHECK(rc_next(&c, &m, 5000) == 1);
  CHECK_EQ_INT(m.id, 1);
  CHECK_REPLY(&m, ST_ERR_CANCELLED, NULL);
  msg_free(&m);
  CHECK_EQ_INT(stt_server_wait_exit(s, 5000), 0);
  double took = stt_now_ms() - t0;
  CHECK(took >= 150);    /* shutdown_grace_s = 0.2 */
  CHECK(took < 3000);
  CHECK(access(s->socket, F_OK) != 0);
  rc_close(&c);
}

TEST(grace_period_cancels_long_calls) {
  stt_server_init(&S);
  stt_write_endpoint(&S, "slow.lua", SLOW_EP);
  stt_server_config(&S, "shutdown_grace_s = 0.2,");
  int started = stt_server_start(&S);
  if (started == 0) grace_body(&S);
  stt_server_cleanup(&S);
  CHECK_EQ_INT(started, 0);
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  RUN(sigterm_exits_fast_and_unlinks);
  RUN(second_server_refuses_to_start);
  RUN(stale_socket_is_replaced);
  RUN(the_socket_file_appears_listening);
  RUN(regular_file_is_refused);
  RUN(too_long_path_is_refused);
  RUN(missing_config_is_an_error);
  RUN(check_mode);
  RUN(check_refuses_duplicate_devices_and_unknown_groups);
  RUN(help_version_and_bad_flags);
  RUN(base_path_precedence);
  RUN(sighup_reloads);
  RUN(sigterm_drains_inflight_calls);
  RUN(grace_period_cancels_long_calls);
  RUN(one_socket_per_device);
  return stt_summary();
}
