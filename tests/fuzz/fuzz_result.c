/* Fuzz target: the client's side of a reply, from the socket to the
 * result: libstclient's one exchange (src/client/rpc.c: frame reader,
 * response id, error maps, descriptor count), then the result and value
 * decoder (src/client/result.c: arenas mapped and checked, tensors,
 * modules, objects), then the accessors a program uses on what it got
 * (values as JSON, tensor reads and copies).
 *
 * Input: one control byte, then the bytes the "server" sends. Bit 0:
 * decode as call does (result = {value, object?, arenas?}) or as a plain
 * method (the result is the value). Bits 1-3: how many descriptors travel
 * with the bytes (0..7), alternately a sealed 4096-byte memfd and an
 * unsealed one of 64 bytes. The client's request has id 1.
 *
 * The "server" is the other end of a socketpair: the bytes and the
 * descriptors are written there, then its write side is shut, so that a
 * reply cut short ends in "connection closed" rather than a wait.
 *
 * Properties: every tensor of a result lies inside a mapping this process
 * holds (its last element is read, and a copy to host of a small tensor
 * succeeds); nothing leaks (descriptors included: the process would run
 * out of them long before the end of a run).
 */
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/client_internal.h"
#include "client/result.h"
#include "fuzz.h"

static int memfds[2] = {-1, -1};

static int make_memfd(size_t bytes, int seals) {
  int fd = memfd_create("fuzz-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) abort();
  if (seals && fcntl(fd, F_ADD_SEALS, seals) != 0) abort();
  return fd;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  memfds[0] = make_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
  memfds[1] = make_memfd(64, 0);
  return 0;
}

/* Writes the bytes (the descriptors with the first one) and shuts the
 * write side. 0, or -1 when the socket took less. */
static int serve(int fd, const uint8_t *data, size_t size, int nfds) {
  union {
    char buf[CMSG_SPACE(8 * sizeof(int))];
    struct cmsghdr align;
  } ctl;
  size_t off = 0;
  if (nfds > 0 && size > 0) {   /* descriptors travel with a byte */
    struct iovec iov = {.iov_base = (void *)data, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                        .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    for (int i = 0; i < nfds; i++) memcpy(CMSG_DATA(cm) + i * sizeof(int), &memfds[i & 1], sizeof(int));
    if (sendmsg(fd, &mh, MSG_NOSIGNAL) != 1) return -1;
    off = 1;
  }
  while (off < size) {
    ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) return -1;
    off += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  return 0;
}

static void use_tensor(const st_tensor_t *t) {
  FUZZ_CHECK(t->name && t->ndim >= 0 && t->ndim <= ST_MAX_NDIM);
  st_tensor_is_contiguous(t);
  if (t->device != ST_DEVICE_CPU || t->numel == 0 || !t->data) return;
  /* The element farthest from the start: it must be inside the mapping. */
  int64_t last = 0;
  for (int i = 0; i < t->ndim; i++) last += (t->shape[i] - 1) * t->strides[i];
  volatile const unsigned char *p = (const unsigned char *)t->data;
  size_t esize = st_dtype_size(t->dtype);
  (void)p[(size_t)last * esize + esize - 1];
  (void)st_tensor_get(t, t->numel - 1);
  if (t->nbytes <= 65536) {
    void *buf = malloc(t->nbytes ? t->nbytes : 1);
    FUZZ_CHECK(buf && st_tensor_copy_to_host(t, buf, t->nbytes) == ST_OK);
    free(buf);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > (1u << 16)) return 0;
  int unwrap = data[0] & 1, nfds = (data[0] >> 1) & 7;
  data++;
  size--;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) abort();
  fcntl(sv[0], F_SETFL, O_NONBLOCK);
  int big = 1 << 20;
  setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (serve(sv[1], data, size, nfds) != 0) {
    close(sv[0]);
    close(sv[1]);
    return 0;
  }
  st_client_t *c = calloc(1, sizeof *c);
  FUZZ_CHECK(c && st__reader_init(&c->reader, ST_CLIENT_MAX_REPLY) == ST_OK);
  c->reader_ready = 1;
  c->fd = sv[0];
  c->next_id = 1;
  c->timeout_ms = 5000;
  snprintf(c->server_id, sizeof c->server_id, "fuzz-server");

  st_result_t *r = NULL;
  int rc = st__client_method(c, unwrap ? "call" : "objects", NULL, unwrap, &r);
  if (rc == ST_OK) {
    FUZZ_CHECK(r && r->value);
    char *json = st_value_json(st_result_value(r), 1);
    free(json);
    st_object_info_t info;
    st_result_object(r, &info);
    for (size_t i = 0; i < st_result_tensor_count(r); i++) {
      const st_tensor_t *t = st_result_tensor(r, i);
      use_tensor(t);
      FUZZ_CHECK(st_result_find(r, t->name) != NULL);
    }
    st_result_free(r);
  } else {
    FUZZ_CHECK(rc < 0 && !r && c->err == rc);
  }
  st_client_close(c);
  close(sv[1]);
  return 0;
}
