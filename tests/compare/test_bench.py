"""spdrank bench: one run, every ranker on the same slates; speed-ups; decoder rows sharing one
forward pass; paired differences vs a reference row; the latency decomposition; --device/--dtype;
benchmarks/gpu.sh's commands parse."""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import spdrank.commands.cli
from spdrank.compare.decoders import decoder_rows
from spdrank.compare.latency import STAGES, _paired_ratio, decompose, resize_slates
from spdrank.compare.report import DECOMPOSITION_PLOT, STAGES_PLOT, speedups
from spdrank.core.slates import Slate, write_slates
from spdrank.eval.evaluate import evaluate
from spdrank.eval.metrics import is_valid_permutation
from spdrank.methods.spd.decode import DECODERS
from spdrank.model.ranker import SPDRanker
from tests.helpers import dry_run_commands, make_slate, tiny_config

TEACHER_MS = [100.0, 300.0, 500.0, 700.0, 900.0, 5000.0]  # median 600, mean 1250


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def eval_slates() -> list[Slate]:
    rng = random.Random(1)
    return [
        make_slate(rng, rng.randint(4, 9), f"e{i}", catalogue=40, history=3)
        for i in range(len(TEACHER_MS))
    ]


@pytest.fixture(scope="module")
def spd_dir(tmp_path_factory, tiny_backbone) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("spd")
    SPDRanker.build(tiny_config(tiny_backbone, "attn")).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def spd_model(spd_dir) -> SPDRanker:
    return SPDRanker.from_pretrained(spd_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory, eval_slates) -> Path:
    rng = random.Random(2)
    path = tmp_path_factory.mktemp("data")
    train = [make_slate(rng, 8, f"t{i}", catalogue=40, history=3) for i in range(20)]
    write_slates(path / "train.jsonl", train)
    write_slates(path / "eval.jsonl", eval_slates)
    with open(path / "direct.labels.jsonl", "w") as fh:
        for slate, ms in zip(eval_slates, TEACHER_MS):
            n = len(slate)
            fh.write(json.dumps({"qid": slate.query.qid, "n": n, "parsed": list(range(1, n + 1)),
                                 "ranking": slate.docids, "decode_passes": 4 * n,
                                 "latency_ms": ms}) + "\n")
    return path


# -- one run, one report -----------------------------------------------------------------------


