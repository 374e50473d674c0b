"""The HTTP API contract and its error cases, through FastAPI's TestClient on a tiny model."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from spdrank.core.ranking import STAGES
from spdrank.model.ranker import SPDRanker
from spdrank.serving import ServeSettings, create_app
from tests.helpers import save_features_only_model

K = 8  # the served model's positions (serving/conftest.py)


@pytest.fixture(scope="module")
def client(served):
    with TestClient(create_app(served[0], name="tiny-spd")) as c:
        yield c


DOCS = ["argan hair oil", {"text": "rose shampoo"}, "nail polish remover", "vanilla body lotion"]


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == response.status_code
    return body["error"]


def test_rerank_contract(client, served):
    r = client.post("/v1/rerank", json={"query": "1. rose conditioner", "documents": DOCS,
                                        "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("rerank-") and body["model"] == "tiny-spd"
    results = body["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in results]
    assert all(a >= b for a, b in pairwise(scores)) and all(0 < x <= 1 for x in scores), scores
    texts = [d if isinstance(d, str) else d["text"] for d in DOCS]
    assert all(x["document"]["text"] == texts[x["index"]] for x in results)
    # The same order and scores as the model ranking the same texts directly: the scores are
    # the model's relevance, not the ranks.
    direct = served[0].rank("1. rose conditioner", texts)
    assert [x["index"] for x in results] == [int(d) for d in direct.docids]
    assert scores == pytest.approx(direct.scores)
    assert scores != pytest.approx([1 - r / 4 for r in range(4)])
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    meta = body["meta"]
    assert meta["batch_size"] == 1 and meta["collected"] == 1 and meta["truncated_documents"] == []
    assert (
        meta["queue_ms"] >= 0
        and meta["inference_ms"] > 0
        and meta["total_ms"] >= meta["inference_ms"]
    )
    assert set(meta["timings_ms"]) == set(STAGES)


@pytest.mark.parametrize("path", ["/rerank", "/v2/rerank"])
def test_rerank_aliases_top_n_and_return_documents(client, path):
    r = client.post(
        path,
        json={
            "model": "tiny-spd",
            "query": "q",
            "documents": DOCS,
            "top_n": 2,
            "return_documents": False,
        },
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == 2 and all("document" not in x for x in results)
    r = client.post(path, json={"query": "q", "documents": DOCS[:2], "top_n": 10})
    assert len(r.json()["results"]) == 2  # top_n past the end is all


def test_rank_fields_other_than_text_are_refused_not_ignored(client):
    """Cohere's rank_fields names the fields of object documents to rank on; this server reads
    'text' alone, so asking for another field is an error, not a ranking by text."""
    texts = ["argan hair oil", "rose shampoo", "nail polish remover"]
    docs = [{"title": f"title {i}", "text": text} for i, text in enumerate(texts)]
    r = client.post("/v1/rerank", json={"query": "q", "documents": docs, "rank_fields": ["text"]})
    assert r.status_code == 200, r.text
    r = client.post("/v1/rerank", json={"query": "q", "documents": docs,
                                        "rank_fields": ["title", "text"]})
    assert r.status_code == 422, r.text
    error = error_of(r)
    assert (error["type"], error["param"]) == ("invalid_request", "rank_fields")
    assert error["message"].startswith("rank_fields ['title', 'text']: this server ranks a "
                                       "document by its 'text' alone")


def test_any_model_name_a_client_sends_is_answered_and_documents_are_off_by_default(client):
    # Cohere's clients always send a model name; the served model answers it, named back.
    r = client.post("/v1/rerank", json={"model": "rerank-english-v3.0", "query": "q",
                                        "documents": DOCS})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny-spd"
    assert all("document" not in x for x in r.json()["results"])  # Cohere's default


def test_documents_over_k_go_through_windows_when_enabled(served):
    from spdrank.serving.settings import ServeSettings

    docs = [f"document number {i}" for i in range(20)]  # the tiny model's K is 8
    with TestClient(create_app(served[0], name="tiny-spd")) as plain:
        r = plain.post("/v1/rerank", json={"query": "q", "documents": docs})
        assert r.status_code == 422 and "at most 8" in error_of(r)["message"]
    settings = ServeSettings(window=8, window_stride=4, max_documents=64)
    with TestClient(create_app(served[0], name="tiny-spd", settings=settings)) as windowed:
        r = windowed.post("/v1/rerank", json={"query": "q", "documents": docs, "top_n": 20})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert sorted(x["index"] for x in results) == list(range(20))
        scores = [x["relevance_score"] for x in results]
        assert all(a > b for a, b in pairwise(scores))
        r = windowed.post("/v1/rerank", json={"query": "q", "documents": docs * 4})
        assert r.status_code == 422  # over --max-documents


def test_rank_takes_a_slate_and_returns_a_result_record(client):
    slate = {
        "query": {"qid": "u1", "text": "1. rose shampoo"},
        "candidates": [
            {"docid": f"B{i}", "doc": {"title": t}} for i, t in enumerate(["oil", "gel", "soap"])
        ],
        "clicked": ["B1"],
    }
    r = client.post("/v1/rank", json=slate)
    assert r.status_code == 200, r.text
    record = r.json()
    assert sorted(c["docid"] for c in record["candidates"]) == ["B0", "B1", "B2"]
    assert record["clicked"] == ["B1"] and record["query"]["qid"] == "u1"
    scores = [c["score"] for c in record["candidates"]]
    assert all(a >= b for a, b in pairwise(scores))
    assert "timings_ms" in record and record["meta"]["batch_size"] == 1


def test_rank_slate_error_is_422_with_its_message(client):
    r = client.post("/v1/rank", json={"query": "q", "candidates": [{"docid": "a", "doc": {}}]})
    assert r.status_code == 422
    assert "candidates[0] (docid 'a') has no text" in error_of(r)["message"]


# One test per kind of bad input: status, and a message naming what is wrong.
BAD = {
    "invalid_json": (b'{"query": "q", "documents": [', 400, "invalid JSON"),
    "empty_body": (b"", 400, "body is empty"),
    "nan": (b'{"query": "q", "documents": ["a"], "top_n": NaN}', 400, "NaN is not valid JSON"),
    "deep_nesting": (b"[" * 50_000, 400, "nested too deeply"),
    "not_an_object": ([1, 2], 422, "must be a JSON object, got an array"),
    "missing_query": ({"documents": ["a"]}, 422, "query: Field required"),
    "query_wrong_type": (
        {"query": 5, "documents": ["a"]},
        422,
        "query: Input should be a valid string",
    ),
    "documents_not_list": ({"query": "q", "documents": "a b"}, 422, "documents must be a list"),
    "documents_empty": ({"query": "q", "documents": []}, 422, "documents is empty"),
    "document_empty_string": (
        {"query": "q", "documents": ["a", "  "]},
        422,
        "documents[1] is empty",
    ),
    "document_wrong_type": (
        {"query": "q", "documents": ["a", "b", 7]},
        422,
        "documents[2] must be a string",
    ),
    "document_object_no_text": (
        {"query": "q", "documents": [{"title": "a"}]},
        422,
        "documents[0] has no 'text'",
    ),
    "document_text_wrong_type": (
        {"query": "q", "documents": [{"text": None}]},
        422,
        "documents[0].text must be a string",
    ),
    "too_many_documents": (
        {"query": "q", "documents": [f"d{i}" for i in range(K + 1)]},
        422,
        f"{K + 1} given; this model ranks at most {K}",
    ),
    "top_n_wrong_type": (
        {"query": "q", "documents": ["a"], "top_n": "2"},
        422,
        "top_n: Input should be a valid integer",
    ),
    "top_n_zero": (
        {"query": "q", "documents": ["a"], "top_n": 0},
        422,
        "top_n: Input should be greater than or equal to 1",
    ),
    "return_documents_wrong_type": (
        {"query": "q", "documents": ["a"], "return_documents": "yes"},
        422,
        "return_documents",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_clear_4xx(client, case):
    body, status, message = BAD[case]
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post("/v1/rerank", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert message in error_of(r)["message"]


def test_truncated_texts_are_ranked_and_reported(client):
    long_doc = "extra virgin organic argan oil " * 20
    r = client.post(
        "/v1/rerank", json={"query": "rose " * 200, "documents": ["gel", long_doc, "soap"]}
    )
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    assert meta["truncated_documents"] == [1] and meta["query_truncated"] is True


def test_body_over_the_limit_is_413(served):
    app = create_app(served[0], ServeSettings(max_body_bytes=300), name="tiny-spd")
    with TestClient(app) as c:
        big = {"query": "q", "documents": ["word " * 100]}
        r = c.post("/v1/rerank", json=big)
        assert (
            r.status_code == 413 and "larger than the limit of 300 bytes" in error_of(r)["message"]
        )

        def chunks():  # no Content-Length: the limit is enforced while reading
            yield b'{"query": "q", "documents": ["'
            for _ in range(10):
                yield b"x" * 100
            yield b'"]}'

        r = c.post("/v1/rerank", content=chunks())
        assert r.status_code == 413
        assert c.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200
        assert 'spdrank_requests_total{route="/v1/rerank",status="413"} 2' in c.get("/metrics").text


def test_inference_failure_answers_500_and_the_server_keeps_serving(served, monkeypatch):
    model = served[0]
    real = model.rank_batch
    calls = {"n": 0}

    def flaky(slates, decoder=None, encoded=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(slates, decoder, encoded)

    monkeypatch.setattr(model, "rank_batch", flaky)
    with TestClient(create_app(model, name="tiny-spd")) as c:
        r = c.post("/v1/rerank", json={"query": "q", "documents": DOCS})
        assert r.status_code == 500
        err = error_of(r)
        assert err["type"] == "inference_error" and "simulated" in err["message"]
        r = c.post("/v1/rerank", json={"query": "q", "documents": DOCS})
        assert r.status_code == 200, r.text
        assert 'type="inference_error"' in c.get("/metrics").text


def test_health_metrics_docs_and_unknown_routes(client):
    health = client.get("/healthz").json()
    assert (
        health["status"] == "ok" and health["max_documents"] == K and health["model"] == "tiny-spd"
    )
    assert health["batch_policy"] == "single"  # auto, on a CPU
    assert client.get("/v1/models").json()["data"][0]["id"] == "tiny-spd"
    client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    for family in (
        "spdrank_requests_total",
        "spdrank_errors_total",
        "spdrank_request_duration_seconds_bucket",
        "spdrank_batch_size_bucket",
        "spdrank_queue_wait_seconds_count",
        "spdrank_inference_seconds_sum",
        "spdrank_queue_depth 0",
    ):
        assert family in text.text, family
    schema = client.get("/openapi.json").json()
    assert "/v1/rerank" in schema["paths"] and "/v1/rank" in schema["paths"]
    assert "documents" in schema["components"]["schemas"]["RerankRequest"]["properties"]
    assert client.get("/docs").status_code == 200
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404 and error_of(r)["type"] == "not_found"
    r = client.get("/v1/rerank")
    assert r.status_code == 405 and error_of(r)["type"] == "method_not_allowed"


def test_serve_command_wires_the_flags(served, monkeypatch):
    import uvicorn

    from spdrank.commands.cli import build_parser

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            str(served[1]),
            "--port",
            "8123",
            "--max-batch-size",
            "3",
            "--max-wait-ms",
            "2",
            "--max-queue",
            "5",
            "--max-body-bytes",
            "1000",
            "--device",
            "cpu",
            "--batch-policy",
            "bucketed",
            "--max-padding",
            "0.25",
        ]
    )
    assert args.func(args) == 0
    app = seen["app"]
    assert (seen["host"], seen["port"]) == ("127.0.0.1", 8123)
    assert app.state.settings == ServeSettings(
        max_batch_size=3,
        max_wait_ms=2,
        max_queue=5,
        max_body_bytes=1000,
        batch_policy="bucketed",
        max_padding=0.25,
    )
    assert app.state.engine.name == "tiny-spd" and app.state.batcher.max_batch_size == 3
    assert (app.state.engine.policy, app.state.engine.max_padding) == ("bucketed", 0.25)
    bad = build_parser().parse_args(["serve", "--model", str(served[1]), "--max-batch-size", "0"])
    with pytest.raises(ValueError, match="--max-batch-size must be at least 1, got 0"):
        bad.func(bad)
    bad = build_parser().parse_args(["serve", "--model", str(served[1]), "--max-padding", "-1"])
    with pytest.raises(ValueError, match="--max-padding must be at least 0, got -1"):
        bad.func(bad)
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        build_parser().parse_args(["serve", "--model", str(served[1]), "--batch-policy", "fast"])
    # The default: auto, which is one prefill per slate on a CPU (see docs/serving.md).
    args = build_parser().parse_args(["serve", "--model", str(served[1]), "--device", "cpu"])
    assert args.func(args) == 0
    assert seen["app"].state.settings.batch_policy == "auto"
    assert seen["app"].state.engine.policy == "single"


def test_each_slate_is_encoded_once_per_request(client, served, monkeypatch):
    model = served[0]
    real = model.prompts.encode
    calls = []
    monkeypatch.setattr(model.prompts, "encode", lambda *a: calls.append(1) or real(*a))
    r = client.post("/v1/rerank", json={"query": "q", "documents": DOCS})
    assert r.status_code == 200 and len(calls) == 1
    assert r.json()["meta"]["timings_ms"]["tokenize"] > 0


def test_an_unexpected_bug_is_a_json_500_and_the_server_keeps_serving(served, monkeypatch):
    import spdrank.serving.replies as replies_module

    app = create_app(served[0], name="tiny-spd")
    with TestClient(app, raise_server_exceptions=False) as c:
        monkeypatch.setattr(replies_module, "serve_meta", lambda *a: 1 / 0)
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 500 and error_of(r)["type"] == "internal_error"
        monkeypatch.undo()
        assert c.post("/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 200


# -- a model that reads upstream features ----------------------------------------------------


@pytest.fixture(scope="module")
def features_served(tmp_path_factory) -> Path:
    """A features-only model (no backbone: fast), reading 'pop' and the candidates' score."""
    return save_features_only_model(
        tmp_path_factory.mktemp("served") / "features-spd", K, std=(2.0, 0.25)
    )


