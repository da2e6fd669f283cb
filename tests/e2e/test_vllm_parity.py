"""Parity with `vllm serve`: the same requests to vLLM's own OpenAI server and to the appliance.

Both run the same model with the same engine settings (the shared daemon's: eager, 2048
tokens of context, 1 GiB of KV cache, the hermes tool parser with auto tool choice). Every
request below is one vLLM's server answers on SmolLM2; the appliance must answer it the
same way: same status, same shape, and with greedy sampling the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from appliance.client import iter_sse
from bench.servers import ServerProc, free_port, start_vllm_server
from tests.conftest import PARITY_VLLM_ARGS, TEST_DTYPE, Daemon

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass
class Pair:
    """The two servers, and one call that asks both."""

    vllm_url: str
    appliance_url: str
    model: str

    def both(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[Any, Any]:
        """(vLLM's response, the appliance's response) to the same request."""
        out = []
        for base in (self.vllm_url, self.appliance_url):
            payload = None if body is None else {"model": self.model, **body}
            out.append(requests.request(method, base + path, json=payload, timeout=300))
        return out[0], out[1]


@pytest.fixture(scope="module")
def pair(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    log_dir: Path = tmp_path_factory.mktemp("vllm-server")
    server: ServerProc = start_vllm_server(
        daemon.model_dir,
        free_port(),
        log_dir / "vllm.log",
        kv_space_gib=1,
        max_model_len=2048,
        max_num_seqs=32,
        extra_args=PARITY_VLLM_ARGS,
        dtype=TEST_DTYPE,
    )
    try:
        yield Pair(server.url, daemon.url, daemon.model_name)
    finally:
        server.stop()


def _ok(*responses: requests.Response) -> list[dict[str, Any]]:
    for r in responses:
        assert r.status_code == 200, (r.url, r.status_code, r.text[:500])
    return [r.json() for r in responses]


def test_health_ping_version_as_vllm_answers(pair: Pair):
    for path in ("/health", "/ping"):
        ours, theirs = pair.both("GET", path)[::-1]
        assert (
            (ours.status_code, ours.content) == (theirs.status_code, theirs.content) == (200, b"")
        )
    v, a = _ok(*pair.both("GET", "/version"))
    assert a["version"] == v["version"]


def test_json_schema_parses_and_fits_on_both(pair: Pair):
    body = {
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 120,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "place", "schema": CITY_SCHEMA},
        },
    }
    for out in _ok(*pair.both("POST", "/v1/chat/completions", body)):
        place = json.loads(out["choices"][0]["message"]["content"])
        assert set(place) == {"city", "country"} and all(isinstance(x, str) for x in place.values())


def test_json_object_parses_on_both(pair: Pair):
    body = {
        "messages": [{"role": "user", "content": "Give the capital of France as JSON."}],
        "temperature": 0,
        "max_tokens": 300,
        "response_format": {"type": "json_object"},
    }
    v, a = _ok(*pair.both("POST", "/v1/chat/completions", body))
    # Greedy: the same answer from both; where it closed the object, it parses.
    assert a["choices"][0]["message"] == v["choices"][0]["message"]
    assert a["choices"][0]["finish_reason"] == v["choices"][0]["finish_reason"]
    if v["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(a["choices"][0]["message"]["content"]), dict)


@pytest.mark.parametrize(
    "tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"]
)
def test_forced_tool_call_has_json_arguments_on_both(pair: Pair, tool_choice: Any):
    body = {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": tool_choice,
        "temperature": 0,
        "max_tokens": 100,
    }
    v, a = _ok(*pair.both("POST", "/v1/chat/completions", body))
    for name, out in (("vllm", v), ("appliance", a)):
        calls = out["choices"][0]["message"]["tool_calls"]
        assert calls and calls[0]["function"]["name"] == "get_weather", (name, out)
        # JSON arguments (what SmolLM2 puts in them is its own affair: vLLM's CPU build
        # answered '"Paris"' for this schema; the appliance must answer the same).
        json.loads(calls[0]["function"]["arguments"])
    assert [c["function"] for c in a["choices"][0]["message"]["tool_calls"]] == [
        c["function"] for c in v["choices"][0]["message"]["tool_calls"]
    ]


def test_chat_logprobs_of_the_asked_size(pair: Pair):
    body = {
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 3,
    }
    v, a = _ok(*pair.both("POST", "/v1/chat/completions", body))
    for out in (v, a):
        content = out["choices"][0]["logprobs"]["content"]
        assert len(content) == out["usage"]["completion_tokens"]
        assert all(len(t["top_logprobs"]) == 3 for t in content)
    tokens = [[t["token"] for t in o["choices"][0]["logprobs"]["content"]] for o in (v, a)]
    assert tokens[0] == tokens[1]


def test_completion_logprobs_echo_and_n(pair: Pair):
    body = {
        "prompt": "The capital of France is",
        "temperature": 0,
        "max_tokens": 6,
        "logprobs": 2,
        "echo": True,
    }
    v, a = _ok(*pair.both("POST", "/v1/completions", body))
    for out in (v, a):
        choice = out["choices"][0]
        assert choice["text"].startswith("The capital of France is")
        assert len(choice["logprobs"]["tokens"]) == len(choice["logprobs"]["top_logprobs"])
    assert a["choices"][0]["text"] == v["choices"][0]["text"]
    n_body = {"prompt": "Once upon a time", "max_tokens": 6, "n": 2, "seed": 3}
    for out in _ok(*pair.both("POST", "/v1/completions", n_body)):
        assert sorted(c["index"] for c in out["choices"]) == [0, 1]
    chat_n = {"messages": QUESTION, "max_tokens": 6, "n": 2, "seed": 3}
    for out in _ok(*pair.both("POST", "/v1/chat/completions", chat_n)):
        assert sorted(c["index"] for c in out["choices"]) == [0, 1]


def test_sampling_extras_and_logit_bias_mean_the_same(pair: Pair):
    tokens = _ok(pair.both("POST", "/tokenize", {"prompt": " Paris"})[1])[0]["tokens"]
    body = {
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 12,
        "top_k": 5,
        "min_p": 0.01,
        "repetition_penalty": 1.1,
        "min_tokens": 12,
        "ignore_eos": True,
        "logit_bias": {str(tokens[0]): -100},
    }
    v, a = _ok(*pair.both("POST", "/v1/chat/completions", body))
    for out in (v, a):
        assert out["usage"]["completion_tokens"] == 12  # min_tokens + ignore_eos
        assert "Paris" not in out["choices"][0]["message"]["content"]  # banned by logit_bias
    assert a["choices"][0]["message"]["content"] == v["choices"][0]["message"]["content"]
    stop_ids = {"prompt": "1, 2, 3,", "temperature": 0, "max_tokens": 20, "stop_token_ids": [28]}
    v, a = _ok(*pair.both("POST", "/v1/completions", stop_ids))
    assert a["choices"][0]["text"] == v["choices"][0]["text"]


def test_tokenize_and_detokenize_identical(pair: Pair):
    v, a = _ok(*pair.both("POST", "/tokenize", {"prompt": "Hello, appliance!"}))
    assert a == v
    v2, a2 = _ok(*pair.both("POST", "/detokenize", {"tokens": v["tokens"]}))
    assert a2 == v2 and a2["prompt"] == "Hello, appliance!"
    v3, a3 = _ok(*pair.both("POST", "/tokenize", {"messages": QUESTION}))
    assert a3 == v3


def test_responses_api_on_both(pair: Pair):
    body = {"input": "What is the capital of France?", "max_output_tokens": 16, "temperature": 0}
    v, a = _ok(*pair.both("POST", "/v1/responses", body))
    for out in (v, a):
        assert out["object"] == "response" and out["status"] in ("completed", "incomplete")
        texts = [c["text"] for o in out["output"] if o["type"] == "message" for c in o["content"]]
        assert texts and texts[0]
    assert a["output"][-1]["content"][0]["text"] == v["output"][-1]["content"][0]["text"]


def test_stream_frames_match(pair: Pair):
    body = {
        "messages": QUESTION,
        "temperature": 0,
        "max_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    texts, usage = [], []
    for base in (pair.vllm_url, pair.appliance_url):
        r = requests.post(
            base + "/v1/chat/completions",
            json={"model": pair.model, **body},
            stream=True,
            timeout=120,
        )
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        frames = list(iter_sse(r.iter_lines(decode_unicode=True)))
        assert frames[-1].done
        chunks = [f.json() for f in frames[:-1]]
        usage.append(chunks[-1]["usage"])
        texts.append(
            "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        )
    assert texts[0] == texts[1] and texts[0]
    assert usage[0] == usage[1]


def test_unknown_model_and_bad_field_status_match(pair: Pair):
    v, a = pair.both("POST", "/v1/chat/completions", {"messages": QUESTION, "model": "nope"})
    assert v.status_code == a.status_code == 404
    v, a = pair.both("POST", "/v1/chat/completions", {"messages": QUESTION, "top_p": 3})
    assert v.status_code == a.status_code == 400
    assert "top_p" in a.json()["error"]["message"]
