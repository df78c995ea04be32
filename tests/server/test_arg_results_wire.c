/* A call's result that is its own tensor argument, on the wire
 * (docs/protocol.md, "Tensor arguments"), against a real stserver over raw
 * sockets with hand-made CPU memfds:
 *   - to a client whose hello lists "arg_results", a result arena that is
 *     one of the request's arguments is {arg: i} (its index in the
 *     request's arenas) and carries no descriptor; the tensor's offset is
 *     the window's place in that allocation; a result that is not an
 *     argument comes as an arena with its descriptor, in the same reply
 *     too;
 *   - without the feature (no hello, or a hello without it), the
 *     argument comes back with a descriptor, as before;
 *   - a task's result never uses the form (it is fetched by a request of
 *     its own).
 */
#include "check.h"
#include "wire.h"

static stt_server_t S;
static uint32_t next_id = 100;

static const char EP_WINDOW[] =
    "return st.endpoint{ name = 'window', params = { x = st.tensor_param{}, n = 2 },\n"
    "  build = function(a) return a.x:narrow(0, 1, a.n) end }\n";
static const char EP_BOTH[] =
    "return st.endpoint{ name = 'both', params = { x = st.tensor_param{}, y = st.tensor_param{} },\n"
    "  build = function(a) return { y = a.y, new = a.x:clone() } end }\n";

#define PAGE 4096
#define ARENA(fd, id) "{fd: " #fd ", bytes: 4096, device: 'cpu', backend: 'memfd', id: " #id "}"
#define F64(a, off, n) "tensor(" #a ", " #off ", 'float64', [" #n "], [1])"

/* Connects and says hello with `features` (a list's items, may be ""). */
static int open_hello(rc_t *c, const char *features) {
  return rc_open_hello(c, S.socket, features);
}

/* What a reply brought: descriptors, and arenas[0]'s `arg` (-1: none) and
 * whether it has an `fd`, and the first tensor's arena and offset. */
typedef struct {
  int fds, arenas, arg0, fd0, arg1, fd1;
} got_t;

static int arena_arg(const msgpack_object *a, uint32_t i, int *has_fd) {
  *has_fd = 0;
  if (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size <= i) return -2;
  const msgpack_object *e = &a->via.array.ptr[i];
  *has_fd = obj_get(e, "fd") != NULL;
  const msgpack_object *arg = obj_get(e, "arg");
  return arg ? (int)obj_int(arg) : -1;
}

/* call `window` on x = 4 float64 at offset 0 of a fresh memfd. */
static int call_window(rc_t *c, got_t *g, msg_t *m) {
  memset(g, 0, sizeof *g);
  int fds[1] = {rc_memfd_with(PAGE, 7.5, 0)};
  int before = c->nfds;
  if (fds[0] < 0 ||
      rc_rpcf_fds(c, m, fds, 1,
                  "[0, %u, 'call', [{endpoint: 'window', args: {x: " F64(0, 0, 4)
                  "}, arenas: [" ARENA(0, 77) "]}]]",
                  next_id++) != 1)
    return -1;
  if (m->error) {
    fprintf(stderr, "   window: %s: %s\n", msg_errname(m), msg_errmsg(m));
    msg_free(m);
    return -1;
  }
  g->fds = c->nfds - before;
  const msgpack_object *a = obj_get(m->result, "arenas");
  g->arenas = a && a->type == MSGPACK_OBJECT_ARRAY ? (int)a->via.array.size : -1;
  g->arg0 = arena_arg(a, 0, &g->fd0);
  rc_drop_fds(c);
  return 0;
}

/* The value's tensor: its arena index and byte offset. */
static void tensor_place(const msg_t *m, uint32_t *arena, uint64_t *offset) {
  st__tensor_desc_t d;
  char why[100];
  memset(&d, 0, sizeof d);
  d.arena = 99;
  if (st__parse_tensor(obj_get(m->result, "value"), &d, why, sizeof why) != ST_OK)
    fprintf(stderr, "   bad tensor: %s\n", why);
  *arena = d.arena;
  *offset = d.offset;
}

