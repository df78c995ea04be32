/* A write to read-only memory the library mapped says what it hit before
 * the process dies (docs/client.md, "A write to read-only memory";
 * src/client/fault.c), against a real stserver. Each case runs in a
 * forked child whose stderr the parent reads:
 *   - a key got read-only, a live key opened by a connection that is not
 *     its publisher, the result of an endpoint declared readonly and a
 *     buffer opened read-only: the child dies of SIGSEGV, as before, and
 *     its stderr has one line naming the key (and version), the live key,
 *     the endpoint or the buffer, and what to do instead;
 *   - a fault elsewhere (address 16, or another read-only page) dies of
 *     SIGSEGV with no word from the library;
 *   - a SIGSEGV handler the program installed before (with SA_SIGINFO, or
 *     a plain one) is called after the message, and decides (here: exits
 *     with its own status);
 *   - ST_NO_FAULT_HANDLER=1: the death as before, no message;
 *   - a process that maps nothing read-only keeps its SIGSEGV handler
 *     untouched (the library installs its own at the first read-only
 *     mapping).
 */
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client_kit.h"

static stt_server_t srv;
static st_client_t *cli;

/* The result of an endpoint declared readonly: every caller maps it
 * read-only. */
static const stt_endpoint_t endpoints[] = {
    {"rozeros.lua",
     "return st.endpoint{ name = \"rozeros\", cache = true, readonly = true,\n"
     "  build = function() return { w = st.zeros{16} } end }\n"},
    {NULL, NULL}};

/* What a child did: how it ended and what it wrote to stderr. */
typedef struct child {
  int status;
  char err[4096];
} child_t;

/* Runs fn(arg) in a child (no core dump; stderr into out->err) with a
 * client of its own; fn's return is its exit status. */
static void in_child(int (*fn)(st_client_t *c, void *arg), void *arg, child_t *out) {
  memset(out, 0, sizeof *out);
  out->status = -1;
  int p[2];
  if (pipe(p) != 0) return;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    st_client_t *c = stt_client_open(srv.socket);
    _exit(c ? fn(c, arg) : 99);
  }
  close(p[1]);
  size_t n = 0;
  ssize_t r;
  while ((r = read(p[0], out->err + n, sizeof out->err - 1 - n)) > 0) n += (size_t)r;
  out->err[n] = '\0';
  close(p[0]);
  if (pid > 0) waitpid(pid, &out->status, 0);
}

static int died_of_segv(const child_t *ch) {
  if (WIFSIGNALED(ch->status) && WTERMSIG(ch->status) == SIGSEGV) return 1;
  fprintf(stderr, "   status 0x%x (want death by SIGSEGV); stderr: %s\n", ch->status, ch->err);
  return 0;
}

static int exited_with(const child_t *ch, int code) {
  if (WIFEXITED(ch->status) && WEXITSTATUS(ch->status) == code) return 1;
  fprintf(stderr, "   status 0x%x (want exit %d); stderr: %s\n", ch->status, code, ch->err);
  return 0;
}

/* Writes the first float of r's tensor `name`: returns only when the
 * memory was writable. */
static int write_tensor(st_result_t *r, const char *name) {
  const st_tensor_t *t = st_result_find(r, name);
  if (!t) return 2;
  ((volatile float *)t->data)[0] = 5.0f;
  return 0;
}

/* Gets key "weights" read-only, then writes to it. */
static int child_writes_readonly_key(st_client_t *c, void *arg) {
  (void)arg;
  st_result_t *r = NULL;
  if (st_client_get(c, "weights", 0, ST_GET_READONLY, &r, NULL) != ST_OK) return 3;
  return write_tensor(r, "w");
}

/* Opens live key "live/w" (another connection publishes it), then writes
 * to its tensor, as an optimizer step on a bound module would. */
static int child_writes_live_key(st_client_t *c, void *arg) {
  (void)arg;
  st_key_t *k = NULL;
  if (st_key_open(c, "live/w", 0, &k) != ST_OK) return 3;
  return write_tensor(st_key_result(k), "w");
}

