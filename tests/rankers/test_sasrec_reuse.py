"""One SASRec fit per set of inputs: the fit a build makes for its ``sasrec`` feature is the one
``spdrank eval --ranker sasrec`` ranks with on that build's slates, a second evaluation loads
its own earlier fit, and every fit says how far it is, epoch by epoch, under ``--no-progress``
too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from spdrank.commands.cli import main
from spdrank.core.slates import read_slates
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions
from spdrank.rankers.sasrec import SASRec, SASRecRanker
from spdrank.rankers.sasrec_config import SASREC, SASREC_FIT, SASRecConfig
from tests.helpers import walking_log

#: A fit of about a second on one thread.
TINY = SASRecConfig(dim=16, epochs=3, batch_size=16, dropout=0.1, max_len=8, lr=1e-2)
N_ITEMS = 30


@pytest.fixture(autouse=True)
def _one_thread_private_cache_tiny_ranker(tmp_path, monkeypatch):
    """One thread, a private cache for every fit, and the eval ranker on the tiny settings."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    original = SASRecRanker.__init__

    def tiny(self, config=None, cache="default", name=SASREC):
        original(self, TINY, cache, name)

    monkeypatch.setattr(SASRecRanker, "__init__", tiny)
    yield
    torch.set_num_threads(threads)


def fits(monkeypatch) -> list[int]:
    """Count the fits that train (not those loaded from the cache): one entry a fit."""
    trained: list[int] = []
    original = SASRec._train

    def counted(self, sequences):
        trained.append(len(sequences))
        return original(self, sequences)

    monkeypatch.setattr(SASRec, "_train", counted)
    return trained


def write_log(folder: Path, users: int = 60, length: int = 6) -> tuple[Path, Path]:
    """Users who walk i, i+1, ... through the items, and the items' titles."""
    return walking_log(folder, users, length, N_ITEMS)


def build(folder: Path, **options) -> Path:
    seqs, titles = write_log(folder)
    out = folder / "slates"
    build_from_files(seqs, titles, out, BuildOptions(candidates=8, eval_fraction=0.25,
                                                     sasrec=TINY, **options), progress=False)
    return out


def eval_sasrec(out: Path) -> int:
    return main(["eval", "--slates", str(out / "eval.jsonl"), "--ranker", "sasrec",
                 "--no-progress"])


def test_eval_ranks_with_the_fit_the_build_made_for_its_feature(tmp_path, monkeypatch, caplog):
    trained = fits(monkeypatch)
    out = build(tmp_path, features=(SASREC,))
    assert len(trained) == 1
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    key = manifest[SASREC_FIT]["key"]

    ranker = SASRecRanker()
    with caplog.at_level(logging.INFO):
        assert ranker.fit_build(out / "train.jsonl")
        assert eval_sasrec(out) == 0
    assert len(trained) == 1  # loaded, not fitted again
    assert ranker.model is not None and ranker.model.key == key
    assert any("the fit the build of" in r.getMessage() for r in caplog.records)
    # Asked again for the same file (a teacher asks before it fits, then fits): no second load.
    monkeypatch.setattr(SASRec, "cached", lambda *a, **k: pytest.fail("loaded a second time"))
    assert ranker.fit_build(out / "train.jsonl")
    # The same model as the slates' feature: its scores are the feature's, to its rounding.
    slate = next(iter(read_slates(out / "eval.jsonl")))
    feature = [c.features[SASREC] for c in slate.candidates]
    assert ranker.scores(slate) == pytest.approx(feature, abs=1e-6)


def test_a_changed_training_file_or_other_settings_fit_their_own(tmp_path, monkeypatch):
    trained = fits(monkeypatch)
    out = build(tmp_path, features=(SASREC,))
    other = SASRecRanker()
    other.config = SASRecConfig(**{**TINY.to_dict(), "epochs": 2})
    assert not other.fit_build(out / "train.jsonl")  # another setting: not the build's fit
    train = out / "train.jsonl"
    train.write_text("".join(reversed(train.read_text(encoding="utf-8").splitlines(True))),
                     encoding="utf-8")
    assert not SASRecRanker().fit_build(train)  # not the file the build wrote
    assert eval_sasrec(out) == 0
    assert len(trained) == 2


def test_a_second_evaluation_loads_the_first_ones_fit_and_a_fit_says_its_epochs(
    tmp_path, monkeypatch, caplog
):
    trained = fits(monkeypatch)
    out = build(tmp_path)  # no sasrec feature: the eval ranker fits its own
    with caplog.at_level(logging.INFO):
        assert eval_sasrec(out) == 0
    assert len(trained) == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "spdrank.rankers.sasrec"]
    assert lines[0].startswith("SASRec: fitting on ") and "3 epochs of " in lines[0]
    epochs = [line for line in lines if line.startswith("SASRec epoch ")]
    assert [line.split(":")[0] for line in epochs] == [f"SASRec epoch {e}/3" for e in (1, 2, 3)]
    assert all("s left" in line for line in epochs)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert eval_sasrec(out) == 0
    assert len(trained) == 1  # the second evaluation fitted nothing
    assert any("loaded the cached fit" in r.getMessage() for r in caplog.records)
