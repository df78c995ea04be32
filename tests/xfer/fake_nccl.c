/* A library that says it is NCCL 2.28.9 and has nothing else. */
__attribute__((visibility("default"))) int ncclGetVersion(int *version);
int ncclGetVersion(int *version) {
  *version = 22809;
  return 0;
}
