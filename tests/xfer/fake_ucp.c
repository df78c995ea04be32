/* A library that says it is UCX 1.99.7 and has nothing else: the probe
 * must report its version (servers compare versions) and what it lacks. */
__attribute__((visibility("default"))) void ucp_get_version(unsigned *major, unsigned *minor,
                                                            unsigned *release);
void ucp_get_version(unsigned *major, unsigned *minor, unsigned *release) {
  *major = 1;
  *minor = 99;
  *release = 7;
}
