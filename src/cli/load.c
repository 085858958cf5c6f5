#include "cli/load.h"

#include "cli/cli.h"
#include "util/err.h"

kaon_model *kaon_cli_load_model(const char *path) {
    if (!path) path = kaon_cli_default_model();
    if (!path) {
        kaon_cli_fail("no model given (-m) and the default model (" KAON_DEFAULT_MODEL_FILE
                      ") is not in ./models; run the README's set-up command first");
        return NULL;
    }
    kaon_model *m = kaon_model_load(path);
    if (!m) kaon_cli_fail("%s", kaon_last_error());
    return m;
}

kaon_tokenizer *kaon_cli_load_tokenizer(const kaon_model *m) {
    kaon_tokenizer *t = m->gguf ? kaon_tokenizer_from_gguf(m->gguf) : kaon_tokenizer_from_hf_dir(m->path);
    if (!t) kaon_cli_fail("%s: tokenizer: %s", m->path, kaon_last_error());
    return t;
}