def test_bench_end_to_end(tmp_path, data, eval_slates, spd_dir, tiny_backbone, capsys):
    """Baselines, a replayed teacher, the scalar peer and SPD under every decoder: one report."""
    torch.manual_seed(0)
    scalar_dir = tmp_path / "scalar"
    SPDRanker.build(tiny_config(tiny_backbone, "scalar")).save_pretrained(scalar_dir)
    out = tmp_path / "report"
    preamble = tmp_path / "preamble.md"
    preamble.write_text("Trained by a script, at a stated scale.\n")
    argv = [
        "bench", "--slates", str(data / "eval.jsonl"), "--ranker", "random",
        "--ranker", "popularity", "--labels", f"direct={data / 'direct.labels.jsonl'}",
        "--model", f"spd={spd_dir}", "--model", f"scalar={scalar_dir}", "--device", "cpu",
        "--out", str(out), "--no-progress", "--latency", "--latency-sizes", "4,12",
        "--latency-slates", "4", "--batch-size", "2", "--preamble", str(preamble),
        "--bootstrap", "500",
    ]
    assert spdrank.commands.cli.main(argv) == 0
    assert "report:" in capsys.readouterr().out

    d = json.loads((out / "results.json").read_text())
    spd_rows = [f"spd:{name}" for name in DECODERS]
    assert list(d["rankers"]) == ["random", "popularity", "direct", *spd_rows, "scalar"]
    assert d["n_slates"] == len(TEACHER_MS) and d["teachers"] == ["direct"]
    for name, row in d["rankers"].items():
        assert row["n_slates"] == len(TEACHER_MS), name
        assert set(row["metrics"]) == {
            "AUC", "R@1", "R@10", "NDCG@1", "NDCG@10", "MRR", "tau", "top1", "top10",
        }
        assert row["valid_pct"] == 100.0
        assert row["latency_ms"]["median"] is not None and row["latency_ms"]["p95"] is not None
    direct = d["rankers"]["direct"]
    assert direct["latency_ms"]["median"] == 600.0 and direct["metrics"]["tau"]["mean"] < 1
    assert d["rankers"]["spd:hungarian"]["decode_passes_mean"] == 1.0
    assert direct["decode_passes_mean"] == pytest.approx(np.mean([4 * len(s) for s in eval_slates]))
    # speed-up over the teacher: the ratio of the medians in this very table
    for name, row in d["rankers"].items():
        assert d["speedup"][name]["direct"] == pytest.approx(600.0 / row["latency_ms"]["median"])
    assert d["speedup"]["direct"]["direct"] == 1.0
    # every decoder row reports the shared forward's stages plus its own decode
    for name in spd_rows:
        assert set(d["rankers"][name]["stage_ms"]) == set(STAGES)

    assert [(r["model"], r["n"]) for r in d["latency"]] == [("spd", 4), ("spd", 12)]
    for row in d["latency"]:
        assert row["slates"] == 4 and row["overhead"] > 0 and row["throughput"] > 0
        assert row["peak_memory_mb"] > 0 and row["peak_memory_batch_mb"] > 0
        assert 0 < row["overhead_ms"] <= row["total_ms"]["p95"]
        assert row["overhead_ratio"] == pytest.approx(row["overhead_ms"] / row["bare_prefill_ms"])
    # the decomposition's table: every stage, the rest, and the overhead in ms and over the
    # bare prefill, one line per size
    report = (out / "report.md").read_text()
    table = report[report.index("## Latency decomposition") :].splitlines()
    head = [c.strip() for c in table[2].strip("|").split("|")]
    assert head[3 : 4 + len(STAGES)] == [f"{s} ms" for s in (*STAGES, "rest")]
    assert {"SPD / bare prefill", "overhead ms", "overhead / bare prefill"} <= set(head)
    for line, row in zip(table[4:6], d["latency"]):
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        assert cells["N"] == str(row["n"])
        assert cells["overhead / bare prefill"] == f"{row['overhead_ratio']:.2%}"
        assert cells["SPD / bare, per slate"] == f"{row['paired_ratio']:.3f}x"

    # paired differences: every other row minus the first SPD decoder row, slate by slate
    paired = d["paired"]
    assert paired["reference"] == "spd:hungarian" and paired["resamples"] == 500
    assert list(paired["rows"]) == [name for name in d["rankers"] if name != "spd:hungarian"]
    ref = d["rankers"]["spd:hungarian"]["metrics"]
    for name, diffs in paired["rows"].items():
        assert set(diffs) == set(ref) - {"valid"}
        for metric, diff in diffs.items():
            # every slate pairs, so the mean difference is the difference of the means
            assert diff["n"] == len(TEACHER_MS)
            mean = d["rankers"][name]["metrics"][metric]["mean"] - ref[metric]["mean"]
            assert diff["mean"] == pytest.approx(mean, abs=1e-12)
            assert diff["low"] <= diff["mean"] <= diff["high"]

    report = (out / "report.md").read_text()
    assert report.startswith("# spdrank bench: report\n\nTrained by a script, at a stated scale.\n")
    assert "- wall time of this benchmark: " in report and "latency decomposition" in report
    assert "## Paired differences vs `spd:hungarian` (95% CI over slates)" in report
    assert "| ranker | slates | slates (tau) | slates (top1, top10) | AUC |" in report
    assert "| spd:greedy | 6 | 6 | 6 |" in report
    assert "| ranker | p50 ms | p95 ms | speed-up vs direct | passes |" in report
    assert "Table 5" in report and "| spd | 12 | 4 |" in report
    assert "peak MiB (1 / batch)" in report
    for png in ("quality_vs_latency.png", "latency_stages.png", "latency_decomposition.png"):
        assert f"]({png})" in report
        _assert_png(out / png)
    assert (out / "table.txt").read_text().startswith("ranker")


def _assert_png(path: Path) -> None:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0  # something was drawn


