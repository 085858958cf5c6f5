// libFuzzer target for the HTTP layer of `kaon serve` (src/server/): each input is the raw
// bytes a client sends on one connection — request line, headers, body, possibly several
// pipelined requests, chunked bodies, garbage. A real server runs in this process (started once,
// on 127.0.0.1 with an ephemeral port): libmicrohttpd parses the bytes and calls kaon's handlers
// (routing, auth, body limits, the OpenAI parser, chat templates, tokenizing, the engine and the
// SSE streams), so everything after the socket is the code that serves real clients. The engine
// runs the default model's tokenizer and shapes on the `noop` backend (no math), with small
// limits so that every generation ends within a few steps.
//
// Per input: connect, send the bytes, half-close, read until the server closes. Checked: the
// server answers every input it answers at all with an HTTP status line, never 500 (a handler
// failure), and within 30 s (a hang aborts). ASan/UBSan watch every thread of the server.
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"
#include "util/err.h"

#define API_KEY "fuzz-key"

static int port = -1;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void start_server(void) {
    // The repository root, from this file's path (CMake passes sources by absolute path).
    static char model[4200];
    const char *env = getenv("KAON_MODEL");
    if (env && *env) {
        snprintf(model, sizeof model, "%s", env);
    } else {
        char root[4096];
        snprintf(root, sizeof root, "%s", __FILE__);
        char *cut = strstr(root, "tests/fuzz/fuzz_http.c");
        if (cut) *cut = 0;
        else snprintf(root, sizeof root, "./");
        snprintf(model, sizeof model, "%smodels/SmolLM2-135M-Instruct.Q4_1.gguf", root);
    }
    kaon_server_options o;
    kaon_server_options_default(&o);
    kaon_engine_options_default(&o.engine);
    o.engine.model = model;
    o.engine.device = "noop";
    o.engine.n_threads = 1;
    o.engine.max_model_len = 96;
    o.engine.max_num_seqs = 8;
    o.engine.max_num_batched_tokens = 128;
    o.engine.kv_cache_memory = (size_t)16 << 20;
    o.host = "127.0.0.1";
    o.port = 0;
    o.api_key = API_KEY;
    o.served_model_names[o.n_served_model_names++] = "smol";
    o.max_body_bytes = (size_t)64 << 10;
    o.max_connections = 64;
    o.max_queue = 16;
    o.max_prompt_tokens = 80;
    o.max_tokens = 8;
    o.max_n = 3;
    o.request_timeout_s = 10;
    o.drain_timeout_s = 1;
    kaon_server *s = kaon_server_start(&o);
    if (!s) {
        fprintf(stderr, "fuzz_http: cannot start the server on %s: %s\n", model, kaon_last_error());
        abort();
    }
    port = kaon_server_port(s);
    // The server lives until the process exits (libFuzzer ends with exit()).
}

// libFuzzer's -timeout arms a periodic SIGALRM, so blocking calls can end with EINTR: a
// connect interrupted that way goes on in the background; wait for it and read its result.
static int connect_retrying(int fd, const struct sockaddr_in *a) {
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) == 0) return 0;
    if (errno != EINTR) return -1;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r = poll(&p, 1, 10000);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            errno = r == 0 ? ETIMEDOUT : errno;
            return -1;
        }
        int err = 0;
        socklen_t len = sizeof err;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return -1;
        errno = err;
        return err ? -1 : 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (port < 0) start_server();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect_retrying(fd, &a) != 0) {
        fprintf(stderr, "fuzz_http: connect: %s\n", strerror(errno));
        abort();
    }
    // The server may answer (413, 400) and close before taking everything: EPIPE is fine.
    size_t off = 0;
    while (off < size) {
        ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);

    char head[16];
    size_t got = 0;
    char buf[65536];
    const double deadline = now_s() + 30;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int left_ms = (int)((deadline - now_s()) * 1000);
        if (left_ms <= 0) {
            fprintf(stderr, "fuzz_http: no end of response within 30 s\n");
            abort();
        }
        if (poll(&p, 1, left_ms) <= 0) continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // closed (or reset after an early answer)
        for (ssize_t i = 0; i < n && got < sizeof head; i++) head[got++] = buf[i];
    }
    close(fd);
    if (got > 0) {
        if (got < 12 || memcmp(head, "HTTP/1.", 7) != 0) {
            fprintf(stderr, "fuzz_http: the reply does not start with a status line\n");
            abort();
        }
        if (!memcmp(head + 9, "500", 3)) {
            fprintf(stderr, "fuzz_http: the server answered 500\n");
            abort();
        }
    }
    return 0;
}