def test_features_come_with_slates_and_are_checked_before_queueing(features_served):
    slate = {
        "query": {"qid": "u1", "text": "1. rose shampoo"},
        "candidates": [
            {"docid": "a", "doc": {"title": "argan oil"}, "score": 0.9, "features": {"pop": 3}},
            {"docid": "b", "doc": {"title": "lotion"}, "score": 0.1, "features": {"pop": 0}},
        ],
    }
    with TestClient(create_app(SPDRanker.from_pretrained(features_served), name="f")) as c:
        r = c.post("/v1/rank", json=slate)
        assert r.status_code == 200, r.text
        assert sorted(x["docid"] for x in r.json()["candidates"]) == ["a", "b"]
        del slate["candidates"][1]["features"]
        r = c.post("/v1/rank", json=slate)
        assert r.status_code == 422 and error_of(r)["type"] == "invalid_slate"
        assert "candidates[1] (docid 'b') has no feature 'pop'" in error_of(r)["message"]
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
        assert r.status_code == 422 and error_of(r)["type"] == "features_required"
        assert "reads upstream features (pop, score)" in error_of(r)["message"]


@pytest.mark.parametrize("blank", ["left out", "null"])
def test_a_slate_without_scores_is_refused_as_a_missing_feature(features_served, blank):
    """The model reads 'score': a candidate that sends none (or null) is refused with the
    422 a missing 'pop' gets, not ranked as if its score were 0."""
    slate = {"query": {"qid": "u1", "text": "1. rose shampoo"}, "candidates": [
        {"docid": "a", "doc": {"title": "argan oil"}, "features": {"pop": 3}},
        {"docid": "b", "doc": {"title": "lotion"}, "score": 0.0, "features": {"pop": 0}}]}
    if blank == "null":
        slate["candidates"][0]["score"] = None
    with TestClient(create_app(SPDRanker.from_pretrained(features_served), name="f")) as c:
        r = c.post("/v1/rank", json=slate)
        assert r.status_code == 422 and error_of(r)["type"] == "invalid_slate"
        assert ("candidates[0] (docid 'a') has no feature 'score' (its 'score' is left out or "
                "null), which this model reads (features: pop, score)") in error_of(r)["message"]
        slate["candidates"][0]["score"] = 0.5
        assert c.post("/v1/rank", json=slate).status_code == 200


