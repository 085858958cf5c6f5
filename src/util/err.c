#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

// Formatted aside first: callers wrap the previous message ("context: %s", kaon_last_error()),
// and printing a buffer into itself is undefined (valgrind: overlapping mempcpy).
int kaon_set_error(const char *fmt, ...) {
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return -1;
}

const char *kaon_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

void kaon_clear_error(void) { last_error[0] = 0; }
