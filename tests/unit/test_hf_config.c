// config.json / generation_config.json parsing: the real configs in /work/shared/configs
// (values checked against the files' own text), synthetic configs for defaults and
// family-specific rules, wrong types, and loading from a folder.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/config.h"
#include "test.h"
#include "util/err.h"

static const char *configs_dir(void) {
    const char *d = getenv("KAON_SHARED_CONFIGS");
    return d ? d : "/work/shared/configs";
}

// Parses a shared config; returns 0/-1 like the parser, -2 when the file is missing.
static int parse_shared(const char *name, kaon_model_config *c) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", configs_dir(), name);
    size_t len;
    char *text = kaon_test_read_file(path, &len);
    kaon_model_config_init(c);
    if (!text) {
        fprintf(stderr, "missing config file %s (set KAON_SHARED_CONFIGS)\n", path);
        kaon_test_failures++;
        return -2;
    }
    kaon_clear_error();
    int rc = kaon_hf_config_parse(text, len, c);
    free(text);
    return rc;
}

static int parse_text(const char *json, kaon_model_config *c) {
    kaon_model_config_init(c);
    kaon_clear_error();
    return kaon_hf_config_parse(json, strlen(json), c);
}

static void expect_error(const char *json, const char *needle, int line) {
    kaon_model_config c;
    int rc = parse_text(json, &c);
    if (rc == 0 || !strstr(kaon_last_error(), needle)) {
        fprintf(stderr, "line %d: rc=%d error '%s' lacks '%s'\n", line, rc,
                rc ? kaon_last_error() : "", needle);
        kaon_test_failures++;
    }
}
#define EXPECT_ERROR(json, needle) expect_error((json), (needle), __LINE__)

