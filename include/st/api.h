/* sharedtensor: export macro for the public C API. */
#ifndef ST_API_H
#define ST_API_H
#if defined(__GNUC__)
#define ST_API __attribute__((visibility("default")))
#else
#define ST_API
#endif
#endif
