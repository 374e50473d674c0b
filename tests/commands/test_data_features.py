"""``spdrank data features``: any ranker's score as a feature, leak-free on the training file,
each text embedded once by dense, resumable after a crash, and its refusals."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest

from spdrank.commands import data_features
from spdrank.commands.cli import main
from spdrank.commands.named_rankers import build_rankers, fit_rankers
from spdrank.core.ranking import rank_scores
from spdrank.core.slates import read_slates, training_sequence
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions
from spdrank.rankers.baselines import CooccurrenceRanker, PopularityRanker
from tests.helpers import save_features_only_model, walking_log

N_ITEMS = 30


def write_log(folder: Path, users: int = 40, length: int = 6) -> tuple[Path, Path]:
    """Users who walk i, i+1, ... through the items, and the items' titles."""
    return walking_log(folder, users, length, N_ITEMS)


def build(folder: Path, **options) -> Path:
    seqs, titles = write_log(folder)
    out = folder / "slates"
    build_from_files(seqs, titles, out, BuildOptions(candidates=8, eval_fraction=0.25,
                                                     **options), progress=False)
    return out


def features(path: Path, *names: str) -> list[list[dict[str, float]]]:
    """Each slate's candidates' ``names`` values."""
    return [[{n: c.features[n] for n in names} for c in s.candidates] for s in read_slates(path)]


def run(*argv: str) -> int:
    return main(["data", "features", "--no-progress", *argv])


