// Exact digit-range grammars for integer bounds: [lo, hi] split into a negative and a
// non-negative part, each split by digit count, each fixed-length range split by its first
// differing digit (the usual construction: prefix, middle block of free digits, suffix).
#include <stdio.h>
#include <string.h>

#include "grammar/json_schema_internal.h"

static void digit_class(gbnf_text *out, int from, int to) {
    if (from == to)
        gbnf_printf(out, "\"%d\"", from);
    else
        gbnf_printf(out, "[%d-%d]", from, to);
}

static void free_digits(gbnf_text *out, int n) {
    if (n == 1) gbnf_puts(out, " [0-9]");
    else if (n > 1) gbnf_printf(out, " [0-9]{%d}", n);
}

static bool all_char(const char *s, int n, char c) {
    for (int i = 0; i < n; i++)
        if (s[i] != c) return false;
    return true;
}

// Digit strings of length n between x and y inclusive (x <= y, same length), as alternatives.
static void fixed_range(gbnf_text *out, const char *x, const char *y, int n) {
    if (n == 0) return;
    int a = x[0] - '0', b = y[0] - '0';
    if (a == b) {
        gbnf_printf(out, "\"%d\"", a);
        if (n > 1) {
            gbnf_puts(out, " (");
            fixed_range(out, x + 1, y + 1, n - 1);
            gbnf_puts(out, ")");
        }
        return;
    }
    // the whole block [a-b] followed by anything when x's tail is 0...0 and y's 9...9
    bool low_full = all_char(x + 1, n - 1, '0'), high_full = all_char(y + 1, n - 1, '9');
    int mid_from = low_full ? a : a + 1, mid_to = high_full ? b : b - 1;
    bool first = true;
    if (!low_full) {
        char nines[JS_MAX_INT_DIGITS + 1];
        memset(nines, '9', (size_t)n - 1);
        gbnf_printf(out, "\"%d\" (", a);
        fixed_range(out, x + 1, nines, n - 1);
        gbnf_puts(out, ")");
        first = false;
    }
    if (mid_from <= mid_to) {
        if (!first) gbnf_puts(out, " | ");
        digit_class(out, mid_from, mid_to);
        free_digits(out, n - 1);
        first = false;
    }
    if (!high_full) {
        char zeros[JS_MAX_INT_DIGITS + 1];
        memset(zeros, '0', (size_t)n - 1);
        if (!first) gbnf_puts(out, " | ");
        gbnf_printf(out, "\"%d\" (", b);
        fixed_range(out, zeros, y + 1, n - 1);
        gbnf_puts(out, ")");
    }
}

static int64_t pow10_i(int n) {
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

static int digit_count(int64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

// Non-negative [lo, hi] as alternatives (no surrounding group).
static void nonneg_range(gbnf_text *out, int64_t lo, int64_t hi) {
    bool first = true;
    for (int d = digit_count(lo); d <= digit_count(hi); d++) {
        int64_t from = d == 1 ? 0 : pow10_i(d - 1), to = pow10_i(d) - 1;
        if (from < lo) from = lo;
        if (to > hi) to = hi;
        char x[24], y[24];
        snprintf(x, sizeof x, "%lld", (long long)from);
        snprintf(y, sizeof y, "%lld", (long long)to);
        if (!first) gbnf_puts(out, " | ");
        gbnf_puts(out, "(");
        fixed_range(out, x, y, d);
        gbnf_puts(out, ")");
        first = false;
    }
}

void js_int_range_expr(gbnf_text *out, int64_t lo, int64_t hi) {
    gbnf_puts(out, "(");
    bool first = true;
    if (lo < 0) {  // -hi'..-lo' written as "-" and the magnitude, which is at least 1
        int64_t mag_lo = hi < 0 ? -hi : 1, mag_hi = -lo;
        gbnf_puts(out, "\"-\" (");
        nonneg_range(out, mag_lo, mag_hi);
        gbnf_puts(out, ")");
        first = false;
    }
    if (hi >= 0) {
        if (!first) gbnf_puts(out, " | ");
        nonneg_range(out, lo < 0 ? 0 : lo, hi);
    }
    gbnf_puts(out, ")");
}
