// --plugin PATH (any number, any position after the command) and $KAON_PLUGINS: taken out of
// argv before a command parses its own flags, so every command that loads a model accepts it.
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "kaon.h"
#include "model/plugin.h"
#include "util/err.h"

int kaon_cli_take_plugins(int *argc, char **argv) {
    // $KAON_PLUGINS first, then the flags in order: a clash names the later one.
    if (kaon_plugin_load_list(getenv("KAON_PLUGINS"))) return kaon_cli_fail("%s", kaon_last_error());
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i], *path = NULL;
        if (!strcmp(a, "--")) {  // the rest are operands
            while (i < *argc) argv[out++] = argv[i++];
            break;
        }
        if (!strcmp(a, "--plugin")) {
            if (i + 1 >= *argc) return kaon_cli_fail("--plugin needs a path to a plugin (.so)");
            path = argv[++i];
        } else if (!strncmp(a, "--plugin=", 9)) {
            path = a + 9;
        }
        if (!path) {
            argv[out++] = argv[i];
            continue;
        }
        if (kaon_plugin_load(path)) return kaon_cli_fail("%s", kaon_last_error());
    }
    argv[out] = NULL;
    *argc = out;
    return 0;
}