def order_by(values: list[float]) -> list[int]:
    """Candidate indices by value, ties in candidate order (how a ranking by scores sorts)."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def test_popularity_on_the_training_file_leaves_each_user_out(tmp_path: Path) -> None:
    """On the training file a slate's own sequence is not counted: the values equal the
    builder's leave-one-user-out features, and a refit without the user (co-occurrence's
    rank-derived score)."""
    out = build(tmp_path, features=("popularity", "cooccurrence"))
    train = out / "train.jsonl"
    dst = tmp_path / "f.jsonl"
    assert run("--slates", str(train), "--out", str(dst), "--add", "pop=popularity",
               "--add", "co=cooccurrence") == 0
    slates = list(read_slates(train))
    featured = list(read_slates(dst))
    for slate, done in zip(slates, featured):
        for c in done.candidates:
            # the builder's popularity is log1p of the count without the slate's user
            assert round(math.log1p(c.features["pop"]), 6) == c.features["popularity"]
        others = [training_sequence(s) for s in slates if s.query.qid != slate.query.qid]
        refit = CooccurrenceRanker()
        refit.fit_sequences(others)
        ranking = refit.rank(slate)
        expected = dict(zip(ranking.docids, rank_scores(len(slate))))
        assert [c.features["co"] for c in done.candidates] == [expected[d] for d in slate.docids]
    # and a slate's own target would have counted: without leaving out, values differ
    whole = PopularityRanker()
    whole.fit(slates)
    target = slates[0].clicked[0]
    value = next(c.features["pop"] for c in featured[0].candidates if c.docid == target)
    assert whole.scores(slates[0])[slates[0].docids.index(target)] == value + 1


def test_values_on_eval_slates_are_what_eval_ranks_by(tmp_path: Path) -> None:
    out = build(tmp_path)
    slates_path = out / "eval.jsonl"
    dst = tmp_path / "f.jsonl"
    specs = ["popularity", "cooccurrence", "fusion:rrf:popularity+cooccurrence"]
    argv = ["--slates", str(slates_path), "--out", str(dst)]
    assert run(*argv, *[x for s in specs for x in ("--add", s)]) == 0
    rankers = build_rankers(specs)
    fit_rankers(rankers, out / "train.jsonl", progress=False)
    names = [data_features.feature_name(s) for s in specs]
    assert names == ["popularity", "cooccurrence", "fusion_rrf_popularity_cooccurrence"]
    for slate, done in zip(read_slates(slates_path), read_slates(dst)):
        for ranker, name in zip(rankers, names):
            ranking = ranker.rank(slate)
            values = [c.features[name] for c in done.candidates]
            # the ranker's order is the order of the feature
            assert [slate.docids[i] for i in order_by(values)] == ranking.docids
            if ranker.ranks_by_scores:
                assert dict(zip(ranking.docids, ranking.scores)) == dict(
                    zip(slate.docids, values))


def test_a_run_and_a_feature_are_values_too(tmp_path: Path) -> None:
    out = build(tmp_path)
    slates = list(read_slates(out / "eval.jsonl"))
    run_file = tmp_path / "runs" / "mine.trec"
    run_file.parent.mkdir()
    lines = [f"{s.query.qid} Q0 {d} {r + 1} {10.0 - r} tag"
             for s in slates for r, d in enumerate(s.docids[:5])]
    run_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    dst = tmp_path / "f.jsonl"
    assert run("--slates", str(out / "eval.jsonl"), "--out", str(dst),
               "--add", f"run:{run_file}") == 0
    for done in read_slates(dst):
        values = [c.features["mine"] for c in done.candidates]
        assert values[:5] == [10.0, 9.0, 8.0, 7.0, 6.0]
        assert all(v == math.nextafter(6.0, -math.inf) for v in values[5:])


def test_sasrec_on_the_training_file_is_refused_unless_the_build_fitted_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build(tmp_path)
    assert run("--slates", str(out / "train.jsonl"), "--out", str(tmp_path / "f.jsonl"),
               "--add", "sasrec") == 2
    err = capsys.readouterr().err
    assert "is in its fit" in err and "--features ...,sasrec" in err


def test_two_adds_one_name_an_existing_feature_and_out_over_in_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build(tmp_path, features=("popularity",))
    train = str(out / "train.jsonl")
    dst = tmp_path / "f.jsonl"
    assert run("--slates", train, "--out", str(dst), "--add", "popularity",
               "--add", "popularity=cooccurrence") == 2
    assert "both write the feature 'popularity'" in capsys.readouterr().err
    assert run("--slates", train, "--out", str(dst), "--add", "popularity") == 2
    err = capsys.readouterr().err
    assert "already holds feature 'popularity'" in err and "train.jsonl:1" in err
    assert run("--slates", train, "--out", str(dst), "--add", "popularity", "--overwrite") == 0
    assert run("--slates", train, "--out", train, "--add", "x=popularity") == 2
    assert "is the same file as --slates" in capsys.readouterr().err
    assert run("--slates", train, "--out", str(dst), "--add", "nonsense") == 2
    assert "unknown baseline 'nonsense'" in capsys.readouterr().err
    assert run("--slates", train, "--out", str(dst), "--add", "score=popularity") == 2
    assert "'score' is the candidate's own score field" in capsys.readouterr().err


def test_a_non_finite_value_names_the_slate_and_the_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build(tmp_path)
    monkeypatch.setattr(PopularityRanker, "scores",
                        lambda self, slate, leave_out=None: [math.nan] * len(slate))
    assert run("--slates", str(out / "eval.jsonl"), "--out", str(tmp_path / "f.jsonl"),
               "--add", "popularity") == 2
    err = capsys.readouterr().err
    assert "eval.jsonl:1" in err and "candidates[0] (docid" in err and "nan" in err


def test_a_crash_resumes_to_the_bytes_of_an_uninterrupted_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build(tmp_path)
    slates = str(out / "train.jsonl")
    argv = ["--slates", slates, "--add", "popularity", "--add", "cooccurrence",
            "--add", "rrf=fusion:rrf:popularity+cooccurrence"]
    whole = tmp_path / "whole.jsonl"
    assert run(*argv, "--out", str(whole)) == 0

    monkeypatch.setattr(data_features, "CHUNK", 4)
    original = CooccurrenceRanker.rank
    calls = {"n": 0}

    def crashing(self, slate, leave_out=None):
        calls["n"] += 1
        if calls["n"] > 20:  # two chunks of 4, ranked alone and in the fusion
            raise RuntimeError("killed")
        return original(self, slate, leave_out)

    monkeypatch.setattr(CooccurrenceRanker, "rank", crashing)
    dst = tmp_path / "f.jsonl"
    with pytest.raises(RuntimeError, match="killed"):
        run(*argv, "--out", str(dst))
    partial = data_features.partial_path(dst)
    assert not dst.exists() and partial.exists()
    kept = partial.read_bytes().splitlines(keepends=True)
    assert len(kept) == 1 + 8  # the header and two whole chunks
    with open(partial, "ab") as fh:  # a kill in the middle of a line
        fh.write(b'{"query":{"qid":"u')
    monkeypatch.setattr(CooccurrenceRanker, "rank", original)
    assert run(*argv, "--out", str(dst)) == 0
    assert dst.read_bytes() == whole.read_bytes()
    assert not partial.exists()
    assert "8 of them from f.jsonl.partial" in capsys.readouterr().out


def test_a_partial_of_other_slates_or_another_command_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = build(tmp_path)
    dst = tmp_path / "f.jsonl"
    monkeypatch.setattr(data_features, "CHUNK", 4)
    original = PopularityRanker.rank
    calls = {"n": 0}

    def crashing(self, slate, leave_out=None):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("killed")
        return original(self, slate, leave_out)

    monkeypatch.setattr(PopularityRanker, "rank", crashing)
    argv = ["--out", str(dst), "--add", "popularity"]
    with pytest.raises(RuntimeError):
        run("--slates", str(out / "eval.jsonl"), *argv)
    monkeypatch.setattr(PopularityRanker, "rank", original)
    capsys.readouterr()
    assert run("--slates", str(out / "eval.jsonl"), *argv[:-1], "cooccurrence") == 2
    assert "left by another `spdrank data features` run" in capsys.readouterr().err
    lines = (out / "eval.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    (out / "eval.jsonl").write_text("".join([lines[1], lines[0], *lines[2:]]),
                                     encoding="utf-8")
    assert run("--slates", str(out / "eval.jsonl"), *argv) == 2
    err = capsys.readouterr().err
    assert "f.jsonl.partial:2" in err and "eval.jsonl:1's" in err and "--restart" in err
    assert run("--slates", str(out / "eval.jsonl"), *argv, "--restart") == 0
    assert len(list(read_slates(dst))) == len(lines)


def test_dense_embeds_each_distinct_text_once_and_scores_as_it_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spdrank.rankers import dense
    from tests.rankers.test_dense import _tiny_bert

    tiny = _tiny_bert(tmp_path / "bert")
    monkeypatch.setattr(dense, "minilm_path", lambda: tiny)
    words = ["flea", "tick", "moon", "tide", "dog", "cat"]
    rng = random.Random(1)
    rows = [{"query": {"qid": f"q{q}", "text": " ".join(rng.sample(words, 2))},
             "candidates": [{"docid": f"d{d}", "doc": {"text": " ".join(rng.sample(words, 2))}}
                            for d in rng.sample(range(12), 5)]}
            for q in range(9)]
    src = tmp_path / "s.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    embedded: list[list[str]] = []
    original = dense.DenseRanker.embed

    def counted(self, texts):
        embedded.append(list(texts))
        return original(self, texts)

    monkeypatch.setattr(dense.DenseRanker, "embed", counted)
    monkeypatch.setattr(data_features, "CHUNK", 4)
    dst = tmp_path / "f.jsonl"
    assert run("--slates", str(src), "--out", str(dst), "--add", "dense",
               "--add", "fused=fusion:rrf:dense+retriever") == 0
    texts = [t for call in embedded for t in call]
    distinct = {r["query"]["text"] for r in rows} | {
        c["doc"]["text"] for r in rows for c in r["candidates"]}
    assert sorted(texts) == sorted(distinct)  # each once, across chunks and rankers
    assert len(embedded) == 3  # one call a chunk (9 slates in chunks of 4)
    ranker = dense.DenseRanker()
    for slate, done in zip(read_slates(src), read_slates(dst)):
        values = [c.features["dense"] for c in done.candidates]
        assert values == pytest.approx(ranker.scores(slate), abs=1e-6)


def test_sasrec_loads_the_fit_its_build_made_and_then_features_the_training_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's fit holds no slate's target, so its scores of the training slates are
    leak-free: the command loads it and writes the builder's feature, to its rounding."""
    from spdrank.rankers.sasrec import SASRecRanker
    from spdrank.rankers.sasrec_config import SASREC, SASRecConfig

    tiny = SASRecConfig(dim=8, epochs=1, batch_size=16, dropout=0.1, max_len=8, lr=1e-2)
    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    original = SASRecRanker.__init__
    monkeypatch.setattr(SASRecRanker, "__init__",
                        lambda self, config=None, cache="default", name=SASREC:
                        original(self, tiny, cache, name))
    out = build(tmp_path, features=(SASREC,), sasrec=tiny)
    dst = tmp_path / "f.jsonl"
    assert run("--slates", str(out / "train.jsonl"), "--out", str(dst),
               "--add", "s=sasrec") == 0
    for done in read_slates(dst):
        values = [c.features["s"] for c in done.candidates]
        assert values == pytest.approx([c.features[SASREC] for c in done.candidates], abs=1e-6)