def test_speedups_are_ratios_of_medians(eval_slates):
    class Slow:
        name, needs_train = "teacher", False

        def fit(self, train):
            pass

        def rank(self, slate):
            from spdrank.core.ranking import Ranking

            ms = TEACHER_MS[int(slate.query.qid[1:])]
            return Ranking(slate.docids, decode_passes=40, recorded_ms=ms)

    class Fast(Slow):
        name = "student"

        def rank(self, slate):
            out = super().rank(slate)
            out.recorded_ms = STUDENT_MS[int(slate.query.qid[1:])]
            return out

    STUDENT_MS = [10.0, 20.0, 30.0, 40.0, 50.0, 9000.0]  # median 35, mean 1525
    results = evaluate([Slow(), Fast()], eval_slates, warmup=0)
    ratios = speedups(results, ["teacher"])
    assert ratios["student"]["teacher"] == pytest.approx(600.0 / 35.0)  # not a ratio of means
    assert ratios["teacher"]["teacher"] == 1.0
    with pytest.raises(ValueError, match="no row named"):
        speedups(results, ["nobody"])


# -- decoder rows ------------------------------------------------------------------------------


def test_decoder_rows_share_one_forward_per_slate(spd_model, eval_slates):
    model = spd_model
    rows = decoder_rows(model, list(DECODERS))
    shared = rows[0].shared
    results = evaluate(rows, eval_slates, warmup=0)
    assert shared.passes == len(eval_slates)  # not one per decoder
    for i, slate in enumerate(eval_slates):
        records = [r.records[i] for r in results.rankers]
        forward = {k: v for k, v in records[0].timings.items() if k != "assign"}
        for rec in records:
            # the same forward's stages in every row; each row's own decode on top
            assert {k: v for k, v in rec.timings.items() if k != "assign"} == forward
            assert rec.latency_ms >= sum(rec.timings.values())
        # the row of the checkpoint's own decoder ranks exactly as its rank() does
        own = next(row for row in rows if row.decoder == model.config.decoder)
        assert own.rank(slate).docids == model.rank(slate).docids
        for row in rows:
            assert is_valid_permutation(row.rank(slate).docids, slate.docids)


def test_a_timed_call_never_reuses_its_own_warmup(spd_model, eval_slates):
    rows = decoder_rows(spd_model, ["hungarian", "greedy"])
    evaluate(rows, eval_slates[:2], warmup=1)
    # slate 0: warm-up + timed call of each row, each timed call a fresh forward; slate 1: one
    assert rows[0].shared.passes == 2 + 1 + 1


def test_decoder_rows_need_a_matrix_head(spd_model, tiny_backbone):
    with pytest.raises(ValueError, match="unknown decoder"):
        decoder_rows(spd_model, ["hungarian", "nope"])
    scalar = SPDRanker.build(tiny_config(tiny_backbone, "scalar"))
    with pytest.raises(ValueError, match="no decoders"):
        decoder_rows(scalar, ["hungarian"])


# -- latency decomposition ---------------------------------------------------------------------


def test_resize_slates_is_seeded_and_keeps_each_slate_distinct(eval_slates):
    grown = resize_slates(eval_slates, 15, seed=3)
    assert grown == resize_slates(eval_slates, 15, seed=3)
    assert grown != resize_slates(eval_slates, 15, seed=4)
    pool = {d for s in eval_slates for d in s.docids}
    for before, after in zip(eval_slates, grown):
        assert len(after) == 15 and len(set(after.docids)) == 15
        assert after.docids[: len(before)] == before.docids  # the real slate comes first
        assert set(after.docids) <= pool and after.clicked == before.clicked
    cut = resize_slates(eval_slates, 3)
    assert [s.docids for s in cut] == [s.docids[:3] for s in eval_slates]
    with pytest.raises(ValueError, match="distinct items"):
        resize_slates(eval_slates[:1], 20)


def test_latency_decomposition_stages_fit_in_the_total(spd_model, eval_slates):
    model = spd_model
    # per slate, the stages rank() reports add up to at most its wall time
    results = evaluate([model], eval_slates, warmup=0)
    for rec in results.rankers[0].records:
        assert set(rec.timings) == set(STAGES)
        assert sum(rec.timings.values()) <= rec.latency_ms
    rows = decompose(model, eval_slates[:4], sizes=(5, 12), batch_size=3, warmup=1)
    assert [(r.n, r.slates, r.batch_size) for r in rows] == [(5, 4, 3), (12, 4, 3)]
    for r in rows:
        assert set(r.stages_ms) == {*STAGES, "rest"}
        # each stage is at most the total on every slate, hence in the median too
        assert all(0 <= v <= r.total_ms["median"] for v in r.stages_ms.values())
        assert r.total_ms["median"] <= r.total_ms["p95"]
        assert 0 < r.bare_prefill_ms and r.overhead > 0 and r.throughput > 0
        # the overhead is everything but the prefill: the other stages and the rest
        assert 0 < r.overhead_ms <= r.total_ms["p95"]
        assert r.overhead_ratio == pytest.approx(r.overhead_ms / r.bare_prefill_ms)
        # each slate's SPD call includes a prefill as long as its bare one, give or take
        # the machine's noise
        assert r.paired_ratio is not None and r.paired_ratio > 0.5
        assert r.memory_kind == "process RSS, peak" and r.peak_memory_mb > 0
    with pytest.raises(ValueError, match="--positions 20"):
        decompose(model, eval_slates, sizes=(20,))


