// kaon serve's vLLM flag table (src/cli/vllm_flags.c): aliases, "=" and underscore forms,
// accepted, ignored (warned once), refused and unknown flags, vLLM's integers with units, and
// the checks against the model (--quantization, --tokenizer, --dtype).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/vllm_flags.h"
#include "test.h"

static char err_text[8192];

// Translates the NULL-terminated argument list ("serve" is argv[0]); the messages land in err_text.
static int run(kaon_vllm_args *o, const char *const *args) {
    char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"serve";
    for (; *args; args++) argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    FILE *f = tmpfile();
    int rc = kaon_vllm_translate(argc, argv, o, f);
    rewind(f);
    size_t n = fread(err_text, 1, sizeof err_text - 1, f);
    err_text[n] = 0;
    fclose(f);
    return rc;
}

// Whether o's argv (after argv[0]) is exactly the NULL-terminated list want.
static int argv_is(const kaon_vllm_args *o, const char *const *want) {
    int i = 1;
    for (; *want; want++, i++)
        if (i >= o->argc || strcmp(o->argv[i], *want)) return 0;
    return i == o->argc && o->argv[o->argc] == NULL;
}

static int count(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static int lines(const char *s) { return count(s, "\n"); }

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

int main(void) {
    kaon_vllm_args o;

    // kaon's own flags pass through unchanged; the positional MODEL too.
    CHECK(run(&o, ARGS("m.gguf", "--port", "0", "--no-prefix-caching", "--threads", "2")) == 0);
    CHECK(argv_is(&o, ARGS("m.gguf", "--port", "0", "--no-prefix-caching", "--threads", "2")));
    CHECK(err_text[0] == 0);
    CHECK(!strcmp(o.argv[0], "serve"));
    kaon_vllm_args_free(&o);

    // "=" form, underscore form, and both.
    CHECK(run(&o, ARGS("--model=m.gguf", "--max_num_seqs", "8", "--max_num_batched_tokens=64", "--api-key=a=b")) == 0);
    CHECK(argv_is(&o, ARGS("--model", "m.gguf", "--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--api-key",
                           "a=b")));
    kaon_vllm_args_free(&o);

    // Aliases with a value rewritten: units, bfloat16, the prefix-caching switches, a list of names.
    CHECK(run(&o, ARGS("--max-model-len", "1k", "--kv-cache-dtype", "bfloat16", "--no-enable-prefix-caching",
                       "--enable_prefix_caching", "--kv-cache-memory-bytes=1G")) == 0);
    CHECK(argv_is(&o, ARGS("--max-model-len", "1000", "--kv-cache-dtype", "bf16", "--no-prefix-caching",
                           "--enable-prefix-caching", "--kv-cache-memory", "1073741824")));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--max_model_len=32K", "--max-num-batched-tokens", "8k")) == 0);
    CHECK(argv_is(&o, ARGS("--max-model-len", "32768", "--max-num-batched-tokens", "8000")));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--max-model-len", "-1", "m.gguf")) == 0);  // vLLM's "the model's": kaon's default
    CHECK(argv_is(&o, ARGS("m.gguf")));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--served-model-name", "a", "b", "c", "--port", "1")) == 0);
    CHECK(argv_is(&o, ARGS("--served-model-name", "a", "--served-model-name", "b", "--served-model-name", "c",
                           "--port", "1")));
    CHECK(lines(err_text) == 0);  // every name is served: nothing to warn about
    kaon_vllm_args_free(&o);

    // Accepted: dropped without a word; values kaon has (-pp 1, --dtype auto) too.
    CHECK(run(&o, ARGS("--enable-auto-tool-choice", "--disable-log-requests", "--disable_log_stats",
                       "--pipeline-parallel-size", "1", "--dtype", "bfloat16",
                       "--no-trust-remote-code", "--task", "generate")) == 0);
    CHECK(o.argc == 1);
    CHECK(err_text[0] == 0);
    kaon_vllm_args_free(&o);

    // Ignored: dropped with one warning per flag, however often it is given; values are consumed.
    CHECK(run(&o, ARGS("--trust-remote-code", "--swap-space", "4", "--trust_remote_code", "--seed=7",
                       "--download-dir", "/x", "m.gguf")) == 0);
    CHECK(argv_is(&o, ARGS("m.gguf")));
    CHECK(count(err_text, "kaon: warning: --trust-remote-code ignored") == 1);
    CHECK(count(err_text, "kaon: warning: --swap-space ignored") == 1);
    CHECK(count(err_text, "--seed ignored") == 1 && count(err_text, "--download-dir ignored") == 1);
    CHECK(lines(err_text) == 4);
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("-O3", "-O", "2", "--compilation-config={\"level\": 3}")) == 0);  // -O with its value attached
    CHECK(o.argc == 1 && count(err_text, "-O ignored") == 1 && count(err_text, "--compilation-config ignored") == 1);
    kaon_vllm_args_free(&o);

    // --enforce-eager, --quantization, --tokenizer, --dtype float32: kept for cmd_serve's checks.
    CHECK(run(&o, ARGS("--enforce-eager", "-q", "awq", "--tokenizer", "/tmp", "--dtype", "float32")) == 0);
    CHECK(o.enforce_eager && o.quantization && !strcmp(o.quantization, "awq"));
    CHECK(o.tokenizer && !strcmp(o.tokenizer, "/tmp") && o.dtype && !strcmp(o.dtype, "float32"));
    CHECK(o.argc == 1 && err_text[0] == 0);
    kaon_vllm_args_free(&o);

    // --data-parallel-size with --enable-expert-parallel: both passed on in order (kaon serve
    // then makes the ranks DP attention instead of replicas).
    CHECK(run(&o, ARGS("--data-parallel-size", "2", "--enable-expert-parallel")) == 0);
    CHECK(o.argc == 4 && !strcmp(o.argv[1], "--data-parallel-size") && !strcmp(o.argv[2], "2") &&
          !strcmp(o.argv[3], "--enable-expert-parallel") && err_text[0] == 0);
    kaon_vllm_args_free(&o);

    // Refused: exit status 2 and one error line naming the flag.
    const char *const *refused[] = {
        ARGS("--pipeline-parallel-size", "2"),
        ARGS("--decode-context-parallel-size", "2"),
        ARGS("--dtype", "float16"),
        ARGS("--dtype", "float32", "--device", "cuda"),
        ARGS("--enable-lora"),
        ARGS("--ssl-keyfile", "k.pem"),
        ARGS("--max-model-len", "1.5K"),
        ARGS("--max-model-len", "lots"),
        ARGS("--task", "embed"),
    };
    const char *refused_name[] = {"--pipeline-parallel-size",
                                  "--decode-context-parallel-size", "--dtype", "--dtype",
                                  "--enable-lora", "--ssl-keyfile", "--max-model-len", "--max-model-len", "--task"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        int rc = run(&o, refused[i]);
        if (rc != 2 || lines(err_text) != 1 || strncmp(err_text, "kaon: error: ", 13) ||
            !strstr(err_text, refused_name[i]))
            fprintf(stderr, "refused case %zu: rc %d, '%s'\n", i, rc, err_text);
        CHECK(rc == 2);
        CHECK(lines(err_text) == 1 && !strncmp(err_text, "kaon: error: ", 13));
        CHECK(strstr(err_text, refused_name[i]) != NULL);
        kaon_vllm_args_free(&o);
    }
    CHECK(run(&o, ARGS("-pp", "2")) == 2 && strstr(err_text, "issue 18"));
    kaon_vllm_args_free(&o);
    // Tensor parallelism is kaon's own flag now (-tp: its vLLM spelling).
    CHECK(run(&o, ARGS("-tp", "2")) == 0 && o.argc == 3 && !strcmp(o.argv[1], "--tensor-parallel-size") &&
          !strcmp(o.argv[2], "2"));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--tensor_parallel_size=4")) == 0 && o.argc == 3 && !strcmp(o.argv[2], "4"));
    kaon_vllm_args_free(&o);
    // So is expert parallelism (MoE experts placed on the -tp ranks).
    CHECK(run(&o, ARGS("-tp", "2", "--enable-expert-parallel")) == 0 && o.argc == 4 &&
          !strcmp(o.argv[3], "--enable-expert-parallel") && err_text[0] == 0);
    kaon_vllm_args_free(&o);

    // Data-parallel replicas are kaon's own flag too (-dp, --data_parallel_size=N).
    CHECK(run(&o, ARGS("-dp", "2")) == 0 && o.argc == 3 && !strcmp(o.argv[1], "--data-parallel-size") &&
          !strcmp(o.argv[2], "2") && err_text[0] == 0);
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--data_parallel_size=3")) == 0 && o.argc == 3 &&
          !strcmp(o.argv[1], "--data-parallel-size") && !strcmp(o.argv[2], "3"));
    kaon_vllm_args_free(&o);

    // Unknown flags, a missing value, a value given to a switch.
    CHECK(run(&o, ARGS("--no-such-flag", "1")) == 2);
    CHECK(!strcmp(err_text, "kaon: error: unknown option '--no-such-flag' (see kaon serve --help)\n"));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--max_bogus=3")) == 2 && strstr(err_text, "'--max_bogus=3'") && lines(err_text) == 1);
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--no-port")) == 2 && strstr(err_text, "unknown option"));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--port")) == 2 && strstr(err_text, "--port needs a value"));
    kaon_vllm_args_free(&o);
    CHECK(run(&o, ARGS("--trust-remote-code=yes")) == 2 && strstr(err_text, "takes no value"));
    kaon_vllm_args_free(&o);

    // vLLM's integers with units.
    long long n = 0;
    CHECK(kaon_vllm_parse_human_int("4096", 0, 1LL << 40, &n) && n == 4096);
    CHECK(kaon_vllm_parse_human_int("1k", 0, 1LL << 40, &n) && n == 1000);
    CHECK(kaon_vllm_parse_human_int("1K", 0, 1LL << 40, &n) && n == 1024);
    CHECK(kaon_vllm_parse_human_int("25.6k", 0, 1LL << 40, &n) && n == 25600);
    CHECK(kaon_vllm_parse_human_int("1m", 0, 1LL << 40, &n) && n == 1000000);
    CHECK(kaon_vllm_parse_human_int("2M", 0, 1LL << 40, &n) && n == 2097152);
    CHECK(!kaon_vllm_parse_human_int("1.5K", 0, 1LL << 40, &n));
    CHECK(!kaon_vllm_parse_human_int("1kb", 0, 1LL << 40, &n));
    CHECK(!kaon_vllm_parse_human_int("", 0, 1LL << 40, &n));
    CHECK(!kaon_vllm_parse_human_int("2k", 0, 1999, &n));

    // The checks against the model: a GGUF file, a folder with a quantization_config, a float one.
    char dir[] = "/tmp/kaon-vllm-flags-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char gguf[256], awq[256], plain[256], path[300];
    snprintf(gguf, sizeof gguf, "%s/m.gguf", dir);
    snprintf(awq, sizeof awq, "%s/awq", dir);
    snprintf(plain, sizeof plain, "%s/plain", dir);
    FILE *f = fopen(gguf, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite("GGUF\3\0\0\0", 1, 8, f);
        fclose(f);
    }
    CHECK(mkdir(awq, 0700) == 0 && mkdir(plain, 0700) == 0);
    snprintf(path, sizeof path, "%s/config.json", awq);
    if ((f = fopen(path, "w"))) {
        fputs("{\"quantization_config\": {\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128}}", f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/config.json", plain);
    if ((f = fopen(path, "w"))) {
        fputs("{\"hidden_size\": 64}", f);
        fclose(f);
    }
    FILE *e = tmpfile();
    CHECK(kaon_vllm_check_quant(NULL, gguf, e) == 0);
    CHECK(kaon_vllm_check_quant("gguf", gguf, e) == 0);
    CHECK(kaon_vllm_check_quant("awq", awq, e) == 0);
    CHECK(kaon_vllm_check_quant("awq_marlin", awq, e) == 0);
    CHECK(kaon_vllm_check_quant("none", plain, e) == 0);
    rewind(e);
    CHECK(fgetc(e) == EOF);  // no message when they match
    fclose(e);
    e = tmpfile();
    CHECK(kaon_vllm_check_quant("gptq", awq, e) == 2);
    CHECK(kaon_vllm_check_quant("fp8", gguf, e) == 2);
    CHECK(kaon_vllm_check_quant("awq", plain, e) == 2);
    rewind(e);
    size_t got = fread(err_text, 1, sizeof err_text - 1, e);
    err_text[got] = 0;
    fclose(e);
    CHECK(lines(err_text) == 3 && strstr(err_text, "which is awq") && strstr(err_text, "which is gguf") &&
          strstr(err_text, "not quantized"));
    e = tmpfile();
    CHECK(kaon_vllm_check_tokenizer(awq, awq, e) == 0);
    CHECK(kaon_vllm_check_tokenizer(dir, gguf, e) == 0);  // the GGUF's folder
    CHECK(kaon_vllm_check_tokenizer(plain, awq, e) == 2);
    CHECK(kaon_vllm_check_dtype("float32", NULL, e) == 0);  // the CPU (the default device)
    CHECK(kaon_vllm_check_dtype("float32", "cpu", e) == 0);
    CHECK(kaon_vllm_check_dtype("float32", "cuda:0", e) == 2);
    CHECK(kaon_vllm_check_dtype("auto", "cuda", e) == 0);
    fclose(e);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    CHECK(system(path) == 0);

    TEST_MAIN_END();
}