TEST(the_argument_comes_back_by_its_index) {
  rc_t c;
  CHECK(open_hello(&c, "'arg_results'") == 0);
  got_t g;
  msg_t m;
  CHECK(call_window(&c, &g, &m) == 0);
  CHECK_EQ_INT(g.fds, 0);
  CHECK(g.arenas == 1 && g.arg0 == 0 && !g.fd0);
  uint32_t arena;
  uint64_t offset;
  tensor_place(&m, &arena, &offset);
  CHECK(arena == 0 && offset == 8);   /* narrow(0, 1, 2) of float64 */
  msg_free(&m);
  rc_close(&c);
}

TEST(an_argument_and_a_new_tensor_in_one_reply) {
  rc_t c;
  CHECK(open_hello(&c, "'arg_results'") == 0);
  int fds[2] = {rc_memfd_with(PAGE, 1.5, 0), rc_memfd_with(PAGE, 2.5, 0)};
  CHECK(fds[0] >= 0 && fds[1] >= 0);
  msg_t m;
  int before = c.nfds;
  CHECK(rc_rpcf_fds(&c, &m, fds, 2,
                    "[0, 5, 'call', [{endpoint: 'both', args: {x: " F64(0, 0, 2) ", y: " F64(1, 0, 2)
                    "}, arenas: [" ARENA(0, 1) ", " ARENA(1, 2) "]}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  /* y is the request's arenas[1]; the copy of x is new memory. */
  const msgpack_object *a = obj_get(m.result, "arenas");
  CHECK(a && a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size == 2);
  int fd_a, fd_b;
  int arg_a = arena_arg(a, 0, &fd_a), arg_b = arena_arg(a, 1, &fd_b);
  CHECK((arg_a == 1 && !fd_a && arg_b == -1 && fd_b) || (arg_b == 1 && !fd_b && arg_a == -1 && fd_a));
  CHECK_EQ_INT(c.nfds - before, 1);
  msg_free(&m);
  rc_drop_fds(&c);
  rc_close(&c);
}

TEST(without_the_feature_the_argument_has_a_descriptor) {
  rc_t c;
  CHECK(open_hello(&c, "'object_refs'") == 0);
  got_t g;
  msg_t m;
  CHECK(call_window(&c, &g, &m) == 0);
  msg_free(&m);
  CHECK(g.fds == 1 && g.arg0 == -1 && g.fd0);
  rc_close(&c);
  OPEN_RC(d, S.socket);   /* no hello at all */
  CHECK(call_window(&d, &g, &m) == 0);
  msg_free(&m);
  CHECK(g.fds == 1 && g.arg0 == -1 && g.fd0);
  rc_close(&d);
}

TEST(a_task_result_has_a_descriptor) {
  rc_t c;
  CHECK(open_hello(&c, "'arg_results'") == 0);
  int fds[1] = {rc_memfd_with(PAGE, 3.5, 0)};
  msg_t m;
  CHECK(rc_rpcf_fds(&c, &m, fds, 1,
                    "[0, 6, 'submit', [{endpoint: 'window', args: {x: " F64(0, 0, 4)
                    "}, arenas: [" ARENA(0, 9) "]}]]") == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  int64_t task = obj_int(obj_get(m.result, "task_id"));
  msg_free(&m);
  CHECK(rc_rpcf(&c, &m, "[0, 7, 'wait', [{task_id: %lld, timeout: 10}]]", (long long)task) == 1);
  msg_free(&m);
  int before = c.nfds;
  CHECK(rc_rpcf(&c, &m, "[0, 8, 'result', [{task_id: %lld}]]", (long long)task) == 1);
  CHECK_REPLY(&m, ST_OK, NULL);
  int has_fd;
  CHECK_EQ_INT(arena_arg(obj_get(m.result, "arenas"), 0, &has_fd), -1);
  CHECK(has_fd && c.nfds - before == 1);
  msg_free(&m);
  rc_drop_fds(&c);
  rc_close(&c);
}

int main(void) {
  stt_server_setup(&S, "workers = 1,",
                   (const stt_endpoint_t[]){{"window.lua", EP_WINDOW},
                                            {"both.lua", EP_BOTH},
                                            {NULL, NULL}});
  RUN(the_argument_comes_back_by_its_index);
  RUN(an_argument_and_a_new_tensor_in_one_reply);
  RUN(without_the_feature_the_argument_has_a_descriptor);
  RUN(a_task_result_has_a_descriptor);
  return stt_server_finish(&S);
}
