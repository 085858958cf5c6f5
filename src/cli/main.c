// kaon's command line: one binary, one sub-command per job.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dist/cluster.h"
#include "util/err.h"

static int run_command(const char *cmd, int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: kaon <command> [options]\n"
            "commands:\n"
            "  serve    the OpenAI-compatible server (default: the default model on 127.0.0.1:8000)\n"
            "  run      generate from a prompt, streaming tokens to stdout\n"
            "  chat     talk with a model interactively (its chat template, streamed answers)\n"
            "  tokenize   text -> token ids (JSON list);  detokenize: ids -> text\n"
            "  info     describe a model: architecture, parameters, formats, memory\n"
            "  generate offline batch generation: JSONL prompts in, JSONL outputs out\n"
            "  logits   write the logits of every position of a prompt (for tests)\n"
            "  bench    benchmarks: serve (any OpenAI-compatible server), latency, throughput\n"
            "Run 'kaon <command> --help' for its options.\n"
            "serve, run, chat, generate, logits, info and bench also take --plugin PATH (repeatable): a\n"
            "shared library adding architectures (docs/API.md, \"Plugins\"); $KAON_PLUGINS lists more (a.so:b.so).\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    // The commands that load a model take plugins first, so its architecture is known.
    static const char *const with_plugins[] = {"serve", "run", "chat", "generate", "logits", "info", "bench"};
    for (size_t i = 0; i < sizeof with_plugins / sizeof with_plugins[0]; i++) {
        if (strcmp(cmd, with_plugins[i])) continue;
        int sub_argc = argc - 1;
        int rc = kaon_cli_take_plugins(&sub_argc, argv + 1);
        if (rc) return rc;
        argc = sub_argc + 1;
    }
    // One of the processes of a multi-node job (mpirun / srun): MPI first, ended at exit.
    if (kaon_cluster_init()) return kaon_cli_fail("%s", kaon_last_error());
    const int rc = run_command(cmd, argc, argv);
    kaon_cluster_finalize(rc);
    return rc;
}

static int run_command(const char *cmd, int argc, char **argv) {
    if (!strcmp(cmd, "serve")) return kaon_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return kaon_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return kaon_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return kaon_cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return kaon_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return kaon_cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "generate")) return kaon_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "logits")) return kaon_cmd_logits(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return kaon_cmd_bench(argc - 1, argv + 1);
    usage(stderr);
    return kaon_cli_fail("unknown command '%s'", cmd);
}
