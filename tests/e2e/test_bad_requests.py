"""A table of bad requests against a real `kaon serve`: each gets the right status and an error
body in OpenAI's shape, and the server answers a normal request right after each one."""
import json
import socket

import pytest

from conftest import API_KEY, MAX_BODY, MAX_MODEL_LEN

AUTH = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
MSG = [{"role": "user", "content": "hi"}]
LONG = "hello " * (MAX_MODEL_LEN + 50)  # more tokens than the context holds


def chat(**kw):
    return json.dumps({"messages": MSG, "max_tokens": 2, **kw}).encode()


def comp(**kw):
    return json.dumps({"prompt": "hi", "max_tokens": 2, **kw}).encode()


# (name, method, path, body bytes, headers, status, param)
CASES = [
    ("malformed json", "POST", "/v1/chat/completions", b'{"messages": [', AUTH, 400, None),
    ("not an object", "POST", "/v1/chat/completions", b"[1, 2, 3]", AUTH, 400, None),
    ("empty body", "POST", "/v1/chat/completions", b"", AUTH, 400, None),
    ("trailing garbage", "POST", "/v1/completions", b'{"prompt": "x"} xyz', AUTH, 400, None),
    ("missing messages", "POST", "/v1/chat/completions", b'{"model": "smol"}', AUTH, 400, "messages"),
    ("empty messages", "POST", "/v1/chat/completions", b'{"messages": []}', AUTH, 400, "messages"),
    ("messages not a list", "POST", "/v1/chat/completions", b'{"messages": "hi"}', AUTH, 400, "messages"),
    ("invalid role", "POST", "/v1/chat/completions",
     b'{"messages": [{"role": "robot", "content": "x"}]}', AUTH, 400, "messages[0].role"),
    ("missing content", "POST", "/v1/chat/completions", b'{"messages": [{"role": "user"}]}', AUTH, 400,
     "messages[0].content"),
    ("content wrong type", "POST", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": 42}]}', AUTH, 400, "messages[0].content"),
    ("image part", "POST", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": [
         {"type": "image_url", "image_url": {"url": "data:,"}}]}]}).encode(), AUTH, 400,
     "messages[0].content"),
    ("temperature string", "POST", "/v1/chat/completions", chat(temperature="hot"), AUTH, 400, "temperature"),
    ("temperature negative", "POST", "/v1/chat/completions", chat(temperature=-1), AUTH, 400, "temperature"),
    ("top_p zero", "POST", "/v1/chat/completions", chat(top_p=0), AUTH, 400, "top_p"),
    ("top_k bad", "POST", "/v1/completions", comp(top_k=-5), AUTH, 400, "top_k"),
    ("min_p > 1", "POST", "/v1/completions", comp(min_p=2), AUTH, 400, "min_p"),
    ("presence_penalty range", "POST", "/v1/chat/completions", chat(presence_penalty=3), AUTH, 400,
     "presence_penalty"),
    ("n zero", "POST", "/v1/chat/completions", chat(n=0), AUTH, 400, "n"),
    ("n float", "POST", "/v1/completions", comp(n=1.5), AUTH, 400, "n"),
    ("max_tokens zero", "POST", "/v1/chat/completions", chat(max_tokens=0), AUTH, 400, "max_tokens"),
    ("max_tokens string", "POST", "/v1/completions", comp(max_tokens="10"), AUTH, 400, "max_tokens"),
    ("max_tokens beyond context", "POST", "/v1/completions", comp(max_tokens=MAX_MODEL_LEN * 2), AUTH, 400,
     "max_tokens"),
    ("prompt beyond context", "POST", "/v1/completions",
     json.dumps({"prompt": LONG, "max_tokens": 1}).encode(), AUTH, 400, "prompt"),
    ("messages beyond context", "POST", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": LONG}]}).encode(), AUTH, 400, "messages"),
    ("stream not bool", "POST", "/v1/chat/completions", chat(stream="yes"), AUTH, 400, "stream"),
    ("stream_options without stream", "POST", "/v1/chat/completions",
     chat(stream_options={"include_usage": True}), AUTH, 400, "stream_options"),
    ("stop wrong type", "POST", "/v1/completions", comp(stop=7), AUTH, 400, "stop"),
    ("logit_bias bad key", "POST", "/v1/completions", comp(logit_bias={"abc": 1}), AUTH, 400, "logit_bias"),
    ("logit_bias out of vocab", "POST", "/v1/completions", comp(logit_bias={"99999999": 1}), AUTH, 400,
     "logit_bias"),
    ("top_logprobs without logprobs", "POST", "/v1/chat/completions", chat(top_logprobs=2), AUTH, 400,
     "top_logprobs"),
    ("logprobs too many", "POST", "/v1/completions", comp(logprobs=50), AUTH, 400, "logprobs"),
    ("seed float", "POST", "/v1/completions", comp(seed=0.5), AUTH, 400, "seed"),
    ("prompt missing", "POST", "/v1/completions", b'{"max_tokens": 2}', AUTH, 400, "prompt"),
    ("prompt ids out of vocab", "POST", "/v1/completions", b'{"prompt": [1, 2, 100000000]}', AUTH, 400,
     "prompt"),
    ("prompt empty list", "POST", "/v1/completions", b'{"prompt": []}', AUTH, 400, "prompt"),
    ("mixed prompt list", "POST", "/v1/completions", b'{"prompt": ["a", 1]}', AUTH, 400, "prompt"),
    ("response_format unknown type", "POST", "/v1/chat/completions",
     chat(response_format={"type": "yaml"}), AUTH, 400, "response_format"),
    ("structured_outputs two kinds", "POST", "/v1/chat/completions",
     chat(structured_outputs={"regex": "a", "choice": ["a"]}), AUTH, 400, "structured_outputs"),
    ("unknown model", "POST", "/v1/chat/completions", chat(model="gpt-4o"), AUTH, 404, "model"),
    ("unknown model card", "GET", "/v1/models/gpt-4o", None, AUTH, 404, "model"),
    ("unknown path", "GET", "/v1/embeddings", None, AUTH, 404, None),
    ("unknown path post", "POST", "/nope", b"{}", AUTH, 404, None),
    ("wrong method on chat", "GET", "/v1/chat/completions", None, AUTH, 405, None),
    ("wrong method on models", "DELETE", "/v1/models", None, AUTH, 405, None),
    ("wrong method on tokenize", "PUT", "/tokenize", b"{}", AUTH, 405, None),
    ("missing api key", "POST", "/v1/chat/completions", chat(), {"Content-Type": "application/json"}, 401,
     None),
    ("wrong api key", "POST", "/v1/completions", comp(),
     {"Authorization": "Bearer nope", "Content-Type": "application/json"}, 401, None),
    ("key without Bearer", "GET", "/v1/models", None, {"Authorization": API_KEY}, 401, None),
    ("oversized body", "POST", "/v1/chat/completions", b'{"messages": "' + b"x" * (MAX_BODY + 10) + b'"}',
     AUTH, 413, None),
    ("tokenize bad", "POST", "/tokenize", b'{"prompt": 5}', AUTH, 400, "prompt"),
    ("detokenize bad ids", "POST", "/detokenize", b'{"tokens": [-1]}', AUTH, 400, "tokens"),
]


