/* src/common: the server's log. One line per event on stderr:
 *   2026-11-21T11:48:43.123Z info  loop: listening on /tmp/shared-tensor-0.sock
 * Thread-safe (each line is written with one write(2)). The client library
 * never logs.
 */
#ifndef ST_COMMON_LOG_H
#define ST_COMMON_LOG_H

/* Levels, most severe first: a level writes itself and everything above. */
typedef enum { ST_LOG_ERROR = 0, ST_LOG_WARN, ST_LOG_INFO, ST_LOG_DEBUG } st__log_level_t;

/* Parses "error" | "warn" (also "warning") | "info" | "debug" into a level;
 * -1 for anything else (NULL included). Any thread. */
int st__log_level_parse(const char *s);

void st__log_set_level(st__log_level_t level);
int st__log_enabled(st__log_level_t level);
void st__log(st__log_level_t level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ST_LOG_E(who, ...) st__log(ST_LOG_ERROR, who, __VA_ARGS__)
#define ST_LOG_W(who, ...) st__log(ST_LOG_WARN, who, __VA_ARGS__)
#define ST_LOG_I(who, ...) st__log(ST_LOG_INFO, who, __VA_ARGS__)
#define ST_LOG_D(who, ...) \
  do { if (st__log_enabled(ST_LOG_DEBUG)) st__log(ST_LOG_DEBUG, who, __VA_ARGS__); } while (0)

#endif