def test_a_rerank_field_sent_with_a_slate_is_refused_not_echoed(features_served):
    """A slate keeps unknown fields and hands them back; top_n would come back unread, with
    every candidate, so /v1/rank refuses it, naming the field and where it is read."""
    slate = {"query": {"qid": "u1", "text": "1. rose shampoo"}, "candidates": [
        {"docid": d, "doc": {"title": d}, "score": 0.5, "features": {"pop": i}}
        for i, d in enumerate("abc")], "note": "travels along"}
    with TestClient(create_app(SPDRanker.from_pretrained(features_served), name="f")) as c:
        r = c.post("/v1/rank", json=slate)
        assert r.status_code == 200 and r.json()["note"] == "travels along"
        for field, value in (("top_n", 1), ("return_documents", False)):
            r = c.post("/v1/rank", json=slate | {field: value})
            assert r.status_code == 422, r.text
            error = error_of(r)
            assert (error["type"], error["param"]) == ("invalid_slate", field)
            assert error["message"].startswith(f"'{field}' is a /v1/rerank field")


@pytest.mark.parametrize("n", [3, 20])
def test_a_served_slate_has_its_features_normalised_once(features_served, monkeypatch, n):
    """The check on the request's thread normalises a slate's features and its batch reads
    them as they are (a slate over K, each window its candidates' rows): one normalisation a
    slate, counted, and the ranking the model gives the slate itself."""
    from spdrank.core.features import FeatureNormalizer
    from spdrank.core.slates import Slate
    from spdrank.rankers.windows import WindowedRanker, Windows
    from spdrank.serving.settings import ServeSettings

    model = SPDRanker.from_pretrained(features_served)
    slate = {"query": {"qid": "u1", "text": "1. rose shampoo"}, "candidates": [
        {"docid": f"d{i}", "doc": {"title": f"item {i}"}, "score": (7 * i % n) / n,
         "features": {"pop": (3 * i) % 5}} for i in range(n)
    ]}
    alone = Slate.from_dict(slate, text_fields=model.config.text_fields)
    windows = Windows(K, K // 2)
    expected = (model.rank(alone.query, alone.candidates) if n <= K
                else WindowedRanker(model, windows).rank(alone))
    normalised = []
    real = FeatureNormalizer.__call__
    monkeypatch.setattr(FeatureNormalizer, "__call__",
                        lambda self, s: normalised.append(len(s)) or real(self, s))
    settings = ServeSettings(window=windows.window, window_stride=windows.stride)
    with TestClient(create_app(model, name="f", settings=settings)) as c:
        r = c.post("/v1/rank", json=slate)
    assert r.status_code == 200, r.text
    assert normalised == [n]
    assert [x["docid"] for x in r.json()["candidates"]] == expected.docids


def test_serve_command_warms_up_a_features_model(features_served, monkeypatch):
    import uvicorn

    from spdrank.commands.cli import build_parser

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    args = build_parser().parse_args(["serve", "--model", str(features_served), "--device", "cpu"])
    assert args.func(args) == 0
    assert seen["app"].state.engine.features == ("pop", "score")


# -- one source for each thing the server defines ---------------------------------------------


def test_every_serve_setting_is_a_flag_with_its_default(served):
    import dataclasses

    from spdrank.commands.cli import build_parser
    from spdrank.commands.serve import settings_from_args

    parser = build_parser()
    args = parser.parse_args(["serve", "--model", str(served[1])])
    serve = parser._subparsers._group_actions[0].choices["serve"]
    by_dest = {a.dest: a for a in serve._actions}
    for f in dataclasses.fields(ServeSettings):
        action = by_dest[f.name]
        assert action.option_strings == ["--" + f.name.replace("_", "-")]
        # A flag that needs another has no default of its own: None tells it was left out.
        assert action.default == (None if f.metadata.get("needs") else f.default)
        assert f.default == getattr(ServeSettings(), f.name)
        assert action.type is type(f.default), f.name
        assert f"(default: {f.default})" in action.help
    assert tuple(by_dest["batch_policy"].choices) == ("auto", "padded", "bucketed", "single")
    assert settings_from_args(args) == ServeSettings()


def test_rerank_and_rank_build_the_same_slate(served):
    from spdrank.core.slates import Candidate, Query, Slate
    from spdrank.serving.engine import Engine
    from spdrank.serving.intake import admit, rerank_request, rerank_slate

    engine = Engine(served[0], "tiny-spd")
    texts = ["argan hair oil", "rose shampoo"]
    req = rerank_request({"query": "1. rose", "documents": [texts[0], {"text": texts[1]}]}, engine)
    field = engine.text_field
    as_rank = {
        "query": {"qid": "", "text": "1. rose"},
        "candidates": [{"docid": str(i), "doc": {field: t}} for i, t in enumerate(texts)],
    }
    direct = Slate(Query("", "1. rose"), [Candidate(str(i), {field: t}, scored=False)
                                          for i, t in enumerate(texts)])
    assert rerank_slate(req, engine).slate == admit(as_rank, engine).slate == direct


def test_one_fallback_score_for_a_ranking_without_scores(served):
    import io
    from types import SimpleNamespace

    import numpy as np

    from spdrank.core.outputs import result_record, write_trec_lines
    from spdrank.core.ranking import Ranking, rank_scores
    from spdrank.core.slates import Candidate, Query, Slate
    from spdrank.methods.spd.method import SPDMethod
    from spdrank.serving.batcher import Done
    from spdrank.serving.engine import Ranked
    from spdrank.serving.replies import rerank_reply
    from spdrank.serving.schemas import RerankRequest

    n = 4
    want = [1.0 - r / n for r in range(n)]
    assert rank_scores(n) == want
    # SPD reports its relevance: on a matrix that says nothing, every item's is alike.
    assert SPDMethod().ranked_scores(np.zeros((n, n)), np.array([2, 0, 3, 1])) == pytest.approx(
        [1.0 - (n - 1) / 2 / n] * n)
    bare = Ranking(["2", "0", "3", "1"])
    assert bare.reported_scores() == want
    assert Ranking(["a", "b"], [3, 1]).reported_scores() == [3.0, 1.0]
    slate = Slate(Query("u", "q"), [Candidate(str(i), {"title": f"t{i}"}) for i in range(n)])
    assert [c["score"] for c in result_record(slate, bare)["candidates"]] == want
    trec = io.StringIO()
    write_trec_lines(trec, slate, bare, "tag")
    assert [float(line.split()[4]) for line in trec.getvalue().splitlines()] == want
    req = RerankRequest.model_validate({"query": "q", "documents": [f"t{i}" for i in range(n)]})
    done = Done(Ranked(bare, [False] * n, False, 10), batch_size=1, queue_ms=0, inference_ms=1)

    request = SimpleNamespace(scope={})
    reply = rerank_reply(req, "m", request, done)  # type: ignore[arg-type]
    assert [x["relevance_score"] for x in reply["results"]] == want


def test_every_served_path_is_a_known_metrics_route(client):
    from spdrank.serving.routes import KNOWN_ROUTES, route_label

    served_paths = {r.path for r in client.app.routes} - {"/docs/oauth2-redirect"}
    assert served_paths == KNOWN_ROUTES
    assert route_label("/v1/rank") == "/v1/rank" and route_label("/wp-admin") == "other"