static void test_llama31(void) {
    kaon_model_config c;
    int rc = parse_shared("meta-llama__Llama-3.1-8B-Instruct.json", &c);
    CHECK(rc == 0);
    if (rc) { fprintf(stderr, "%s\n", kaon_last_error()); return; }
    CHECK(!strcmp(c.arch_name, "LlamaForCausalLM") && c.arch == KAON_ARCH_LLAMA);
    CHECK(c.n_layers == 32 && c.hidden_size == 4096 && c.intermediate_size == 14336);
    CHECK(c.n_heads == 32 && c.n_kv_heads == 8 && c.head_dim == 128 && c.rope_dim == 128);
    CHECK(c.vocab_size == 128256 && c.max_position_embeddings == 131072);
    CHECK(c.rms_norm_eps == 1e-5f && c.rope_theta == 500000.0f);
    CHECK(c.rope_scaling == KAON_ROPE_SCALING_LLAMA3 && c.rope_factor == 8.0f);
    CHECK(c.rope_low_freq_factor == 1.0f && c.rope_high_freq_factor == 4.0f);
    CHECK(c.rope_original_max_pos == 8192 && !c.rope_interleaved);
    CHECK(!c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
    CHECK(c.bos_token_id == 128000 && c.n_eos_token_ids == 3);
    CHECK(c.eos_token_ids[0] == 128001 && c.eos_token_ids[1] == 128008 &&
          c.eos_token_ids[2] == 128009);
    CHECK(!strcmp(c.torch_dtype, "bfloat16"));
    CHECK(kaon_model_config_validate(&c) == 0);

    rc = parse_shared("meta-llama__Llama-3.1-8B.json", &c);
    CHECK(rc == 0 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 128001);
}

static void test_qwen3(void) {
    kaon_model_config c;
    int rc = parse_shared("Qwen__Qwen3-8B.json", &c);
    CHECK(rc == 0);
    if (rc) { fprintf(stderr, "%s\n", kaon_last_error()); return; }
    CHECK(!strcmp(c.arch_name, "Qwen3ForCausalLM") && c.arch == KAON_ARCH_QWEN3);
    CHECK(c.n_layers == 36 && c.hidden_size == 4096 && c.intermediate_size == 12288);
    CHECK(c.n_heads == 32 && c.n_kv_heads == 8 && c.head_dim == 128 && c.rope_dim == 128);
    CHECK(c.vocab_size == 151936 && c.max_position_embeddings == 40960);
    CHECK(c.rms_norm_eps == 1e-6f && c.rope_theta == 1000000.0f);
    CHECK(c.rope_scaling == KAON_ROPE_SCALING_NONE);  // "rope_scaling": null
    CHECK(c.qk_norm && !c.attention_bias && !c.tie_word_embeddings);
    CHECK(c.bos_token_id == 151643 && c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 151645);
    CHECK(kaon_model_config_validate(&c) == 0);

    // The MoE variant: head_dim 128 although hidden 2048 / 32 heads = 64.
    rc = parse_shared("Qwen__Qwen3-30B-A3B.json", &c);
    CHECK(rc == 0 && !strcmp(c.arch_name, "Qwen3MoeForCausalLM") && c.qk_norm);
    CHECK(c.head_dim == 128 && c.hidden_size == 2048 && c.n_heads == 32 && c.n_kv_heads == 4);
    CHECK(c.arch == kaon_arch_from_name("Qwen3MoeForCausalLM"));
}

static void test_other_real(void) {
    kaon_model_config c;
    int rc = parse_shared("mistralai__Mixtral-8x7B-v0.1.json", &c);
    CHECK(rc == 0);
    CHECK(!strcmp(c.arch_name, "MixtralForCausalLM"));
    CHECK(c.n_layers == 32 && c.n_kv_heads == 8 && c.head_dim == 128 && c.vocab_size == 32000);
    CHECK(c.rope_theta == 1000000.0f && c.bos_token_id == 1 && c.eos_token_ids[0] == 2);
    CHECK(c.max_position_embeddings == 32768 && c.rope_scaling == KAON_ROPE_SCALING_NONE);

    // YaRN (DeepSeek-V3/R1, Kimi-K2, gpt-oss): its keys, and HF's cos/sin factor (1 when
    // mscale == mscale_all_dim).
    rc = parse_shared("deepseek-ai__DeepSeek-V3.json", &c);
    CHECK(rc == 0 && c.arch == KAON_ARCH_DEEPSEEK3 && c.rope_scaling == KAON_ROPE_SCALING_YARN);
    CHECK(c.rope_factor == 40.0f && c.rope_original_max_pos == 4096 && c.rope_beta_fast == 32.0f &&
          c.rope_beta_slow == 1.0f && c.rope_mscale_all_dim == 1.0f && c.rope_attn_factor == 1.0f);
    CHECK(c.head_dim == 192 && c.rope_dim == 64 && c.kv_lora_rank == 512 && c.q_lora_rank == 1536 &&
          c.v_head_dim == 128 && c.n_kv_heads == 128 && c.n_nextn_layers == 1);
    CHECK(c.n_experts == 256 && c.n_experts_used == 8 && c.moe_n_group == 8 && c.moe_topk_group == 4 &&
          c.moe_scoring == KAON_MOE_SIGMOID && c.moe_score_bias && c.moe_group_top2 &&
          c.moe_routed_scale == 2.5f && c.shared_expert_intermediate_size == 2048);
    CHECK(!kaon_config_layer_is_moe(&c, 2) && kaon_config_layer_is_moe(&c, 3));
    CHECK(kaon_model_config_validate(&c) == 0);
    rc = parse_shared("openai__gpt-oss-20b.json", &c);
    CHECK(rc == 0 && c.rope_scaling == KAON_ROPE_SCALING_YARN && c.rope_factor == 32.0f);
    CHECK(fabsf(c.rope_attn_factor - (float)(0.1 * log(32.0) + 1.0)) < 1e-6f);  // no mscale keys
    CHECK(c.arch == KAON_ARCH_GPTOSS && c.rope_yarn_no_truncate && c.n_experts == 32 && c.n_experts_used == 4 &&
          c.sliding_window == 128 && c.moe_swiglu_limit == 7.0f);
    CHECK(kaon_model_config_validate(&c) == 0);
    // Kimi-K2.5 is a multimodal wrapper: its text_config is a DeepSeek-V3 model whose tensors
    // sit under language_model.
    rc = parse_shared("moonshotai__Kimi-K2.5.json", &c);
    CHECK(rc == 0 && !strcmp(c.arch_name, "DeepseekV3ForCausalLM") && c.arch == KAON_ARCH_DEEPSEEK3);
    CHECK(!strcmp(c.hf_prefix, "language_model.") && c.eos_token_ids[0] == 163585 && c.n_experts == 384);
    CHECK(kaon_model_config_validate(&c) == 0);
}

static void test_synthetic(void) {
    kaon_model_config c;
    // Qwen2: biases without an attention_bias key; defaults for kv heads, head_dim, theta.
    CHECK(parse_text("{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":896,"
                     "\"num_attention_heads\":14,\"num_hidden_layers\":24,"
                     "\"tie_word_embeddings\":true,\"eos_token_id\":151645}", &c) == 0);
    CHECK(c.arch == KAON_ARCH_QWEN2 && c.attention_bias && !c.qk_norm);
    CHECK(c.n_kv_heads == 14 && c.head_dim == 64 && c.rope_dim == 64 && c.rope_theta == 10000.0f);
    CHECK(c.tie_word_embeddings && c.bos_token_id == -1 && c.n_eos_token_ids == 1);
    // null head_dim, partial rotary, linear scaling, model_type fallback.
    CHECK(parse_text("{\"model_type\":\"llama\",\"hidden_size\":512,\"num_attention_heads\":8,"
                     "\"num_key_value_heads\":null,\"head_dim\":null,\"partial_rotary_factor\":0.5,"
                     "\"rope_scaling\":{\"type\":\"linear\",\"factor\":4},\"bos_token_id\":null,"
                     "\"dtype\":\"float16\"}", &c) == 0);
    CHECK(c.arch == KAON_ARCH_LLAMA && !strcmp(c.arch_name, "llama"));
    CHECK(c.head_dim == 64 && c.rope_dim == 32 && c.n_kv_heads == 8 && c.bos_token_id == -1);
    CHECK(c.rope_scaling == KAON_ROPE_SCALING_LINEAR && c.rope_factor == 4.0f);
    CHECK(!strcmp(c.torch_dtype, "float16"));
    CHECK(parse_text("{\"rope_scaling\":{\"rope_type\":\"default\"},\"torch_dtype\":\"float32\","
                     "\"dtype\":\"bfloat16\"}", &c) == 0);
    CHECK(c.rope_scaling == KAON_ROPE_SCALING_NONE && !strcmp(c.torch_dtype, "float32"));
    CHECK(parse_text("{\"hidden_size\":4096.0,\"attention_bias\":true}", &c) == 0);
    CHECK(c.hidden_size == 4096 && c.attention_bias && c.arch == KAON_ARCH_UNKNOWN);

    EXPECT_ERROR("{\"hidden_size\":\"4096\"}", "\"hidden_size\" must be an integer (got string)");
    EXPECT_ERROR("{\"hidden_size\":1.5}", "\"hidden_size\" = 1.5 is not an integer");
    EXPECT_ERROR("{\"vocab_size\":1e20}", "\"vocab_size\" = 1e+20 is not an integer in range");
    EXPECT_ERROR("{\"num_hidden_layers\":[32]}", "\"num_hidden_layers\" must be an integer");
    EXPECT_ERROR("{\"rms_norm_eps\":\"1e-5\"}", "\"rms_norm_eps\" must be a number (got string)");
    EXPECT_ERROR("{\"rope_theta\":1e300}", "\"rope_theta\" = 1e+300 does not fit a float");
    EXPECT_ERROR("{\"tie_word_embeddings\":1}", "\"tie_word_embeddings\" must be true or false");
    EXPECT_ERROR("{\"attention_bias\":\"no\"}", "\"attention_bias\" must be true or false");
    EXPECT_ERROR("{\"torch_dtype\":16}", "\"torch_dtype\" must be a string (got number)");
    EXPECT_ERROR("{\"torch_dtype\":\"a-very-long-dtype-name\"}", "\"torch_dtype\" is longer");
    EXPECT_ERROR("{\"architectures\":[]}", "\"architectures\" must be a list");
    EXPECT_ERROR("{\"architectures\":\"LlamaForCausalLM\"}", "\"architectures\" must be a list");
    EXPECT_ERROR("{\"architectures\":[7]}", "\"architectures\" must be a list");
    EXPECT_ERROR("{\"architectures\":[\"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\"]}",
                 "\"architectures\"[0] is longer than 63");
    EXPECT_ERROR("{\"eos_token_id\":\"2\"}", "\"eos_token_id\" must be an integer or a list");
    EXPECT_ERROR("{\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}", "\"eos_token_id\" lists 9 ids");
    EXPECT_ERROR("{\"eos_token_id\":[1,\"x\"]}", "\"eos_token_id\"[1] must be a token id");
    EXPECT_ERROR("{\"eos_token_id\":[1,-2]}", "\"eos_token_id\"[1] must be a token id");
    EXPECT_ERROR("{\"rope_scaling\":{\"rope_type\":\"dynamic\",\"factor\":2}}",
                 "rope_scaling type 'dynamic' is not supported");
    EXPECT_ERROR("{\"rope_scaling\":{\"factor\":2}}", "\"rope_scaling\" has no \"rope_type\"");
    EXPECT_ERROR("{\"rope_scaling\":{\"rope_type\":3}}", "\"rope_scaling.rope_type\" must be a string");
    EXPECT_ERROR("{\"rope_scaling\":\"llama3\"}", "\"rope_scaling\" must be an object");
    EXPECT_ERROR("{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                 "\"high_freq_factor\":4}}", "needs \"original_max_position_embeddings\"");
    EXPECT_ERROR("{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
                 "llama3 \"rope_scaling\" needs \"low_freq_factor\"");
    EXPECT_ERROR("{\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":\"8\"}}",
                 "\"rope_scaling.factor\" must be a number");
    EXPECT_ERROR("{\"rope_scaling\":{\"type\":\"linear\"}}", "linear \"rope_scaling\" needs");
    EXPECT_ERROR("{\"partial_rotary_factor\":1.5}", "\"partial_rotary_factor\" = 1.5 must lie in");
    EXPECT_ERROR("{\"hidden_size\":", "config.json: not valid JSON");
    EXPECT_ERROR("", "config.json: not valid JSON");
    EXPECT_ERROR("[1,2]", "config.json: not a JSON object");
    CHECK(kaon_hf_config_parse(NULL, 0, &c) == -1);
}

static void test_generation(void) {
    kaon_model_config c;
    CHECK(parse_text("{\"eos_token_id\":2}", &c) == 0);
    const char *g = "{\"bos_token_id\":1,\"do_sample\":true,\"eos_token_id\":[128001,128009],"
                    "\"temperature\":0.6,\"top_p\":0.9,\"top_k\":20,\"repetition_penalty\":1.1,"
                    "\"min_p\":0.05,\"max_new_tokens\":256,\"transformers_version\":\"4.42.3\"}";
    CHECK(kaon_hf_generation_config_parse(g, strlen(g), &c) == 0);
    CHECK(c.gen_temperature == 0.6f && c.gen_top_p == 0.9f && c.gen_top_k == 20);
    CHECK(c.gen_repetition_penalty == 1.1f && c.gen_min_p == 0.05f && c.gen_max_new_tokens == 256);
    CHECK(c.n_eos_token_ids == 2 && c.eos_token_ids[0] == 128001 && c.eos_token_ids[1] == 128009);
    // Absent keys leave the config alone.
    kaon_model_config_init(&c);
    CHECK(kaon_hf_generation_config_parse("{}", 2, &c) == 0);
    CHECK(c.gen_temperature < 0 && c.gen_top_p < 0 && c.gen_top_k < 0 && c.n_eos_token_ids == 0);
    CHECK(c.gen_min_p < 0 && c.gen_max_new_tokens < 0);
    const char *bad = "{\"top_k\":\"20\"}";
    CHECK(kaon_hf_generation_config_parse(bad, strlen(bad), &c) == -1);
    CHECK(strstr(kaon_last_error(), "generation_config.json: \"top_k\" must be an integer"));
    bad = "{\"temperature\":[1]}";
    CHECK(kaon_hf_generation_config_parse(bad, strlen(bad), &c) == -1);
    CHECK(strstr(kaon_last_error(), "\"temperature\" must be a number"));
    CHECK(kaon_hf_generation_config_parse("nope", 4, &c) == -1);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
}

static void test_load(void) {
    char dir[] = "/tmp/kaon_hf_test_XXXXXX";
    if (!mkdtemp(dir)) abort();
    kaon_model_config c;
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_load(dir, &c) == -1);
    char want[600];
    snprintf(want, sizeof want, "%s: no config.json", dir);
    CHECK(!strcmp(kaon_last_error(), want));

    write_text(dir, "config.json",
               "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":576,"
               "\"intermediate_size\":1536,\"num_attention_heads\":9,\"num_key_value_heads\":3,"
               "\"num_hidden_layers\":30,\"vocab_size\":49152,\"max_position_embeddings\":8192,"
               "\"rms_norm_eps\":1e-05,\"rope_theta\":100000,\"tie_word_embeddings\":true,"
               "\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"bfloat16\"}");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_load(dir, &c) == 0);
    CHECK(c.n_eos_token_ids == 1 && c.eos_token_ids[0] == 2 && c.gen_temperature < 0);
    CHECK(c.head_dim == 64 && c.rope_theta == 100000.0f && c.tie_word_embeddings);
    CHECK(kaon_model_config_validate(&c) == 0);

    write_text(dir, "generation_config.json", "{\"eos_token_id\":[2,0],\"temperature\":0.2}");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_load(dir, &c) == 0);
    CHECK(c.n_eos_token_ids == 2 && c.eos_token_ids[1] == 0 && c.gen_temperature == 0.2f);

    write_text(dir, "generation_config.json", "{\"top_p\":\"high\"}");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_load(dir, &c) == -1);
    CHECK(strstr(kaon_last_error(), "/generation_config.json: \"top_p\" must be a number"));

    write_text(dir, "config.json", "{\"hidden_size\":");
    CHECK(kaon_hf_config_load(dir, &c) == -1);
    snprintf(want, sizeof want, "%s/config.json: not valid JSON", dir);
    CHECK(strstr(kaon_last_error(), want) != NULL);

    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    unlink(path);
    rmdir(dir);
}

