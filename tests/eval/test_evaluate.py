"""evaluate(): same slates for every ranker, invalid outputs flagged, table, JSON, CLI."""

from __future__ import annotations

import json
import logging

import pytest

import spdrank.commands.cli
from spdrank.core.slates import Candidate, Query, Slate, write_slates
from spdrank.eval.evaluate import evaluate, format_table, percentile
from spdrank.rankers.baselines import RandomRanker
from tests.helpers import EVAL, Fixed
from tests.helpers import item_slate as mk


def test_every_ranker_sees_the_same_slates_in_one_pass():
    ident = Fixed("identity", lambda s: s.docids)
    rev = Fixed("reverse", lambda s: s.docids[::-1])
    res = evaluate([ident, rev], iter(EVAL), warmup=0)  # a one-shot stream
    assert res.n_slates == 3 and res.n_with_teacher == 2
    for r in res.rankers:
        assert [rec.index for rec in r.records] == [0, 1, 2]
        assert [rec.qid for rec in r.records] == ["e1", "e2", "e3"]
        assert all(rec.latency_ms >= 0 for rec in r.records)
    s = res["identity"].summary()
    assert s["valid"].mean == 1.0
    # click metrics skip e3 (every candidate clicked): e1 hit at rank 3, e2 at rank 1
    assert s["MRR"].n == 2 and s["MRR"].mean == pytest.approx((1 / 3 + 1) / 2)
    assert s["R@1"].mean == pytest.approx(0.5)
    assert s["top1"].n == 2 and s["top1"].mean == pytest.approx(0.5)
    assert res["reverse"].summary()["R@1"].mean == 0.0


def test_invalid_output_is_flagged_and_scored_on_the_repaired_ranking():
    broken = Fixed("broken", lambda s: ["zz", s.docids[2], s.docids[2]])
    empty = Fixed("empty", lambda s: [])
    res = evaluate([broken, empty], EVAL[:2], warmup=0)
    b = res["broken"].to_dict()
    assert b["valid_pct"] == 0.0 and b["n_invalid"] == 2
    # repaired e1: c, a, b, d -> the click at c is first
    rec = res["broken"].records[0]
    assert not rec.metrics.valid and rec.metrics.values["R@1"] == 1.0
    assert rec.metrics.values["tau"] == 1.0  # repaired equals e1's teacher
    # an empty output is repaired to the original order
    assert res["empty"].records[1].metrics.values["R@1"] == 1.0


def test_teacher_agreement_and_decode_passes():
    teacher = Fixed("teacher", lambda s: s.teacher or s.docids, passes=39)
    d = evaluate([teacher], EVAL, warmup=0).to_dict()["rankers"]["teacher"]
    assert d["metrics"]["tau"] == {"mean": 1.0, "n": 2}
    assert d["metrics"]["top1"]["mean"] == 1.0
    assert d["decode_passes_mean"] == 39.0
    assert d["stage_ms"] == {"x": 1.0}


def test_warmup_calls_are_extra_and_untimed():
    r = Fixed("r", lambda s: s.docids)
    res = evaluate([r], EVAL, warmup=2)
    assert r.calls == 3 + 2 and res["r"].n == 3


def test_prepare_runs_once_per_slate_before_the_rankers_and_untimed():
    import time

    seen: list[str] = []
    r = Fixed("r", lambda s: seen.append(f"rank {s.query.qid}") or s.docids)

    def prepare(slate):
        seen.append(f"prepare {slate.query.qid}")
        time.sleep(0.05)

    res = evaluate([r], EVAL, warmup=0, prepare=prepare)
    assert seen == [f"{what} {q}" for q in ("e1", "e2", "e3") for what in ("prepare", "rank")]
    assert all(rec.latency_ms < 50 for rec in res["r"].records)


