// kaon logits: the logits of every position of a token sequence, as raw little-endian f32
// [n, vocab] — what the reference tests compare against numpy. Through the engine: one request
// asking for its prompt logits, the prompt in chunks of --chunk tokens; --decode feeds one
// token per step (the decode path) instead.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/load.h"
#include "kaon.h"

int kaon_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_arg = NULL, *out_path = NULL, *device = NULL, *kv_dtype = NULL;
    long threads = kaon_cli_default_threads(), chunk = 512, tp = 1, dp = 1;
    bool decode = false, ep = false, dummy = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: kaon logits [-m MODEL] --prompt-ids IDS -o OUT.f32 [--decode] [--chunk N] [--threads N]\n"
                   "                   [--tensor-parallel-size N] [--enable-expert-parallel]\n"
                   "                   [--data-parallel-size D (with --enable-expert-parallel)]\n"
                   "                   [--device cpu|cuda|cuda:N] [--kv-cache-dtype auto|bf16|fp8]\n"
                   "                   [--load-format auto|dummy (dummy: random weights from -m CONFIG)]\n");
            return 0;
        }
        if (!v && a[0] == '-' && strcmp(a, "--decode") && strcmp(a, "--enable-expert-parallel")) return kaon_cli_fail("option %s needs a value", a);
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "--prompt-ids")) ids_arg = argv[++i];
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out_path = argv[++i];
        else if (!strcmp(a, "--decode")) decode = true;
        else if (!strcmp(a, "--enable-expert-parallel")) ep = true;
        else if (!strcmp(a, "--chunk")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 1 << 16, &chunk)) return kaon_cli_fail("bad --chunk");
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 1024, &threads)) return kaon_cli_fail("bad --threads");
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 64, &tp)) return kaon_cli_fail("bad --tensor-parallel-size");
        } else if (!strcmp(a, "--data-parallel-size") || !strcmp(a, "-dp")) {
            if (!kaon_cli_parse_int(argv[++i], 1, 64, &dp)) return kaon_cli_fail("bad --data-parallel-size");
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            kv_dtype = argv[++i];
            if (kaon_cli_check_kv_dtype(kv_dtype)) return 2;
        } else if (!strcmp(a, "--device")) {
            device = argv[++i];
            if (kaon_cli_check_device(device, false)) return 2;
        } else if (!strcmp(a, "--load-format")) {
            const char *f = argv[++i];
            if (strcmp(f, "auto") && strcmp(f, "dummy"))
                return kaon_cli_fail("bad --load-format '%s' (auto, dummy)", f);
            dummy = !strcmp(f, "dummy");
        } else return kaon_cli_fail("unknown option '%s'", a);
    }
    if (!ids_arg || !out_path) return kaon_cli_fail("--prompt-ids and -o are required");
    int32_t *ids = NULL;
    int n = 0;
    if (kaon_cli_parse_ids(ids_arg, &ids, &n) || n == 0) return kaon_cli_fail("bad --prompt-ids");
    kaon_cli_quiet_logs();
    kaon_engine_options eo;
    kaon_engine_options_default(&eo);
    eo.device = device;
    eo.n_threads = (int)threads;
    eo.tensor_parallel_size = (int)tp;
    eo.enable_expert_parallel = ep;
    eo.data_parallel_size = (int)dp;
    eo.kv_cache_dtype = kv_dtype;
    eo.load_tokenizer = false;
    eo.max_num_seqs = 1;
    // A step of `chunk` prompt tokens, each with its logit row; the context holds the prompt
    // and the one token the request must generate.
    eo.max_num_batched_tokens = decode ? 1 : (int)chunk;
    eo.max_logit_rows = eo.max_num_batched_tokens;
    eo.max_model_len = n + 1;
    kaon_engine *e = kaon_cli_engine(&eo, model, dummy);
    if (!e) {
        free(ids);
        return 2;
    }
    int rc = 2;
    kaon_engine_info info;
    kaon_engine_get_info(e, &info);
    const int V = info.vocab_size;
    kaon_sampling sp;
    kaon_sampling_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = 1;
    sp.ignore_eos = true;
    sp.prompt_logits = true;
    kaon_request *r = NULL;
    for (int i = 0; i < n; i++)
        if (ids[i] >= V) { kaon_cli_fail("id %d outside the vocabulary", ids[i]); goto out; }
    if (!(r = kaon_engine_submit(e, ids, n, &sp))) {
        kaon_cli_fail("%s", kaon_last_error());
        goto out;
    }
    kaon_output o;
    bool wrote = false;
    while (kaon_request_next(r, &o, -1) == 1) {
        if (o.finish == KAON_FINISH_ERROR) {
            kaon_cli_fail("%s", o.error ? o.error : "the forward pass failed");
            goto out;
        }
        if (o.prompt_logits && o.n_prompt_logits == n) {
            FILE *f = fopen(out_path, "wb");
            if (!f || fwrite(o.prompt_logits, sizeof(float) * V, (size_t)n, f) != (size_t)n) {
                kaon_cli_fail("cannot write %s", out_path);
                if (f) fclose(f);
                goto out;
            }
            if (fclose(f)) {
                kaon_cli_fail("cannot write %s", out_path);
                goto out;
            }
            wrote = true;
        }
        if (o.finished) break;
    }
    if (!wrote) kaon_cli_fail("the engine returned no prompt logits");
    else rc = 0;
out:
    kaon_request_free(r);
    kaon_engine_destroy(e);
    free(ids);
    return rc;
}