static int first_moe_layer(const kaon_model_config *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (kaon_config_layer_is_moe(c, l)) return l;
    return -1;
}

// `test_hf_config --dump DIR`: kaon_hf_config_load on DIR, the result as one JSON line.
static int dump(const char *dir) {
    kaon_model_config c;
    kaon_model_config_init(&c);
    if (kaon_hf_config_load(dir, &c)) {
        fprintf(stderr, "error: %s\n", kaon_last_error());
        return 2;
    }
    printf("{\"arch_name\": \"%s\", \"arch\": \"%s\", \"n_layers\": %d, \"hidden_size\": %d, "
           "\"intermediate_size\": %d, \"n_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
           "\"vocab_size\": %d, \"max_position_embeddings\": %d, \"rms_norm_eps\": %.17g, "
           "\"rope_theta\": %.17g, \"rope_dim\": %d, \"rope_interleaved\": %s, "
           "\"rope_scaling\": %d, \"rope_factor\": %.17g, \"rope_low_freq_factor\": %.17g, "
           "\"rope_high_freq_factor\": %.17g, \"rope_original_max_pos\": %d, "
           "\"tie_word_embeddings\": %s, \"attention_bias\": %s, \"qk_norm\": %s, "
           "\"bos_token_id\": %d, \"eos_token_ids\": [",
           c.arch_name, kaon_arch_label(c.arch), c.n_layers, c.hidden_size, c.intermediate_size,
           c.n_heads, c.n_kv_heads, c.head_dim, c.vocab_size, c.max_position_embeddings,
           (double)c.rms_norm_eps, (double)c.rope_theta, c.rope_dim,
           c.rope_interleaved ? "true" : "false", (int)c.rope_scaling, (double)c.rope_factor,
           (double)c.rope_low_freq_factor, (double)c.rope_high_freq_factor,
           c.rope_original_max_pos, c.tie_word_embeddings ? "true" : "false",
           c.attention_bias ? "true" : "false", c.qk_norm ? "true" : "false", c.bos_token_id);
    for (int i = 0; i < c.n_eos_token_ids; i++) printf(i ? ", %d" : "%d", c.eos_token_ids[i]);
    printf("], \"gen_temperature\": %.17g, \"gen_top_p\": %.17g, \"gen_top_k\": %d, "
           "\"gen_repetition_penalty\": %.17g, \"torch_dtype\": \"%s\", ",
           (double)c.gen_temperature, (double)c.gen_top_p, c.gen_top_k,
           (double)c.gen_repetition_penalty, c.torch_dtype);
    printf("\"rope_beta_fast\": %.17g, \"rope_beta_slow\": %.17g, \"rope_mscale\": %.17g, "
           "\"rope_mscale_all_dim\": %.17g, \"rope_attn_factor\": %.17g, \"q_lora_rank\": %d, "
           "\"kv_lora_rank\": %d, \"qk_nope_head_dim\": %d, \"v_head_dim\": %d, \"n_experts\": %d, "
           "\"n_experts_used\": %d, \"moe_intermediate_size\": %d, \"shared_expert_intermediate_size\": %d, "
           "\"norm_topk_prob\": %s, \"moe_scoring\": %d, \"moe_score_bias\": %s, \"moe_n_group\": %d, "
           "\"moe_topk_group\": %d, \"moe_routed_scale\": %.17g, \"first_moe_layer\": %d, "
           "\"n_nextn_layers\": %d, \"hf_prefix\": \"%s\"}\n",
           (double)c.rope_beta_fast, (double)c.rope_beta_slow, (double)c.rope_mscale,
           (double)c.rope_mscale_all_dim, (double)c.rope_attn_factor, c.q_lora_rank, c.kv_lora_rank,
           c.qk_nope_head_dim, c.v_head_dim, c.n_experts, c.n_experts_used, c.moe_intermediate_size,
           c.shared_expert_intermediate_size, c.norm_topk_prob ? "true" : "false", c.moe_scoring,
           c.moe_score_bias ? "true" : "false", c.moe_n_group, c.moe_topk_group,
           (double)c.moe_routed_scale, first_moe_layer(&c), c.n_nextn_layers, c.hf_prefix);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--dump")) return dump(argv[2]);
    test_llama31();
    test_qwen3();
    test_other_real();
    test_synthetic();
    test_generation();
    test_load();
    TEST_MAIN_END();
}