def test_duplicate_names_and_no_rankers_are_errors():
    with pytest.raises(ValueError, match="unique"):
        evaluate([RandomRanker(), RandomRanker()], EVAL)
    with pytest.raises(ValueError):
        evaluate([], EVAL)


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(1, 101)), 95) == pytest.approx(95.05)
    assert percentile([7.0], 95) == 7.0
    assert percentile([], 50) is None


def test_table_and_json():
    res = evaluate([RandomRanker(), Fixed("identity", lambda s: s.docids)], EVAL, warmup=0)
    table = format_table(res)
    lines = table.splitlines()
    assert lines[0].split() == [
        "ranker", "n", "valid%", "AUC", "R@1", "R@10", "NDCG@1", "NDCG@10", "MRR",
        "tau", "top1", "top10", "passes", "p50", "ms", "p95", "ms",
    ]
    assert lines[2].startswith("random") and lines[3].startswith("identity")
    assert len(lines[2]) == len(lines[3]) == len(lines[0])  # fixed width
    assert "click metrics over 2 of 3 slates" in table
    d = json.loads(json.dumps(res.to_dict(per_slate=True)))
    ident = d["rankers"]["identity"]
    assert ident["n_slates"] == 3 and ident["metrics"]["AUC"]["n"] == 2
    assert len(ident["per_slate"]) == 3 and ident["per_slate"][2]["AUC"] is None
    no_teacher = evaluate([RandomRanker()], [EVAL[2]], warmup=0)
    assert "tau" not in format_table(no_teacher).split()


def test_teacher_scores_make_ties_ties():
    """slate.teacher_scores reach the metrics: the order inside a tie is not scored."""
    tied = mk("t", [], list("abcd"), teacher=list("abcd"))
    tied.teacher_scores = [1.0, 0.0, 0.0, 0.0]
    flat = mk("f", [], list("abcd"), teacher=list("abcd"))
    flat.teacher_scores = [0.0] * 4
    res = evaluate([Fixed("dcba", lambda s: s.docids[::-1])], [tied, flat], warmup=0)
    first, second = (r.metrics.values for r in res["dcba"].records)
    assert first["tau"] == -1.0  # only a's three pairs are ordered; tau-a would say -1 too
    assert first["top1"] == 0.0 and first["top10"] == 1.0
    assert second["tau"] is None and second["top1"] == 1.0  # every candidate tied at the top
    rev = evaluate([Fixed("acbd", lambda s: list("acbd"))], [tied], warmup=0)
    assert rev["acbd"].records[0].metrics.values["tau"] == 1.0  # tau-a: 2/3
    assert "dcba: tau over 1 of 2 slates" in format_table(res)


# -- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path):
    items = [f"i{k}" for k in range(8)]
    train = [
        mk(f"t{u}", ["i0", "i1"], items, clicked=["i2"]) for u in range(3)
    ] + [mk("t9", ["i5"], items, clicked=["i0"])]
    evals = [mk(f"e{u}", ["i0", "i1"], items[::-1], clicked=["i2"]) for u in range(4)]
    write_slates(tmp_path / "train.jsonl", train)
    write_slates(tmp_path / "eval.jsonl", evals)
    return tmp_path


@pytest.fixture
def cli(monkeypatch):
    # only the eval command, so this test does not depend on the other commands' modules
    monkeypatch.setattr(spdrank.commands.cli, "COMMANDS", ("eval",))
    return spdrank.commands.cli.main


def test_cli_end_to_end(cli, data_dir, capsys):
    out = data_dir / "out" / "results.json"
    rows = data_dir / "rows.jsonl"
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--no-progress"]
    for name in ("random", "popularity", "cooccurrence"):
        argv += ["--ranker", name]
    rc = cli([*argv, "--limit", "3", "--json", str(out), "--per-slate", str(rows)])
    assert rc == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].startswith("ranker")
    assert [ln.split()[0] for ln in table.splitlines()[2:5]] == [
        "random", "popularity", "cooccurrence",
    ]
    d = json.loads(out.read_text())
    assert d["n_slates"] == 3 and list(d["rankers"]) == ["random", "popularity", "cooccurrence"]
    assert d["meta"]["train"] == str(data_dir / "train.jsonl")  # found beside --slates
    # i2 follows i0, i1 in training: co-occurrence puts the target first on every slate
    assert d["rankers"]["cooccurrence"]["metrics"]["R@1"]["mean"] == 1.0
    assert d["rankers"]["popularity"]["metrics"]["R@1"]["mean"] == 0.0  # i0 is most popular
    assert len(rows.read_text().splitlines()) == 9


