/* CUDA arenas in one process: device naming by UUID, VMM allocation,
 * describe/dup, an in-process import of the exported descriptor, the size
 * cap, out-of-memory, and device memory back at its baseline after release.
 * Without a CUDA build or device: checks that the failure is a clear
 * "no CUDA device: <reason>" error, then exits 77 (skipped). */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "mem/arena.h"
#include "mem/cuda.h"

#ifdef ST_HAVE_CUDA
#include "cuda/kernels.h"
#endif

#define MiB (1024ull * 1024ull)

static char reason[512];

/* What a host without a device (or a build without CUDA) must see. */
TEST(no_device_is_a_clear_error) {
  char err[512] = "";
  st__arena_t *a = (st__arena_t *)1;
  CHECK_ERR_MSG(st__arena_new_cuda(0, 4096, &a, err, sizeof err), ST_ERR_CAPABILITY, err);
  CHECK(a == NULL);
  CHECK_CONTAINS(err, "no CUDA device: ");
  st__cuda_mapping_t m;
  err[0] = '\0';
  CHECK_ERR_MSG(st__cuda_import(0, 2 * MiB, "GPU-00000000-0000-0000-0000-000000000000", &m, err,
                                sizeof err),
                ST_ERR_CAPABILITY, err);
  CHECK_CONTAINS(err, "no CUDA device: ");
  int n = -1;
  CHECK_ERR_MSG(st__cuda_device_count(&n, err, sizeof err), ST_ERR_CAPABILITY, err);
  CHECK_EQ_INT(n, 0);
}

#ifdef ST_HAVE_CUDA

static const st__cuda_api_t *cu;
static char uuid0[ST_CUDA_UUID_LEN];
static uint64_t gran;

