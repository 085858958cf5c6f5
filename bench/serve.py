#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (kaon serve, llama-server, vLLM, SGLang...).

    python3 bench/serve.py --base-url http://127.0.0.1:8000 --random-input-len 128 \\
        --random-output-len 64 --num-prompts 64 --max-concurrency 1,4,16
    kaon bench serve ...                  # the same script, found next to the kaon binary

Flags and metrics follow vLLM's `vllm bench serve`, so its numbers and ours can be compared:
  TTFT  time from sending the request to the first streamed chunk that carries a choice
  ITL   the gaps between consecutive such chunks (one list over all requests)
  E2EL  time from sending the request to the last chunk that carries a choice
  TPOT  (E2EL - TTFT) / (output tokens - 1), per request with more than one output token
  output tokens come from the server's `usage` (stream_options.include_usage); servers that do
  not report usage fall back to the number of chunks (noted in the results).
  request_throughput = completed / duration; output_throughput = output tokens / duration;
  total_token_throughput = (input + output tokens) / duration; goodput = requests meeting every
  SLO of --goodput (ttft, tpot, e2el in ms) / duration. Percentiles interpolate linearly (as
  numpy.percentile). Failed requests (HTTP errors, errors inside the stream, no chunk) are
  counted, never dropped silently: the table and the JSON carry `failed` and the first errors.

Random prompts: token ids drawn from the server's vocabulary (ids found by sending a word list
to its /tokenize), turned into text with /detokenize and trimmed to the exact length with
/tokenize, as vLLM's random dataset does with a local tokenizer. Without /detokenize the ids
are sent as they are (completions only); without /tokenize random words are sent and their
token count is calibrated from `usage`. --random-vocab-size N sends ids from [0, N) directly
(for servers without a tokenizer). --random-prefix-len adds one shared prefix to every prompt.

