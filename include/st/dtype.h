/* sharedtensor: element types, shared by the server, the wire and clients.
 *
 * The wire names a dtype by its string name ("float32"); the enum value is
 * local to a process. New types are appended to the map, so the values of
 * the older ones stay as they were (the C ABI passes st_dtype_t). DLPack codes follow
 * DLPack 1.0 (kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBfloat=4, kDLBool=6,
 * kDLFloat8_e4m3fn=10, kDLFloat8_e5m2=12).
 */
#ifndef ST_DTYPE_H
#define ST_DTYPE_H

#include "st/api.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*  X(enum suffix, wire name, size in bytes, DLPack code, DLPack bits) */
#define ST_DTYPE_MAP(X)                         \
  X(BOOL,          "bool",          1, 6, 8)    \
  X(UINT8,         "uint8",         1, 1, 8)    \
  X(INT8,          "int8",          1, 0, 8)    \
  X(INT16,         "int16",         2, 0, 16)   \
  X(INT32,         "int32",         4, 0, 32)   \
  X(INT64,         "int64",         8, 0, 64)   \
  X(FLOAT16,       "float16",       2, 2, 16)   \
  X(BFLOAT16,      "bfloat16",      2, 4, 16)   \
  X(FLOAT32,       "float32",       4, 2, 32)   \
  X(FLOAT64,       "float64",       8, 2, 64)   \
  X(FLOAT8_E4M3FN, "float8_e4m3fn", 1, 10, 8)   \
  X(FLOAT8_E5M2,   "float8_e5m2",   1, 12, 8)   \
  X(UINT16,        "uint16",        2, 1, 16)   \
  X(UINT32,        "uint32",        4, 1, 32)   \
  X(UINT64,        "uint64",        8, 1, 64)

typedef enum {
  ST_DTYPE_INVALID = 0,
#define ST__DTYPE_ENUM(e, name, size, code, bits) ST_DTYPE_##e,
  ST_DTYPE_MAP(ST__DTYPE_ENUM)
#undef ST__DTYPE_ENUM
  ST_DTYPE_COUNT
} st_dtype_t;

/* Wire name of a dtype ("float32"), or NULL for an invalid value. Static. */
ST_API const char *st_dtype_name(st_dtype_t dtype);

/* dtype for a wire name; also accepts the aliases "float", "double",
 * "half", "int", "long" and "bf16". ST_DTYPE_INVALID when unknown. */
ST_API st_dtype_t st_dtype_from_name(const char *name);

/* Element size in bytes; 0 for an invalid value. */
ST_API size_t st_dtype_size(st_dtype_t dtype);

/* DLPack type code and bit width; both 0 for an invalid value. */
ST_API void st_dtype_dlpack(st_dtype_t dtype, uint8_t *code, uint8_t *bits);

/* Nonzero for floating types (float16, bfloat16, float32, float64, fp8). */
ST_API int st_dtype_is_float(st_dtype_t dtype);

/* Read element i of a buffer of `dtype` as a double (bool: 0/1). Used for
 * printing values and checksums; never for bulk math. */
ST_API double st_dtype_load(st_dtype_t dtype, const void *base, size_t i);

/* Store `v` as element i of a buffer of `dtype`. Integers: truncated toward
 * zero, then wrapped to the type's width (NaN stores 0, out-of-int64-range
 * saturates first; uint64 takes [2^63, 2^64) as it is and saturates at
 * 2^64 - 1 past it, so every double in [0, 2^64) stores exactly). bool: v != 0. Floats round to nearest even, as PyTorch
 * converts: float8_e4m3fn has no infinity (overflow and +-inf give NaN,
 * 0x7f/0xff), float8_e5m2 overflows to +-inf. */
ST_API void st_dtype_store(st_dtype_t dtype, void *base, size_t i, double v);

/* Scalar conversions used by st_dtype_load/store, exported for tests and
 * for the CUDA backend so both backends round identically. */
ST_API uint16_t st_float_to_half(float f);
ST_API float    st_half_to_float(uint16_t h);
ST_API uint16_t st_float_to_bfloat16(float f);
ST_API float    st_bfloat16_to_float(uint16_t b);
ST_API uint8_t  st_float_to_e4m3fn(float f);
ST_API float    st_e4m3fn_to_float(uint8_t v);
ST_API uint8_t  st_float_to_e5m2(float f);
ST_API float    st_e5m2_to_float(uint8_t v);

#ifdef __cplusplus
}
#endif
#endif
