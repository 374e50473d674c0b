"""Hostile input: every bad file line, request or checkpoint is a clear error, never a traceback
or a 500 (issue 21). Files and requests pass one gate (spdrank.core.validation), so most cases are
checked through both the CLI and the server.

The model is features-only (no backbone: it loads in milliseconds); the checks under test run
before any model code, so what they refuse holds for every model.
"""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from spdrank.backbone.trust import require_safetensors
from spdrank.commands.cli import main
from spdrank.core.slates import SlateError, iter_slates, read_slates, unique_qids
from spdrank.model.ranker import SPDRanker
from spdrank.serving import create_app
from tests.helpers import save_features_only_model

K = 4

GOOD = {
    "query": {"qid": "u1", "text": "1. rose shampoo", "history": ["i1", "i2"]},
    "candidates": [
        {"docid": "a", "doc": {"title": "argan oil"}, "score": 0.9, "features": {"pop": 3}},
        {"docid": "b", "doc": {"title": "lotion"}, "score": 0.1, "features": {"pop": 0}},
    ],
    "clicked": ["a"],
}


def good(qid: str = "u1") -> dict:
    slate = copy.deepcopy(GOOD)
    slate["query"]["qid"] = qid
    return slate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A features-only model (K = 4) reading 'pop' and the candidates' score."""
    return save_features_only_model(tmp_path_factory.mktemp("hostile") / "features-spd", K)


@pytest.fixture(scope="module")
def client(model_dir):
    with TestClient(create_app(SPDRanker.from_pretrained(model_dir), name="f")) as c:
        yield c


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def edited(old: str, new: str, **extra) -> str:
    """The JSON line of the good slate ``u2`` (with the ``extra`` top-level fields) with ``old``
    replaced by ``new``: text no dict dumps to (NaN, a 400-digit number, a lone surrogate)."""
    return json.dumps(good("u2") | extra).replace(old, new)