/* Calls rozeros, then writes to its result. */
static int child_writes_readonly_result(st_client_t *c, void *arg) {
  (void)arg;
  st_result_t *r = NULL;
  if (st_client_call(c, "rozeros", NULL, &r) != ST_OK) return 3;
  return write_tensor(r, "w");
}

/* Opens buffer "cam" read-only, then writes to its slot 0. */
static int child_writes_readonly_buffer(st_client_t *c, void *arg) {
  (void)arg;
  st_buffer_t *b = NULL;
  if (st_buffer_open(c, "cam", 1, &b) != ST_OK) return 3;
  *(volatile char *)st_buffer_slot(b, 0) = 1;
  return 0;
}

/* Maps a key read-only (so the handler is in), then faults elsewhere:
 * at address 16, or (arg non-NULL) on a read-only page of its own. */
static int child_faults_elsewhere(st_client_t *c, void *arg) {
  st_result_t *r = NULL;
  if (st_client_get(c, "weights", 0, ST_GET_READONLY, &r, NULL) != ST_OK) return 3;
  if (arg) {
    void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 4;
    *(volatile int *)p = 1;
    return 0;
  }
  volatile uintptr_t sixteen = 16;   /* read at run time: no warning */
  *(volatile int *)sixteen = 0;
  return 0;
}

static void own_info_handler(int sig, siginfo_t *si, void *ctx) {
  (void)si;
  (void)ctx;
  static const char msg[] = "own handler (siginfo)\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) _exit(40);
  _exit(sig == SIGSEGV ? 42 : 41);
}

static void own_plain_handler(int sig) {
  static const char msg[] = "own handler (plain)\n";
  if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) _exit(40);
  _exit(sig == SIGSEGV ? 43 : 41);
}

/* Installs its own SIGSEGV handler (arg non-NULL: with SA_SIGINFO), then
 * writes to a key got read-only. */
static int child_with_own_handler(st_client_t *c, void *arg) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  if (arg) {
    sa.sa_sigaction = own_info_handler;
    sa.sa_flags = SA_SIGINFO;
  } else {
    sa.sa_handler = own_plain_handler;
  }
  if (sigaction(SIGSEGV, &sa, NULL) != 0) return 4;
  return child_writes_readonly_key(c, NULL);
}

static int child_opted_out(st_client_t *c, void *arg) {
  setenv("ST_NO_FAULT_HANDLER", "1", 1);
  return child_writes_readonly_key(c, arg);
}

/* Gets a key writable and writes to it: SIGSEGV's action stays the
 * default (exit 0), else exit 5. */
