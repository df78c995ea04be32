/* src/common: the one JSON reader of the tree (RFC 8259, strict), used for
 * safetensors headers and shard indexes (src/mem) and for JSON argument
 * text (libstclient: `stcli call --args-json`, "key:json=" words).
 *
 * One value, then only whitespace; no comments, no trailing commas, no NaN
 * or Infinity, no leading zeros, no control characters in strings, valid
 * UTF-8 (no overlong forms, no surrogates), \u escapes with surrogate pairs
 * combined and lone surrogates refused. Nesting of arrays and objects is
 * capped and a document holds at most 8 Mi values, so hostile text cannot
 * exhaust the stack or memory. Object keys may repeat; callers decide what
 * a repeat means.
 *
 * The reader does no I/O: it is fed bytes. A document is an array of nodes
 * linked first-child / next-sibling (node 0 is the root); decoded strings
 * live in one buffer no larger than the input. Numbers keep their text:
 * each caller converts them as its format wants.
 *
 * Messages say what was expected and where:
 *   invalid JSON at byte 5: expected ':' after an object key but found '1'
 *   at line 1, column 6
 */
#ifndef ST_COMMON_JSON_H
#define ST_COMMON_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "st/errors.h"

/* Nesting limit of st__json_parse (arrays and objects; the outermost
 * counts as 1). */
#define ST__JSON_MAX_DEPTH 64

typedef enum {
  ST__JSON_NULL = 0, ST__JSON_FALSE, ST__JSON_TRUE, ST__JSON_NUMBER,
  ST__JSON_STRING, ST__JSON_ARRAY, ST__JSON_OBJECT
} st__json_type_t;

typedef struct st__json_node {
  st__json_type_t type;
  uint32_t count;              /* children of an array or object */
  uint32_t first;              /* first child (0: none; the root is never a child) */
  uint32_t next;               /* next sibling (0: none) */
  const char *key;             /* object member: its key (decoded) */
  size_t key_len;
  const char *str;             /* string: decoded text; number: the raw text */
  size_t len;
  size_t at;                   /* byte offset of the value in the input */
} st__json_node_t;

typedef struct st__json {
  st__json_node_t *nodes;
  size_t n, cap;
  char *strs;                  /* decoded strings (owned) */
  size_t strs_used;
} st__json_t;

/* Parses `len` bytes of `text` as one JSON value followed only by
 * whitespace, with containers nested at most ST__JSON_MAX_DEPTH levels.
 * Decoded strings are NUL-terminated and may contain NUL bytes. ST_OK, or
 * ST_ERR_INVALID_ARGUMENT with "invalid JSON at byte N: WHAT at line L,
 * column C" in err (may be NULL), ST_ERR_OUT_OF_MEMORY. On success *doc is
 * owned by the caller (st__json_free); on failure nothing is left to free.
 * For files (safetensors headers and indexes). Any thread. */
int st__json_parse(const char *text, size_t len, st__json_t *doc, char *err, size_t errlen);

/* st__json_parse with containers nested at most `max_depth` (>= 1) levels
 * and a message without the byte offset, "WHAT at line L, column C", for
 * text a person typed (the caller says where it came from). */
int st__json_read(const char *text, size_t len, int max_depth, st__json_t *doc, char *err,
                  size_t errlen);

/* Frees what doc holds; NULL members are fine. Any thread. */
void st__json_free(st__json_t *doc);

/* A number node as a non-negative integer (plain digits, no sign, fraction
 * or exponent, at most UINT64_MAX). 0 on success, -1 otherwise. */
int st__json_uint(const st__json_node_t *n, uint64_t *out);

/* Line and column (both from 1) of byte `at` of text (for messages about a
 * node: pass node->at). */
void st__json_line_col(const char *text, size_t at, size_t *line, size_t *col);

/* Length of the valid UTF-8 sequence at p (at most `left` >= 1 bytes), 0
 * when invalid: overlong forms, surrogates, code points above U+10FFFF and
 * truncated sequences are refused. Any thread. */
size_t st__utf8_len(const unsigned char *p, size_t left);

/* How byte c is written inside a JSON string: the escape for a quote, a
 * backslash or a control character (\n, \u001f, ... written into buf, which
 * holds 8 bytes, when no short form exists), NULL when c stands as it is.
 * Any thread. */
const char *st__json_escape(unsigned char c, char buf[8]);

/* Writes into buf (len >= 32) the "%.*g" text of the finite d with the
 * fewest significant digits, from min_digits up to 17, that reads back as
 * exactly d. Any thread. */
void st__json_double_text(double d, int min_digits, char *buf, size_t len);

#endif
