/* src/common: the server's log. One line per event on stderr:
 *   2026-11-21T11:48:43.123Z info  loop: listening on /run/sharedtensor/st-0.sock
 * ("<6>2026-..." when stderr is the journal: st__log_detect_journal).
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

/* Looks (again) whether stderr is the journal's stream ($JOURNAL_STREAM
 * names fd 2's device and inode): then every line starts with its syslog
 * priority "<N>" (error 3, warn 4, info 6, debug 7). The first line looks
 * by itself; call this after pointing fd 2 elsewhere. Returns 1 when lines
 * get the prefix. Any thread. */
int st__log_detect_journal(void);
int st__log_enabled(st__log_level_t level);

/* One line of `level` from `who`. Warnings and errors are rate-limited
 * per call site (the format string's address): at most
 * ST_LOG_RATE_BURST lines per ST_LOG_RATE_WINDOW_S seconds each; the
 * others are counted, and the site's next line written comes after one
 * saying how many were suppressed. Any thread. */
void st__log(st__log_level_t level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* st__log without the rate limit, for a bounded report whose every line
 * matters (the problems of a failed load, one per line). Any thread. */
void st__log_all(st__log_level_t level, const char *who, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The rate limit of warnings and errors: `burst` lines per `window_s`
 * seconds from one call site (0: no limit); forgets what was counted.
 * Any thread. */
#define ST_LOG_RATE_BURST 20
#define ST_LOG_RATE_WINDOW_S 10.0
void st__log_set_rate_limit(unsigned burst, double window_s);

#define ST_LOG_E(who, ...) st__log(ST_LOG_ERROR, who, __VA_ARGS__)
#define ST_LOG_W(who, ...) st__log(ST_LOG_WARN, who, __VA_ARGS__)
#define ST_LOG_I(who, ...) st__log(ST_LOG_INFO, who, __VA_ARGS__)
#define ST_LOG_D(who, ...) \
  do { if (st__log_enabled(ST_LOG_DEBUG)) st__log(ST_LOG_DEBUG, who, __VA_ARGS__); } while (0)

#endif
