/* C consumer: maps the weights of `load_linear` from the server and runs a
 * forward pass y = W x + b on them, in place, without copying a byte.
 *
 *   build/examples/c_consumer [SOCKET] [INPUT_DIM] [OUTPUT_DIM]
 *
 * SOCKET defaults to the device-0 socket of $SHARED_TENSOR_BASE_PATH (else
 * the first of the default places where one exists: st_socket_path). Exits
 * 1 with the server's error otherwise.
 */
#include <stdio.h>
#include <stdlib.h>

#include "st/client.h"

int main(int argc, char **argv) {
  const char *sock = argc > 1 ? argv[1] : NULL;
  int in_dim = argc > 2 ? atoi(argv[2]) : 16;
  int out_dim = argc > 3 ? atoi(argv[3]) : 4;
  char err[512];
  st_client_t *c;
  int rc = sock ? st_client_connect(sock, &c, err, sizeof err)
                : st_client_connect_device(NULL, 0, &c, err, sizeof err);
  if (rc != ST_OK) {
    fprintf(stderr, "connect: %s\n", err);
    return 1;
  }

  st_args_t *args = st_args_new();
  st_args_int(args, "input_dim", in_dim);
  st_args_int(args, "output_dim", out_dim);
  st_result_t *res;
  rc = st_client_call(c, "load_linear", args, &res);
  st_args_free(args);
  if (rc != ST_OK) {
    fprintf(stderr, "load_linear: %s: %s\n", st_client_error_name(c), st_client_error(c));
    st_client_close(c);
    return 1;
  }

  /* A module's tensors are found by name; both live in one mapping. */
  const st_tensor_t *w = st_result_find(res, "weight");
  const st_tensor_t *b = st_result_find(res, "bias");
  if (!w || !b || w->dtype != ST_DTYPE_FLOAT32 || w->device != ST_DEVICE_CPU) {
    fprintf(stderr, "load_linear: expected float32 CPU weight and bias\n");
    return 1;
  }
  const float *W = w->data, *B = b->data;
  printf("weight %lldx%lld mapped at %p, bias at %p (no copy)\n", (long long)w->shape[0],
         (long long)w->shape[1], (const void *)W, (const void *)B);

  /* x = [1, 1, ..., 1]: y[o] = sum_i W[o][i] + b[o]. */
  for (int64_t o = 0; o < w->shape[0]; o++) {
    double y = B[o * b->strides[0]];
    for (int64_t i = 0; i < w->shape[1]; i++) y += W[o * w->strides[0] + i * w->strides[1]];
    printf("y[%lld] = %.6f\n", (long long)o, y);
  }

  st_object_info_t obj;
  if (st_result_object(res, &obj) == ST_OK && obj.lease) {
    int released, destroyed;
    int64_t refcount;
    st_client_release(c, obj.id, &released, &destroyed, &refcount);
    printf("released object %llu (refcount now %lld)\n", (unsigned long long)obj.id,
           (long long)refcount);
  }
  st_result_free(res);
  st_client_close(c);
  return 0;
}
