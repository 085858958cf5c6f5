// Error reporting for library code: functions return a status (or NULL) and leave the
// message here for the caller. Thread-local, so each HTTP/engine thread keeps its own.
#ifndef KAON_UTIL_ERR_H
#define KAON_UTIL_ERR_H

#if defined(__GNUC__)
#define KAON_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KAON_PRINTF(a, b)
#endif

// Sets the message returned by kaon_last_error(); always returns -1 so callers can write
// `return kaon_set_error("bad %s", x);`.
int kaon_set_error(const char *fmt, ...) KAON_PRINTF(1, 2);
const char *kaon_last_error(void);
void kaon_clear_error(void);

#endif
