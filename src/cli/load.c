#include "cli/load.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dist/cluster.h"
#include "engine/ranks.h"
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

kaon_engine *kaon_cli_engine(kaon_engine_options *eo, const char *path, bool dummy) {
    if (dummy && !path) {
        kaon_cli_fail("--load-format dummy needs -m CONFIG (a config.json or its folder)");
        return NULL;
    }
    if (!path) path = kaon_cli_default_model();
    if (!path) {
        kaon_cli_fail("no model given (-m) and the default model (" KAON_DEFAULT_MODEL_FILE
                      ") is not in ./models; run the README's set-up command first");
        return NULL;
    }
    char *spec = NULL;
    if (dummy) {  // the model loader reads "dummy:<config>" as random weights of its shapes
        size_t n = strlen(path) + 8;
        if (!(spec = malloc(n))) {
            kaon_cli_fail("out of memory");
            return NULL;
        }
        snprintf(spec, n, "dummy:%s", path);
    }
    eo->model = spec ? spec : path;
    kaon_engine *e = kaon_engine_create(eo);
    eo->model = NULL;  // the engine keeps its own copy of the path
    free(spec);
    if (!e) kaon_cli_fail("%s", kaon_last_error());
    if (e) kaon_cli_follow_if_follower(e);
    return e;
}

void kaon_cli_follow_if_follower(kaon_engine *e) {
    if (!kaon_cluster_follower()) return;
    // mpirun hands a ^C or SIGTERM to every process: process 0 finishes its work and then ends
    // the job (a follower that left first would fail process 0's next collective).
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    int rc = kaon_engine_follow(e) ? kaon_cli_fail("%s", kaon_last_error()) : 0;
    kaon_engine_destroy(e);
    kaon_cluster_finalize(rc);
    exit(rc);
}
