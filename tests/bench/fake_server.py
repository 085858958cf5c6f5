"""A fake OpenAI-compatible streaming server with known delays, for checking bench/serve.py.

Each generation request gets the next index k (in arrival order); plan(k, body) returns what the
server does: a dict with
  status        HTTP status (non-200: a JSON error body, no stream)
  ttft          seconds before the first chunk
  itl           seconds between chunks
  chunks        number of chunks carrying a choice (default: max_tokens)
  usage_tokens  completion_tokens reported in usage (default: chunks); None: no usage at all
  error_after   send an error event after this many chunks and end the stream
Chunks leave at absolute deadlines (arrival + ttft + i * itl) and their send times are recorded
(.timings, time.perf_counter() of this process), so tests can compare the client's figures
with what the server really did even when the machine is busy.
/tokenize maps words to ids (a vocabulary grown as words arrive), /detokenize maps them back, so
prompt lengths in tokens are word counts. Every request body is recorded in .requests.
"""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, plan=None, tokenizer=True, metrics=False):
        self.plan = plan or (lambda k, body: {})
        self.tokenizer = tokenizer
        self.metrics = metrics  # serve kaon's step counters: per request 1 prefill + 2 decode steps
        self.lock = threading.Lock()
        self.count = 0
        self.requests = []
        self.timings = {}  # k -> {"recv": perf_counter at arrival, "chunks": [perf_counter at each choice chunk]}
        self.vocab, self.words = {}, []
        for w in "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split():
            self._id(w)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _json(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _chunk(self, text):
                data = text.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def do_GET(self):
                if self.path == "/v1/models":
                    return self._json(200, {"object": "list", "data": [{"id": "fake-model", "owned_by": "fake"}]})
                if self.path == "/metrics" and outer.metrics:
                    n = outer.count
                    m = 'model_name="fake-model"'
                    lines = [f'kaon:engine_steps_by_kind_total{{{m},kind="prefill"}} {n}',
                             f'kaon:engine_steps_by_kind_total{{{m},kind="prefill",engine="0"}} 999',
                             f'kaon:engine_steps_by_kind_total{{{m},kind="decode"}} {2 * n}',
                             f'kaon:engine_step_seconds_total{{{m},kind="prefill"}} {0.25 * n}',
                             f'kaon:engine_step_seconds_total{{{m},kind="decode"}} {0.125 * n}',
                             f'kaon:num_preemptions_total{{{m}}} {n // 3}']
                    data = ("\n".join(lines) + "\n").encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path in ("/tokenize", "/detokenize"):
                    if not outer.tokenizer:
                        return self._json(404, {"error": {"message": "not found"}})
                    if self.path == "/tokenize":
                        return self._json(200, {"tokens": outer.tokenize(body.get("prompt", ""))})
                    return self._json(200, {"prompt": " ".join(outer.words[i] for i in body["tokens"])})
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    return self._json(404, {"error": {"message": "not found"}})
                t_recv = time.perf_counter()
                with outer.lock:
                    k = outer.count
                    outer.count += 1
                    outer.requests.append(body)
                chat = self.path.endswith("chat/completions")
                plan = {"status": 200, "ttft": 0.0, "itl": 0.0, "error_after": None}
                plan.update(outer.plan(k, body))
                if plan["status"] != 200:
                    return self._json(plan["status"], {"error": {"message": f"planned failure of request {k}"}})
                n = plan.get("chunks") or body.get("max_tokens") or body.get("max_completion_tokens") or 16
                prompt = body["messages"][0]["content"] if chat else body["prompt"]
                n_prompt = len(prompt) if isinstance(prompt, list) else len(outer.tokenize(prompt))
                if not body.get("stream"):
                    return self._json(200, {"choices": [{"text": "x", "index": 0}],
                                            "usage": {"prompt_tokens": n_prompt, "completion_tokens": 1}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = []
                with outer.lock:
                    outer.timings[k] = {"recv": t_recv, "chunks": sent}
                for i in range(n):
                    # absolute deadlines: a late wake-up does not shift the chunks after it
                    wait = t_recv + plan["ttft"] + i * plan["itl"] - time.perf_counter()
                    if wait > 0:
                        time.sleep(wait)
                    if plan["error_after"] is not None and i == plan["error_after"]:
                        self._chunk('data: {"error": {"message": "planned stream error", "code": 500}}\n\n')
                        break
                    if chat:
                        delta = {"content": f" w{i}", **({"role": "assistant"} if i == 0 else {})}
                        choice = {"index": 0, "delta": delta, "finish_reason": "length" if i == n - 1 else None}
                    else:
                        choice = {"index": 0, "text": f" w{i}", "finish_reason": "length" if i == n - 1 else None}
                    self._chunk("data: " + json.dumps({"choices": [choice]}) + "\n\n")
                    sent.append(time.perf_counter())
                else:
                    usage_tokens = plan.get("usage_tokens", n)
                    if usage_tokens is not None and (body.get("stream_options") or {}).get("include_usage"):
                        self._chunk("data: " + json.dumps({"choices": [], "usage": {
                            "prompt_tokens": n_prompt, "completion_tokens": usage_tokens,
                            "total_tokens": n_prompt + usage_tokens}}) + "\n\n")
                    self._chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def _id(self, w):
        if w not in self.vocab:
            self.vocab[w] = len(self.words)
            self.words.append(w)
        return self.vocab[w]

    def tokenize(self, text):
        with self.lock:
            return [self._id(w) for w in text.split()]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