def test_the_paired_ratio_is_each_slates_own_then_their_median():
    # each slate's SPD call is 2% over its own bare prefill, but one call caught a hiccup:
    # the median call is then another slate's than the median bare prefill (240 / 200 ms)
    bare = [100.0, 150.0, 200.0, 250.0, 300.0]
    totals = [b * 1.02 for b in bare]
    totals[2] = 240.0
    assert _paired_ratio(totals, bare) == pytest.approx(1.02)
    assert _paired_ratio(totals, [0.0] * 5) is None
    with pytest.raises(ValueError, match="5 SPD calls against 4 bare prefills"):
        _paired_ratio(totals, bare[:4])


def test_bench_reference_row(tmp_path, data, capsys):
    """Without SPD rows the first row is the default reference; --reference picks another, and
    one that names no row fails before anything is measured."""
    base = ["bench", "--slates", str(data / "eval.jsonl"), "--ranker", "random", "--ranker",
            "popularity", "--no-progress"]
    (tmp_path / "a").mkdir()
    stale = [tmp_path / "a" / name for name in (STAGES_PLOT, DECOMPOSITION_PLOT)]
    for path in stale:  # an earlier run's SPD rows' plots: no row of this run's
        path.write_bytes(b"png")
    assert spdrank.commands.cli.main([*base, "--out", str(tmp_path / "a")]) == 0
    assert not any(path.exists() for path in stale)
    d = json.loads((tmp_path / "a" / "results.json").read_text())
    assert d["paired"]["reference"] == "random" and list(d["paired"]["rows"]) == ["popularity"]
    assert spdrank.commands.cli.main([*base, "--reference", "popularity", "--out", str(tmp_path / "b")]) == 0
    d = json.loads((tmp_path / "b" / "results.json").read_text())
    assert d["paired"]["reference"] == "popularity" and list(d["paired"]["rows"]) == ["random"]
    capsys.readouterr()
    assert spdrank.commands.cli.main([*base, "--reference", "nobody", "--out", str(tmp_path / "c")]) == 2
    assert "--reference 'nobody' names no row" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert spdrank.commands.cli.main([*base, "--train", str(data / "eval.jsonl"),
                                      "--out", str(tmp_path / "d")]) == 2
    assert "popularity would be fitted on the clicks they are judged by" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_bench_refuses_a_qid_twice_as_eval_does(tmp_path, data, capsys):
    """A slate counted twice narrows the paired intervals as if it were two users."""
    lines = (data / "eval.jsonl").read_text().splitlines()
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join([*lines, lines[0]]) + "\n")
    argv = ["bench", "--slates", str(twice), "--ranker", "random", "--no-progress",
            "--out", str(tmp_path / "out")]
    assert spdrank.commands.cli.main(argv) == 2
    assert f"twice.jsonl:{len(lines) + 1}: duplicate qid" in capsys.readouterr().err


def test_bench_latency_needs_an_spd_checkpoint(data, capsys):
    argv = ["bench", "--slates", str(data / "eval.jsonl"), "--ranker", "random", "--latency",
            "--out", "unused", "--no-progress"]
    assert spdrank.commands.cli.main(argv) == 2
    assert "--latency decomposes SPD checkpoints" in capsys.readouterr().err