def test_cli_defaults_to_all_baselines(cli, data_dir, capsys):
    assert cli(["eval", "--slates", str(data_dir / "eval.jsonl"), "--no-progress"]) == 0
    names = [ln.split()[0] for ln in capsys.readouterr().out.splitlines()[2:]]
    assert names == ["random", "popularity", "cooccurrence"]  # registry order


def test_cli_missing_training_data_is_a_clear_error(cli, data_dir, capsys):
    (data_dir / "train.jsonl").unlink()
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--no-progress"]
    assert cli([*argv, "--ranker", "popularity"]) == 2
    err = capsys.readouterr().err
    assert "popularity need training slates" in err and "--train" in err
    assert cli([*argv, "--ranker", "random"]) == 0  # random needs none


def test_cli_refuses_to_fit_on_the_slates_it_scores(cli, data_dir, capsys):
    evals = data_dir / "eval.jsonl"
    (data_dir / "link.jsonl").symlink_to(evals)
    for train in (evals, data_dir / "link.jsonl"):
        argv = ["eval", "--slates", str(evals), "--train", str(train), "--no-progress"]
        assert cli([*argv, "--ranker", "popularity", "--ranker", "random"]) == 2
        assert (f"--train {train} is the file being scored (--slates): popularity would be "
                "fitted on the clicks they are judged by") in capsys.readouterr().err
        assert cli([*argv, "--ranker", "random"]) == 0  # nothing is fitted: only a note


def test_cli_feature_baseline_rows_need_no_training_file(cli, tmp_path, capsys):
    slates = [
        Slate(
            query=Query(qid=f"e{u}", text="-"),
            candidates=[
                Candidate(docid=d, doc={"title": d}, features={"title_similarity": v})
                for d, v in (("a", 0.0), ("b", 0.9), ("c", 0.0), ("d", 0.2))
            ],
            clicked=["b"],
        )
        for u in range(2)
    ]
    write_slates(tmp_path / "eval.jsonl", slates)
    out = tmp_path / "results.json"
    argv = ["eval", "--slates", str(tmp_path / "eval.jsonl"), "--no-progress", "--json", str(out)]
    assert cli([*argv, "--ranker", "title_similarity", "--ranker", "feature:title_similarity"]) == 0
    d = json.loads(out.read_text())
    assert list(d["rankers"]) == ["title_similarity", "feature:title_similarity"]
    assert d["rankers"]["title_similarity"]["metrics"]["R@1"]["mean"] == 1.0
    assert d["meta"]["train"] is None  # nothing was fitted
    assert cli([*argv, "--ranker", "feature:nope"]) == 2
    assert "no feature 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli([*argv, "--ranker", "title-similarity"])
    assert "unknown baseline 'title-similarity'" in capsys.readouterr().err


def test_cli_missing_slates(cli, tmp_path, capsys):
    assert cli(["eval", "--slates", str(tmp_path / "nope.jsonl"), "--ranker", "random"]) == 2
    assert "no such slate file" in capsys.readouterr().err


