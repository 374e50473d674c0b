"""``spdrank demo --tiny``: the README's first command, end to end at a toy scale, so it cannot rot.

It runs every real step (Beauty build, teacher labels, training on the real bundled backbone's
first layer, evaluation) and then again, to check an interrupted or repeated demo reuses
what is done.
"""

import json

from spdrank.cli import main


def test_demo_tiny_end_to_end_and_rerun_reuses(tmp_path, capsys):
    root = tmp_path / "demo"
    assert main(["demo", "--tiny", "--dir", str(root), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    for step in range(1, 7):
        assert f"[{step}/6]" in out
    results = json.loads((root / "report" / "results.json").read_text())
    rankers = results["rankers"]
    assert {"random", "popularity", "cooccurrence", "spd-student:expected_rank",
            "spd-student:hungarian"} <= set(rankers)
    assert (root / "report" / "report.md").exists() and list((root / "report").glob("*.png"))
    # the recipe: frozen backbone states (cached) and the upstream features, decoded by
    # expected rank, which the checkpoint carries
    saved = json.loads((root / "student" / "model" / "config.json").read_text())
    assert saved["decoder"] == "expected_rank" and saved["backbone"]["lora"] is None
    assert saved["features"]["names"] == ["popularity", "cooccurrence", "title_similarity"]
    assert list((root / "states").rglob("*.safetensors"))
    student = rankers["spd-student:expected_rank"]
    assert student["valid_pct"] == 100.0 and student["n_slates"] == 6
    assert student["decode_passes_mean"] == 1.0
    # fidelity to the teacher is measured: the eval slates carry the teacher's permutation
    assert student["metrics"]["tau"]["n"] == 6
    assert rankers["cooccurrence"]["metrics"]["tau"]["mean"] == 1.0  # it IS the teacher
    assert "spdrank rank --model" in out and "spdrank serve --model" in out
    trained = (root / "student" / "train.json").stat().st_mtime

    assert main(["demo", "--tiny", "--dir", str(root), "--device", "cpu"]) == 0
    again = capsys.readouterr().out
    assert again.count("already done, reusing it") == 3  # slates, teacher labels, student
    assert (root / "student" / "train.json").stat().st_mtime == trained
