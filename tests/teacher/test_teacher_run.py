"""``spdrank teacher`` end to end: ranker and file backends, resumability, kill -9, shards."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import Slate, load_slates, training_sequence, write_slates
from spdrank.rankers.baselines import CooccurrenceRanker, FeatureRanker, PopularityRanker
from spdrank.teacher.labels import LabelStore
from tests.helpers import SRC, make_slates, records


@pytest.fixture
def data(tmp_path):
    write_slates(tmp_path / "train.jsonl", make_slates(40, seed=1, prefix="t"))
    write_slates(tmp_path / "slates.jsonl", make_slates(12, seed=2))
    return tmp_path


def teacher(data: Path, *extra: str, out: str = "labels.jsonl", backend: str = "ranker:cooccurrence") -> int:
    return main(
        ["teacher", "--slates", str(data / "slates.jsonl"), "--out", str(data / out),
         "--backend", backend, "--no-progress", *extra]
    )


def test_ranker_backend_end_to_end_and_rerun_skips(data, capsys):
    assert teacher(data, "--json", str(data / "summary.json")) == 0
    recs = records(data / "labels.jsonl")
    assert [r["qid"] for r in recs] == [f"u{i}" for i in range(12)]
    ranker = CooccurrenceRanker()
    ranker.fit(load_slates(data / "train.jsonl"))
    labelled = load_slates(data / "labels.slates.jsonl")
    for slate, rec in zip(labelled, recs):
        assert slate.teacher == rec["ranking"] == ranker.rank(slate).docids
        assert rec["status"] == "ok" and rec["decode_passes"] == 0
        assert rec["backend"] == "ranker:cooccurrence" and rec["mode"] == "direct"
        assert rec["raw"].startswith("[") and rec["n"] == len(slate) and "latency_ms" in rec
        # co-occurrence breaks its score ties by popularity: its scores are not its order
        assert "scores" not in rec and slate.teacher_scores is None
    summary = json.loads((data / "summary.json").read_text())
    assert summary["statuses"]["ok"] == 12 and summary["labelled_now"] == 12
    out = capsys.readouterr().out
    assert "ok" in out and "12 labelled now" in out

    before = (data / "labels.jsonl").read_bytes()
    assert teacher(data) == 0
    assert (data / "labels.jsonl").read_bytes() == before
    assert "12 already labelled, 0 labelled now" in capsys.readouterr().out


def test_a_rerun_with_another_backend_and_nothing_to_label_is_refused(data, capsys):
    assert teacher(data) == 0
    labels, slates = (data / "labels.jsonl").read_bytes(), (data / "labels.slates.jsonl").read_bytes()
    assert teacher(data, backend="ranker:popularity") == 2
    err = capsys.readouterr().err
    assert f"{data / 'labels.jsonl'}:1: all 12 selected slates are labelled already" in err
    assert "12 by ranker:cooccurrence" in err and "none by ranker:popularity" in err
    assert (data / "labels.jsonl").read_bytes() == labels
    assert (data / "labels.slates.jsonl").read_bytes() == slates
    assert teacher(data, "--prompt", "search") == 2  # the same backend under another prompt
    assert "none by ranker:cooccurrence (direct mode, search prompt)" in capsys.readouterr().err


def test_a_rerun_over_a_mixed_file_warns_as_the_run_that_mixed_it(data, caplog):
    assert teacher(data, "--limit", "4") == 0
    assert teacher(data, backend="ranker:popularity") == 0  # labels the 8 others
    mixed = "already holds 4 labels from ranker:cooccurrence"
    assert mixed in caplog.text
    caplog.clear()
    assert teacher(data, backend="ranker:popularity") == 0  # nothing to label: warned alike
    assert mixed in caplog.text


@pytest.mark.parametrize("backend", [
    "ranker:random", "ranker:bm25", "ranker:fusion:popularity+cooccurrence", "file",
])
def test_a_rerun_with_the_same_backend_and_nothing_to_label_says_nothing(data, caplog, backend):
    # The name the command gives before building the backend is the one its labels record.
    if backend == "file":
        slates = load_slates(data / "slates.jsonl")
        (data / "rankings.jsonl").write_text("".join(
            json.dumps({"qid": s.query.qid, "ranking": s.docids[::-1]}) + "\n" for s in slates))
        backend = f"file:{data / 'rankings.jsonl'}"
    assert teacher(data, backend=backend) == 0
    caplog.clear()
    assert teacher(data, backend=backend) == 0
    assert "already holds" not in caplog.text


def test_limit_and_custom_slates_out(data):
    assert teacher(data, "--limit", "3", "--slates-out", str(data / "x.jsonl")) == 0
    assert len(records(data / "labels.jsonl")) == 3
    assert [s.query.qid for s in load_slates(data / "x.jsonl")] == ["u0", "u1", "u2"]


def with_similarity(slates: list[Slate], seed: int = 0) -> list[Slate]:
    """The slates with a lexical score per candidate: mostly 0.0, as a title retriever gives."""
    rng = random.Random(seed)
    for slate in slates:
        for cand in slate.candidates:
            cand.features = {"title_similarity": rng.choice([0.0, 0.0, 0.0, 0.25, 0.5])}
    return slates


def test_lexical_teacher_records_its_scores_and_ties(tmp_path):
    slates = with_similarity(make_slates(12, seed=2))
    write_slates(tmp_path / "slates.jsonl", slates)  # no train.jsonl: nothing to fit
    assert teacher(tmp_path, backend="ranker:title_similarity") == 0
    recs = records(tmp_path / "labels.jsonl")
    labelled = load_slates(tmp_path / "labels.slates.jsonl")
    ranker = FeatureRanker("title_similarity")
    for slate, rec, out in zip(slates, recs, labelled):
        expected = ranker.rank(slate)
        assert rec["backend"] == "ranker:title_similarity" and rec["status"] == "ok"
        assert rec["ranking"] == expected.docids and rec["scores"] == expected.scores
        assert out.teacher == expected.docids and out.teacher_scores == expected.scores
    assert any(len(set(r["scores"])) < len(r["scores"]) for r in recs)  # ties were recorded
    assert '"teacher_scores":[' in (tmp_path / "labels.slates.jsonl").read_text()

    # a rerun writes the labelled slates again from the records on disk: the same bytes
    before = (tmp_path / "labels.slates.jsonl").read_bytes()
    (tmp_path / "labels.slates.jsonl").unlink()
    assert teacher(tmp_path, backend="ranker:title_similarity") == 0
    assert (tmp_path / "labels.slates.jsonl").read_bytes() == before

    # merge keeps the scores, and prefers the copy that has them
    bare = [{k: v for k, v in rec.items() if k != "scores"} for rec in recs[:4]]
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare))
    merge = ["teacher", "merge", "--slates", str(tmp_path / "slates.jsonl"),
             "--out", str(tmp_path / "m.jsonl")]
    labels = [str(tmp_path / "bare.jsonl"), str(tmp_path / "labels.jsonl")]
    assert main([*merge, "--labels", *labels]) == 0
    assert load_slates(tmp_path / "m.slates.jsonl") == labelled
    assert (tmp_path / "m.slates.jsonl").read_bytes() == before


def test_label_scores_are_checked_and_may_be_absent(tmp_path, capsys):
    slates = with_similarity(make_slates(3, seed=4))
    write_slates(tmp_path / "slates.jsonl", slates)
    assert teacher(tmp_path, backend="ranker:title_similarity") == 0
    recs = records(tmp_path / "labels.jsonl")
    merge = ["teacher", "merge", "--slates", str(tmp_path / "slates.jsonl"),
             "--out", str(tmp_path / "m.jsonl")]

    # old records without scores: labelled slates without teacher_scores
    (tmp_path / "old.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "scores"}) + "\n" for r in recs)
    )
    assert main([*merge, "--labels", str(tmp_path / "old.jsonl")]) == 0
    assert [s.teacher_scores for s in load_slates(tmp_path / "m.slates.jsonl")] == [None] * 3

    # scores that disagree with the ranking: an error naming file:line
    bad = dict(recs[1], scores=sorted(recs[1]["scores"]))
    bad["scores"][-1] += 1.0  # strictly increasing somewhere
    (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
    assert main([*merge, "--labels", str(tmp_path / "bad.jsonl"), "--allow-missing"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'bad.jsonl'}:1" in err and "'scores' must be non-increasing" in err

    # the same ranking with other scores is a conflict
    other = dict(recs[1], scores=[x + 1.0 for x in recs[1]["scores"]])
    (tmp_path / "other.jsonl").write_text(json.dumps(other) + "\n")
    labels = [str(tmp_path / "labels.jsonl"), str(tmp_path / "other.jsonl")]
    assert main([*merge, "--labels", *labels]) == 2
    assert "conflicting scores" in capsys.readouterr().err


def test_popularity_teacher_records_scores(data):
    assert teacher(data, backend="ranker:popularity") == 0
    ranker = PopularityRanker()
    ranker.fit(load_slates(data / "train.jsonl"))
    for slate in load_slates(data / "labels.slates.jsonl"):
        assert slate.teacher_scores == ranker.rank(slate).scores


def test_a_ranker_labelling_its_own_training_slates_leaves_each_ones_user_out(data, capsys):
    """Labelling the slates it was fitted on, a co-occurrence teacher counts none of a slate's
    own pairs (else it would put every slate's target first); a fusion, which cannot leave a
    user out, is refused and pointed to ``data features``."""
    train = str(data / "train.jsonl")
    assert main(["teacher", "--slates", train, "--out", str(data / "own.jsonl"),
                 "--backend", "ranker:cooccurrence", "--no-progress"]) == 0
    ranker = CooccurrenceRanker()
    ranker.fit(load_slates(data / "train.jsonl"))
    labelled = load_slates(data / "own.slates.jsonl")
    assert [s.teacher for s in labelled] == [
        ranker.rank(s, leave_out=training_sequence(s)).docids for s in labelled]
    assert any(s.teacher != ranker.rank(s).docids for s in labelled)
    capsys.readouterr()
    assert main(["teacher", "--slates", train, "--out", str(data / "fused.jsonl"), "--backend",
                 "ranker:fusion:rrf:cooccurrence+popularity", "--no-progress"]) == 2
    assert ("it cannot leave a user out; add it as a feature, `spdrank data features --slates "
            f"{train} --add 'fusion:rrf:cooccurrence+popularity' --out FILE`, which gives no "
            "slate its own target, and label FILE with --backend "
            "ranker:feature:fusion_rrf_cooccurrence_popularity") in capsys.readouterr().err
    assert not (data / "fused.jsonl").read_text()  # opened before the backend: no label


def test_file_backend_statuses_and_missing_qid(data, capsys):
    slates = load_slates(data / "slates.jsonl")
    lines = []
    for s in slates[1:]:  # u0 has no ranking in the file
        ranking = s.docids[::-1]
        if s.query.qid == "u1":
            ranking = ranking + [ranking[0]]  # repetition
        if s.query.qid == "u2":
            ranking = ["nope"] + ranking  # not a candidate
        if s.query.qid == "u3":
            ranking = ranking[:2]  # missing
        lines.append(json.dumps({"qid": s.query.qid, "ranking": ranking}))
    (data / "rankings.jsonl").write_text("\n".join(lines) + "\n")
    assert teacher(data, backend=f"file:{data / 'rankings.jsonl'}") == 1  # u0 left unlabelled
    recs = {r["qid"]: r for r in records(data / "labels.jsonl")}
    assert set(recs) == {f"u{i}" for i in range(1, 12)}
    assert (recs["u1"]["status"], recs["u2"]["status"], recs["u3"]["status"]) == (
        "repetition", "out_of_range", "missing",
    )
    assert recs["u4"]["status"] == "ok" and recs["u4"]["ranking"] == slates[4].docids[::-1]
    assert recs["u3"]["ranking"][:2] == slates[3].docids[::-1][:2]
    for s in slates[1:]:
        assert sorted(recs[s.query.qid]["ranking"]) == sorted(s.docids)
    assert not (data / "labels.slates.jsonl").exists()  # not all selected slates labelled
    assert "1 failed" in capsys.readouterr().out

    # Slates with teacher filled are a valid file too; the rerun labels only u0.
    write_slates(data / "teach.jsonl", [Slate(s.query, s.candidates, teacher=s.docids[::-1]) for s in slates])
    assert teacher(data, backend=f"file:{data / 'teach.jsonl'}") == 0
    assert records(data / "labels.jsonl")[-1]["qid"] == "u0"
    assert len(load_slates(data / "labels.slates.jsonl")) == 12
    assert all("scores" not in r for r in records(data / "labels.jsonl"))  # a file teacher's


def test_duplicate_qid_is_an_error_naming_file_and_line(data, capsys):
    lines = (data / "slates.jsonl").read_text().splitlines()
    (data / "dup.jsonl").write_text("\n".join(lines[:3] + [lines[1]]) + "\n")
    code = main(["teacher", "--slates", str(data / "dup.jsonl"), "--out", str(data / "l.jsonl"),
                 "--backend", "ranker:random", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and f"{data / 'dup.jsonl'}:4" in err and "duplicate qid 'u1'" in err


def test_torn_last_line_is_cut_away_and_relabelled(data, caplog):
    assert teacher(data, "--limit", "4") == 0
    good = (data / "labels.jsonl").read_bytes()
    with open(data / "labels.jsonl", "ab") as fh:
        fh.write(b'{"qid":"u4","status":"ok","ranking":["i1"')  # a write cut short
    assert teacher(data, "--limit", "5") == 0
    recs = records(data / "labels.jsonl")
    assert [r["qid"] for r in recs] == ["u0", "u1", "u2", "u3", "u4"]
    assert (data / "labels.jsonl").read_bytes().startswith(good)
    assert "torn last line" in caplog.text
    # A complete last line that is not JSON (e.g. zeros after a crash) is torn as well.
    with open(data / "labels.jsonl", "ab") as fh:
        fh.write(b"\x00\x00\x00\n")
    labels = LabelStore(data / "labels.jsonl")
    labels.close()
    assert len(labels.labels) == 5 and (data / "labels.jsonl").read_bytes().endswith(b"}\n")


@pytest.mark.parametrize("text", [
    b'{"model": "x", "lr": 0.1}',  # a config without its final newline
    b"important notes, no newline",
    b"notes\n",  # a whole line, but not JSON
    b"\n\nnotes",  # blank lines are no label record
])
def test_a_file_that_is_no_label_file_is_refused_not_cut(data, capsys, text):
    (data / "notes.txt").write_bytes(text)
    assert teacher(data, out="notes.txt") == 2
    err = capsys.readouterr().err
    line = text.count(b"\n") + 1 if not text.endswith(b"\n") else 1
    assert f"{data / 'notes.txt'}:{line}: not written by this command" in err
    assert (data / "notes.txt").read_bytes() == text
    assert not (data / "notes.slates.jsonl").exists()


@pytest.mark.parametrize("text", [b'{"qid":"u0","status":"o', b'{"q', b"\x00\x00\x00\n"])
def test_a_torn_first_record_is_still_cut_away(data, caplog, text):
    # What a crash leaves on the first append: the start of a record, or zeros.
    (data / "labels.jsonl").write_bytes(text)
    assert teacher(data, "--limit", "2") == 0
    assert [r["qid"] for r in records(data / "labels.jsonl")] == ["u0", "u1"]
    assert "torn last line" in caplog.text


def test_corrupt_line_inside_the_file_is_an_error(data, capsys):
    assert teacher(data, "--limit", "3") == 0
    lines = (data / "labels.jsonl").read_text().splitlines(keepends=True)
    lines[1] = "garbage\n"
    (data / "labels.jsonl").write_text("".join(lines))
    assert teacher(data) == 2
    assert f"{data / 'labels.jsonl'}:2" in capsys.readouterr().err


def test_kill_9_mid_run_loses_nothing_written(data):
    reference = data / "ref"
    reference.mkdir()
    assert main(["teacher", "--slates", str(data / "slates.jsonl"), "--out", str(reference / "l.jsonl"),
                 "--backend", "ranker:random", "--no-progress"]) == 0
    out = data / "labels.jsonl"
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spdrank", "teacher", "--slates", str(data / "slates.jsonl"),
         "--out", str(out), "--backend", "ranker:random", "--no-progress", "--debug-delay", "0.2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
    )
    deadline = time.monotonic() + 60
    while not (out.exists() and out.read_bytes().count(b"\n") >= 3):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "the teacher wrote nothing"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    killed = out.read_bytes()
    done = killed.count(b"\n")
    assert 3 <= done < 12, "killed too late to test anything"
    assert killed.endswith(b"\n")  # every record is written whole
    with open(out, "ab") as fh:  # and simulate a crash mid-write on top
        fh.write(b'{"qid":"u9","sta')

    assert teacher(data, backend="ranker:random") == 0
    recs = records(out)
    assert out.read_bytes().startswith(killed)
    assert sorted(r["qid"] for r in recs) == sorted(f"u{i}" for i in range(12))
    ref = {r["qid"]: r["ranking"] for r in records(reference / "l.jsonl")}
    assert {r["qid"]: r["ranking"] for r in recs} == ref
    assert load_slates(data / "labels.slates.jsonl") == load_slates(reference / "l.slates.jsonl")


def test_shards_and_merge(data, capsys):
    assert teacher(data, "--shard", "0/3", out="a.jsonl") == 0
    assert teacher(data, "--shard", "1/3", out="b.jsonl") == 0
    assert [r["qid"] for r in records(data / "a.jsonl")] == ["u0", "u3", "u6", "u9"]
    assert [r["qid"] for r in records(data / "b.jsonl")] == ["u1", "u4", "u7", "u10"]
    merge = ["teacher", "merge", "--slates", str(data / "slates.jsonl"), "--out", str(data / "m.jsonl")]
    # Shard 2/3 is missing: reported, nothing written.
    assert main([*merge, "--labels", str(data / "a.jsonl"), str(data / "b.jsonl")]) == 1
    out = capsys.readouterr().out
    assert "4 missing" in out and "u2, u5, u8, u11" in out and not (data / "m.jsonl").exists()
    assert main([*merge, "--labels", str(data / "a.jsonl"), str(data / "b.jsonl"), "--allow-missing"]) == 0
    assert len(load_slates(data / "m.slates.jsonl")) == 8

    assert teacher(data, "--shard", "2/3", out="c.jsonl") == 0
    assert teacher(data, out="full.jsonl") == 0
    shards = [str(data / f) for f in ("c.jsonl", "a.jsonl", "b.jsonl", "full.jsonl")]
    assert main([*merge, "--labels", *shards]) == 0  # overlaps with equal rankings are fine
    assert "12 duplicate labels" in capsys.readouterr().out
    full = records(data / "full.jsonl")
    assert [r["ranking"] for r in records(data / "m.jsonl")] == [r["ranking"] for r in full]
    assert load_slates(data / "m.slates.jsonl") == load_slates(data / "full.slates.jsonl")

    # The same qid with another ranking is a conflict naming both places.
    rec = full[5]
    rec["ranking"] = rec["ranking"][::-1]
    (data / "bad.jsonl").write_text(json.dumps(rec) + "\n")
    assert main([*merge, "--labels", str(data / "full.jsonl"), str(data / "bad.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'bad.jsonl'}:1" in err and f"{data / 'full.jsonl'}:6" in err


def test_bad_arguments(data, capsys):
    assert teacher(data, "--shard", "3/3") == 2
    assert teacher(data, backend="nonsense") == 2
    assert main(["teacher", "--slates", str(data / "slates.jsonl")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_ranker_fitted_on_other_items_is_said_to_label_in_the_given_order(data, caplog):
    """Counts of another catalogue score every candidate 0: the labels are the slates' own
    order, which a student would then learn."""
    import json

    lines = []
    for s in load_slates(data / "train.jsonl"):
        d = s.to_dict()
        d["candidates"] = [{**c, "docid": f"x{c['docid']}"} for c in d["candidates"]]
        d["clicked"] = [f"x{c}" for c in d.get("clicked") or ()]
        d["query"]["history"] = [f"x{h}" for h in d["query"].get("history") or ()]
        d.pop("teacher", None)
        lines.append(json.dumps(d) + "\n")
    (data / "foreign.jsonl").write_text("".join(lines))
    with caplog.at_level("WARNING"):
        assert teacher(data, "--train", str(data / "foreign.jsonl"),
                       backend="ranker:popularity") == 0
    assert any(r.getMessage().startswith("popularity: the training slates it was fitted on hold "
                                         "none of the candidates of 12 of the 12 slates")
               for r in caplog.records)