def test_cli_replays_a_teacher_label_file(cli, tmp_path, capsys):
    """--labels puts the teacher in the table: its raw answer (invalid ones counted), its
    decode passes and its recorded latency, not the lookup time."""
    write_slates(tmp_path / "eval.jsonl", EVAL)
    recs = [
        # a clean answer: c > a > b > d
        {"qid": "e1", "n": 4, "parsed": [3, 1, 2, 4], "ranking": ["c", "a", "b", "d"],
         "decode_passes": 20, "latency_ms": 500.0},
        # a repeated and an out-of-range id: invalid, repaired to a, c, b, d
        {"qid": "e2", "n": 4, "parsed": [1, 1, 9, 3], "ranking": ["a", "c", "b", "d"],
         "decode_passes": 30, "latency_ms": 700.0},
        # a ranking computed elsewhere (file: / ranker: backends): no parsed ids
        {"qid": "e3", "n": 4, "ranking": ["d", "c", "b", "a"], "decode_passes": 0,
         "latency_ms": 0.0},
    ]
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps(r) + "\n" for r in recs))
    out = tmp_path / "r.json"
    argv = ["eval", "--slates", str(tmp_path / "eval.jsonl"), "--ranker", "random",
            "--labels", f"smol={labels}", "--json", str(out), "--no-progress"]
    assert cli(argv) == 0
    d = json.loads(out.read_text())["rankers"]["smol"]
    assert d["valid_pct"] == pytest.approx(200 / 3) and d["n_invalid"] == 1
    assert d["metrics"]["R@1"]["mean"] == 1.0  # e2 repaired puts a first (e3: all clicked)
    assert d["metrics"]["top1"]["mean"] == 1.0  # agrees with the teacher field where present
    assert d["latency_ms"]["median"] == 500.0
    assert d["decode_passes_mean"] == pytest.approx(50 / 3)
    # a slate the label file does not cover is a clear error naming the file
    labels.write_text(json.dumps(recs[0]) + "\n")
    assert cli(argv) == 2
    assert "no record in the label file" in capsys.readouterr().err


def test_cli_k_chooses_the_cutoffs_of_recall_ndcg_and_mrr(cli, data_dir, capsys):
    out = data_dir / "r.json"
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--no-progress", "--ranker",
            "cooccurrence", "--json", str(out)]
    assert cli(argv) == 0
    d = json.loads(out.read_text())
    metrics = d["rankers"]["cooccurrence"]["metrics"]
    for k in (1, 5, 10, 20):  # the default; the keys of earlier versions stay
        assert {f"R@{k}", f"NDCG@{k}", f"MRR@{k}"} <= set(metrics)
    assert d["ks"] == [1, 5, 10, 20] and metrics["MRR"]["mean"] == 1.0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[3:8] == ["AUC", "R@1", "R@5", "R@10", "R@20"]
    assert cli([*argv, "--k", "3,1"]) == 0
    metrics = json.loads(out.read_text())["rankers"]["cooccurrence"]["metrics"]
    assert [m for m in metrics if "@" in m] == ["R@3", "R@1", "NDCG@3", "NDCG@1", "MRR@3", "MRR@1"]
    for bad in ("0", "1,1", "a,5", ""):
        with pytest.raises(SystemExit):
            cli([*argv, "--k", bad])
        assert "--k" in capsys.readouterr().err


def test_cli_counts_extra_sequences_beside_the_training_slates(cli, data_dir, capsys):
    """Users who make no slate (no retriever list) still count for the count baselines:
    extra_sequences.txt beside train.jsonl is read by default, --extra-sequences names one."""
    out = data_dir / "r.json"
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--no-progress", "--ranker",
            "popularity", "--json", str(out)]
    assert cli(argv) == 0  # i0 is the most popular training item: ranked first
    assert json.loads(out.read_text())["rankers"]["popularity"]["metrics"]["R@1"]["mean"] == 0.0
    (data_dir / "extra_sequences.txt").write_text("".join(f"x{u} i2 i2 i2\n" for u in range(5)))
    assert cli(argv) == 0  # now i2, the eval target, is
    assert json.loads(out.read_text())["rankers"]["popularity"]["metrics"]["R@1"]["mean"] == 1.0
    (data_dir / "extra_sequences.txt").rename(data_dir / "other.txt")
    assert cli([*argv, "--extra-sequences", str(data_dir / "other.txt")]) == 0
    assert json.loads(out.read_text())["rankers"]["popularity"]["metrics"]["R@1"]["mean"] == 1.0
    assert cli([*argv, "--extra-sequences", str(data_dir / "nope.txt")]) == 2
    assert "no such extra sequences file" in capsys.readouterr().err