def test_a_second_run_on_the_same_out_is_refused_while_the_first_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run started on an --out another run is writing is refused at once, naming the
    partial, and the first writes each slate once."""
    out = build(tmp_path)
    slates = out / "eval.jsonl"
    dst = tmp_path / "f.jsonl"
    argv = ["--slates", str(slates), "--out", str(dst), "--add", "popularity"]
    monkeypatch.setattr(data_features, "CHUNK", 4)
    original = PopularityRanker.rank
    second: list[int] = []
    started: list[bool] = []

    def ranking_then_a_second_run(self, slate, leave_out=None):
        if not started and data_features.partial_path(dst).stat().st_size > 0:
            started.append(True)
            second.append(run(*argv))
        return original(self, slate, leave_out)

    monkeypatch.setattr(PopularityRanker, "rank", ranking_then_a_second_run)
    assert run(*argv) == 0
    assert second == [2]
    captured = capsys.readouterr()
    assert f"{dst}.partial is being written by another `spdrank data features` run" \
        in captured.err
    given = [s.query.qid for s in read_slates(slates)]
    assert [s.query.qid for s in read_slates(dst)] == given
    assert f"wrote {len(given):,} slates" in captured.out
    assert not data_features.partial_path(dst).exists()


def test_a_partial_a_finishing_run_unlinked_is_let_go_for_the_path_s_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between opening the partial and locking it, the run that held it may finish and unlink
    it: the lock must then be taken on the file the path names, not on the unlinked one."""
    partial = tmp_path / "f.jsonl.partial"
    partial.write_bytes(b"the finishing run's\n")
    from spdrank.core import journal

    real_flock = journal.fcntl.flock
    unlinked: list[int] = []

    def finishing_meanwhile(fd: int, op: int) -> None:
        if not unlinked:
            unlinked.append(os.fstat(fd).st_ino)
            partial.unlink()
        real_flock(fd, op)

    monkeypatch.setattr(journal.fcntl, "flock", finishing_meanwhile)
    fh = data_features.open_partial(partial, tmp_path / "f.jsonl")
    try:
        assert os.path.samestat(os.fstat(fh.fileno()), os.stat(partial))
        assert partial.read_bytes() == b""
    finally:
        data_features.close_partial(fh, partial)
    assert not partial.exists()  # left empty by a run that failed: removed


