// The plugin loader (model/plugin.c): the example plugin registers its architecture and its
// config keys are read; the broken ones (tests/plugins/broken.c) are refused with the error
// each deserves, and leave the registry as it was.
#include <stdio.h>
#include <string.h>

#include "kaon.h"
#include "kaon_plugin.h"
#include "model/arch.h"
#include "model/config.h"
#include "model/plugin.h"
#include "test.h"

#ifndef KAON_PLUGIN_DIR
#error "KAON_PLUGIN_DIR: the folder the build puts plugins in (CMakeLists.txt)"
#endif

static const char *plugin(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s.so", KAON_PLUGIN_DIR, name);
    return path;
}

// Loading name fails with an error that contains want.
static void refused(const char *name, const char *want) {
    const char *p = plugin(name);
    int rc = kaon_plugin_load(p);
    CHECK(rc == -1);
    const char *err = kaon_last_error();
    if (rc != -1 || !strstr(err, want) || strncmp(err, "plugin ", 7))
        fprintf(stderr, "  %s: got rc %d, \"%s\"; want \"%s\"\n", name, rc, err, want);
    CHECK(strstr(err, want) != NULL);
    CHECK(strstr(err, p) != NULL);  // names the file
    CHECK(strchr(err, '\n') == NULL);  // one line
}

static void test_refusals_before_any_load(void) {
    refused("no_such_plugin", "no such file");
    char want[256];
    snprintf(want, sizeof want, "built for plugin API %d, this kaon has %d (rebuild the plugin against this kaon)",
             KAON_PLUGIN_API_VERSION + 1, KAON_PLUGIN_API_VERSION);
    refused("broken_version", want);
    refused("broken_magic", "bad magic 0xdeadbeef");
    refused("broken_layout", "built against other kaon headers (sizeof(kaon_plugin_host)");
    refused("broken_no_entry", "no kaon_plugin_entry symbol");
    // A file that is not a shared library at all.
    CHECK(kaon_plugin_load("tests/plugins/broken.c") == -1);
    CHECK(strstr(kaon_last_error(), "cannot load") != NULL);
    // A name a built-in answers to: refused, and the plugin's other (new) name is not added.
    refused("broken_dup_builtin", "architecture 'LlamaForCausalLM' is already registered (by 'llama')");
    CHECK(kaon_arch_find("BrokenFreshName", NULL) == NULL);
    kaon_arch v = KAON_ARCH_UNKNOWN;
    const kaon_arch_ops *llama = kaon_arch_find("LlamaForCausalLM", &v);
    CHECK(llama && !strcmp(llama->label, "llama") && v == KAON_ARCH_LLAMA);
    CHECK(kaon_arch_find("KaonExampleForCausalLM", NULL) == NULL);  // nothing loaded yet
}

static void test_example_loads(void) {
    CHECK(kaon_plugin_load(plugin("kaon_example")) == 0);
    kaon_arch v = KAON_ARCH_UNKNOWN;
    const kaon_arch_ops *a = kaon_arch_find("KaonExampleForCausalLM", &v);
    CHECK(a && !strcmp(a->label, "kaon-example") && v == KAON_ARCH_PLUGIN);
    CHECK(kaon_arch_find("kaon_example", NULL) == a);
    CHECK(strstr(kaon_arch_supported(), "KaonExampleForCausalLM") != NULL);
    // Again, directly and through a KAON_PLUGINS list: the same library, nothing to do.
    CHECK(kaon_plugin_load(plugin("kaon_example")) == 0);
    char list[8192];
    snprintf(list, sizeof list, "::%s:", plugin("kaon_example"));
    CHECK(kaon_plugin_load_list(list) == 0);
    CHECK(kaon_plugin_load_list(NULL) == 0);
    char bad[4096];
    snprintf(bad, sizeof bad, "%s", plugin("broken_magic"));  // plugin() reuses one buffer
    snprintf(list, sizeof list, "%s:%s", plugin("kaon_example"), bad);
    CHECK(kaon_plugin_load_list(list) == -1);
    CHECK(strstr(kaon_last_error(), "bad magic") != NULL);
    // A second library claiming the example's name.
    refused("broken_dup_example", "architecture 'KaonExampleForCausalLM' is already registered (by 'kaon-example')");
    CHECK(kaon_arch_find("KaonExampleForCausalLM", NULL) == a);
}

// The plugin's hf_config reads its keys into the config, with defaults, and refuses bad values.
static void test_example_config(void) {
    const char *base = "{\"architectures\": [\"KaonExampleForCausalLM\"], \"hidden_size\": 64, "
                       "\"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                       "\"num_key_value_heads\": 2, \"vocab_size\": 300, \"max_position_embeddings\": 512, "
                       "\"rms_norm_eps\": 1e-5%s}";
    char json[1024];
    kaon_model_config c;
    snprintf(json, sizeof json, base, ", \"embedding_multiplier\": 12.0, \"residual_multiplier\": 0.25, "
                                      "\"final_logit_softcapping\": 30.0");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_parse(json, strlen(json), &c) == 0);
    CHECK(kaon_model_config_validate(&c) == 0);
    CHECK(c.arch == KAON_ARCH_PLUGIN && c.impl && !strcmp(c.impl->label, "kaon-example"));
    CHECK_NEAR(c.arch_params[0], 12.0, 0);
    CHECK_NEAR(c.arch_params[1], 0.25, 0);
    CHECK_NEAR(c.final_logit_softcap, 30.0, 0);
    snprintf(json, sizeof json, base, "");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_parse(json, strlen(json), &c) == 0);
    CHECK_NEAR(c.arch_params[0], 1.0, 0);
    CHECK_NEAR(c.arch_params[1], 1.0, 0);
    CHECK_NEAR(c.final_logit_softcap, 0.0, 0);
    snprintf(json, sizeof json, base, ", \"residual_multiplier\": -1");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_parse(json, strlen(json), &c) == -1);
    CHECK(strstr(kaon_last_error(), "\"residual_multiplier\" = -1 must be positive") != NULL);
    snprintf(json, sizeof json, base, ", \"embedding_multiplier\": \"big\"");
    kaon_model_config_init(&c);
    CHECK(kaon_hf_config_parse(json, strlen(json), &c) == -1);
    CHECK(strstr(kaon_last_error(), "embedding_multiplier") != NULL);
}

int main(void) {
    test_refusals_before_any_load();
    test_example_loads();
    test_example_config();
    if (kaon_test_failures) fprintf(stderr, "%d check(s) failed\n", kaon_test_failures);
    return kaon_test_failures ? 1 : 0;
}