def test_progress_off_a_terminal_is_a_log_line_every_few_seconds(monkeypatch, caplog):
    """Captured stderr is no terminal: no bar, but lines a log file can hold."""
    import spdrank.core.progress

    monkeypatch.setattr(spdrank.core.progress, "EVERY_S", 0.0)
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        evaluate([RandomRanker()], EVAL, warmup=0, progress=None, total=3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4 and lines[0].startswith("eval (random): 1/3 slates, ")
    assert lines[-1].startswith("eval (random): 3/3 slates, ")
    assert lines[-1].endswith(" slates/s (done)")
    caplog.clear()
    with caplog.at_level("INFO", logger="spdrank.core.progress"):
        evaluate([RandomRanker()], EVAL, warmup=0, progress=False)
    assert caplog.records == []


def test_cli_counts_a_target_the_retriever_missed_as_a_miss(cli, tmp_path, capsys):
    """A slate built with --no-insert-target keeps its missed target out of the candidates:
    every ranker is charged for it, so recall stays honest about the retriever."""
    found = mk("e1", ["a"], ["a", "b", "c"], clicked=["b"])
    missed = mk("e2", ["a"], ["a", "b", "c"], clicked=[])
    missed.extra["clicked_not_retrieved"] = ["z"]
    write_slates(tmp_path / "eval.jsonl", [found, missed])
    out = tmp_path / "r.json"
    argv = ["eval", "--slates", str(tmp_path / "eval.jsonl"), "--no-progress", "--json", str(out)]
    assert cli([*argv, "--ranker", "feature:score", "--k", "3"]) == 0
    metrics = json.loads(out.read_text())["rankers"]["feature:score"]["metrics"]
    assert metrics["R@3"] == {"mean": 0.5, "n": 2} and metrics["MRR"]["n"] == 2
    missed.extra["clicked_not_retrieved"] = ["c"]  # a candidate: it belongs in 'clicked'
    write_slates(tmp_path / "eval.jsonl", [found, missed])
    assert cli([*argv, "--ranker", "random"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'eval.jsonl'}:2: 'clicked_not_retrieved' names candidates ['c']" in err


def test_slates_of_fitted_users_are_ranked_with_their_own_sequence_left_out(cli, data_dir,
                                                                            capsys, caplog):
    """Scoring training slates copied to another file: each fitted user's own target is left
    out of the counts (co-occurrence learned i2 after i0, i1 from t0-t2 alone), as the teacher
    and the feature builder leave it out; SASRec, which cannot, is said to measure the fit."""
    from spdrank.core.slates import read_slates

    train = data_dir / "train.jsonl"
    copy = data_dir / "copy.jsonl"
    slates = [*read_slates(train), mk("t8", ["i6"], [f"i{k}" for k in range(8)], clicked=["i7"])]
    write_slates(train, slates)
    write_slates(copy, slates)
    argv = ["eval", "--slates", str(copy), "--train", str(train), "--no-progress",
            "--ranker", "cooccurrence", "--json", str(data_dir / "r.json")]
    with caplog.at_level(logging.INFO, logger="spdrank.commands.named_rankers"):
        assert cli(argv) == 0
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "cooccurrence: 5 users of" in said and "its own sequence left out" in said
    rows = json.loads((data_dir / "r.json").read_text())["rankers"]["cooccurrence"]
    # t8 alone bought i7 after i6: left out, nothing puts i7 first (counted, it was first).
    assert rows["metrics"]["R@1"]["mean"] == 0.8
    capsys.readouterr()


def test_labels_numbering_another_order_of_the_candidates_are_refused(cli, data_dir, capsys):
    from spdrank.core.slates import read_slates

    evals = list(read_slates(data_dir / "eval.jsonl"))
    labels = data_dir / "labels.jsonl"
    labels.write_text("".join(json.dumps({
        "qid": s.query.qid, "status": "ok", "n": len(s), "parsed": [3, 1, 2],
        "ranking": [s.docids[2], s.docids[0], s.docids[1], *s.docids[3:]],
    }) + "\n" for s in evals))
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--labels", str(labels),
            "--ranker", "random", "--no-progress"]
    assert cli(argv) == 0
    for s in evals:
        s.candidates.reverse()
    write_slates(data_dir / "reversed.jsonl", evals)
    argv[2] = str(data_dir / "reversed.jsonl")
    assert cli(argv) == 2
    assert ("labels.jsonl:1: the record for qid 'e0' numbers its slate's candidates in another "
            "order than this slate lists them") in capsys.readouterr().err


def test_counts_fitted_on_other_items_are_said_to_rank_in_the_given_order(cli, data_dir, caplog):
    from spdrank.core.slates import read_slates

    foreign = [mk(s.query.qid, ["x0"], ["x1", "x2"], clicked=["x1"])
               for s in read_slates(data_dir / "train.jsonl")]
    write_slates(data_dir / "foreign.jsonl", foreign)
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--train",
            str(data_dir / "foreign.jsonl"), "--ranker", "cooccurrence", "--no-progress"]
    with caplog.at_level(logging.WARNING):
        assert cli(argv) == 0
    assert any(r.getMessage().startswith(
        "cooccurrence: the training slates it was fitted on hold none of the candidates of 4 "
        "of the 4 slates ranked") for r in caplog.records)


