/* A UCX that says it is 1.99.7 and is otherwise the real one: it links
 * libucp.so.0, so every other symbol a dlsym looks up through it is the
 * real library's. Two servers whose UCX versions differ, as two hosts'
 * may after one upgraded. */
__attribute__((visibility("default"))) void ucp_get_version(unsigned *major, unsigned *minor,
                                                            unsigned *release);
void ucp_get_version(unsigned *major, unsigned *minor, unsigned *release) {
  *major = 1;
  *minor = 99;
  *release = 7;
}
