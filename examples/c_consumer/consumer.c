/* C consumer: maps the weights of `load_linear` from the server and runs a
 * forward pass y = W x + b on them, in place, without copying a byte (CPU
 * weights; CUDA ones are copied to the host for this CPU pass).
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
  if (!w || !b || w->dtype != ST_DTYPE_FLOAT32 || b->dtype != ST_DTYPE_FLOAT32 || w->ndim != 2 ||
      b->ndim != 1 || b->shape[0] != w->shape[0]) {
    fprintf(stderr, "load_linear: expected a float32 weight [out, in] and bias [out]\n");
    return 1;
  }
  /* CPU weights are read where they are mapped. On a GPU host the server
   * builds them on cuda:N: this host-side forward pass then copies them
   * (a CUDA consumer would use the device pointers w->data, b->data). */
  const float *W = w->data, *B = b->data;
  int64_t ws0 = w->strides[0], ws1 = w->strides[1], bs0 = b->strides[0];
  float *copy = NULL;
  if (w->device == ST_DEVICE_CUDA) {
    copy = malloc(w->nbytes + b->nbytes);
    if (!copy || st_tensor_copy_to_host(w, copy, w->nbytes) != ST_OK ||
        st_tensor_copy_to_host(b, (char *)copy + w->nbytes, b->nbytes) != ST_OK) {
      fprintf(stderr, "load_linear: cannot copy the weights from cuda:%d\n", w->device_index);
      return 1;
    }
    W = copy;
    B = (const float *)((const char *)copy + w->nbytes);
    ws0 = w->shape[1], ws1 = 1, bs0 = 1;   /* the copies are contiguous */
    printf("weight %lldx%lld on cuda:%d at %p, copied to the host for this CPU pass\n",
           (long long)w->shape[0], (long long)w->shape[1], w->device_index, w->data);
  } else {
    printf("weight %lldx%lld mapped at %p, bias at %p (no copy)\n", (long long)w->shape[0],
           (long long)w->shape[1], (const void *)W, (const void *)B);
  }

  /* x = [1, 1, ..., 1]: y[o] = sum_i W[o][i] + b[o]. */
  for (int64_t o = 0; o < w->shape[0]; o++) {
    double y = B[o * bs0];
    for (int64_t i = 0; i < w->shape[1]; i++) y += W[o * ws0 + i * ws1];
    printf("y[%lld] = %.6f\n", (long long)o, y);
  }
  free(copy);

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
