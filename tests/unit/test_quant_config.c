// quantization_config / hf_quant_config.json parsing: every quantized config kaon has a copy
// of (tests/data/quant: the quantization_config objects of public checkpoints, and whole
// config.json files), the ignore lists per module, wrong types, and the unsupported errors.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/quant_config.h"
#include "test.h"
#include "util/fp8.h"
#include "util/err.h"

static char *read_all(const char *path, size_t *len) {
    char *p = kaon_test_read_file(path, len);
    if (!p) {
        fprintf(stderr, "missing %s (run from the repository root)\n", path);
        kaon_test_failures++;
    }
    return p;
}

// A quantization_config object file, wrapped as a config.json.
static int parse_snippet(const char *name, kaon_quant_config *q) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/quant/%s.quantization_config.json", name);
    size_t len;
    char *t = read_all(path, &len);
    memset(q, 0, sizeof *q);
    if (!t) return -2;
    char *json = malloc(len + 64);
    int n = snprintf(json, len + 64, "{\"quantization_config\": %s}", t);
    kaon_clear_error();
    int rc = kaon_quant_config_parse(json, (size_t)n, q);
    free(json);
    free(t);
    return rc;
}

static int parse_full(const char *name, kaon_quant_config *q) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/quant/full/%s.json", name);
    size_t len;
    char *t = read_all(path, &len);
    memset(q, 0, sizeof *q);
    if (!t) return -2;
    kaon_clear_error();
    int rc = kaon_quant_config_parse(t, len, q);
    free(t);
    return rc;
}

static int parse_text(const char *json, kaon_quant_config *q) {
    kaon_clear_error();
    return kaon_quant_config_parse(json, strlen(json), q);
}

static void expect_fp8_block(kaon_quant_config *q) {
    CHECK(q->method == KAON_QUANT_FP8 && !strcmp(q->method_name, "fp8"));
    CHECK(q->format == KAON_QFMT_FP8_BLOCK && q->block[0] == 128 && q->block[1] == 128);
    CHECK(!strcmp(q->fp8_fmt, "e4m3") && q->bits == 8 && q->act == KAON_QACT_DYNAMIC);
    CHECK(kaon_quant_config_check(q, "config.json") == 0);
}

static void expect_error(const char *json, const char *needle, int line) {
    kaon_quant_config q;
    int rc = parse_text(json, &q);
    if (rc == 0 || !strstr(kaon_last_error(), needle)) {
        fprintf(stderr, "line %d: expected error containing '%s', got rc %d '%s'\n", line, needle, rc,
                kaon_last_error());
        kaon_test_failures++;
    }
    kaon_quant_config_free(&q);
}

static void expect_unsupported(kaon_quant_config *q, const char *needle, int line) {
    kaon_clear_error();
    int rc = kaon_quant_config_check(q, "config.json");
    if (rc == 0 || !strstr(kaon_last_error(), needle) || !strstr(kaon_last_error(), "supported: fp8 block")) {
        fprintf(stderr, "line %d: expected unsupported error with '%s', got rc %d '%s'\n", line, needle, rc,
                kaon_last_error());
        kaon_test_failures++;
    }
}

// e4m3fn both ways: every finite code round-trips; ties go to the even code; saturation.
static void check_e4m3(void) {
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F) continue;  // NaN
        CHECK(kaon_f32_to_e4m3(kaon_e4m3_to_f32((uint8_t)b)) == b);
    }
    CHECK(kaon_e4m3_to_f32(0x7E) == 448.0f && kaon_e4m3_to_f32(0x01) == 0x1p-9f && kaon_e4m3_to_f32(0x38) == 1.0f);
    CHECK(kaon_f32_to_e4m3(1.0625f) == 0x38 && kaon_f32_to_e4m3(1.1875f) == 0x3A);  // ties to even
    CHECK(kaon_f32_to_e4m3(1.07f) == 0x39 && kaon_f32_to_e4m3(-1.07f) == 0xB9);
    CHECK(kaon_f32_to_e4m3(0x1.8p-10f) == 0x01 && kaon_f32_to_e4m3(0x1p-11f) == 0x00);  // subnormal ties
    CHECK(kaon_f32_to_e4m3(0.01553f) == 0x08);  // rounds up into the first normal
    CHECK(kaon_f32_to_e4m3(500.0f) == 0x7E && kaon_f32_to_e4m3(-1e30f) == 0xFE);
    CHECK(kaon_f32_to_e4m3(NAN) == 0x7F);
}

