"""``spdrank demo --tiny``: the README's first command, end to end at a toy scale, so it cannot rot.

It runs every real step (Beauty build, teacher labels, distillation on the real bundled
backbone's first layer, evaluation), then again, to check a repeated demo reuses what is done,
then with another teacher, to check a changed demo redoes what the change touches.
"""

import json

import pytest

from spdrank.commands.cli import main


@pytest.mark.slow  # the whole demo, end to end, on the bundled SmolLM2
def test_demo_tiny_end_to_end_reuses_what_is_done_and_redoes_what_changed(tmp_path, capsys):
    root = tmp_path / "demo"
    assert main(["demo", "--tiny", "--dir", str(root), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for step in range(1, 7):
        assert f"[{step}/6]" in out
    results = json.loads((root / "report" / "results.json").read_text())
    rankers = results["rankers"]
    assert {"random", "popularity", "cooccurrence", "title_similarity",
            "spd-student:expected_rank", "spd-student:hungarian"} <= set(rankers)
    assert (root / "report" / "report.md").exists() and list((root / "report").glob("*.png"))
    # the recipe: a frozen backbone (states cached), the history head matching words as a
    # soft TF-IDF, the teacher's permutations as the target, no upstream feature, decoded by
    # expected rank
    saved = json.loads((root / "student" / "model" / "config.json").read_text())
    assert saved["decoder"] == "expected_rank" and saved["backbone"]["lora"] is None
    assert saved["head"]["kind"] == "history" and saved["prompt"]["readout"] == "words"
    assert saved["head"]["match"] == "tfidf"
    assert not (saved.get("features") or {}).get("names")
    assert json.loads((root / "student" / "train.json").read_text())["config"]["target"] == "teacher"
    assert list((root / "states").rglob("*.safetensors"))
    student = rankers["spd-student:expected_rank"]
    assert student["valid_pct"] == 100.0 and student["n_slates"] == 6
    assert student["decode_passes_mean"] == 1.0
    # fidelity to the teacher is measured: the eval slates carry the lexical teacher's ranking
    assert student["metrics"]["tau"]["n"] > 0
    assert rankers["title_similarity"]["metrics"]["tau"]["mean"] == 1.0  # it IS the teacher
    assert "Kendall tau" in out
    assert "spdrank rank --model" in out and "spdrank serve --model" in out
    trained = (root / "student" / "train.json").stat().st_mtime

    assert main(["demo", "--tiny", "--dir", str(root), "--device", "cpu"]) == 0
    again = capsys.readouterr().out
    assert again.count("already done, reusing it") == 4  # slates, subset, labels, student
    assert (root / "student" / "train.json").stat().st_mtime == trained

    # Another teacher: the slates and the subset are reused; labels and student are redone.
    assert main(["demo", "--tiny", "--dir", str(root), "--device", "cpu",
                 "--teacher", "ranker:popularity"]) == 0
    changed = capsys.readouterr().out
    assert changed.count("already done, reusing it") == 2
    assert "other settings: removing it" in changed
    results = json.loads((root / "report" / "results.json").read_text())
    assert results["rankers"]["popularity"]["metrics"]["tau"]["mean"] == 1.0
    assert (root / "student" / "train.json").stat().st_mtime != trained


def test_a_step_made_with_other_settings_is_removed_with_what_it_wrote_besides(tmp_path):
    from spdrank.commands.demo import begin, finish, is_done

    step, cache = tmp_path / "student", tmp_path / "states"
    begin(step, {"scale": "tiny"}, also=[cache])
    (step / "model.txt").write_text("tiny")
    cache.mkdir()
    (cache / "key.json").write_text("{}")  # e.g. a state cache keyed to the tiny settings
    finish(step, {"scale": "tiny"})
    assert is_done(step, {"scale": "tiny"}) and not is_done(step, {"scale": "full"})

    begin(step, {"scale": "tiny"}, also=[cache])  # same settings: kept, to resume
    assert (step / "model.txt").exists() and cache.exists()
    begin(step, {"scale": "full"}, also=[cache])  # other settings: both go
    assert not (step / "model.txt").exists() and not cache.exists()
    assert not is_done(step, {"scale": "full"})


def test_the_full_demo_evaluates_sasrec_next_to_the_count_baselines(tmp_path):
    from spdrank.commands.demo import FULL, TINY, bench_argv

    def rankers(scale):
        argv = bench_argv(scale, tmp_path / "data", tmp_path / "labels", tmp_path / "student",
                          tmp_path / "report", "cpu")
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--ranker"]

    assert rankers(FULL) == ["random", "popularity", "cooccurrence", "title_similarity", "sasrec"]
    assert "sasrec" not in rankers(TINY)  # the toy scale stays a minute long
    argv = bench_argv(FULL, tmp_path / "data", tmp_path / "labels", tmp_path / "student",
                      tmp_path / "report", "cpu")
    assert argv[argv.index("--train") + 1] == str(tmp_path / "data" / "train.jsonl")
