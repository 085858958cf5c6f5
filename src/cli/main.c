#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: kaon <run|chat|generate|tokenize|detokenize|info|serve|bench> ...\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "kaon: unknown command '%s'\n", argv[1]);
    return 2;
}