TEST(devices_are_named_by_uuid) {
  char err[512];
  int n = 0;
  CHECK_ERR_MSG(st__cuda_device_count(&n, err, sizeof err), ST_OK, err);
  CHECK(n >= 1);
  CHECK_ERR_MSG(st__cuda_device_uuid(0, uuid0, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(strlen(uuid0), 40);
  CHECK(strncmp(uuid0, "GPU-", 4) == 0);
  fprintf(stderr, "   device 0: %s (%d visible)\n", uuid0, n);
  int o = -1;
  CHECK_ERR_MSG(st__cuda_device_by_uuid(uuid0, &o, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(o, 0);
  char upper[ST_CUDA_UUID_LEN];
  for (size_t i = 0; i <= strlen(uuid0); i++)
    upper[i] = (char)((uuid0[i] >= 'a' && uuid0[i] <= 'f') ? uuid0[i] - 32 : uuid0[i]);
  CHECK_ERR_MSG(st__cuda_device_by_uuid(upper + 4, &o, err, sizeof err),
                ST_OK, err);  /* bare form */
  CHECK_EQ_INT(o, 0);
  CHECK_ERR_MSG(st__cuda_device_by_uuid("GPU-00000000-0000-0000-0000-000000000000", &o, err,
                                        sizeof err),
                ST_ERR_NOT_FOUND, err);
  CHECK_CONTAINS(err, "no visible CUDA device has UUID");
  CHECK_EQ_INT(o, -1);
  CHECK_ERR_MSG(st__cuda_device_by_uuid("GPU-12", &o, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_ERR_MSG(st__cuda_ctx_enter(n, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "no CUDA device cuda:");
  st__arena_t *a = NULL;
  CHECK_ERR_MSG(st__arena_new_cuda(n, 4096, &a, err, sizeof err), ST_ERR_INVALID_ARGUMENT, err);
  CHECK(a == NULL);
  CHECK_ERR_MSG(st__cuda_granularity(0, &gran, err, sizeof err), ST_OK, err);
  CHECK(gran >= 4096 && (gran & (gran - 1)) == 0);
  fprintf(stderr, "   allocation granularity %llu bytes\n", (unsigned long long)gran);
}

TEST(create_describe_and_zero_fill) {
  char err[512];
  uint64_t n0, b0, n1, b1;
  st__arena_stats(&n0, &b0);
  st__arena_t *a = NULL;
  CHECK_ERR_MSG(st__arena_new_cuda(0, 10000, &a, err, sizeof err), ST_OK, err);
  CHECK_EQ_INT(st__arena_bytes(a), 10000);
  CHECK_EQ_INT(st__arena_device(a), 0);
  CHECK(st__arena_base(a) != NULL);
  st__arena_desc_t d = {.fd = 2};
  st__arena_describe(a, &d);
  CHECK_EQ_INT(d.fd, 2);
  CHECK_EQ_INT(d.cuda, 1);
  CHECK_STR_EQ(d.backend, "vmm");
  CHECK_STR_EQ(d.uuid, uuid0);
  CHECK_EQ_INT(d.bytes, gran);                  /* 10000 bytes: one granule */
  CHECK_EQ_INT(d.id, st__arena_id(a));
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0 + 1);
  CHECK_EQ_INT(b1, b0 + gran);

  static unsigned char host[4 * 1024 * 1024];
  CHECK(d.bytes <= sizeof host);
  memset(host, 0xab, sizeof host);
  CHECK_ERR_MSG(st__cuda_copy_to_host(host, (uint64_t)(uintptr_t)st__arena_base(a), d.bytes, 0,
                                      err, sizeof err),
                ST_OK, err);
  for (uint64_t i = 0; i < d.bytes; i++)
    if (host[i] != 0) CHECK_EQ_INT(host[i], 0);

  int fd = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd >= 0);
  CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  int fd2 = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd2 >= 0 && fd2 != fd);
  close(fd);
  close(fd2);
  st__arena_unref(a);
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0);
  CHECK_EQ_INT(b1, b0);

  /* Zero bytes still make one mappable granule; sizes round up. */
  CHECK_ERR_MSG(st__arena_new_cuda(0, 0, &a, err, sizeof err), ST_OK, err);
  st__arena_describe(a, &d);
  CHECK_EQ_INT(d.bytes, gran);
  st__arena_unref(a);
  CHECK_ERR_MSG(st__arena_new_cuda(0, 3 * gran + 1, &a, err, sizeof err), ST_OK, err);
  st__arena_describe(a, &d);
  CHECK_EQ_INT(d.bytes, 4 * gran);
  st__arena_unref(a);
}

/* A second mapping of the exported descriptor in the same process sees the
 * kernel's writes and writes back through it. */
TEST(import_a_dup_in_process) {
  char err[512];
  st__arena_t *a = NULL;
  const int64_t n = 1000003;
  CHECK_ERR_MSG(st__arena_new_cuda(0, (uint64_t)n * 4, &a, err, sizeof err), ST_OK, err);
  const st__gen_t up_by_one = {.kind = ST__GEN_ARANGE, .a = 0, .b = 1};   /* element i: i */
  CHECK_ERR_MSG(st__cuda_generate(st__arena_base(a), ST_DTYPE_INT32, n, &up_by_one, NULL, err,
                                  sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
  st__arena_desc_t d = {0};
  st__arena_describe(a, &d);
  int fd = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd >= 0);
  st__cuda_mapping_t m;
  CHECK_ERR_MSG(st__cuda_import(fd, d.bytes, d.uuid, &m, err, sizeof err), ST_OK, err);
  close(fd);                                   /* the mapping does not need it */
  CHECK(m.dptr != 0);
  CHECK(m.dptr != (uint64_t)(uintptr_t)st__arena_base(a));
  CHECK_EQ_INT(m.bytes, d.bytes);
  CHECK_EQ_INT(m.ordinal, 0);
  static int32_t host[1000003];
  CHECK_ERR_MSG(st__cuda_copy_to_host(host, m.dptr, (uint64_t)n * 4, 0, err, sizeof err),
                ST_OK, err);
  for (int64_t i = 0; i < n; i++)
    if (host[i] != (int32_t)i) CHECK_EQ_INT(host[i], i);
  CHECK_ERR_MSG(st__cuda_fill((void *)(uintptr_t)m.dptr, ST_DTYPE_INT32, 10, -5, NULL, err,
                              sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
  CHECK_ERR_MSG(st__cuda_copy_to_host(host, (uint64_t)(uintptr_t)st__arena_base(a), 64, 0, err,
                                      sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(host[9], -5);
  CHECK_EQ_INT(host[10], 10);
  /* The server's reference goes first; the mapping still reads. */
  st__arena_unref(a);
  CHECK_ERR_MSG(st__cuda_copy_to_host(host, m.dptr, (uint64_t)n * 4, 0, err, sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(host[0], -5);
  CHECK_EQ_INT(host[n - 1], n - 1);
  st__cuda_unmap(&m);
  CHECK_EQ_INT(m.dptr, 0);
  st__cuda_unmap(&m);                          /* no-op */
}

/* The allocation carries the GPUDirect-RDMA flag exactly when the device
 * supports it for VMM allocations (the properties of its handle, retained
 * from the server's mapping); the device attribute is what
 * st__cuda_gpudirect_rdma (and info) says. */
TEST(allocations_carry_the_gpudirect_rdma_flag_where_supported) {
  char err[512];
  st__arena_t *a = NULL;
  CHECK_ERR_MSG(st__arena_new_cuda(0, gran, &a, err, sizeof err), ST_OK, err);
  CUmemGenericAllocationHandle h = 0;
  CHECK_EQ_INT(cu->cuMemRetainAllocationHandle(&h, st__arena_base(a)), CUDA_SUCCESS);
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  CHECK_EQ_INT(cu->cuMemGetAllocationPropertiesFromHandle(&prop, h), CUDA_SUCCESS);
  CHECK_EQ_INT(cu->cuMemRelease(h), CUDA_SUCCESS);
  int want = st__cuda_gpudirect_rdma(0), attr = -1;
  CUdevice dev;
  CHECK_EQ_INT(cu->cuDeviceGet(&dev, 0), CUDA_SUCCESS);
  CHECK_EQ_INT(cu->cuDeviceGetAttribute(
                   &attr, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev),
               CUDA_SUCCESS);
  CHECK_EQ_INT(attr != 0, want);
  CHECK_EQ_INT(prop.allocFlags.gpuDirectRDMACapable != 0, want);
  fprintf(stderr, "   GPUDirect RDMA on VMM allocations of device 0: %s\n", want ? "yes" : "no");
  st__arena_unref(a);
}

TEST(import_rejects_bad_descriptors) {
  char err[512];
  st__arena_t *a = NULL;
  CHECK_ERR_MSG(st__arena_new_cuda(0, gran, &a, err, sizeof err), ST_OK, err);
  int fd = st__arena_dup_fd(a, NULL, 0);
  CHECK(fd >= 0);
  st__cuda_mapping_t m;
  CHECK_ERR_MSG(st__cuda_import(-1, gran, uuid0, &m, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_ERR_MSG(st__cuda_import(fd, gran + 1, uuid0, &m, err, sizeof err),
                ST_ERR_INVALID_ARGUMENT, err);
  CHECK_CONTAINS(err, "granularity");
  CHECK_ERR_MSG(st__cuda_import(fd, gran, "GPU-00000000-0000-0000-0000-000000000000", &m, err,
                                sizeof err),
                ST_ERR_NOT_FOUND, err);
  /* A descriptor that claims more than the allocation holds cannot map. */
  int rc = st__cuda_import(fd, 4 * gran, uuid0, &m, err, sizeof err);
  CHECK_ERR(rc, ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "larger than the allocation");
  CHECK_EQ_INT(m.dptr, 0);
  fprintf(stderr, "   oversized import: %s\n", err);
  /* Not a CUDA descriptor at all. */
  int p[2];
  CHECK_EQ_INT(pipe(p), 0);
  rc = st__cuda_import(p[0], gran, uuid0, &m, err, sizeof err);
  CHECK_ERR(rc, ST_ERR_INVALID_ARGUMENT);
  CHECK_CONTAINS(err, "not an exported CUDA allocation");
  fprintf(stderr, "   pipe import: %s\n", err);
  close(p[0]);
  close(p[1]);
  /* Still usable afterwards. */
  CHECK_ERR_MSG(st__cuda_import(fd, gran, uuid0, &m, err, sizeof err), ST_OK, err);
  st__cuda_unmap(&m);
  close(fd);
  st__arena_unref(a);
}

TEST(size_cap_applies) {
  char err[512];
  st__arena_t *a = NULL;
  st__arena_set_limit(MiB);
  CHECK_ERR_MSG(st__arena_new_cuda(0, MiB + 1, &a, err, sizeof err), ST_ERR_LIMIT, err);
  CHECK_CONTAINS(err, "max_object_bytes");
  CHECK(a == NULL);
  CHECK_ERR_MSG(st__arena_new_cuda(0, MiB, &a, err, sizeof err), ST_OK, err);
  st__arena_unref(a);
  st__arena_set_limit(0);
}

TEST(out_of_memory_is_reported_and_survived) {
  char err[512];
  uint64_t free0, total;
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free0, &total, err, sizeof err), ST_OK, err);
  uint64_t want = total + 64 * MiB;
  st__arena_t *a = NULL;
  uint64_t n0, b0, n1, b1;
  st__arena_stats(&n0, &b0);
  CHECK_ERR_MSG(st__arena_new_cuda(0, want, &a, err, sizeof err), ST_ERR_OUT_OF_MEMORY, err);
  fprintf(stderr, "   %s\n", err);
  CHECK(a == NULL);
  char expect[64];
  snprintf(expect, sizeof expect, "requested %llu bytes", (unsigned long long)want);
  CHECK_CONTAINS(err, expect);
  CHECK_CONTAINS(err, "bytes free of");
  CHECK_CONTAINS(err, uuid0);
  st__arena_stats(&n1, &b1);
  CHECK_EQ_INT(n1, n0);
  CHECK_EQ_INT(b1, b0);
  /* Half of what is free, twice: the second cannot fit. */
  st__arena_t *big = NULL, *big2 = NULL;
  uint64_t half = free0 / 2 + gran;
  CHECK_ERR_MSG(st__arena_new_cuda(0, half, &big, err, sizeof err), ST_OK, err);
  CHECK_ERR_MSG(st__arena_new_cuda(0, half, &big2, err, sizeof err), ST_ERR_OUT_OF_MEMORY, err);
  fprintf(stderr, "   %s\n", err);
  CHECK_CONTAINS(err, "bytes free of");
  st__arena_unref(big);
  /* The process carries on. */
  CHECK_ERR_MSG(st__arena_new_cuda(0, 4 * MiB, &a, err, sizeof err), ST_OK, err);
  CHECK_ERR_MSG(st__cuda_fill(st__arena_base(a), ST_DTYPE_FLOAT32, MiB, 2.5, NULL, err, sizeof err),
                ST_OK, err);
  CHECK_EQ_INT(cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
  float f[4];
  CHECK_ERR_MSG(st__cuda_copy_to_host(f, (uint64_t)(uintptr_t)st__arena_base(a), sizeof f, 0, err,
                                      sizeof err),
                ST_OK, err);
  CHECK(f[3] == 2.5f);
  st__arena_unref(a);
}

TEST(device_memory_returns_to_baseline) {
  char err[512];
  uint64_t free0, free1, free2, total;
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free0, &total, err, sizeof err), ST_OK, err);
  st__arena_t *a[4];
  for (int i = 0; i < 4; i++) {
    CHECK_ERR_MSG(st__arena_new_cuda(0, 256 * MiB, &a[i], err, sizeof err), ST_OK, err);
    int fd = st__arena_dup_fd(a[i], NULL, 0); /* an exported dup, closed again */
    CHECK(fd >= 0);
    close(fd);
  }
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free1, NULL, err, sizeof err), ST_OK, err);
  fprintf(stderr, "   free: %llu MiB before, %llu MiB with 4 x 256 MiB\n",
          (unsigned long long)(free0 / MiB), (unsigned long long)(free1 / MiB));
  CHECK(free1 + 1024 * MiB <= free0 + 2 * gran);
  for (int i = 0; i < 4; i++) st__arena_unref(a[i]);
  CHECK_ERR_MSG(st__cuda_mem_info(0, &free2, NULL, err, sizeof err), ST_OK, err);
  fprintf(stderr, "   free after release: %llu MiB\n", (unsigned long long)(free2 / MiB));
  CHECK(free2 + 2 * gran >= free0);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Figures for docs/cuda.md, printed, not asserted: arena creation
 * (create + export + reserve + map + access + zero-fill) and a warm
 * in-process import (context already current). */
TEST(print_timings) {
  char err[512];
  const uint64_t sizes[] = {2 * MiB, 256 * MiB, 4096 * MiB};
  for (int k = 0; k < 3; k++) {
    const int reps = k == 0 ? 20 : 3;
    double create = 0, import = 0, release = 0;
    for (int r = 0; r < reps; r++) {
      st__arena_t *a = NULL;
      double t0 = now_us();
      CHECK_ERR_MSG(st__arena_new_cuda(0, sizes[k], &a, err, sizeof err), ST_OK, err);
      double t1 = now_us();
      st__arena_desc_t d = {0};
      st__arena_describe(a, &d);
      int fd = st__arena_dup_fd(a, NULL, 0);
      st__cuda_mapping_t m;
      double t2 = now_us();
      CHECK_ERR_MSG(st__cuda_import(fd, d.bytes, d.uuid, &m, err, sizeof err), ST_OK, err);
      double t3 = now_us();
      close(fd);
      st__cuda_unmap(&m);
      double t4 = now_us();
      st__arena_unref(a);
      double t5 = now_us();
      create += t1 - t0;
      import += t3 - t2;
      release += t5 - t4;
    }
    fprintf(stderr, "   %5llu MiB: create+export+map+zero %.0f us, import+map %.0f us, "
            "server release %.0f us (mean of %d)\n", (unsigned long long)(sizes[k] / MiB),
            create / reps, import / reps, release / reps, reps);
  }
}

#endif

int main(void) {
  char err[512];
  if (st__cuda_available(err, sizeof err) != ST_OK) {
    snprintf(reason, sizeof reason, "%s", err);
    RUN(no_device_is_a_clear_error);
    if (stt_failed) return stt_summary();
    stt_skip(reason);
  }
#ifdef ST_HAVE_CUDA
  cu = st__cuda_api(NULL, 0);
  RUN(devices_are_named_by_uuid);
  RUN(create_describe_and_zero_fill);
  RUN(import_a_dup_in_process);
  RUN(allocations_carry_the_gpudirect_rdma_flag_where_supported);
  RUN(import_rejects_bad_descriptors);
  RUN(size_cap_applies);
  RUN(out_of_memory_is_reported_and_survived);
  RUN(device_memory_returns_to_baseline);
  RUN(print_timings);
#endif
  return stt_summary();
}
