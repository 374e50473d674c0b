"""The scripts behind benchmarks/results/overhead-cpu: the micro-benchmark, the head's profile
and the report's tables, run on a tiny checkpoint and on small result files."""

from __future__ import annotations

import json
import sys

import pytest

from spdrank.model import SPDRanker
from spdrank.ranking import STAGES
from tests.helpers import load_benchmark, tiny_config


@pytest.fixture
def checkpoint(tmp_path, tiny_backbone):
    """A tiny history-head checkpoint reading words, the kind `spdrank train` builds."""
    from spdrank.prompt import PromptSettings

    config = tiny_config(tiny_backbone, kind="history", frozen=True, positions=12,
                         tokens=True, match="tfidf", match_width=8)
    config.prompt = PromptSettings(max_item_tokens=8, readout="words", history_items=True)
    SPDRanker.build(config).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_micro_benchmark_times_every_stage_around_the_prefill(checkpoint, slates, monkeypatch):
    micro = load_benchmark("overhead_micro", monkeypatch)
    model = SPDRanker.from_pretrained(checkpoint, device="cpu")
    from spdrank.bench.latency import resize_slates

    times = micro.stages(model, resize_slates(slates, 5, 0)[:3], reps=3)
    assert list(times) == ["tokenize", "readout", "head", "assign", "result", "around"]
    for t in times.values():
        assert 0 < t["min"] <= t["median"]


def test_head_profile_lists_the_heads_operations(checkpoint, tmp_path, slates, monkeypatch, capsys):
    from spdrank.slates import write_slates

    write_slates(tmp_path / "s.jsonl", slates)
    profile = load_benchmark("head_profile", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["head_profile.py", "--model", str(checkpoint), "--slates",
                                      str(tmp_path / "s.jsonl"), "--n", "6", "--calls", "3"])
    assert profile.main() == 0
    out = capsys.readouterr().out
    assert "Self CPU" in out and "ms of CPU per head call" in out


def _row(model: str, n: int, overhead_ms: float, ratio: float, paired: float | None) -> dict:
    row = {"model": model, "n": n, "stages_ms": dict.fromkeys((*STAGES, "rest"), 1.0),
           "total_ms": {"median": 100.0, "p95": 120.0}, "bare_prefill_ms": 95.0,
           "overhead_ms": overhead_ms, "overhead": ratio}
    if paired is not None:  # results written before the bench kept the per-slate ratio lack it
        row["paired_ratio"] = paired
    return row


def test_summary_tables_compare_with_the_goals_and_the_code_before(tmp_path, monkeypatch, capsys):
    (tmp_path / "float32").mkdir()
    (tmp_path / "before").mkdir()
    rows = [_row("a", 20, 3.0, 1.05, 1.04), _row("a", 50, 4.5, 1.024, 1.018),
            _row("a", 150, 9.0, 1.009, None)]
    (tmp_path / "float32" / "results.json").write_text(json.dumps({"latency": rows}))
    micro = {"rows": [{"n": 50, "stage": "around", "min": 2.5, "median": 3.0},
                      {"n": 50, "stage": "head", "min": 2.0, "median": 2.2}]}
    (tmp_path / "float32" / "micro-a.json").write_text(json.dumps(micro))
    old = {"rows": [{"n": 50, "stage": "head", "min": 3.0, "median": 3.1}]}
    (tmp_path / "before" / "micro-a-float32.json").write_text(json.dumps(old))
    summary = load_benchmark("overhead_summary", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["overhead_summary.py", "--dir", str(tmp_path),
                                      "--before", str(tmp_path / "before")])
    assert summary.main() == 0
    out = capsys.readouterr().out
    assert "| a | float32 | 50 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 1.00 | 100 | 95.00 |" in out
    assert "| a | float32 | 50 | - | - | 3.00 → 2.00 | - | - | 2.50 |" in out
    goals = out[out.index("### Against the goals") :]
    assert "| a | float32 | 50 | 4.50 | 2.50 | 1.0 | 1.024x | 1.018x | 1.02x |" in goals
    assert "| a | float32 | 150 | 9.00 | - | 3.0 | 1.009x | - | 1.03x |" in goals
    assert "| 20 |" not in goals[: goals.index("### Each stage")]  # no goal at N = 20
    situ = out[out.index("### Each stage right after a prefill") :]
    # in situ (every stage 1.0 ms in the bench) over warm (the head's 2.0 ms minimum); the
    # work around the prefill less the head: 4.5 - 1.0
    assert "| a | float32 | 50 | - | - | 1.00 / 2.00 (0.5x) | - | 3.50 |" in situ


@pytest.mark.parametrize("base, head, readout, names", [
    ("lex/words-tfidf/512", "history", "words",
     ("lex/words-tfidf-w128/512", "lex/words-tfidf-w256/512")),
    ("lex/paper/512", "attn", "last", ("lex/paper-w128/512", "lex/paper-w256/512")),
    ("clicks/words-tfidf+pop+co", "history", "words",
     ("clicks/words-tfidf+pop+co-w128", "clicks/words-tfidf+pop+co-w256")),
])
def test_width_rows_change_only_the_head_width_and_the_run_directory(base, head, readout, names,
                                                                     monkeypatch):
    widths = load_benchmark("head_width_fidelity", monkeypatch)
    assert set(widths.BASES) == {"lex/words-tfidf/512", "lex/paper/512",
                                 "clicks/words-tfidf+pop+co"}
    narrow, wide = widths.width_row(base, 128), widths.width_row(base, 256)
    assert (narrow.name, wide.name) == names
    a, b = narrow.train_command(), wide.train_command()
    assert a[a.index("--head") + 1] == head and a[a.index("--readout") + 1] == readout
    assert a[a.index("--head-width") + 1] == "128" and b[b.index("--head-width") + 1] == "256"
    # Both read one state cache; only the width and the output folder differ.
    assert a[a.index("--cache-states") + 1] == b[b.index("--cache-states") + 1]
    differ = {x for x, y in zip(a, b) if x != y}
    assert differ == {"128", str(narrow.run_dir())}