def write_run(slates: Path, path: Path, top: float = 10.0) -> None:
    """A TREC run scoring each slate's first five candidates ``top``, ``top - 1``, ..."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{s.query.qid} Q0 {d} {r + 1} {top - r} tag"
             for s in read_slates(slates) for r, d in enumerate(s.docids[:5])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def crash_after(monkeypatch: pytest.MonkeyPatch, calls: int) -> None:
    """Popularity raises ``RuntimeError('killed')`` after ``calls`` slates: a killed run."""
    original = PopularityRanker.rank
    seen = {"n": 0}

    def crashing(self, slate, leave_out=None):
        seen["n"] += 1
        if seen["n"] > calls:
            raise RuntimeError("killed")
        return original(self, slate, leave_out)

    monkeypatch.setattr(PopularityRanker, "rank", crashing)


def test_a_fusion_s_run_is_an_input_no_out_overwrites_and_a_resume_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run read as a fusion's component is refused as --out, as a run added alone is, and a
    resume after it changed is refused rather than mixing the old run's values with the new."""
    out = build(tmp_path)
    slates = out / "eval.jsonl"
    run_file = tmp_path / "runs" / "mine.trec"
    write_run(slates, run_file)
    before = run_file.read_bytes()
    fused = f"f=fusion:rrf:run:{run_file}+popularity"
    assert run("--slates", str(slates), "--out", str(run_file), "--add", fused) == 2
    assert "is the same file as --add fusion:'s component" in capsys.readouterr().err
    assert run_file.read_bytes() == before
    assert not data_features.partial_path(run_file).exists()

    dst = tmp_path / "f.jsonl"
    argv = ["--slates", str(slates), "--out", str(dst), "--add", fused]
    monkeypatch.setattr(data_features, "CHUNK", 4)
    crash_after(monkeypatch, 4)
    with pytest.raises(RuntimeError, match="killed"):
        run(*argv)
    monkeypatch.undo()
    write_run(slates, run_file, top=20.0)
    capsys.readouterr()
    assert run(*argv) == 2
    assert "left by another `spdrank data features` run" in capsys.readouterr().err
    assert run(*argv, "--restart") == 0
    fresh = tmp_path / "fresh.jsonl"
    assert run("--slates", str(slates), "--out", str(fresh), "--add", fused) == 0
    assert dst.read_bytes() == fresh.read_bytes()