# Each case: (a JSON line, as written; the field the error must name; a phrase of the error).
# Line 1 of the file is a good slate, the bad one is line 2.
HUGE = "9" * 400
BAD_LINES = {
    "huge_int_score": (
        edited('"score": 0.9', f'"score": {HUGE}'), "candidates[0].score", "beyond the float range",
    ),
    "huge_int_feature": (
        edited('"pop": 3', f'"pop": {HUGE}'), "features.pop", "beyond the float range",
    ),
    "docid_of_5000_digits": (
        edited('"docid": "a"', '"docid": ' + "7" * 5000),
        "candidates[0].docid", "integer of 5000 digits",
    ),
    "nan_score": (
        edited('"score": 0.9', '"score": NaN'), "candidates[0].score", "NaN is not valid JSON",
    ),
    "infinity_score": (
        edited('"score": 0.9', '"score": Infinity'),
        "candidates[0].score", "Infinity is not valid JSON",
    ),
    "minus_infinity_feature": (
        edited('"pop": 3', '"pop": -Infinity'),
        "candidates[0].features.pop", "-Infinity is not valid JSON",
    ),
    "1e999_score": (
        edited('"score": 0.9', '"score": 1e999'), "candidates[0].score", "beyond the float range",
    ),
    "1e999_extra_field": (
        edited('"weight": 1', '"weight": 1e999', weight=1), "weight", "beyond the float range",
    ),
    "surrogate_title": (
        edited("argan oil", "argan \\ud800 oil"),
        "candidates[0].doc.title", "lone UTF-16 surrogate",
    ),
    "surrogate_query": (
        edited("rose shampoo", "rose \\udfff"), "query.text", "lone UTF-16 surrogate",
    ),
    "surrogate_qid": (
        edited('"qid": "u2"', '"qid": "u\\ud83d"'), "query.qid", "lone UTF-16 surrogate",
    ),
    "surrogate_key": (
        edited('"x": 1', '"\\ud800": 1', x=1), "a key of the value", "lone UTF-16 surrogate",
    ),
    "boolean_qid": (
        edited('"qid": "u2"', '"qid": true'), "query.qid", "must be a string, got bool",
    ),
    "boolean_history": (
        edited('["i1", "i2"]', '["i1", false]'), "query.history[1]", "must be a string, got bool",
    ),
    # Ids a TREC run line cannot carry are refused as they are read, not only at --trec.
    "empty_docid": (edited('"docid": "a"', '"docid": ""'), "candidates[0].docid", "is empty"),
    "nul_in_docid": (
        edited('"docid": "a"', '"docid": "a\\u0000"'), "candidates[0].docid", "U+0000",
    ),
    "rlo_in_qid": (
        edited('"qid": "u2"', '"qid": "u\\u202e2"'), "query.qid", "U+202E RIGHT-TO-LEFT OVERRIDE",
    ),
    "space_in_docid": (
        edited('"docid": "b"', '"docid": "b c"'), "candidates[1].docid", "holds whitespace",
    ),
    "tab_in_history": (
        edited('["i1", "i2"]', '["i1", "i\\t2"]'), "query.history[1]", "holds whitespace",
    ),
    "zero_width_relevance_key": (
        edited('{"a": 1}', '{"\\u200b": 1}', relevance={"a": 1}), "relevance",
        "U+200B ZERO WIDTH SPACE",
    ),
    "null_docid": (
        edited('"docid": "a"', '"docid": null'), "candidates[0].docid", "must be a string",
    ),
    "object_docid": (
        edited('"docid": "a"', '"docid": {"a": 1}'), "candidates[0].docid", "must be a string",
    ),
    "nested_too_deep_extra": (
        edited('"deep": 1', '"deep": ' + "[" * 80 + "]" * 80, deep=1), "deep", "nested too deeply",
    ),
    "nested_100000_deep": ("[" * 100_000 + "]" * 100_000, None, "nested too deeply"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_lines_name_file_line_and_field(tmp_path, case):
    line, field, phrase = BAD_LINES[case]
    path = write_lines(tmp_path / "slates.jsonl", [json.dumps(good()), line])
    with pytest.raises(SlateError) as info:
        list(read_slates(path))
    message = str(info.value)
    assert message.startswith(f"{path}:2: ") and phrase in message, message
    if field is not None:
        assert field in message and "\n" not in message, message


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_the_cli_exits_2_with_one_line(tmp_path, model_dir, capsys, case):
    line, _, phrase = BAD_LINES[case]
    path = write_lines(tmp_path / "slates.jsonl", [json.dumps(good()), line])
    out = tmp_path / "ranked.jsonl"
    code = main(["rank", "--model", str(model_dir), "--input", str(path), "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    errors = [e for e in err if "error:" in e]
    assert code == 2 and len(errors) == 1 and f"{path}:2" in errors[0] and phrase in errors[0]
    assert "Traceback" not in "\n".join(err) and not out.exists()  # nothing partial written


@pytest.mark.parametrize("case", [c for c in BAD_LINES if c != "nested_100000_deep"])
def test_the_server_refuses_the_same_lines_with_a_4xx_naming_the_field(client, case):
    line, field, phrase = BAD_LINES[case]
    r = client.post("/v1/rank", content=line.encode("utf-8", "surrogatepass"),
                    headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert phrase in error["message"] and field in error["message"], error
    param = {"huge_int_feature": "candidates[0].features.pop", "surrogate_key": None}
    if case == "nested_too_deep_extra":  # the path, cut short
        assert error["param"].startswith("deep[0][0]") and error["param"].endswith("..."), error
    else:
        assert error["param"] == param.get(case, field), error


def test_a_100000_deep_body_is_a_400(client):
    r = client.post("/v1/rank", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"query": "q\ud800", "documents": ["a"]}, "query"),
        ({"query": "q", "documents": ["a", "b\udc00"]}, "documents[1]"),
        ({"query": "q", "documents": [{"text": "\ud800"}]}, "documents[0].text"),
        ({"query": "q", "documents": ["a"], "top_n": float("inf")}, "top_n"),
    ],
)
def test_rerank_refuses_surrogates_and_infinities_with_a_422(client, body, field):
    content = json.dumps(body).encode("utf-8")  # json escapes lone surrogates as \udXXX
    r = client.post("/v1/rerank", content=content, headers={"content-type": "application/json"})
    assert r.status_code in (400, 422), r.text
    error = r.json()["error"]
    assert error["param"] == field and field in error["message"], error


def test_a_feature_the_normaliser_cannot_hold_is_refused_not_a_broken_matrix(
    tmp_path, client, model_dir, capsys
):
    slate = good()
    slate["candidates"][1]["features"]["pop"] = 1.7e308  # finite, but (x - 1) / 0.5 is not
    r = client.post("/v1/rank", json=slate)
    assert r.status_code == 422, r.text
    message = r.json()["error"]["message"]
    assert "candidates[1] (docid 'b') has 'pop' = 1.7e+308, beyond what this model" in message
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(slate)])
    code = main(["rank", "--model", str(model_dir), "--input", str(path),
                 "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and f"{path}:1: " in err and "beyond what this model" in err


@pytest.mark.parametrize("field,value", [("pop", 1e20), ("score", -4e19), ("pop", 3e6)])
def test_a_feature_far_outside_training_is_refused_not_a_nan_matrix(
    tmp_path, client, model_dir, capsys, field, value
):
    # Finite, and finite in float32 once normalised, but the head's LayerNorm squares it
    # (1e20 gave a NaN score matrix: a 500 blaming the model, and no file:line from the CLI).
    slate = good()
    if field == "score":
        slate["candidates"][0]["score"] = value
    else:
        slate["candidates"][0]["features"][field] = value
    r = client.post("/v1/rank", json=slate)
    assert r.status_code == 422, r.text
    assert f"has '{field}' = {value:g}, beyond what this model can represent" in r.text
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(good("ok")), json.dumps(slate)])
    out = tmp_path / "o.jsonl"
    code = main(["rank", "--model", str(model_dir), "--input", str(path), "--output", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{path}:2: " in err and "standard deviations" in err and not out.exists()
    slate["candidates"][0]["features"]["pop"] = slate["candidates"][0]["score"] = 1e5
    assert client.post("/v1/rank", json=slate).status_code == 200  # far, but computable


def test_model_limits_name_file_and_line(tmp_path, model_dir, capsys):
    too_many = good("big")
    too_many["candidates"] = [
        {"docid": f"d{i}", "doc": {"title": f"t{i}"}, "features": {"pop": i}} for i in range(K + 1)
    ]
    too_many["clicked"] = ["d0"]
    no_feature = good("nf")
    del no_feature["candidates"][1]["features"]
    for bad, phrase in ((too_many, f"ranks at most {K}"), (no_feature, "has no feature 'pop'")):
        path = write_lines(tmp_path / "s.jsonl", [json.dumps(good()), json.dumps(bad)])
        code = main(["rank", "--model", str(model_dir), "--input", str(path),
                     "--output", str(tmp_path / "o.jsonl")])
        err = capsys.readouterr().err
        assert code == 2 and f"{path}:2: " in err and phrase in err, err


def test_duplicate_qids_are_refused_with_both_lines(tmp_path, model_dir, capsys):
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(good("x")), json.dumps(good("y")),
                                              json.dumps(good("x"))])
    code = main(["rank", "--model", str(model_dir), "--input", str(path),
                 "--output", str(tmp_path / "o.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and f"{path}:3: duplicate qid 'x' (first at {path}:1)" in err
    blank = [good(""), good("")]  # rank_llm's bare query strings carry no qid: not refused
    path = write_lines(tmp_path / "b.jsonl", [json.dumps(s) for s in blank])
    assert len(list(unique_qids(iter_slates(path), allow_blank=True))) == 2
    with pytest.raises(SlateError, match="duplicate qid ''"):
        list(unique_qids(iter_slates(path)))


@pytest.mark.parametrize("content", [b"", b"\n  \n", gzip.compress(b"", mtime=0)], ids=["empty", "blank", "empty-gzip"])
def test_an_empty_input_is_an_error(tmp_path, model_dir, capsys, content):
    path = tmp_path / ("empty.jsonl.gz" if content.startswith(b"\x1f\x8b") else "empty.jsonl")
    path.write_bytes(content)
    out = tmp_path / "o.jsonl"
    code = main(["rank", "--model", str(model_dir), "--input", str(path), "--output", str(out)])
    assert code == 2 and "holds no slates" in capsys.readouterr().err and not out.exists()


def test_unreadable_paths_and_gzip_files(tmp_path, model_dir, capsys):
    data = "".join(json.dumps(good(f"q{i}")) + "\n" for i in range(100)).encode()
    not_gzip = tmp_path / "a.jsonl.gz"
    not_gzip.write_bytes(data)
    truncated = tmp_path / "b.jsonl.gz"
    truncated.write_bytes(gzip.compress(data)[:-30])
    directory = tmp_path / "dir.jsonl"
    directory.mkdir()
    for path, phrase in (
        (not_gzip, f"{not_gzip}:1: not a readable gzip file"),
        (truncated, "not a readable gzip file"),
        (directory, "is a directory"),
    ):
        code = main(["rank", "--model", str(model_dir), "--input", str(path),
                     "--output", str(tmp_path / "o.jsonl")])
        err = capsys.readouterr().err
        assert code == 2 and phrase in err and "Traceback" not in err, err


def test_ids_a_trec_line_cannot_carry_are_refused_as_read_with_or_without_trec(
    tmp_path, model_dir, capsys
):
    out, trec = tmp_path / "o.jsonl", tmp_path / "o.trec"
    spaced = write_lines(tmp_path / "s.jsonl", [json.dumps(good()), json.dumps(good("u 1"))])
    args = ["rank", "--model", str(model_dir), "--input", str(spaced), "--output", str(out)]
    for trec_args in ([], ["--trec", str(trec)]):
        assert main([*args, *trec_args]) == 2
        assert f"{spaced}:2: query.qid 'u 1' holds whitespace" in capsys.readouterr().err
        assert not out.exists() and not trec.exists()


def test_a_slate_without_a_qid_is_ranked_but_refused_by_trec(tmp_path, model_dir, capsys):
    # A qid may be left out of a slate (rank_llm's bare query string), not out of a run line.
    blank = good("")
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(good()), json.dumps(blank)])
    out, trec = tmp_path / "o.jsonl", tmp_path / "o.trec"
    args = ["rank", "--model", str(model_dir), "--input", str(path), "--output", str(out)]
    assert main([*args, "--trec", str(trec)]) == 2
    assert "query.qid '' cannot go into a TREC run line: it is empty" in capsys.readouterr().err
    assert not out.exists() and not trec.exists()
    assert main(args) == 0
    for line in out.read_text().splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in the output"))


def test_an_empty_docid_never_reaches_a_trec_line(tmp_path, model_dir, capsys):
    empty = good("u2")
    empty["candidates"][1]["docid"] = ""
    path = write_lines(tmp_path / "s.jsonl", [json.dumps(good()), json.dumps(empty)])
    trec = tmp_path / "o.trec"
    assert main(["rank", "--model", str(model_dir), "--input", str(path), "--output",
                 str(tmp_path / "o.jsonl"), "--trec", str(trec)]) == 2
    assert f"{path}:2: candidates[1].docid '' is empty" in capsys.readouterr().err
    assert not trec.exists()


def test_rank_keeps_a_slates_own_meta(client):
    slate = good() | {"meta": {"source": "bm25"}}
    r = client.post("/v1/rank", json=slate)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"] == {"source": "bm25"} and body["serve_meta"]["batch_size"] == 1
    r = client.post("/v1/rank", json=good())
    assert "batch_size" in r.json()["meta"] and "serve_meta" not in r.json()


def test_oversized_bodies_get_their_413_under_concurrency(model_dir):
    # Over a real socket: answering before the body was read closed the connection on clients
    # still uploading, so most saw a connection reset instead of the 413 (benchmarks/soak.py).
    import asyncio
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = create_app(SPDRanker.from_pretrained(model_dir), name="f")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    body = json.dumps(good() | {"pad": "x" * 1_200_000}).encode()
    outcomes: list[int | str] = []

    async def client() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:

            async def one() -> None:
                for _ in range(3):
                    try:
                        r = await c.post("/v1/rank", content=body,
                                         headers={"content-type": "application/json"})
                        outcomes.append(r.status_code)
                    except httpx.HTTPError as exc:
                        outcomes.append(type(exc).__name__)

            await asyncio.gather(*(one() for _ in range(16)))

    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        asyncio.run(client())
    finally:
        server.should_exit = True
        thread.join(30)
    assert outcomes == [413] * 48, sorted(map(str, outcomes))


def test_a_body_over_the_limit_in_its_last_chunk_is_answered_at_once():
    """Nothing is left to drain: the 413 must not wait for a message that never comes."""
    import asyncio

    from spdrank.serving.gate import Gate
    from spdrank.serving.metrics import ServerMetrics

    async def never_called(scope, receive, send):
        raise AssertionError("the app saw an over-large body")

    gate = Gate(never_called, max_body_bytes=10, metrics=ServerMetrics())
    messages = [{"type": "http.request", "body": b"x" * 11, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # a client that sent everything waits for the answer

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/v1/rank", "method": "POST", "headers": []}
    asyncio.run(asyncio.wait_for(gate(scope, receive, send), timeout=5))
    assert sent[0]["status"] == 413


# -- checkpoints --------------------------------------------------------------------------------


def copy_model(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_broken_checkpoints_are_errors_naming_the_path(tmp_path, model_dir):
    from safetensors.torch import load_file, save_file

    truncated = copy_model(model_dir, tmp_path / "truncated")
    head = truncated / "head.safetensors"
    head.write_bytes(head.read_bytes()[:5])
    with pytest.raises(ValueError, match=f"{head}: not a readable safetensors file"):
        SPDRanker.from_pretrained(truncated)

    missing = copy_model(model_dir, tmp_path / "missing")
    tensors = load_file(str(missing / "head.safetensors"))
    del tensors[next(iter(tensors))]
    save_file(tensors, str(missing / "head.safetensors"))
    with pytest.raises(ValueError, match="the weights do not fit the head in config.json"):
        SPDRanker.from_pretrained(missing)

    wider = copy_model(model_dir, tmp_path / "wider")
    config = json.loads((wider / "config.json").read_text())
    config["head"]["width"] = 32
    (wider / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{wider / 'head.safetensors'}: the weights do not fit"):
        SPDRanker.from_pretrained(wider)

    not_json = copy_model(model_dir, tmp_path / "not-json")
    (not_json / "config.json").write_text("{format: spdrank")
    with pytest.raises(ValueError, match=f"{not_json / 'config.json'}: not a JSON checkpoint"):
        SPDRanker.from_pretrained(not_json)
    (not_json / "config.json").write_text('{"format": "spdrank"}')
    with pytest.raises(ValueError, match="not a usable spdrank checkpoint config .missing field"):
        SPDRanker.from_pretrained(not_json)


def test_pickle_only_weight_directories_are_refused(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match=f"{adapter}: the adapter weights are pickles"):
        require_safetensors(adapter, "adapter")
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    require_safetensors(adapter, "adapter")  # safetensors present: fine
    with pytest.raises(FileNotFoundError, match="adapter directory is missing"):
        require_safetensors(tmp_path / "nope", "adapter")
    require_safetensors("HuggingFaceTB/SmolLM2-135M", "backbone")  # a hub id: the loader's


# -- training and the teacher -------------------------------------------------------------------


def signal_slate_dicts(n: int, unclicked: set[int]) -> list[dict]:
    """Slate JSON whose click is the candidate with 'signal' 1, except the ``unclicked`` ones."""
    out = []
    for i in range(n):
        slate = good(f"s{i}")
        for j, cand in enumerate(slate["candidates"]):
            cand["features"] = {"signal": float(j == i % 2)}
        slate["clicked"] = [] if i in unclicked else [slate["candidates"][i % 2]["docid"]]
        out.append(slate)
    return out


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_clicks_training_skips_slates_without_a_click(tmp_path, capsys, suffix):
    lines = "".join(json.dumps(s) + "\n" for s in signal_slate_dicts(10, unclicked={2, 5, 7}))
    path = tmp_path / f"train{suffix}"
    path.write_bytes(gzip.compress(lines.encode()) if suffix.endswith(".gz") else lines.encode())
    args = [
        "train", "--slates", str(path), "--target", "clicks", "--features", "signal",
        "--features-only", "--positions", "4", "--head-width", "16", "--max-steps", "2",
        "--batch-size", "4", "--warmup-steps", "0", "--no-progress", "--device", "cpu",
    ]
    assert main([*args, "--out", str(tmp_path / "run")]) == 0
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["train_slates"] == 7 and summary["skipped_slates"] == 3
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "strict"), "--require-clicks"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: " in err and "has no 'clicked' items" in err


def test_teacher_refuses_a_surrogate_title_before_labelling(tmp_path, capsys):
    bad = json.dumps(good("u2")).replace("argan oil", "argan \\ud800")
    path = write_lines(tmp_path / "slates.jsonl", [json.dumps(good()), bad])
    out = tmp_path / "labels.jsonl"
    code = main(["teacher", "--slates", str(path), "--out", str(out), "--backend",
                 "ranker:random", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"{path}:2: candidates[0].doc.title" in err
    assert not out.exists()  # no empty label file left behind