--max-concurrency takes a list (1,4,16,64): one run per level, a results file holding all of
them (`runs`), a summary table and PNG plots (bench/plot.py). Results are JSON with vLLM's key
names plus date, commit, machine, model and command; saved under bench/results/ by default.
Needs only Python 3.9+ (its own small asyncio HTTP/1.1 client, one connection per request), and
matplotlib for the plots (without it the results are still written; bench/plot.py plots later).
"""
import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import random
import re
import shlex
import ssl
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MS = 1000.0

# A word list for the vocabulary probe and for servers without /tokenize (common English words).
WORDS = """
the of and to in is was for on are with as be at by this had not but from or have an they which
one you were her all she there would their we him been has when who will more no if out so said
what up its about into than them can only other new some could time these two may then do first
any my now such like our over man me even most made after also did many before must through back
years where much your way well down should because each just those people how too little state
good very make world still own see men work long get here between both life being under never day
same another know while last might us great old year off come since against go came right used
take three states himself few house use during without again place american around however home
small found thought went say part once general high upon school every does got united left number
course war until always away something fact though water less public put think almost hand enough
far took head yet government system better set told nothing night end why called didn find look
going asked later knew point next program city business give group toward young days let room
president side social given present several order national possible rather second face per among
form important often things early white case large become large need big four within felt along
children saw best church ever least power development light thing seemed family interest want
members mind country area others done turned although open problem john god service certain kind
different thus began door help sense means whole matter perhaps itself york times human law line
above name example action company hands local show whether five history gave today either act
feet across taken past quite anything seen having death experience body word half really week
field car words already themselves information tell together college shall money period held keep
sure real probably free seems political cannot behind miss question air office making brought
whose special heard major problems ago became federal moment study available known result street
economic boy position reason change south board individual job society areas west close turn love
community true court force full seem wife future age voice center woman control common policy
necessary following front sometimes six girl clear further land run students provide feel party
able mother music education university child effect level stood military town short morning total
outside rate figure class art century washington north usually plan leave therefore evidence top
million sound black strong hard various says believe type value play surface soon mean near lines
table peace modern tax road red book personal process situation minutes increase idea english
alone women gone nature cost porch waiting river stone garden window letter winter summer bright
""".split()


# ---- metrics (exactly as vLLM's calculate_metrics) -----------------------------------------

@dataclass
class RequestOutput:
    success: bool = False
    latency: float = 0.0            # E2EL: send -> last chunk carrying a choice (s)
    ttft: float = 0.0               # send -> first chunk carrying a choice (s)
    itl: list = field(default_factory=list)  # gaps between consecutive such chunks (s)
    output_tokens: int | None = None  # from usage.completion_tokens (None: not reported)
    n_chunks: int = 0
    prompt_len: int = 0             # usage.prompt_tokens when reported, else the dataset's
    error: str = ""
    start_time: float = 0.0         # perf_counter() at send
    generated_text: str = ""


def percentile(values, p):
    """numpy.percentile(values, p) with its default linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    v = sorted(values)
    k = (len(v) - 1) * p / 100.0
    lo = math.floor(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def _mean(v):
    return sum(v) / len(v) if v else 0.0


def _std(v):
    if not v:
        return 0.0
    m = _mean(v)
    return math.sqrt(sum((x - m) ** 2 for x in v) / len(v))


def parse_goodput(pairs):
    """["ttft:500", "tpot:50"] -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    out = {}
    for pair in pairs or []:
        for item in pair.replace(",", " ").split():
            name, sep, val = item.partition(":")
            if not sep or name not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"bad --goodput item '{item}': use ttft:MS, tpot:MS or e2el:MS")
            out[name] = float(val)
            if out[name] < 0:
                raise ValueError(f"bad --goodput item '{item}': the SLO must be >= 0")
    return out


def calculate_metrics(outputs, duration, percentiles=(90.0, 99.0), goodput=None,
                      metrics=("ttft", "tpot", "itl", "e2el")):
    """vLLM's definitions (vllm/benchmarks/serve.py calculate_metrics) over one run."""
    goodput = goodput or {}
    output_lens, ttfts, tpots, all_tpots, itls, e2els = [], [], [], [], [], []
    total_input = completed = 0
    counted_from_chunks = 0
    for o in outputs:
        if not o.success:
            output_lens.append(0)
            continue
        n = o.output_tokens
        if not n:
            n = o.n_chunks or 1  # the server gave no usage: one token per chunk
            counted_from_chunks += 1
        output_lens.append(n)
        total_input += o.prompt_len
        tpot = 0.0
        if n > 1:
            tpot = (o.latency - o.ttft) / (n - 1)
            tpots.append(tpot)
        all_tpots.append(tpot)  # a 1-token answer counts as TPOT 0 for goodput
        itls += o.itl
        ttfts.append(o.ttft)
        e2els.append(o.latency)
        completed += 1
    good = 0
    if goodput:
        per_req = {"ttft": ttfts, "tpot": all_tpots, "e2el": e2els}
        for i in range(completed):
            if all(per_req[k][i] <= slo / MS for k, slo in goodput.items()):
                good += 1
    total_output = sum(output_lens)
    failed = sum(1 for o in outputs if not o.success)
    r = {
        "duration": duration,
        "completed": completed,
        "failed": failed,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": completed / duration if duration > 0 else 0.0,
        "request_goodput": (good / duration if duration > 0 else 0.0) if goodput else None,
        "output_throughput": total_output / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration if duration > 0 else 0.0,
    }
    if goodput:
        r["good_requests"] = good
    # Peak output tokens/s in 1-second buckets and the peak number of requests in flight.
    ok = [o for o in outputs if o.success]
    max_tps, peak = 0.0, 0
    if ok:
        t0 = min(o.start_time for o in ok)
        t1 = max(o.start_time + o.latency for o in ok)
        buckets = [0] * (int(math.ceil(t1 - t0)) + 1)
        events = []
        for o in ok:
            t = o.start_time + o.ttft
            times = [t]
            for gap in o.itl:
                t += gap
                times.append(t)
            for t in times:
                b = int(t - t0)
                if 0 <= b < len(buckets):
                    buckets[b] += 1
            events += [(o.start_time, 1), (o.start_time + o.latency, -1)]
        cur = 0
        for _, d in sorted(events):
            cur += d
            peak = max(peak, cur)
        max_tps = float(max(buckets))
    r["max_output_tokens_per_s"] = max_tps
    r["max_concurrent_requests"] = peak
    values = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in metrics:
        v = values[name]
        r[f"mean_{name}_ms"] = _mean(v) * MS
        r[f"median_{name}_ms"] = percentile(v, 50) * MS
        r[f"std_{name}_ms"] = _std(v) * MS
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            r[f"p{word}_{name}_ms"] = percentile(v, p) * MS
    # Interactivity: what one user sees (tokens/s of one stream), and throughput per device.
    r["tokens_per_s_per_user"] = MS / r["median_tpot_ms"] if r.get("median_tpot_ms") else 0.0
    r["output_tokens_counted_from_chunks"] = counted_from_chunks
    errors = []
    for o in outputs:
        if not o.success and o.error and o.error not in errors:
            errors.append(o.error)
    r["first_errors"] = errors[:10]
    return r


# ---- a small HTTP/1.1 client (asyncio streams; no dependency) ------------------------------

class Response:
    def __init__(self, reader, writer, status, headers):
        self.reader, self.writer, self.status, self.headers = reader, writer, status, headers

    async def chunks(self):
        """The body as it arrives (chunked, Content-Length or until the server closes)."""
        r = self.reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                line = await r.readline()
                if not line:
                    raise ConnectionError("the stream was cut")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await r.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("the body was cut")
                left -= len(data)
                yield data
        else:
            while True:
                data = await r.read(1 << 16)
                if not data:
                    return
                yield data

    async def read(self):
        return b"".join([c async for c in self.chunks()])

    async def json(self):
        return json.loads(await self.read() or b"null")

    def close(self):
        self.writer.close()


async def http_request(method, url, body=None, headers=None):
    """Sends one request on a new connection (Connection: close); returns a Response."""
    u = urllib.parse.urlsplit(url)
    https = u.scheme == "https"
    reader, writer = await asyncio.open_connection(u.hostname, u.port or (443 if https else 80),
                                                   ssl=ssl.create_default_context() if https else None,
                                                   limit=1 << 22)
    try:
        data = json.dumps(body).encode() if body is not None else b""
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        head = [f"{method} {path} HTTP/1.1", f"Host: {u.netloc}", "Connection: close", "Accept: */*",
                "User-Agent: kaon-bench-serve"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        line = await reader.readline()
        parts = line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise ConnectionError(f"not an HTTP response: {line[:80]!r}")
        hdrs = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            hdrs[k.strip().lower()] = v.strip()
        return Response(reader, writer, int(parts[1]), hdrs)
    except BaseException:
        writer.close()
        raise


async def http_json(method, url, body=None, headers=None):
    r = await http_request(method, url, body, headers)
    try:
        if r.status != 200:
            text = (await r.read())[:200].decode("utf-8", "replace")
            raise RuntimeError(f"HTTP {r.status}: {text}")
        return await r.json()
    finally:
        r.close()


async def server_steps(base, headers):
    """kaon's step counters from /metrics (steps and their wall time, prefill-carrying and
    decode-only, and preemptions), or None from a server without them (vLLM, llama.cpp)."""
    try:
        r = await http_request("GET", base + "/metrics", None, headers)
        try:
            text = (await r.read()).decode("utf-8", "replace") if r.status == 200 else ""
        finally:
            r.close()
    except Exception:  # noqa: BLE001 -- no metrics: nothing to report
        return None
    want = {("kaon:engine_steps_by_kind_total", "prefill"): "prefill_steps",
            ("kaon:engine_steps_by_kind_total", "decode"): "decode_steps",
            ("kaon:engine_step_seconds_total", "prefill"): "prefill_step_s",
            ("kaon:engine_step_seconds_total", "decode"): "decode_step_s",
            ("kaon:num_preemptions_total", None): "preemptions"}
    got = {}
    for line in text.splitlines():
        m = re.match(r'([\w:]+)\{([^}]*)\} (\S+)$', line)
        if not m or "engine=" in m.group(2):  # the total sample only, not each replica's
            continue
        kind = re.search(r'kind="(\w+)"', m.group(2))
        key = want.get((m.group(1), kind.group(1) if kind else None))
        if key:
            got[key] = float(m.group(3))
    return got if len(got) == len(want) else None


# ---- one streaming request ------------------------------------------------------------------

def _sse_events(buf):
    """Splits complete SSE events off buf: (list of data payloads, rest)."""
    out = []
    buf = buf.replace("\r\n", "\n")
    while "\n\n" in buf:
        event, buf = buf.split("\n\n", 1)
        data = [ln[5:].lstrip(" ") for ln in event.split("\n") if ln.startswith("data:")]
        if data:
            out.append("\n".join(data))
    return out, buf


async def send_request(url, payload, headers, prompt_len, timeout=None):
    out = RequestOutput(prompt_len=prompt_len)
    try:
        await asyncio.wait_for(_stream(out, url, payload, headers), timeout)
    except asyncio.TimeoutError:
        out.success = False
        out.error = f"timed out after {timeout} s"
    return out


async def _stream(out, url, payload, headers):
    st = time.perf_counter()
    out.start_time = st
    last = st
    first = False
    text = []
    resp = None
    try:
        resp = await http_request("POST", url, payload, headers)
        if resp.status != 200:
            body = (await resp.read())[:300].decode("utf-8", "replace").replace("\n", " ")
            out.error = f"HTTP {resp.status}: {body}"
            return out
        buf = ""
        done = False
        async for chunk in resp.chunks():
            buf += chunk.decode("utf-8", errors="replace")
            events, buf = _sse_events(buf)
            for data in events:
                if data == "[DONE]":
                    done = True
                    continue
                now = time.perf_counter()
                try:
                    obj = json.loads(data)
                except json.JSONDecodeError:
                    out.error = f"bad SSE data: {data[:200]}"
                    continue
                if obj.get("error"):
                    e = obj["error"]
                    out.error = "error in stream: " + (e.get("message", str(e)) if isinstance(e, dict) else str(e))
                    continue
                choices = obj.get("choices")
                if choices:
                    if not first:
                        first = True
                        out.ttft = now - st
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.n_chunks += 1
                    c = choices[0]
                    delta = c.get("delta") or {}
                    piece = c.get("text") or delta.get("content") or delta.get("reasoning_content") or ""
                    text.append(piece)
                usage = obj.get("usage")
                if usage:
                    if usage.get("completion_tokens") is not None:
                        out.output_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_len = int(usage["prompt_tokens"])
        out.generated_text = "".join(text)
        out.latency = last - st
        if out.error:
            return out
        if not first:
            out.error = "no streamed chunk with a choice was received" + ("" if done else " (stream cut)")
            return out
        out.success = True
    except Exception as e:  # connection refused, reset, cut: a failed request
        out.success = False
        out.error = f"{type(e).__name__}: {e}"
    finally:
        if resp is not None:
            resp.close()
    return out


# ---- prompts --------------------------------------------------------------------------------

@dataclass
class Prompt:
    prompt: object      # str or list of token ids
    prompt_len: int
    output_len: int


class PromptSource:
    """Makes random prompts of given token lengths for one server (see the module doc)."""

    def __init__(self, args, base_url, model, headers, chat):
        self.a, self.base, self.model, self.headers = args, base_url, model, headers
        self.chat = chat
        self.fmt = args.prompt_format
        self.vocab = []
        self.words_per_token = 1.0
        self.word_overhead = 0.0
        self.prefix = None

    async def _post(self, path, body):
        try:
            return await http_json("POST", self.base + path, body, self.headers)
        except RuntimeError as e:
            raise RuntimeError(f"{path}: {e}")

    async def tokenize(self, text):
        # vLLM names the field "prompt", llama-server "content"; unknown fields are ignored.
        j = await self._post("/tokenize", {"model": self.model, "prompt": text, "content": text,
                                           "add_special_tokens": False, "add_special": False})
        toks = j["tokens"]
        return [t if isinstance(t, int) else t["id"] for t in toks]

    async def detokenize(self, ids):
        j = await self._post("/detokenize", {"model": self.model, "tokens": ids})
        return j["prompt"] if "prompt" in j else j["content"]

    async def setup(self):
        a = self.a
        if a.random_vocab_size:
            self.fmt = "ids"
            self.vocab = list(range(a.random_vocab_size))
        else:
            tok_ok = detok_ok = False
            if self.fmt in ("auto", "text", "ids"):
                try:
                    self.vocab = sorted(set(await self.tokenize(" " + " ".join(WORDS))))
                    tok_ok = len(self.vocab) > 10
                    if tok_ok:
                        await self.detokenize(self.vocab[:8])
                        detok_ok = True
                except Exception as e:
                    print(f"note: /tokenize or /detokenize not usable ({e})", file=sys.stderr)
            if self.fmt == "auto":
                self.fmt = "text" if detok_ok else ("ids" if tok_ok and not self.chat else "words")
            elif self.fmt == "text" and not detok_ok:
                raise SystemExit("--prompt-format text needs the server's /tokenize and /detokenize")
            elif self.fmt == "ids" and not tok_ok:
                raise SystemExit("--prompt-format ids needs the server's /tokenize (or --random-vocab-size N)")
        if self.fmt == "ids" and self.chat:
            raise SystemExit("token-id prompts need --endpoint /v1/completions")
        if self.fmt == "words":
            await self._calibrate_words()
        print(f"prompts: {self.fmt}" + (f" from {len(self.vocab)} vocabulary ids" if self.vocab else "")
              + (f" ({self.words_per_token:.2f} words per token)" if self.fmt == "words" else ""))

    async def _calibrate_words(self):
        """Prompt tokens per word from the server's usage, with two prompts of different size."""
        rng = random.Random(12345)
        counts = []
        for n in (40, 200):
            text = " ".join(rng.choice(WORDS) for _ in range(n))
            body = self._payload(text, 1)
            body["stream"] = False
            body.pop("stream_options", None)
            j = await self._post(self.a.endpoint, body)
            counts.append((n, j["usage"]["prompt_tokens"]))
        (n1, p1), (n2, p2) = counts
        tpw = max((p2 - p1) / (n2 - n1), 0.1)
        self.words_per_token = 1.0 / tpw
        self.word_overhead = p1 - n1 * tpw  # template or BOS tokens

    def _payload(self, prompt, max_tokens):
        return make_payload(self.a, self.model, prompt, max_tokens, self.chat)

    async def _text_of_len(self, ids, target, rng):
        text = await self.detokenize(ids)
        for _ in range(3):
            toks = await self.tokenize(text)
            if len(toks) == target:
                break
            if len(toks) > target:
                toks = toks[:target]
            else:
                toks = toks + [rng.choice(self.vocab) for _ in range(target - len(toks))]
            text = await self.detokenize(toks)
        return text

    async def make(self, n, rng):
        a = self.a
        r = a.random_range_ratio
        lo_in, hi_in = int(a.random_input_len * (1 - r)), int(math.ceil(a.random_input_len * (1 + r)))
        lo_out, hi_out = int(a.random_output_len * (1 - r)), int(math.ceil(a.random_output_len * (1 + r)))
        if self.prefix is None and a.random_prefix_len > 0:
            if self.fmt == "words":
                nw = max(1, round(max(1, a.random_prefix_len - self.word_overhead) * self.words_per_token))
                self.prefix = [rng.choice(WORDS) for _ in range(nw)]
            else:
                self.prefix = [rng.choice(self.vocab) for _ in range(a.random_prefix_len)]
        prefix = self.prefix or []
        specs = [(max(1, rng.randint(lo_in, hi_in)), max(1, rng.randint(lo_out, hi_out))) for _ in range(n)]
        if self.fmt == "words":
            out = []
            for lin, lout in specs:
                words = max(1, round(max(1, lin - (0 if prefix else self.word_overhead)) * self.words_per_token))
                text = " ".join(prefix + [rng.choice(WORDS) for _ in range(words)])
                out.append(Prompt(text, (a.random_prefix_len if prefix else 0) + lin, lout))
            return out
        ids = [prefix + [rng.choice(self.vocab) for _ in range(lin)] for lin, _ in specs]
        if self.fmt == "ids":
            return [Prompt(p, len(p), lout) for p, (_, lout) in zip(ids, specs)]
        sem = asyncio.Semaphore(32)
        seeds = [rng.randrange(1 << 30) for _ in specs]

        async def one(p, seed):
            async with sem:
                return await self._text_of_len(p, len(p), random.Random(seed))
        texts = await asyncio.gather(*[one(p, s) for p, s in zip(ids, seeds)])
        return [Prompt(t, len(p), lout) for t, p, (_, lout) in zip(texts, ids, specs)]


def make_payload(a, model, prompt, max_tokens, chat):
    if chat:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "max_completion_tokens": max_tokens}
    else:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if a.ignore_eos:
        body["ignore_eos"] = True
    for k in ("temperature", "top_p", "top_k"):
        v = getattr(a, k)
        if v is not None:
            body[k] = v
    if a.extra_body:
        body.update(a.extra_body)
    return body


# ---- running a level ------------------------------------------------------------------------

class Progress:
    """A progress bar on stderr: requests done, failures, output tokens/s."""

    def __init__(self, total, label, enabled=True):
        self.total, self.label, self.enabled = total, label, enabled
        self.done = self.failed = self.tokens = 0
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.tty = sys.stderr.isatty()

    def update(self, o):
        self.done += 1
        self.failed += not o.success
        self.tokens += (o.output_tokens or o.n_chunks) if o.success else 0
        now = time.perf_counter()
        if self.done == self.total or now - self.last > (0.2 if self.tty else 10.0):
            self.last = now
            self.draw(now)

    def draw(self, now):
        if not self.enabled:
            return
        w = 30
        fill = self.done * w // max(self.total, 1)
        dt = now - self.t0
        line = (f"{self.label} [{'#' * fill}{'.' * (w - fill)}] {self.done}/{self.total} requests, "
                f"{self.failed} failed, {self.tokens / dt if dt > 0 else 0:.1f} output tok/s, {dt:.1f} s")
        sys.stderr.write(("\r" + line + " ") if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def arrival_delays(n, rate, burstiness, rng):
    """Send times (s from the start): all at 0 for rate inf, else gamma-distributed gaps
    (Poisson for burstiness 1) rescaled so the last is n / rate, as vLLM does."""
    if math.isinf(rate):
        return [0.0] * n
    delays, t = [], 0.0
    for _ in range(n):
        t += (1.0 / rate) if math.isinf(burstiness) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        delays.append(t)
    if delays[-1] > 0:
        f = (n / rate) / delays[-1]
        delays = [d * f for d in delays]
    return delays


async def run_level(a, url, model, headers, prompts, concurrency, rng, label):
    delays = arrival_delays(len(prompts), a.request_rate, a.burstiness, rng)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    prog = Progress(len(prompts), label, enabled=not a.disable_tqdm)
    async def one(p):
        payload = make_payload(a, model, p.prompt, p.output_len, a.endpoint.endswith("chat/completions"))
        if sem:
            async with sem:
                o = await send_request(url, payload, headers, p.prompt_len, a.request_timeout)
        else:
            o = await send_request(url, payload, headers, p.prompt_len, a.request_timeout)
        prog.update(o)
        return o
    start = time.perf_counter()
    tasks = []
    for p, d in zip(prompts, delays):
        wait = start + d - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        tasks.append(asyncio.create_task(one(p)))
    outputs = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    return outputs, duration


# ---- reporting ------------------------------------------------------------------------------

def print_run(r, metrics, percentiles):
    def row(k, v, fmt="{:<10.2f}"):
        print("{:<40} ".format(k) + (fmt.format(v) if v is not None else "n/a"))
    print("{:=^60}".format(" Serving Benchmark Result "))
    row("Successful requests:", r["completed"], "{:<10}")
    row("Failed requests:", r["failed"], "{:<10}")
    if r.get("max_concurrency") is not None:
        row("Maximum request concurrency:", r["max_concurrency"], "{:<10}")
    if r.get("request_rate") not in (None, "inf"):
        row("Request rate configured (RPS):", r["request_rate"])
    row("Benchmark duration (s):", r["duration"])
    row("Total input tokens:", r["total_input_tokens"], "{:<10}")
    row("Total generated tokens:", r["total_output_tokens"], "{:<10}")
    row("Request throughput (req/s):", r["request_throughput"])
    if r.get("request_goodput") is not None:
        row("Request goodput (req/s):", r["request_goodput"])
    row("Output token throughput (tok/s):", r["output_throughput"])
    row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"])
    row("Peak concurrent requests:", r["max_concurrent_requests"], "{:<10}")
    row("Total token throughput (tok/s):", r["total_token_throughput"])
    names = {"ttft": ("TTFT", "Time to First Token"), "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
             "itl": ("ITL", "Inter-token Latency"), "e2el": ("E2EL", "End-to-end Latency")}
    for m in metrics:
        short, long = names[m]
        print("{:-^60}".format(long))
        row(f"Mean {short} (ms):", r[f"mean_{m}_ms"])
        row(f"Median {short} (ms):", r[f"median_{m}_ms"])
        for p in percentiles:
            word = str(int(p)) if int(p) == p else str(p)
            row(f"P{word} {short} (ms):", r[f"p{word}_{m}_ms"])
    st = r.get("server_steps")
    if st:
        print("{:-^60}".format("Server steps (kaon /metrics)"))
        row("Prefill-carrying steps / seconds:", f"{st['prefill_steps']:.0f} / {st['prefill_step_s']:.2f}", "{:<10}")
        row("Decode-only steps / seconds:", f"{st['decode_steps']:.0f} / {st['decode_step_s']:.2f}", "{:<10}")
        row("Preemptions:", st["preemptions"], "{:<10.0f}")
    print("=" * 60)
    if r["output_tokens_counted_from_chunks"]:
        print(f"note: {r['output_tokens_counted_from_chunks']} requests had no usage; their output tokens are chunk counts")
    if r["failed"]:
        print(f"FAILED: {r['failed']} of {r['failed'] + r['completed']} requests; first errors:")
        for e in r["first_errors"][:5]:
            print("  " + e[:300])


def print_summary(runs, percentiles):
    p = percentiles[-1]
    pw = str(int(p)) if int(p) == p else str(p)
    hdr = (f"{'conc':>6} {'req/s':>8} {'out tok/s':>10} {'tot tok/s':>10} {'TTFT med':>9} {'TTFT p' + pw:>9} "
           f"{'TPOT med':>9} {'TPOT p' + pw:>9} {'ITL med':>8} {'E2EL med':>9} {'ok':>6} {'failed':>6}")
    print("{:=^{}}".format(" Sweep summary (latencies in ms) ", len(hdr)))
    print(hdr)
    for r in runs:
        c = r.get("max_concurrency")
        print(f"{str(c if c is not None else 'inf'):>6} {r['request_throughput']:8.2f} {r['output_throughput']:10.1f} "
              f"{r['total_token_throughput']:10.1f} {r['median_ttft_ms']:9.1f} {r['p' + pw + '_ttft_ms']:9.1f} "
              f"{r['median_tpot_ms']:9.2f} {r['p' + pw + '_tpot_ms']:9.2f} {r['median_itl_ms']:8.2f} "
              f"{r['median_e2el_ms']:9.1f} {r['completed']:6d} {r['failed']:6d}")
    print("=" * len(hdr))


def git_commit():
    if os.environ.get("KAON_COMMIT"):  # a copy of the tree without .git (e.g. on a GPU machine)
        return os.environ["KAON_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def machine_info():
    cpu = platform.processor() or platform.machine()
    mem = None
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) / 1048576
    except OSError:
        pass
    s = f"{platform.node()}: {cpu}, {os.cpu_count()} cores" + (f", {mem:.0f} GiB" if mem else "")
    try:
        g = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=10)
        names = [x.strip() for x in g.stdout.splitlines() if x.strip()]
        if g.returncode == 0 and names:
            s += f", {len(names)}x {names[0]}"
    except (OSError, subprocess.SubprocessError):
        pass
    return s


def raise_fd_limit():
    """Many requests in flight need many sockets: the soft limit goes up to the hard one."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def parse_list(s):
    return [None if x.strip().lower() in ("none", "inf", "0") else int(x) for x in str(s).split(",") if x.strip()]


# ---- main -----------------------------------------------------------------------------------

def build_parser():
    ap = argparse.ArgumentParser(
        prog=os.environ.get("KAON_BENCH_PROG", "serve.py"),
        description="Serving benchmark for an OpenAI-compatible server (vLLM `bench serve` flags and metrics).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    ap.add_argument("--model", default=None, help="model name in the API (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="Bearer key ($OPENAI_API_KEY)")
    ap.add_argument("--label", default=None, help="name of the server in results and plots (default: /v1/models owned_by)")
    ap.add_argument("--dataset", "--dataset-name", dest="dataset", default="random", choices=["random"])
    ap.add_argument("--random-input-len", "--input-len", dest="random_input_len", type=int, default=1024)
    ap.add_argument("--random-output-len", "--output-len", dest="random_output_len", type=int, default=128)
    ap.add_argument("--random-range-ratio", type=float, default=0.0,
                    help="lengths are uniform in [len*(1-r), len*(1+r)]")
    ap.add_argument("--random-prefix-len", type=int, default=0, help="tokens of one prefix shared by every prompt")
    ap.add_argument("--random-vocab-size", type=int, default=0,
                    help="send token-id prompts from [0, N) (servers without a tokenizer)")
    ap.add_argument("--prompt-format", default="auto", choices=["auto", "text", "ids", "words"])
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--min-prompts-per-concurrency", type=int, default=0,
                    help="in a sweep, at least this many prompts per concurrent request")
    ap.add_argument("--max-concurrency", default=None,
                    help="requests in flight at most; a list (1,4,16) runs a sweep")
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (inf: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrival gaps (1: Poisson)")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=None,
                    help="ask for exactly the output length (default on for the random dataset, as vLLM)")
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--extra-body", type=json.loads, default=None, help="JSON merged into every request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-warmups", type=int, default=0, help="warm-up requests before each level")
    ap.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    ap.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el")
    ap.add_argument("--metric-percentiles", default="90,99")
    ap.add_argument("--num-gpus", type=int, default=1, help="devices behind the server (for per-GPU throughput)")
    ap.add_argument("--request-timeout", type=float, default=6 * 3600)
    ap.add_argument("--result-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--result-filename", default=None)
    ap.add_argument("--no-save", action="store_true", help="print only")
    ap.add_argument("--save-detailed", action="store_true", help="keep per-request data in the JSON")
    ap.add_argument("--plot", action=argparse.BooleanOptionalAction, default=None,
                    help="PNG plots next to the results (default: on for sweeps)")
    ap.add_argument("--plot-dir", default=None, help="where the PNGs go (default: the result dir)")
    ap.add_argument("--metadata", nargs="*", default=None, metavar="KEY=VALUE")
    ap.add_argument("--machine", default=None, help="describe the machine (default: this one)")
    ap.add_argument("--disable-tqdm", "--no-progress", dest="disable_tqdm", action="store_true")
    return ap


async def amain(a):
    raise_fd_limit()
    base = (a.base_url or f"http://{a.host}:{a.port}").rstrip("/")
    url = base + a.endpoint
    chat = a.endpoint.endswith("chat/completions")
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    percentiles = [float(p) for p in a.metric_percentiles.split(",") if p.strip()]
    metrics = [m for m in a.percentile_metrics.split(",") if m.strip()]
    goodput = parse_goodput(a.goodput)
    levels = parse_list(a.max_concurrency) if a.max_concurrency is not None else [None]
    if a.ignore_eos is None:
        a.ignore_eos = a.dataset == "random"
    owned_by = None
    try:
        data = (await http_json("GET", base + "/v1/models", None, headers))["data"]
    except Exception as e:
        raise SystemExit(f"cannot list models at {base}/v1/models: {e}")
    if a.model is None:
        if not data:
            raise SystemExit(f"{base}/v1/models lists no model")
        a.model = data[0]["id"]
    for m in data:
        if m.get("id") == a.model:
            owned_by = m.get("owned_by")
    label = a.label or owned_by or "server"
    rng = random.Random(a.seed)
    src = PromptSource(a, base, a.model, headers, chat)
    await src.setup()
    plans = []
    for c in levels:
        n = max(a.num_prompts, a.min_prompts_per_concurrency * (c or 0))
        if c and n < c:
            print(f"note: {n} prompts cannot keep {c} requests in flight", file=sys.stderr)
        plans.append((c, await src.make(n, rng), await src.make(a.num_warmups, rng) if a.num_warmups else []))

    runs = []
    for c, prompts, warm in plans:
        if warm:
            await run_level(a, url, a.model, headers, warm, c, random.Random(a.seed),
                            f"warm-up c={c}")
        steps0 = await server_steps(base, headers)
        outputs, duration = await run_level(a, url, a.model, headers, prompts, c,
                                            random.Random(a.seed + 1), f"c={c if c else 'inf'}")
        steps1 = await server_steps(base, headers) if steps0 else None
        r = {"max_concurrency": c, "request_rate": a.request_rate if not math.isinf(a.request_rate) else "inf",
             "burstiness": a.burstiness, "num_prompts": len(prompts)}
        r.update(calculate_metrics(outputs, duration, percentiles, goodput, metrics))
        if steps1:  # where the server's time went during this level
            r["server_steps"] = {k: steps1[k] - steps0[k] for k in steps1}
        r["output_throughput_per_gpu"] = r["output_throughput"] / max(a.num_gpus, 1)
        if a.save_detailed:
            r["input_lens"] = [o.prompt_len for o in outputs]
            r["output_lens"] = [o.output_tokens or 0 for o in outputs]
            r["ttfts"] = [o.ttft for o in outputs]
            r["itls"] = [o.itl for o in outputs]
            r["latencies"] = [o.latency for o in outputs]
            r["start_times"] = [o.start_time for o in outputs]
            r["errors"] = [o.error for o in outputs]
            r["generated_texts"] = [o.generated_text for o in outputs]
        print_run(r, metrics, percentiles)
        runs.append(r)
    if len(runs) > 1:
        print_summary(runs, percentiles)

    now = datetime.datetime.now()
    res = {
        "benchmark": "serve",
        "date": now.isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": a.machine or machine_info(),
        "model": a.model,
        "model_id": a.model,
        "label": label,
        "backend": "openai-chat" if chat else "openai",
        "command": os.environ.get("KAON_BENCH_COMMAND") or shlex.join([sys.executable] + sys.argv),
        "base_url": base,
        "endpoint": a.endpoint,
        "dataset_name": a.dataset,
        "random_input_len": a.random_input_len,
        "random_output_len": a.random_output_len,
        "random_range_ratio": a.random_range_ratio,
        "random_prefix_len": a.random_prefix_len,
        "prompt_format": src.fmt,
        "num_prompts": a.num_prompts,
        "request_rate": a.request_rate if not math.isinf(a.request_rate) else "inf",
        "burstiness": a.burstiness,
        "max_concurrency": levels[0] if len(levels) == 1 else [c for c in levels],
        "ignore_eos": a.ignore_eos,
        "seed": a.seed,
        "num_gpus": a.num_gpus,
        "goodput": goodput or None,
        "metric_percentiles": percentiles,
    }
    for item in a.metadata or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"bad --metadata '{item}': use KEY=VALUE")
        res.setdefault("metadata", {})[k.strip()] = v.strip()
    if len(runs) == 1:  # a single run also reads as vLLM's flat result
        res.update({k: v for k, v in runs[0].items() if k not in res or k == "max_concurrency"})
    res["runs"] = runs
    total_failed = sum(r["failed"] for r in runs)
    if not a.no_save:
        d = Path(a.result_dir)
        d.mkdir(parents=True, exist_ok=True)
        safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
        path = Path(a.result_filename) if a.result_filename else d / f"serve-{safe}-{now.strftime('%Y%m%d-%H%M%S')}.json"
        if not path.is_absolute() and a.result_filename:
            path = d / path
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"results: {path}")
        if a.plot or (a.plot is None and len(runs) > 1):
            try:
                sys.path.insert(0, str(Path(__file__).resolve().parent))
                import plot as kplot
                pngs = kplot.plot_results([res], Path(a.plot_dir or path.parent), path.stem + ".")
                print("plots: " + " ".join(str(p) for p in pngs))
            except ImportError as e:
                print(f"note: no plots ({e}); pip install matplotlib", file=sys.stderr)
    if total_failed:
        print(f"{total_failed} requests FAILED (see the errors above)", file=sys.stderr)
    return res


def main(argv=None):
    a = build_parser().parse_args(argv)
    return asyncio.run(amain(a))


if __name__ == "__main__":
    res = main()
    sys.exit(1 if sum(r["failed"] for r in res["runs"]) and not sum(r["completed"] for r in res["runs"]) else 0)
