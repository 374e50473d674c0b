"""What the builder's SASRec is fitted on: every history the build has (each slate's user's
items but their target, in every split, and the whole sequences of users who make no slate),
and never a slate's target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from spdrank.core.slates import read_slates
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions
from spdrank.rankers.sasrec import SASRec
from spdrank.rankers.sasrec_config import SASREC, SASRecConfig

TINY = SASRecConfig(dim=8, epochs=1, batch_size=16, dropout=0.1, max_len=8, lr=1e-2)


@pytest.fixture(autouse=True)
def _one_thread_private_cache(tmp_path, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    yield
    torch.set_num_threads(threads)


N_ITEMS = 60


def write_log(folder: Path, users: int) -> tuple[Path, Path]:
    """User u walks i<u>, i<u+1>, ...: no two users share a sequence, no item repeats."""
    lines = [" ".join([f"u{u}", *(f"i{(u + k) % N_ITEMS}" for k in range(6))])
             for u in range(users)]
    seqs, titles = folder / "seq.txt", folder / "titles.tsv"
    seqs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    titles.write_text("item_id\ttitle\n" + "".join(f"i{i}\tItem {i}\n" for i in range(N_ITEMS)),
                      encoding="utf-8")
    return seqs, titles


def fitted(monkeypatch) -> list[list[list[str]]]:
    """The sequences handed to each SASRec fit."""
    calls: list[list[list[str]]] = []
    original = SASRec.fit.__func__

    def spy(cls, sequences, config=None, items=None, cache=None):
        seqs = [list(s) for s in sequences]
        calls.append(seqs)
        return original(cls, seqs, config, items, cache)

    monkeypatch.setattr(SASRec, "fit", classmethod(spy))
    return calls


def test_the_fit_holds_every_history_and_extra_sequence_and_no_target(tmp_path, monkeypatch):
    seqs, titles = write_log(tmp_path, users=40)
    logged = {line.split()[0]: line.split()[1:]
              for line in seqs.read_text(encoding="utf-8").splitlines()}
    # users u30..u39 have no candidate list: they make no slate and are only counted
    cands = tmp_path / "cands.txt"
    cands.write_text("".join(f"u{u} " + " ".join(f"i{(u + k) % N_ITEMS}" for k in range(8))
                             + "\n" for u in range(30)), encoding="utf-8")
    calls = fitted(monkeypatch)
    out = tmp_path / "slates"
    build_from_files(seqs, titles, out, BuildOptions(
        candidates=8, eval_fraction=0.25, validation=3, features=(SASREC,), sasrec=TINY),
        candidate_file=cands, progress=False)
    assert len(calls) == 1
    sequences = [tuple(s) for s in calls[0]]
    slates = {name: list(read_slates(out / name))
              for name in ("train.jsonl", "valid.jsonl", "eval.jsonl")}
    assert all(slates.values())
    for name, split in slates.items():
        for slate in split:
            items = logged[slate.query.qid]
            # the user's history is fitted, their target (the last item) never: the user's one
            # sequence (counted below) is items[:-1]
            assert tuple(items[:-1]) in sequences, (name, slate.query.qid)
            assert tuple(items) not in sequences
    extra = [u for u in logged if u not in {s.query.qid for v in slates.values() for s in v}]
    assert extra and all(tuple(logged[u]) in sequences for u in extra)
    assert len(sequences) == len(logged)  # one sequence a user, nothing else
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert "every user's items but their last" in manifest["policies"][SASREC]