def test_rank_output_is_said_to_score_by_the_ranking_model(cli, data_dir, caplog):
    """spdrank rank writes the model's score over each candidate's: the retriever's row of
    such a file is that model's ranking, which the evaluation says."""
    lines = (data_dir / "eval.jsonl").read_text().splitlines()
    ranked = data_dir / "ranked.jsonl"
    ranked.write_text("".join(json.dumps({**json.loads(line), "timings_ms": {"head": 1.0}}) + "\n"
                              for line in lines))
    with caplog.at_level(logging.WARNING):
        assert cli(["eval", "--slates", str(ranked), "--ranker", "retriever", "--no-progress"]) == 0
    (said,) = [r.getMessage() for r in caplog.records if "timings_ms" in r.getMessage()]
    assert said.startswith(f"{ranked}:1 holds spdrank rank's output (timings_ms)")


def test_a_feature_a_slate_lacks_is_named_at_its_line(cli, data_dir, capsys):
    argv = ["eval", "--slates", str(data_dir / "eval.jsonl"), "--ranker", "feature:nothing",
            "--no-progress"]
    assert cli(argv) == 2
    assert f"{data_dir / 'eval.jsonl'}:1: slate 'e0': candidates[0]" in capsys.readouterr().err


def test_windows_of_fitted_users_slates_are_those_users(tmp_path):
    """A window of a training slate (<qid>#<j>) holds that user's target: its counts leave
    the user out as the slate's would (data features, a ranker: teacher, eval)."""
    from spdrank.datasets.fitted_users import fitted_users, possible_users

    items = [f"i{k}" for k in range(4)]
    write_slates(tmp_path / "train.jsonl", [mk("u#1", ["i0"], items, clicked=["i1"]),
                                            mk("v", ["i2"], items, clicked=["i3"])])
    users = fitted_users(tmp_path / "train.jsonl", None)
    assert users.user_of("v#0") == "v" and users.user_of("u#1#3") == "u#1"
    assert "v#2" in users and "w#0" not in users and "u" not in users
    window = mk("v#0", ["i2"], items[2:], clicked=["i3"])
    assert users.sequence(window, "here") == ["i2", "i3"]
    assert possible_users({"a#b#c", "d"}) == {"a#b#c", "a#b", "a", "d"}
