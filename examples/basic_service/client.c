/* Basic service client: passes its own tensor to two endpoints of the
 * repository (endpoints/echo.lua, endpoints/scale.lua) without copying it.
 *
 *   basic_client SOCKET
 *
 * 1. st_tensor_alloc makes a 2 x 4 float32 tensor in shareable memory (a
 *    sealed memfd; "cuda:0" would make it in GPU memory) and the client
 *    fills it.
 * 2. echo returns it: the reply maps the very same pages.
 * 3. scale multiplies it by k in place: the client sees the new values in
 *    its own tensor, and nothing was copied either way.
 * 4. An int32 tensor is refused by scale (it declares dtype float32), with
 *    the server's message. */
#include <st/client.h>
#include <stdio.h>

static void print_row(const char *label, const float *p, int n) {
  printf("%-18s", label);
  for (int i = 0; i < n; i++) printf(" %5.2f", p[i]);
  printf("\n");
}

static int fail(st_client_t *c, const char *what) {
  fprintf(stderr, "%s: %s: %s\n", what, st_client_error_name(c), st_client_error(c));
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: basic_client SOCKET\n");
    return 2;
  }
  char err[256];
  st_client_t *c = NULL;
  if (st_client_connect(argv[1], &c, err, sizeof err) != ST_OK) {
    fprintf(stderr, "connect: %s\n", err);
    return 1;
  }
  int64_t shape[2] = {2, 4};
  st_result_t *mine = NULL;
  if (st_tensor_alloc("cpu", ST_DTYPE_FLOAT32, 2, shape, &mine, err, sizeof err) != ST_OK) {
    fprintf(stderr, "st_tensor_alloc: %s\n", err);
    return 1;
  }
  const st_tensor_t *x = st_result_tensor(mine, 0);
  float *p = x->data;
  for (int i = 0; i < 8; i++) p[i] = (float)(i + 1);
  print_row("mine:", p, 8);

  /* echo: the same memory comes back */
  st_args_t *a = st_args_new();
  st_args_tensor(a, "value", x, err, sizeof err);
  st_result_t *r = NULL;
  if (st_client_call(c, "echo", a, &r) != ST_OK) return fail(c, "echo");
  const st_tensor_t *e = st_result_tensor(r, 0);
  print_row("echo:", e->data, 8);
  ((float *)e->data)[0] = 10.0f;
  printf("wrote 10 through echo's reply; mine[0] is now %.2f (%s)\n", p[0],
         p[0] == 10.0f ? "same memory" : "a copy!");
  st_result_free(r);
  st_args_free(a);

  /* scale: the endpoint writes into our tensor */
  a = st_args_new();
  st_args_tensor(a, "x", x, err, sizeof err);
  st_args_float(a, "k", 0.5);
  if (st_client_call(c, "scale", a, &r) != ST_OK) return fail(c, "scale");
  print_row("after scale k=0.5:", p, 8);
  st_result_free(r);
  st_args_free(a);

  /* a dtype the endpoint does not take */
  st_result_t *ints = NULL;
  st_tensor_alloc("cpu", ST_DTYPE_INT32, 2, shape, &ints, err, sizeof err);
  a = st_args_new();
  st_args_tensor(a, "x", st_result_tensor(ints, 0), err, sizeof err);
  int rc = st_client_call(c, "scale", a, &r);
  printf("scale of an int32 tensor: %s: %s\n", st_err_name(rc), st_client_error(c));
  st_args_free(a);
  st_result_free(ints);
  st_result_free(mine);
  st_client_close(c);
  return rc == ST_ERR_INVALID_ARGUMENT ? 0 : 1;
}