def check_normal(server):
    status, body = server.json("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
    assert status == 200, body
    assert body["choices"][0]["text"] is not None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request(server, case):
    name, method, path, body, headers, want_status, want_param = case
    status, hdrs, data = server.request(method, path, body, headers=dict(headers))
    assert status == want_status, (name, status, data[:300])
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == want_param, err
    assert err["type"] == ("authentication_error" if want_status == 401 else "invalid_request_error")
    if want_status == 405:
        assert "Allow" in hdrs
    if want_status == 401:
        assert hdrs.get("WWW-Authenticate") == "Bearer"
    check_normal(server)


def test_table_is_large_enough():
    assert len(CASES) >= 30


def test_disconnect_mid_stream_then_normal(server):
    body = json.dumps({"prompt": "Write a poem.", "max_tokens": 200, "stream": True,
                       "ignore_eos": True}).encode()
    for _ in range(3):
        s = socket.create_connection((server.host, server.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        s.close()
    check_normal(server)


def test_disconnect_before_body(server):
    s = socket.create_connection((server.host, server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
              b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{\"prompt\"")
    s.close()
    check_normal(server)


def test_garbage_http(server):
    s = socket.create_connection((server.host, server.port), timeout=2)
    s.sendall(b"\x00\x01\x02 NOT HTTP\r\n\r\n")
    try:
        reply = s.recv(4096)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply
    except (ConnectionError, socket.timeout):
        pass  # the server may also just wait for a valid request (its idle timeout closes it)
    s.close()
    check_normal(server)


def test_unknown_fields_ignored(server):
    status, body = server.json("POST", "/v1/chat/completions",
                               {"messages": MSG, "max_tokens": 2, "frobnicate": {"x": [1, 2]}})
    assert status == 200, body


def test_cors_preflight(server):
    status, hdrs, _ = server.request("OPTIONS", "/v1/chat/completions",
                                     headers={"Origin": "http://x", "Access-Control-Request-Method": "POST"})
    assert status == 204 and hdrs.get("Access-Control-Allow-Origin") == "*"
