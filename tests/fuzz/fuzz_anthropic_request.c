// Fuzzes the Anthropic Messages request parser (src/server/anthropic.c) with arbitrary bodies,
// then what the server does with a parsed request: the chat template context and an
// Anthropic response and stream built from the request's own text; every error's Anthropic
// JSON. The first byte picks count_tokens (bit 0) and whether the model name is checked (bit
// 4); the rest is the body (not NUL-terminated, so over-reads show up under ASan).
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/anthropic.h"
#include "server/sse.h"

// Compiled into this target (not taken from kaon_lib), as fuzz_openai_request does with
// openai.c; the linker then skips kaon_lib's copy. openai.c (whose validation every parsed
// request goes through) comes from kaon_lib: its file-local helpers share names with these.
#include "../../src/server/anthropic.c"

static const char *const names[] = {"smol"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    bool count_only = data[0] & 1;
    size_t len = size - 1;
    char *copy = malloc(len ? len : 1);  // an exact-size heap copy: any read past len is caught
    if (!copy) return 0;
    if (len) memcpy(copy, data + 1, len);

    kaon_api_limits lim = {0};
    lim.vocab_size = 49152;
    lim.model_names = names;
    lim.n_model_names = (data[0] & 0x10) ? 1 : 0;
    kaon_api_request r;
    kaon_api_error e;
    if (kaon_anthropic_parse(copy, len, count_only, &lim, NULL, &r, &e) == 0) {
        // Invariants the server relies on.
        if (r.kind != KAON_API_CHAT || !r.messages || r.sampling.n != 1) abort();
        if (!count_only && (!r.max_tokens_set || r.sampling.max_tokens < 1)) abort();
        for (const cJSON *m = r.messages->child; m; m = m->next) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (!cJSON_IsString(c) && !cJSON_IsNull(c)) abort();  // normalised by openai.c
        }
        cJSON *ctx = kaon_api_chat_context(&r, "<s>", "</s>", (kaon_api_tool_turns)(data[0] >> 7));
        char *s = cJSON_PrintUnformatted(ctx);
        cJSON_Delete(ctx);
        if (s) {
            // The rendered context's text as the model's output, through both response shapes.
            size_t n = strlen(s);
            cJSON *calls = r.tools ? cJSON_Parse("[{\"id\":\"toolu_1\",\"function\":{\"name\":\"f\","
                                                 "\"arguments\":\"{\\\"a\\\":1}\"}}]")
                                   : NULL;
            cJSON *msg = kaon_anthropic_message("msg_1", r.model ? r.model : "m", s, n / 3, s, n,
                                                calls, "end_turn", r.n_stop ? r.stop[0] : NULL,
                                                n, 1);
            char *t = cJSON_PrintUnformatted(msg);
            free(t);
            cJSON_Delete(msg);
            kaon_sbuf b = {0};
            kaon_anthropic_stream st = {0};
            kaon_anthropic_stream_start(&b, "msg_1", r.model ? r.model : "m", (long long)n);
            kaon_anthropic_stream_delta(&st, &b, s, n / 2, s + n / 2, n - n / 2, calls);
            kaon_anthropic_stream_delta(&st, &b, NULL, 0, s, n, NULL);
            kaon_anthropic_stream_stop(&st, &b, "end_turn", r.n_stop ? r.stop[0] : NULL, 1);
            if (b.failed || st.open) abort();
            kaon_sbuf_free(&b);
            cJSON_Delete(calls);
        }
        free(s);
        kaon_api_request_free(&r);
    } else {
        if (e.status != 400 && e.status != 404 && e.status != 500) abort();
        if (!e.anthropic) abort();
        char *s = kaon_anthropic_error_json(&e, NULL);
        free(s);
    }
    free(copy);
    return 0;
}
