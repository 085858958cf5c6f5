// Fuzzes the OpenAI request parser (src/server/openai.c) with arbitrary bodies for every
// endpoint kind, then exercises what the server does with a parsed request: the chat template
// context, the continue_final_message cut, response and error JSON. The first byte picks the
// kind; the rest is the body (not NUL-terminated, so over-reads show up under ASan).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/openai.h"
#include "server/sse.h"

// The parser is compiled into this target (not taken from kaon_lib) so that it carries the
// fuzzer's coverage instrumentation; the linker then skips kaon_lib's copies.
#include "../../src/server/openai.c"
#include "../../src/server/sse.c"

static const char *const names[] = {"smol"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    kaon_api_kind kind = (kaon_api_kind)(data[0] % 4);
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    // An exact-size heap copy: any read past len is caught.
    char *copy = malloc(len ? len : 1);
    if (!copy) return 0;
    if (len) memcpy(copy, body, len);

    kaon_api_limits lim = {0};
    lim.vocab_size = 49152;
    lim.model_names = names;
    lim.n_model_names = (data[0] & 0x10) ? 1 : 0;
    kaon_api_request r;
    kaon_api_error e;
    if (kaon_api_parse(kind, copy, len, &lim, NULL, &r, &e) == 0) {
        // Invariants the server relies on.
        if (r.sampling.n < 1 || r.sampling.n > 128) abort();
        if (r.sampling.n_stop != r.n_stop || r.sampling.n_logit_bias != r.n_logit_bias) abort();
        for (int i = 0; i < r.n_prompts; i++)
            for (int k = 0; k < r.prompts[i].n_ids; k++)
                if (r.prompts[i].ids[k] < 0 || r.prompts[i].ids[k] >= lim.vocab_size) abort();
        if (r.messages) {
            cJSON *ctx = kaon_api_chat_context(&r, "<s>", "</s>", (kaon_api_tool_turns)(data[0] >> 7));
            char *s = cJSON_PrintUnformatted(ctx);
            if (s) {
                size_t n = strlen(s);
                kaon_api_continue_final_cut(&r, s, n);
                kaon_sbuf b = {0};
                kaon_sse_data(&b, s, n);
                kaon_sbuf_free(&b);
            }
            free(s);
            cJSON_Delete(ctx);
        }
        if (r.n_prompts > 0 && r.prompts[0].text) {
            cJSON *resp = kaon_api_response_new(kind == KAON_API_CHAT ? KAON_API_CHAT : KAON_API_COMPLETION,
                                                r.stream, "id", 0, r.model ? r.model : "m");
            const char *t = r.prompts[0].text;
            kaon_api_add_choice(resp, KAON_API_COMPLETION, r.stream, 0, NULL, t, strlen(t), NULL,
                                "stop", NULL);
            char *s = cJSON_PrintUnformatted(resp);
            free(s);
            cJSON_Delete(resp);
        }
        kaon_api_request_free(&r);
    } else {
        if (e.status != 400 && e.status != 404 && e.status != 500) abort();
        char *s = kaon_api_error_json(&e, NULL);
        free(s);
    }
    // The UTF-8 repair on raw bytes.
    kaon_sbuf b = {0};
    kaon_utf8_sanitize(&b, copy, len);
    kaon_utf8_complete_prefix(copy, len);
    kaon_sbuf_free(&b);
    free(copy);
    return 0;
}
