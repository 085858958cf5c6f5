// kaon logits: the logits of every position of a token sequence, as raw little-endian f32
// [n, vocab] — what the reference tests compare against numpy. --decode feeds one token per
// step (the decode path) instead of one prefill.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "cli/seq.h"
#include "util/err.h"

int kaon_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *out_path = NULL;
    long threads = kaon_cli_default_threads(), chunk = 512;
    bool decode = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kaon logits [-m MODEL] --prompt-ids IDS -o OUT.f32 [--decode] [--chunk N] [--threads N]\n");
            return 0;
        }
        if (!v && a[0] == '-' && strcmp(a, "--decode")) return kaon_cli_fail("option %s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "--prompt-ids")) ids_arg = argv[++i];
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out_path = argv[++i];
        else if (!strcmp(a, "--decode")) decode = true;
        else if (!strcmp(a, "--chunk")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 1 << 16, &chunk)) return kaon_cli_fail("bad --chunk");
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 1024, &threads)) return kaon_cli_fail("bad --threads");
        } else return kaon_cli_fail("unknown option '%s'", a);
    }
    if (!ids_arg || !out_path) return kaon_cli_fail("--prompt-ids and -o are required");
    int32_t *ids = NULL;
    int n = 0;
    if (kaon_cli_parse_ids(ids_arg, &ids, &n) || n == 0) return kaon_cli_fail("bad --prompt-ids");
    kaon_model *m = kaon_cli_load_model(model);
    if (!m) { free(ids); return 2; }
    int rc = 2;
    const int V = m->cfg.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] >= V) { kaon_cli_fail("id %d outside the vocabulary", ids[i]); goto out; }
    kaon_backend *be = kaon_backend_cpu_create((int)threads);
    kaon_seq seq;
    if (!be || kaon_seq_init(&seq, m, be, n, decode ? 1 : (int)chunk, true)) {
        kaon_cli_fail("%s", kaon_last_error());
        if (be) be->ops->destroy(be);
        goto out;
    }
    float *logits = malloc(sizeof(float) * (size_t)n * V);
    if (!logits) kaon_cli_fail("out of memory");
    else if (kaon_seq_feed(&seq, ids, n, logits)) kaon_cli_fail("%s", kaon_last_error());
    else {
        FILE *f = fopen(out_path, "wb");
        if (!f || fwrite(logits, sizeof(float) * V, (size_t)n, f) != (size_t)n)
            kaon_cli_fail("cannot write %s", out_path);
        else rc = 0;
        if (f && fclose(f)) rc = kaon_cli_fail("cannot write %s", out_path);
    }
    free(logits);
    kaon_seq_free(&seq);
    be->ops->destroy(be);
out:
    free(ids);
    kaon_model_free(m);
    return rc;
}