int main(void) {
    kaon_quant_config q;
    char buf[160];
    check_e4m3();

    // FP8 block: DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8 (snippets and whole configs).
    const char *fp8_snippets[] = {"deepseek-ai__DeepSeek-V3", "moonshotai__Kimi-K2-Instruct", "Qwen__Qwen3-32B-FP8"};
    for (int i = 0; i < 3; i++) {
        CHECK(parse_snippet(fp8_snippets[i], &q) == 0);
        expect_fp8_block(&q);
        CHECK(q.n_ignore == 0);
        CHECK(kaon_quant_module_quantized(&q, "model.layers.0.self_attn.q_proj"));
        CHECK(kaon_quant_module_quantized(&q, "lm_head"));  // no list: DeepSeek's head is bf16 by dtype
        kaon_quant_config_free(&q);
    }
    const char *fp8_full[] = {"deepseek-ai__DeepSeek-V3", "deepseek-ai__DeepSeek-R1", "moonshotai__Kimi-K2-Instruct"};
    for (int i = 0; i < 3; i++) {
        CHECK(parse_full(fp8_full[i], &q) == 0);
        expect_fp8_block(&q);
        kaon_quant_config_free(&q);
    }
    CHECK(strstr(kaon_quant_describe(&(kaon_quant_config){.format = KAON_QFMT_FP8_BLOCK, .fp8_fmt = "e4m3",
                                                           .block = {128, 128}, .act = KAON_QACT_DYNAMIC},
                                     buf, sizeof buf),
                 "fp8 e4m3, blocks of 128x128, dynamic activations") != NULL);

    // Qwen3-30B-A3B-FP8: modules_to_not_convert lists lm_head, the norms and the routers.
    CHECK(parse_snippet("Qwen__Qwen3-30B-A3B-FP8", &q) == 0);
    expect_fp8_block(&q);
    CHECK(q.n_ignore == 1 + 48 * 3);
    CHECK(!kaon_quant_module_quantized(&q, "lm_head"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.3.mlp.gate"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.47.input_layernorm"));
    CHECK(kaon_quant_module_quantized(&q, "model.layers.3.mlp.gate_proj"));  // not the router
    CHECK(kaon_quant_module_quantized(&q, "model.layers.3.mlp.experts.5.down_proj"));
    CHECK(kaon_quant_module_quantized(&q, "model.layers.0.self_attn.q_proj"));
    kaon_quant_config_free(&q);
    const char *qwen_full[] = {"Qwen__Qwen3-30B-A3B-FP8", "Qwen__Qwen3-235B-A22B-FP8"};
    for (int i = 0; i < 2; i++) {
        CHECK(parse_full(qwen_full[i], &q) == 0);
        expect_fp8_block(&q);
        CHECK(q.n_ignore > 100 && !kaon_quant_module_quantized(&q, "model.layers.1.mlp.gate"));
        kaon_quant_config_free(&q);
    }

    // Kimi-K2.5: compressed-tensors pack-quantized INT4 group 32, in text_config; the ignore
    // list has regular expressions.
    CHECK(parse_snippet("moonshotai__Kimi-K2.5", &q) == 0);
    CHECK(q.method == KAON_QUANT_COMPRESSED_TENSORS && q.format == KAON_QFMT_INT);
    CHECK(q.bits == 4 && q.group_size == 32 && q.symmetric && q.act == KAON_QACT_NONE);
    CHECK(!strcmp(q.ct_format, "pack-quantized") && q.n_groups == 1 && q.n_ignore == 4);
    CHECK(!kaon_quant_module_quantized(&q, "lm_head"));
    CHECK(!kaon_quant_module_quantized(&q, "language_model.lm_head"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.3.self_attn.q_a_proj"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.0.mlp.gate_proj"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.5.mlp.shared_experts.down_proj"));
    CHECK(kaon_quant_module_quantized(&q, "model.layers.5.mlp.experts.17.down_proj"));
    CHECK(kaon_quant_config_check(&q, "config.json") == 0);  // pack-quantized W4A16 loads
    kaon_quant_config_free(&q);
    CHECK(parse_full("moonshotai__Kimi-K2.5", &q) == 0);
    CHECK(q.method == KAON_QUANT_COMPRESSED_TENSORS && q.bits == 4 && q.group_size == 32);
    kaon_quant_config_free(&q);

    // GPTQ (Qwen2.5-Coder Int4).
    CHECK(parse_snippet("Qwen__Qwen2.5-Coder-1.5B-Instruct-GPTQ-Int4", &q) == 0);
    CHECK(q.method == KAON_QUANT_GPTQ && q.format == KAON_QFMT_INT && q.bits == 4 && q.group_size == 128);
    CHECK(q.symmetric && !q.desc_act && q.act == KAON_QACT_NONE);
    CHECK(kaon_quant_config_check(&q, "config.json") == 0);
    q.bits = 8;  // only 4-bit words are unpacked
    expect_unsupported(&q, "quantization method 'gptq' (8-bit int, group 128)", __LINE__);
    kaon_quant_config_free(&q);

    // gpt-oss: MXFP4 experts; attention, router, embedding and head by glob.
    CHECK(parse_snippet("openai__gpt-oss-20b", &q) == 0);
    CHECK(q.method == KAON_QUANT_MXFP4 && q.format == KAON_QFMT_MXFP4 && q.group_size == 32 && q.n_ignore == 4);
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.7.self_attn.q_proj"));
    CHECK(!kaon_quant_module_quantized(&q, "model.layers.7.mlp.router"));
    CHECK(!kaon_quant_module_quantized(&q, "model.embed_tokens"));
    CHECK(kaon_quant_module_quantized(&q, "model.layers.7.mlp.experts"));
    CHECK(kaon_quant_config_check(&q, "config.json") == 0);  // model/mxfp4_weights.c loads it
    kaon_quant_config_free(&q);
    CHECK(parse_full("openai__gpt-oss-20b", &q) == 0);
    CHECK(q.method == KAON_QUANT_MXFP4);
    kaon_quant_config_free(&q);

    // ModelOpt (hf_quant_config.json): per-tensor FP8, FP8 KV cache.
    {
        size_t len;
        char *t = read_all("tests/data/quant/nvidia__Llama-3.1-70B-Instruct-FP8.hf_quant_config.json", &len);
        CHECK(t && kaon_quant_config_parse_modelopt(t, len, &q) == 0);
        CHECK(q.method == KAON_QUANT_MODELOPT && q.format == KAON_QFMT_FP8_TENSOR && q.act == KAON_QACT_STATIC);
        CHECK(!strcmp(q.kv_cache, "FP8") && q.n_ignore == 1 && !strcmp(q.source, "hf_quant_config.json"));
        CHECK(!kaon_quant_module_quantized(&q, "lm_head"));
        CHECK(kaon_quant_module_quantized(&q, "model.layers.0.mlp.down_proj"));
        CHECK(kaon_quant_config_check(&q, "hf_quant_config.json") == 0);  // supported (fp8_weights.c)
        char d[128];
        CHECK(!strcmp(kaon_quant_describe(&q, d, sizeof d), "fp8 e4m3, per tensor, static activations"));
        kaon_quant_config_free(&q);
        free(t);
    }

    // Synthetic: AWQ, compressed-tensors FP8 channel, bitsandbytes, unknown, none.
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,"
                     "\"zero_point\":true,\"version\":\"gemm\"}}", &q) == 0);
    CHECK(q.method == KAON_QUANT_AWQ && q.bits == 4 && q.group_size == 128 && !q.symmetric);
    CHECK(!strcmp(q.int_format, "gemm") && kaon_quant_config_check(&q, "config.json") == 0);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,"
                     "\"zero_point\":true,\"version\":\"gemv\"}}", &q) == 0);
    expect_unsupported(&q, "quantization method 'awq' (4-bit int, group 128, zero points, gemv)", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,"
                     "\"sym\":false,\"desc_act\":true,\"checkpoint_format\":\"gptq_v2\"}}", &q) == 0);
    CHECK(!q.symmetric && q.desc_act && !strcmp(q.int_format, "gptq_v2") && kaon_quant_config_check(&q, "c") == 0);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,"
                     "\"checkpoint_format\":\"marlin\"}}", &q) == 0);
    expect_unsupported(&q, "'gptq' (4-bit int, group 128, marlin)", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
                     "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,"
                     "\"type\":\"float\",\"strategy\":\"channel\",\"symmetric\":true},\"input_activations\":"
                     "{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"token\",\"dynamic\":true}}},"
                     "\"ignore\":[\"lm_head\"]}}", &q) == 0);
    CHECK(q.format == KAON_QFMT_FP8_CHANNEL && q.act == KAON_QACT_DYNAMIC && q.n_ignore == 1);
    CHECK(!strcmp(q.act_strategy, "token") && kaon_quant_config_check(&q, "config.json") == 0);
    {
        char d[128];
        CHECK(!strcmp(kaon_quant_describe(&q, d, sizeof d), "fp8 e4m3, per channel, dynamic per-token activations"));
    }
    kaon_quant_config_free(&q);
    // Dynamic per-group activations (FP8 block in compressed-tensors) are not read yet.
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
                     "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"block\","
                     "\"block_structure\":[128,128]},\"input_activations\":{\"num_bits\":8,\"type\":\"float\","
                     "\"strategy\":\"group\",\"group_size\":128,\"dynamic\":true}}}}}", &q) == 0);
    expect_unsupported(&q, "fp8 e4m3, blocks of 128x128, dynamic per-group activations", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"bitsandbytes\",\"load_in_4bit\":true}}", &q) == 0);
    CHECK(q.method == KAON_QUANT_BITSANDBYTES && q.bits == 4);
    expect_unsupported(&q, "'bitsandbytes' (4-bit)", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"hqq\"}}", &q) == 0);
    CHECK(q.method == KAON_QUANT_UNKNOWN && !strcmp(q.method_name, "hqq"));
    expect_unsupported(&q, "quantization method 'hqq' (unknown format)", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"static\"}}", &q) == 0);
    CHECK(q.format == KAON_QFMT_FP8_TENSOR && q.act == KAON_QACT_STATIC);
    expect_unsupported(&q, "'fp8' (fp8 e4m3, per tensor, static activations)", __LINE__);
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"hidden_size\":8}", &q) == 0 && q.method == KAON_QUANT_NONE);
    CHECK(kaon_quant_config_check(&q, "config.json") == 0 && !kaon_quant_module_quantized(&q, "lm_head"));
    kaon_quant_config_free(&q);
    CHECK(parse_text("{\"quantization_config\":null}", &q) == 0 && q.method == KAON_QUANT_NONE);
    kaon_quant_config_free(&q);

    // Wrong types name the key.
    expect_error("{\"quantization_config\":3}", "\"quantization_config\" must be an object", __LINE__);
    expect_error("{\"quantization_config\":{}}", "has no \"quant_method\"", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":7}}", "\"quantization_config.quant_method\" must be a string",
                 __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128]}}",
                 "\"quantization_config.weight_block_size\" must be a list of two integers", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"weight_block_size\":[128,0]}}",
                 "weight_block_size\"[1] must be a positive integer", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"sometimes\"}}",
                 "activation_scheme", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"modules_to_not_convert\":\"lm_head\"}}",
                 "\"quantization_config.modules_to_not_convert\" must be a list of module names", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"fp8\",\"modules_to_not_convert\":[\"a\",3]}}",
                 "modules_to_not_convert\"[1] must be a module name", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":\"4\"}}",
                 "\"quantization_config.bits\" must be an integer", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"config_groups\":[]}}",
                 "config_groups\" must be an object", __LINE__);
    expect_error("{\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"config_groups\":"
                 "{\"g\":{\"weights\":{\"num_bits\":true}}}}}", "config_groups.g.weights.num_bits\" must be an integer", __LINE__);
    expect_error("[1]", "not a JSON object", __LINE__);
    expect_error("{", "not valid JSON", __LINE__);
    kaon_clear_error();
    CHECK(kaon_quant_config_parse_modelopt("{\"quantization\":{\"exclude_modules\":{}}}",
                                           strlen("{\"quantization\":{\"exclude_modules\":{}}}"), &q) == -1 &&
          strstr(kaon_last_error(), "quantization.exclude_modules\" must be a list"));
    kaon_quant_config_free(&q);
    CHECK(kaon_quant_config_parse_modelopt("{}", 2, &q) == -1 && strstr(kaon_last_error(), "no \"quantization\""));
    kaon_quant_config_free(&q);
    TEST_MAIN_END();
}
