"""Messages that must say what happens: a slate over K names the flag that ranks it (``--window``),
and ``serve``'s startup line tells the model's K from ``--max-documents``."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from spdrank.commands.cli import main
from spdrank.model.ranker import SPDRanker
from spdrank.serving import create_app
from spdrank.serving.settings import ServeSettings
from tests.helpers import save_features_only_model

K = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_features_only_model(tmp_path_factory.mktemp("honest") / "features-spd", K)


def _slate(n: int) -> dict:
    return {"query": {"qid": "q1", "text": "argan"},
            "candidates": [{"docid": f"d{i}", "doc": {"title": f"item {i}"}, "score": 1.0 / (i + 1),
                            "features": {"pop": i}} for i in range(n)]}


def test_a_slate_over_k_names_the_window_flag(model_dir, tmp_path, capsys):
    slates = tmp_path / "long.jsonl"
    slates.write_text(json.dumps(_slate(K + 2)) + "\n")
    code = main(["rank", "--model", str(model_dir), "--input", str(slates), "--output",
                 str(tmp_path / "out.jsonl")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"has {K + 2} candidates; this model ranks at most {K} (its K) in one pass" in err
    assert f"--window {K} ranks a longer list by sliding windows" in err
    # With the flag it names, the same slate is ranked.
    assert main(["rank", "--model", str(model_dir), "--input", str(slates), "--output",
                 str(tmp_path / "out.jsonl"), "--window", str(K)]) == 0


def test_serve_logs_the_models_k_apart_from_max_documents(model_dir, caplog):
    model = SPDRanker.from_pretrained(model_dir)
    with caplog.at_level(logging.INFO, logger="spdrank.serving.app"):
        with TestClient(create_app(model, name="m")):
            pass
        windowed = ServeSettings(window=K, window_stride=2, max_documents=200)
        with TestClient(create_app(model, name="m", settings=windowed)):
            pass
    plain, slid = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving")]
    assert f"(K={K}, at most {K} documents a request, in one pass," in plain
    assert (f"(K={K}, at most 200 documents a request (--max-documents), those over {K} by "
            f"sliding windows of {K} (--window),") in slid
    assert "K=200" not in slid
