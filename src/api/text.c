// Tokenizer and chat template through the public API: what a front end outside the library
// (the Python package) needs to turn text and conversations into prompt ids and back, done
// exactly as kaon serve and kaon chat do it.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "kaon.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/err.h"

static const kaon_tokenizer *need_tokenizer(kaon_engine *e) {
    const kaon_tokenizer *t = e ? kaon_engine_tokenizer(e) : NULL;
    if (!t) kaon_set_error("the engine has no tokenizer (created with load_tokenizer false, or the model has none)");
    return t;
}

int kaon_engine_tokenize(kaon_engine *e, const char *text, size_t len, bool add_special,
                         int32_t **ids, size_t *n_ids) {
    const kaon_tokenizer *t = need_tokenizer(e);
    if (!t) return -1;
    if (!ids || !n_ids || (!text && len)) return kaon_set_error("kaon_engine_tokenize: NULL argument");
    return kaon_tokenize(t, text ? text : "", len, add_special, ids, n_ids);
}

int kaon_engine_detokenize(kaon_engine *e, const int32_t *ids, size_t n, bool skip_special,
                           char **text, size_t *len) {
    const kaon_tokenizer *t = need_tokenizer(e);
    if (!t) return -1;
    if (!text || !len || (!ids && n)) return kaon_set_error("kaon_engine_detokenize: NULL argument");
    int vocab = kaon_tokenizer_vocab_size(t);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return kaon_set_error("token id %d at %zu is outside the vocabulary (0..%d)", (int)ids[i], i, vocab - 1);
    return kaon_detokenize(t, ids, n, skip_special, text, len);
}

int kaon_engine_special_tokens(kaon_engine *e, kaon_special_tokens *st, int32_t *stop, int cap) {
    const kaon_tokenizer *t = need_tokenizer(e);
    if (!t) return -1;
    if (!st || (cap > 0 && !stop)) return kaon_set_error("kaon_engine_special_tokens: NULL argument");
    st->bos = kaon_tokenizer_bos(t);
    st->eos = kaon_tokenizer_eos(t);
    st->n_stop = 0;
    int vocab = kaon_tokenizer_vocab_size(t);
    for (int id = 0; id < vocab; id++) {
        if (!kaon_tokenizer_is_eog(t, id)) continue;
        if (st->n_stop < cap) stop[st->n_stop] = id;
        st->n_stop++;
    }
    return 0;
}

static bool vocab_has(const char *text, void *tok) {
    return kaon_tokenizer_find_token(tok, text) >= 0;
}

int kaon_engine_apply_chat_template(kaon_engine *e, const char *messages_json,
                                    const char *kwargs_json, const char *chat_template,
                                    bool add_generation_prompt, char **text, size_t *len) {
    const kaon_tokenizer *t = need_tokenizer(e);
    if (!t) return -1;
    if (!messages_json || !text || !len) return kaon_set_error("kaon_engine_apply_chat_template: NULL argument");
    *text = NULL;
    *len = 0;
    cJSON *msgs = cJSON_Parse(messages_json);
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(msgs);
        return kaon_set_error("messages must be a JSON array of {\"role\", \"content\"} objects");
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"))) {
            cJSON_Delete(msgs);
            return kaon_set_error("each message must be an object with a string \"role\"");
        }
    }
    cJSON *ctx = kwargs_json ? cJSON_Parse(kwargs_json) : cJSON_CreateObject();
    if (!cJSON_IsObject(ctx)) {
        cJSON_Delete(msgs);
        cJSON_Delete(ctx);
        return kaon_set_error("chat template kwargs must be a JSON object");
    }
    // The fixed variables win over kwargs of the same name, as in HF's apply_chat_template.
    const char *bos = kaon_tokenizer_bos_text(t), *eos = kaon_tokenizer_eos_text(t);
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "messages");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "add_generation_prompt");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "bos_token");
    cJSON_DeleteItemFromObjectCaseSensitive(ctx, "eos_token");
    cJSON_AddItemToObject(ctx, "messages", msgs);
    cJSON_AddBoolToObject(ctx, "add_generation_prompt", add_generation_prompt);
    cJSON_AddStringToObject(ctx, "bos_token", bos ? bos : "");
    cJSON_AddStringToObject(ctx, "eos_token", eos ? eos : "");
    const char *src = chat_template ? chat_template : kaon_tokenizer_chat_template(t);
    if (!src) src = kaon_fallback_chat_template(vocab_has, (void *)t);
    kaon_chat_template *tmpl = kaon_chat_template_parse(src, strlen(src));
    int rc = -1;
    if (!tmpl) kaon_set_error("chat template does not parse: %s", kaon_last_error());
    else if (kaon_chat_template_render(tmpl, ctx, text, len) < 0) {
        kaon_set_error("chat template: %s", kaon_last_error());
        free(*text);  // a failed render may leave partial output
        *text = NULL;
        *len = 0;
    } else rc = 0;
    kaon_chat_template_free(tmpl);
    cJSON_Delete(ctx);
    return rc;
}
