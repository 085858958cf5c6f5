#include "util/err.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[1024];

int kaon_set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return -1;
}

const char *kaon_last_error(void) { return last_error[0] ? last_error : "unknown error"; }

void kaon_clear_error(void) { last_error[0] = 0; }