static int child_maps_nothing_readonly(st_client_t *c, void *arg) {
  (void)arg;
  st_result_t *r = NULL;
  if (st_client_get(c, "weights", 0, 0, &r, NULL) != ST_OK) return 3;
  if (write_tensor(r, "w") != 0) return 3;
  st_result_free(r);
  struct sigaction now;
  if (sigaction(SIGSEGV, NULL, &now) != 0) return 4;
  return (now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL ? 5 : 0;
}

TEST(a_write_to_a_key_got_readonly_names_the_key) {
  child_t ch;
  in_child(child_writes_readonly_key, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK_CONTAINS(ch.err, "sharedtensor: write to read-only memory of key 'weights' (version 1) at 0x");
  CHECK_CONTAINS(ch.err, "get_into");
  CHECK_CONTAINS(ch.err, "Re-raising SIGSEGV.\n");
}

TEST(a_write_to_a_live_key_names_it_and_its_publisher) {
  child_t ch;
  in_child(child_writes_live_key, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK_CONTAINS(ch.err, "sharedtensor: write to read-only memory of live key 'live/w' at 0x");
  CHECK_CONTAINS(ch.err, "publisher's update");
}

TEST(a_write_to_a_readonly_result_names_the_endpoint) {
  child_t ch;
  in_child(child_writes_readonly_result, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK_CONTAINS(ch.err, "sharedtensor: write to read-only memory of the result of endpoint "
                         "'rozeros' at 0x");
}

TEST(a_write_to_a_buffer_opened_readonly_names_the_buffer) {
  child_t ch;
  in_child(child_writes_readonly_buffer, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK_CONTAINS(ch.err, "sharedtensor: write to read-only memory of buffer 'cam' (opened "
                         "read-only) at 0x");
  CHECK_CONTAINS(ch.err, "open the buffer writable");
}

TEST(other_faults_die_as_before_without_a_word) {
  child_t ch;
  in_child(child_faults_elsewhere, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK(strstr(ch.err, "sharedtensor") == NULL);
  int other_page = 1;
  in_child(child_faults_elsewhere, &other_page, &ch);
  CHECK(died_of_segv(&ch));
  CHECK(strstr(ch.err, "sharedtensor") == NULL);
}

TEST(a_handler_installed_before_is_called_after_the_message) {
  child_t ch;
  int info = 1;
  in_child(child_with_own_handler, &info, &ch);
  CHECK(exited_with(&ch, 42));
  const char *msg = strstr(ch.err, "of key 'weights'"), *own = strstr(ch.err, "own handler");
  CHECK(msg && own && msg < own);
  CHECK_CONTAINS(ch.err, "Passing the signal to the previous handler.\n");
  in_child(child_with_own_handler, NULL, &ch);
  CHECK(exited_with(&ch, 43));
  msg = strstr(ch.err, "of key 'weights'");
  own = strstr(ch.err, "own handler (plain)");
  CHECK(msg && own && msg < own);
}

TEST(the_message_is_turned_off_by_the_environment) {
  child_t ch;
  in_child(child_opted_out, NULL, &ch);
  CHECK(died_of_segv(&ch));
  CHECK(strstr(ch.err, "sharedtensor") == NULL);
}

TEST(nothing_mapped_readonly_leaves_the_handlers_alone) {
  child_t ch;
  in_child(child_maps_nothing_readonly, NULL, &ch);
  CHECK(exited_with(&ch, 0));
}

/* Puts key "weights" {w: 16 floats} (version 1), live key "live/w" and
 * creates buffer "cam"; 1 on success. */
static int publish(st_buffer_t **cam) {
  int64_t n = 16;
  char err[256] = "";
  st_result_t *t = NULL;
  st_args_t *a = st_args_new();
  int rc = st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 1, &n, &t, err, sizeof err);
  if (rc == ST_OK) rc = st_args_tensor(a, "w", st_result_tensor(t, 0), err, sizeof err);
  uint64_t version = 0;
  if (rc == ST_OK) rc = st_client_put(cli, "weights", a, ST_KEY_PINNED, 0, &version);
  if (rc == ST_OK) rc = st_client_put(cli, "live/w", a, ST_KEY_PINNED, ST_PUT_LIVE, NULL);
  if (rc == ST_OK) rc = st_buffer_create(cli, "cam", "cpu", ST_DTYPE_UINT8, 1, &n, 2, cam);
  if (rc != ST_OK) fprintf(stderr, "publish: %s %s\n", err, st_client_error(cli));
  st_args_free(a);
  st_result_free(t);
  return rc == ST_OK && version == 1;
}

int main(void) {
  cli = stt_serve_client(&srv, "workers = 1,", endpoints);
  st_buffer_t *cam = NULL;
  if (!publish(&cam)) return 1;
  RUN(a_write_to_a_key_got_readonly_names_the_key);
  RUN(a_write_to_a_live_key_names_it_and_its_publisher);
  RUN(a_write_to_a_readonly_result_names_the_endpoint);
  RUN(a_write_to_a_buffer_opened_readonly_names_the_buffer);
  RUN(other_faults_die_as_before_without_a_word);
  RUN(a_handler_installed_before_is_called_after_the_message);
  RUN(the_message_is_turned_off_by_the_environment);
  RUN(nothing_mapped_readonly_leaves_the_handlers_alone);
  st_buffer_close(cam);
  return stt_client_finish(cli, &srv);
}