def test_latency_leaves_out_features_only_heads_and_sizes_beyond_k_before_running():
    """A features-only head has no prefill to decompose; a checkpoint is timed at the sizes up
    to its K; a size no checkpoint can rank fails before the (long) evaluation, naming the
    checkpoint that comes closest."""
    from types import SimpleNamespace

    from spdrank.commands.bench import latency_models

    def checkpoint(name, features_only, positions=64):
        head = SimpleNamespace(positions=positions)
        return SimpleNamespace(name=name, config=SimpleNamespace(features_only=features_only, head=head))

    llm, features = checkpoint("llm", False), checkpoint("features", True)
    wide = checkpoint("wide", False, positions=160)
    assert latency_models([features, llm], [20, 50]) == [(llm, [20, 50])]
    assert latency_models([llm, features, wide], [20, 150]) == [(llm, [20]), (wide, [20, 150])]
    with pytest.raises(ValueError, match="wide ranks at most K=160 .* N=200"):
        latency_models([llm, wide], [20, 200])
    with pytest.raises(ValueError, match="llm ranks at most K=64 .* N=150"):
        latency_models([llm], [20, 150])
    with pytest.raises(ValueError, match="that run a backbone"):
        latency_models([features], [20])


# -- device and dtype --------------------------------------------------------------------------


def test_dtype_override_loads_the_backbone_in_bfloat16(spd_dir, eval_slates):
    model = SPDRanker.from_pretrained(spd_dir, device="cpu", dtype="bfloat16")
    assert next(model.backbone.parameters()).dtype == torch.bfloat16
    ranking = model.rank(eval_slates[0])
    assert is_valid_permutation(ranking.docids, eval_slates[0].docids)
    with pytest.raises(ValueError, match="unknown dtype"):
        SPDRanker.from_pretrained(spd_dir, dtype="float8")


# -- benchmarks/gpu.sh -------------------------------------------------------------------------


def test_gpu_script_commands_parse():
    """Every spdrank command the GPU script would run exists, with every flag it passes."""
    commands = dry_run_commands("gpu.sh")
    subcommands = [argv[1] for argv in commands]
    assert {"data", "teacher", "train", "bench"} <= set(subcommands), subcommands
    parser = spdrank.commands.cli.build_parser()
    for argv in commands:
        parser.parse_args(argv[1:])  # exits (fails the test) on an unknown flag or value
    train = next(argv for argv in commands if argv[1] == "train")
    assert train[train.index("--dtype") + 1] == "bfloat16" and "--limit" not in train
    assert any("--latency" in argv for argv in commands if argv[1] == "bench")
    warm = next(argv for argv in commands if "--init-from" in argv)
    lexical = warm[warm.index("--init-from") + 1]
    assert any(argv[argv.index("--out") + 1] == lexical for argv in commands if argv[1] == "train")


def test_a_model_scored_on_slates_its_run_trained_or_chose_on_is_said(tmp_path, data, spd_dir, caplog):
    run = tmp_path / "run"
    shutil.copytree(spd_dir, run / "model")
    (run / "train.json").write_text(json.dumps({"config": {"slates": str(data / "eval.jsonl")}}))
    argv = ["eval", "--ranker", "random", "--model", f"m={run}", "--no-progress"]
    with caplog.at_level(logging.WARNING):
        assert spdrank.commands.cli.main([*argv, "--slates", str(data / "eval.jsonl")]) == 0
        assert spdrank.commands.cli.main([*argv, "--slates", str(data / "train.jsonl"),
                                          "--limit", "2"]) == 0
    said = [r.getMessage() for r in caplog.records if "was trained on" in r.getMessage()]
    assert said == [(f"--model m={run} was trained on --slates {data / 'eval.jsonl'}: its "
                     "row measures the fit, not held-out quality")]
    chosen = {"slates": str(data / "train.jsonl"), "eval_slates": str(data / "eval.jsonl")}
    for select, says in (("best", True), ("last", False)):
        (run / "train.json").write_text(json.dumps({"config": {**chosen, "select": select}}))
        caplog.clear()
        assert spdrank.commands.cli.main([*argv, "--slates", str(data / "eval.jsonl")]) == 0
        said = [r.getMessage() for r in caplog.records if "starting input" in r.getMessage()]
        assert said == ([(f"--model m={run} chose its epoch and starting input on --slates "
                          f"{data / 'eval.jsonl'} (its --eval-slates): its row is biased "
                          "upward; choose on validation slates")] if says else [])
    (run / "train.json").write_text("{not json")  # a damaged record says nothing
    caplog.clear()
    assert spdrank.commands.cli.main([*argv, "--slates", str(data / "eval.jsonl")]) == 0
    assert not [r for r in caplog.records if "was trained on" in r.getMessage()]
