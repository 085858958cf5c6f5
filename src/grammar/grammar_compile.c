// gram_build -> kaon_grammar: charsets sorted, merged and complemented; rules flattened into
// one element array; left recursion refused (the matcher would expand it forever).
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_build.h"
#include "util/err.h"

void gram_build_free(gram_build *b) {
    for (int i = 0; i < b->n_rules; i++) {
        free(b->rules[i].name);
        free(b->rules[i].e);
    }
    free(b->rules);
    free(b->ranges);
    free(b->sets);
    free(b->negated);
    memset(b, 0, sizeof *b);
}

void kaon_grammar_free(kaon_grammar *g) {
    if (!g) return;
    free(g->elems);
    free(g->rule_alts);
    free(g->alt_first);
    free(g->alt_count);
    free(g->ranges);
    free(g->charsets);
    free(g->rep_canon);
    free(g->rep_rem);
    free(g);
}

int kaon_grammar_rule_count(const kaon_grammar *g) { return g ? g->n_rules : 0; }

static int cmp_range(const void *a, const void *b) {
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

// Sorted, merged, complemented when negated: ranges written to out (room for n + 1 pairs).
static int normalize(uint32_t *r, int n, bool neg, uint32_t *out) {
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[2 * i] <= out[2 * m - 1] + 1) {
            if (r[2 * i + 1] > out[2 * m - 1]) out[2 * m - 1] = r[2 * i + 1];
        } else {
            out[2 * m] = r[2 * i];
            out[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    if (!neg) return m;
    uint32_t *tmp = malloc((size_t)(m + 1) * 2 * sizeof *tmp);
    if (!tmp) return -1;
    int k = 0;
    uint32_t next = 0;
    for (int i = 0; i < m; i++) {
        if (out[2 * i] > next) {
            tmp[2 * k] = next;
            tmp[2 * k + 1] = out[2 * i] - 1;
            k++;
        }
        next = out[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) {
        tmp[2 * k] = next;
        tmp[2 * k + 1] = 0x10FFFF;
        k++;
    }
    memcpy(out, tmp, (size_t)k * 2 * sizeof *tmp);
    free(tmp);
    return k;
}

// The ASCII part of sorted ranges as a bitmap.
static void ascii_bits(const uint32_t *r, int n, uint32_t *bits) {
    for (int i = 0; i < n; i++)
        for (uint32_t c = r[2 * i]; c <= r[2 * i + 1] && c < 128; c++) bits[c >> 5] |= 1u << (c & 31);
}

bool gram_charset_has(const kaon_grammar *g, int cs, uint32_t cp) {
    const gram_charset *s = &g->charsets[cs];
    if (cp < 128) return s->ascii[cp >> 5] >> (cp & 31) & 1;
    const uint32_t *r = g->ranges + 2 * s->first;
    int lo = 0, hi = s->n;
    while (lo < hi) {  // first range with hi >= cp
        int mid = (lo + hi) / 2;
        if (r[2 * mid + 1] < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < s->n && r[2 * lo] <= cp;
}

bool gram_charset_meets(const kaon_grammar *g, int cs, uint32_t lo, uint32_t hi) {
    const gram_charset *s = &g->charsets[cs];
    const uint32_t *r = g->ranges + 2 * s->first;
    for (int i = 0; i < s->n; i++)
        if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
    return false;
}

// Rules that can match the empty string. Each alternative scans forward over nullable
// references and, when it meets a reference not yet known nullable, waits on that rule;
// the rule's turn resumes its waiters. Linear in the grammar's size.
static int mark_nullable(const kaon_grammar *g, bool *nullable) {
    int n = g->n_rules, n_alts = g->alt_first[n - 1] + g->alt_count[n - 1];
    int32_t *scan = malloc((size_t)n_alts * sizeof *scan), *alt_rule = malloc((size_t)n_alts * sizeof *alt_rule);
    int32_t *wait_head = malloc((size_t)n * sizeof *wait_head), *wait_next = malloc((size_t)n_alts * sizeof *wait_next);
    int32_t *queue = malloc((size_t)n * sizeof *queue);
    int rc = 0, qh = 0, qt = 0;
    if (!scan || !alt_rule || !wait_head || !wait_next || !queue) {
        rc = -1;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        wait_head[r] = -1;
        for (int k = 0; k < g->alt_count[r]; k++) {
            alt_rule[g->alt_first[r] + k] = r;
            scan[g->alt_first[r] + k] = g->rule_alts[g->alt_first[r] + k];
        }
    }
    for (int a = 0; a < n_alts || qh < qt;) {
        int alt;
        if (qh < qt) {  // a rule just became nullable: resume one of its waiters
            int r = queue[qh];
            if (wait_head[r] < 0) {
                qh++;
                continue;
            }
            alt = wait_head[r];
            wait_head[r] = wait_next[alt];
            scan[alt]++;
        } else {
            alt = a++;
        }
        int p = scan[alt];
        while (g->elems[p].type == GEL_REF && nullable[g->elems[p].val]) p++;
        scan[alt] = p;
        int type = g->elems[p].type, r = alt_rule[alt];
        if (type == GEL_END || type == GEL_ALT) {
            if (!nullable[r]) {
                nullable[r] = true;
                queue[qt++] = r;
            }
        } else if (type == GEL_REF) {
            wait_next[alt] = wait_head[g->elems[p].val];
            wait_head[g->elems[p].val] = alt;
        }
    }
out:
    free(scan);
    free(alt_rule);
    free(wait_head);
    free(wait_next);
    free(queue);
    return rc;
}

// Left recursion: rule r reaches itself through references each preceded only by nullable
// elements. Iterative DFS (state 1 = on the path, 2 = done).
static int check_left_recursion(const kaon_grammar *g, const gram_build *b) {
    int n = g->n_rules;
    if (n <= 0 || n > KAON_GRAMMAR_MAX_RULES) return 0;
    bool *nullable = calloc((size_t)n, 1);
    uint8_t *state = calloc((size_t)n, 1);
    int32_t *stack = malloc((size_t)n * 2 * sizeof *stack);
    int32_t *edge_first = NULL, *edges = NULL;
    int rc = 0;
    if (!nullable || !state || !stack) {
        rc = kaon_set_error("grammar: out of memory");
        goto out;
    }
    if (mark_nullable(g, nullable)) {
        rc = kaon_set_error("grammar: out of memory");
        goto out;
    }
    // left-reachable references of each rule, as edge lists (CSR)
    edge_first = malloc((size_t)(n + 1) * sizeof *edge_first);
    int n_edges = 0;
    if (!edge_first) {
        rc = kaon_set_error("grammar: out of memory");
        goto out;
    }
    for (int pass = 0; pass < 2; pass++) {
        n_edges = 0;
        for (int r = 0; r < n; r++) {
            edge_first[r] = n_edges;
            for (int a = 0; a < g->alt_count[r]; a++) {
                for (int p = g->rule_alts[g->alt_first[r] + a]; g->elems[p].type == GEL_REF; p++) {
                    if (pass) edges[n_edges] = g->elems[p].val;
                    n_edges++;
                    if (!nullable[g->elems[p].val]) break;
                }
            }
        }
        edge_first[n] = n_edges;
        if (!pass && !(edges = malloc((size_t)(n_edges + 1) * sizeof *edges))) {
            rc = kaon_set_error("grammar: out of memory");
            goto out;
        }
    }
    for (int start = 0; start < n && !rc; start++) {
        if (state[start]) continue;
        int sp = 0;
        stack[sp++] = start;
        stack[sp++] = edge_first[start];
        state[start] = 1;
        while (sp && !rc) {
            int r = stack[sp - 2], e = stack[sp - 1]++;
            if (e >= edge_first[r + 1]) {
                state[r] = 2;
                sp -= 2;
                continue;
            }
            int to = edges[e];
            if (state[to] == 1) {
                const char *name = b->rules[to].name;
                rc = kaon_set_error("grammar: left recursion through %s%.64s%s (a rule that can begin "
                                    "with itself, or a repetition of something that can be empty)",
                                    name ? "rule '" : "a group or repetition", name ? name : "",
                                    name ? "'" : "");
            } else if (!state[to]) {
                state[to] = 1;
                stack[sp++] = to;
                stack[sp++] = edge_first[to];
            }
        }
    }
out:
    free(edge_first);
    free(edges);
    free(nullable);
    free(state);
    free(stack);
    return rc;
}

kaon_grammar *gram_build_compile(gram_build *b, const char *root_rule) {
    kaon_grammar *g = calloc(1, sizeof *g);
    if (!g) goto oom;
    g->root = -1;
    for (int i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && !strcmp(b->rules[i].name, root_rule)) g->root = i;
    if (g->root < 0) {
        kaon_set_error("grammar: no rule named '%.64s'", root_rule);
        kaon_grammar_free(g);
        return NULL;
    }
    // charsets: each may grow by one range when complemented
    g->n_charsets = b->n_sets;
    g->charsets = malloc((size_t)(b->n_sets ? b->n_sets : 1) * sizeof *g->charsets);
    g->ranges = malloc(((size_t)b->n_ranges + 2 * (size_t)b->n_sets + 2) * sizeof *g->ranges);
    if (!g->charsets || !g->ranges) goto oom;
    int used = 0;
    for (int s = 0; s < b->n_sets; s++) {
        int m = normalize(b->ranges + 2 * b->sets[s].first, b->sets[s].n, b->negated[s], g->ranges + 2 * used);
        if (m < 0) goto oom;
        g->charsets[s] = (gram_charset){used, m, {0}};
        ascii_bits(g->ranges + 2 * used, m, g->charsets[s].ascii);
        used += m;
    }
    // elements: each rule's elements then END; alternatives start after each ALT
    int n_el = 0, n_alts = 0;
    for (int r = 0; r < b->n_rules; r++) {
        n_el += b->rules[r].n + 1;
        n_alts++;
        for (int i = 0; i < b->rules[r].n; i++) n_alts += b->rules[r].e[i].type == GEL_ALT;
    }
    g->n_rules = b->n_rules;
    g->n_elems = n_el;
    g->elems = malloc((size_t)n_el * sizeof *g->elems);
    g->rule_alts = malloc((size_t)n_alts * sizeof *g->rule_alts);
    g->alt_first = malloc((size_t)b->n_rules * sizeof *g->alt_first);
    g->alt_count = malloc((size_t)b->n_rules * sizeof *g->alt_count);
    if (!g->elems || !g->rule_alts || !g->alt_first || !g->alt_count) goto oom;
    int p = 0, a = 0;
    for (int r = 0; r < b->n_rules; r++) {
        g->alt_first[r] = a;
        g->rule_alts[a++] = p;
        for (int i = 0; i < b->rules[r].n; i++) {
            g->elems[p++] = b->rules[r].e[i];
            if (b->rules[r].e[i].type == GEL_ALT) g->rule_alts[a++] = p;
        }
        g->elems[p++] = (gram_elem){GEL_END, 0};
        g->alt_count[r] = a - g->alt_first[r];
    }
    g->rep_canon = malloc((size_t)n_el * sizeof *g->rep_canon);
    g->rep_rem = calloc((size_t)n_el, sizeof *g->rep_rem);
    if (!g->rep_canon || !g->rep_rem) goto oom;
    memset(g->rep_canon, 0xff, (size_t)n_el * sizeof *g->rep_canon);
    for (int r = 0; r < b->n_rules; r++) {
        const gram_build_rule *br = &b->rules[r];
        if (br->rep_k < 2) continue;
        int start = g->rule_alts[g->alt_first[r]], head = g->rule_alts[g->alt_first[br->rep_head]];
        for (int o = 0; o < 2; o++) {  // x, then the reference to opt_(k-1)
            if (br->rep_head != r) g->rep_canon[start + o] = head + o;
            g->rep_rem[start + o] = br->rep_k - 1;
        }
    }
    if (check_left_recursion(g, b)) {
        kaon_grammar_free(g);
        return NULL;
    }
    return g;
oom:
    kaon_set_error("grammar: out of memory");
    kaon_grammar_free(g);
    return NULL;
}
