/* src/engine: endpoint option rows and their typed access (options.h). */
#include "engine/options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/settings.h"
#include "proto/proto.h"

#define ST__OPTION_ROW(name, field, ctype, type, dflt, choices, implies, desc)              \
  {#name, type, offsetof(st__endpoint_decl_t, field), dflt, choices, implies, desc},

const st__option_t st__endpoint_options[ST__ENDPOINT_NOPTIONS] = {
    ST__ENDPOINT_OPTIONS(ST__OPTION_ROW)};

/* ENUM and BOOL members are int-sized (enums of small values); the
 * string members are char *. */
#define ST__OPTION_CHECK(name, field, ctype, type, dflt, choices, implies, desc)            \
  _Static_assert(type == ST_OPT_SECONDS                                                      \
                     ? sizeof(ctype) == sizeof(double)                                       \
                     : (type == ST_OPT_ENUM || type == ST_OPT_BOOL) ? sizeof(ctype) == sizeof(int) \
                                                                    : sizeof(ctype) == sizeof(char *), \
                 "option " #name ": the member's type does not fit ST_OPT type");
ST__ENDPOINT_OPTIONS(ST__OPTION_CHECK)

static void *member(const st__option_t *o, const st__endpoint_decl_t *d) {
  return (char *)d + o->offset;
}

static int is_text(const st__option_t *o) {
  return o->type == ST_OPT_STRING || o->type == ST_OPT_DEVICE || o->type == ST_OPT_KEY_FORMAT;
}

/* See options.h. */
const st__option_t *st__option_find(const char *name) {
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++)
    if (strcmp(st__endpoint_options[i].name, name) == 0) return &st__endpoint_options[i];
  return NULL;
}

/* Typed reads and stores of an option's member; see options.h. */
int st__option_int(const st__option_t *o, const st__endpoint_decl_t *d) {
  int v;
  memcpy(&v, member(o, d), sizeof v);
  return v;
}

/* The value of a SECONDS option. */
static double option_seconds(const st__option_t *o, const st__endpoint_decl_t *d) {
  double v;
  memcpy(&v, member(o, d), sizeof v);
  return v;
}

/* The value of a string option (borrowed, NULL: unset). */
const char *st__option_text(const st__option_t *o, const st__endpoint_decl_t *d) {
  const char *v;
  memcpy(&v, member(o, d), sizeof v);
  return v;
}

/* Stores an ENUM index or a BOOL. */
void st__option_set_int(const st__option_t *o, st__endpoint_decl_t *d, int v) {
  memcpy(member(o, d), &v, sizeof v);
}

/* Stores a SECONDS value. */
void st__option_set_seconds(const st__option_t *o, st__endpoint_decl_t *d, double v) {
  memcpy(member(o, d), &v, sizeof v);
}

/* Stores a string (taken; the old one is freed). */
void st__option_set_text(const st__option_t *o, st__endpoint_decl_t *d, char *s) {
  free((char *)st__option_text(o, d));
  memcpy(member(o, d), &s, sizeof s);
}

/* See options.h. */
void st__options_defaults(st__endpoint_decl_t *d) {
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++) {
    const st__option_t *o = &st__endpoint_options[i];
    char *none = NULL;
    if (o->type == ST_OPT_SECONDS) st__option_set_seconds(o, d, o->dflt);
    else if (is_text(o)) memcpy(member(o, d), &none, sizeof none);
    else st__option_set_int(o, d, (int)o->dflt);
  }
}

/* Frees the strings of d's options. */
void st__options_free(st__endpoint_decl_t *d) {
  for (size_t i = 0; i < ST__ENDPOINT_NOPTIONS; i++)
    if (is_text(&st__endpoint_options[i])) st__option_set_text(&st__endpoint_options[i], d, NULL);
}

/* Whether d's value of o is the default. */
int st__option_is_default(const st__option_t *o, const st__endpoint_decl_t *d) {
  if (o->type == ST_OPT_SECONDS) return option_seconds(o, d) == o->dflt;
  if (is_text(o)) return st__option_text(o, d) == NULL;
  return st__option_int(o, d) == (int)o->dflt;
}

/* See options.h. */
void st__option_pack(msgpack_packer *pk, const st__option_t *o, const st__endpoint_decl_t *d) {
  size_t len;
  const char *w;
  switch (o->type) {
  case ST_OPT_ENUM:
    w = st__choices_word(o->choices, st__option_int(o, d), &len);
    msgpack_pack_str(pk, w ? len : 0);
    msgpack_pack_str_body(pk, w ? w : "", w ? len : 0);
    break;
  case ST_OPT_BOOL:
    st__pack_bool(pk, st__option_int(o, d) != 0);
    break;
  case ST_OPT_SECONDS:
    if (option_seconds(o, d) > 0) msgpack_pack_double(pk, option_seconds(o, d));
    else msgpack_pack_nil(pk);
    break;
  default: st__pack_cstr(pk, st__option_text(o, d)); break;
  }
}

/* See options.h. */
const char *st__option_show(const st__option_t *o, const st__endpoint_decl_t *d, char *buf,
                            size_t len) {
  size_t wl;
  const char *w;
  switch (o->type) {
  case ST_OPT_ENUM:
    w = st__choices_word(o->choices, st__option_int(o, d), &wl);
    snprintf(buf, len, "%.*s", w ? (int)wl : 1, w ? w : "?");
    break;
  case ST_OPT_BOOL: snprintf(buf, len, "%s", st__option_int(o, d) ? "yes" : "no"); break;
  case ST_OPT_SECONDS:
    if (option_seconds(o, d) > 0) snprintf(buf, len, "%g", option_seconds(o, d));
    else snprintf(buf, len, "-");
    break;
  default: snprintf(buf, len, "%s", st__option_text(o, d) ? st__option_text(o, d) : "-"); break;
  }
  return buf;
}

/* See options.h. */
int st__device_name_ok(const char *s, int bare_cuda) {
  if (strcmp(s, "cpu") == 0 || (bare_cuda && strcmp(s, "cuda") == 0)) return 1;
  if (strncmp(s, "cuda:", 5) != 0 || !s[5] || strlen(s + 5) > 4) return 0;
  return strspn(s + 5, "0123456789") == strlen(s + 5);
}