def test_a_checkpoint_retrained_in_its_folder_is_another_input_to_a_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint is fingerprinted by the files it loads from: a resume after the model was
    retrained in the same folder, or its config.json edited, is refused rather than mixing two
    models' values; what a training run keeps beside its model does not count."""
    out = build(tmp_path)
    slates = tmp_path / "pop.jsonl"
    assert run("--slates", str(out / "eval.jsonl"), "--out", str(slates),
               "--add", "pop=popularity") == 0
    model = save_features_only_model(tmp_path / "m", positions=8)
    dst = tmp_path / "f.jsonl"
    argv = ["--slates", str(slates), "--out", str(dst), "--add", f"m={model}"]
    monkeypatch.setattr(data_features, "CHUNK", 4)
    original = data_features.set_values
    calls = {"n": 0}

    def crashing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("killed")
        return original(*args, **kwargs)

    monkeypatch.setattr(data_features, "set_values", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        run(*argv)
    monkeypatch.setattr(data_features, "set_values", original)
    head = (model / "head.safetensors").read_bytes()
    save_features_only_model(model, positions=8)  # retrained: other weights, same config
    assert (model / "head.safetensors").read_bytes() != head
    capsys.readouterr()
    assert run(*argv) == 2
    assert "left by another `spdrank data features` run" in capsys.readouterr().err

    trained = data_features.fingerprint(model)
    assert set(trained) == {"config.json", "head.safetensors"}
    config = model / "config.json"
    config.write_text(config.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert data_features.fingerprint(model) != trained
    training_run = tmp_path / "run"
    (training_run / "model").mkdir(parents=True)
    for name in ("config.json", "head.safetensors"):
        (training_run / "model" / name).write_bytes((model / name).read_bytes())
    before = data_features.fingerprint(training_run)
    (training_run / "log.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    assert data_features.fingerprint(training_run) == before == data_features.fingerprint(model)


def test_a_resume_from_another_directory_with_other_spellings_of_the_paths_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The partial's header names each file by its resolved path: the same command from
    another working directory, with absolute paths through a symlink, continues the partial
    relative paths began, to the bytes of an uninterrupted run."""
    out = build(tmp_path)
    write_run(out / "eval.jsonl", tmp_path / "runs" / "mine.trec")
    adds = ["--add", "run:runs/mine.trec", "--add", "f=fusion:rrf:run:runs/mine.trec+popularity"]
    monkeypatch.chdir(tmp_path)
    assert run("--slates", "slates/eval.jsonl", "--out", "whole.jsonl", *adds) == 0
    monkeypatch.setattr(data_features, "CHUNK", 4)
    original = PopularityRanker.rank
    crash_after(monkeypatch, 4)
    with pytest.raises(RuntimeError, match="killed"):
        run("--slates", "slates/eval.jsonl", "--out", "f.jsonl", *adds)
    monkeypatch.setattr(PopularityRanker, "rank", original)

    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert run("--slates", str(link / "slates" / "eval.jsonl"), "--out", str(link / "f.jsonl"),
               *[a.replace("runs/", f"{link}/runs/") for a in adds]) == 0
    assert "4 of them from f.jsonl.partial" in capsys.readouterr().out
    assert (tmp_path / "f.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()
    model = tmp_path / "training" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}", encoding="utf-8")
    assert data_features.resolved_spec(str(tmp_path / "training")) \
        == data_features.resolved_spec(str(link / "training" / "model")) == str(model)