def test_compiled_head_times_the_inference_path_and_a_compiled_copy(
    checkpoint, tiny_backbone, tmp_path, slates, monkeypatch, capsys
):
    """The compiled head computes the inference path's scores (to bfloat16's precision), and
    every variant gets a time; a head other than the paper's is refused by name."""
    from spdrank.slates import write_slates

    write_slates(tmp_path / "s.jsonl", slates)
    config = tiny_config(tiny_backbone, kind="attn", frozen=True, positions=12)
    SPDRanker.build(config).save_pretrained(tmp_path / "attn")
    compiled = load_benchmark("compiled_head", monkeypatch)
    argv = ["compiled_head.py", "--slates", str(tmp_path / "s.jsonl"), "--sizes", "5",
            "--reps", "3", "--slates-per-size", "2", "--variants", "eager,inductor"]
    monkeypatch.setattr(sys, "argv", [*argv, "--model", str(tmp_path / "attn"),
                                      "--after-prefill", "--out", str(tmp_path / "c.json")])
    assert compiled.main() == 0
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["meta"]["after_prefill"] is True
    rows = {r["variant"]: r for r in written["rows"]}
    assert set(rows) == {"eager", "inductor"}
    assert 0 < rows["inductor"]["min"] <= rows["inductor"]["median"]
    assert rows["inductor"]["max_abs_diff"] < 0.1

    monkeypatch.setattr(sys, "argv", [*argv, "--model", str(checkpoint)])
    with pytest.raises(SystemExit):
        compiled.main()
    assert "HistoryAttentionHead" in capsys.readouterr().err


def test_head_after_prefill_times_the_work_after_each_condition(checkpoint, slates, monkeypatch):
    after = load_benchmark("head_after_prefill", monkeypatch)
    model = SPDRanker.from_pretrained(checkpoint, device="cpu")
    from spdrank.bench.latency import resize_slates

    times = after.measure(model, resize_slates(slates, 5, 0)[:3], sweep_mb=1)
    assert list(times) == [*after.CONDITIONS, "prefill_itself"]
    assert all(len(v) == 3 and min(v) > 0 for v in times.values())
    assert after.quartiles([1.0, 2.0, 3.0, 4.0, 5.0])["median"] == 3.0


def test_first_touch_times_each_operation_after_each_pause(tmp_path, monkeypatch):
    import torch

    touch = load_benchmark("first_touch", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["first_touch.py", "--rounds", "2", "--pause-s", "0.001",
                                      "--out", str(tmp_path / "t.json")])
    threads = torch.get_num_threads()
    try:
        assert touch.main() == 0
    finally:
        torch.set_num_threads(threads)
    written = json.loads((tmp_path / "t.json").read_text())
    names = [name for name, _ in touch.operations()]
    assert [r["pause"] for r in written["rows"]] == ["none", "compute", "sleep"]
    for row in written["rows"]:
        assert all(row[name] > 0 for name in names)
    assert "linear again" in (tmp_path / "t.txt").read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_huge_text_moves_a_librarys_code_and_it_still_runs(tmp_path):
    """The code moved onto anonymous memory runs as before, in a process of its own (the
    move rewrites the library's mappings, which no test process should share)."""
    import subprocess

    from tests.helpers import ROOT, subprocess_env

    out = tmp_path / "t.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "first_touch.py"), "--rounds", "1",
         "--pause-s", "0.001", "--huge-text", "libtorch_cpu", "--out", str(out)],
        check=False, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    assert written["meta"]["moved_bytes"] >= 2 << 20
    assert all(row["linear"] > 0 for row in written["rows"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_decoder_trace_writes_a_line_per_batch_one_call(
    checkpoint, tmp_path, slates, monkeypatch, capsys
):
    """The bench runs as usual; each batch-1 decoder call at the traced size leaves one line
    with its times, the host's steal and three repeats, and the summary reads them."""
    import spdrank.decode
    from spdrank.slates import write_slates

    write_slates(tmp_path / "s.jsonl", slates)
    # Restored at teardown: the script replaces the module's function for the process.
    monkeypatch.setattr(spdrank.decode, "decode_batch", spdrank.decode.decode_batch)
    trace_script = load_benchmark("decoder_trace", monkeypatch)
    monkeypatch.setenv("TRACE", str(tmp_path / "t.jsonl"))
    argv = ["--size", "6", "bench", "--slates", str(tmp_path / "s.jsonl"), "--model",
            f"m={checkpoint}", "--device", "cpu", "--out", str(tmp_path / "report"),
            "--no-progress", "--latency", "--latency-sizes", "6", "--latency-slates", "3",
            "--bootstrap", "100"]
    assert trace_script.run(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(rows) >= 3  # the timed slates, and the warm-up calls before them
    for row in rows:
        assert row["wall_ms"] > 0 and row["steal_ticks"] >= 0 and len(row["again_ms"]) == 3
    capsys.readouterr()
    assert trace_script.run(["--summary", str(tmp_path / "t.jsonl")]) == 0
    assert f"{len(rows)} calls" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        trace_script.run(["bench"])
