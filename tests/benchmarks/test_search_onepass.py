"""benchmarks/search_onepass_cpu.py: its held-out queries and its commands."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "search_onepass_cpu.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("search_onepass_cpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_validation_queries_are_held_out_whole_and_seeded(tmp_path: Path) -> None:
    bench = _module()
    source = tmp_path / "all.jsonl"
    source.write_text("".join(json.dumps({"query": {"qid": f"q{i}"}}) + "\n" for i in range(20)))
    bench.split_validation(source, tmp_path / "t.jsonl", tmp_path / "v.jsonl", 5)
    kept = [json.loads(x)["query"]["qid"] for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    held = [json.loads(x)["query"]["qid"] for x in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert len(held) == 5 and sorted(kept + held) == sorted(f"q{i}" for i in range(20))
    bench.split_validation(source, tmp_path / "t2.jsonl", tmp_path / "v2.jsonl", 5)
    assert (tmp_path / "v2.jsonl").read_bytes() == (tmp_path / "v.jsonl").read_bytes()


def test_every_command_of_the_dry_run_parses(tmp_path: Path) -> None:
    """Each spdrank command the benchmark runs, on a CPU and as gpu.sh runs it, exists with
    every flag it passes; every student trains one pass over K = 100 and is chosen on the
    held-out queries."""
    from spdrank.commands.cli import build_parser

    parser = build_parser()
    for extra in ([], ["--layers", "0", "--device", "cuda", "--dtype", "bfloat16",
                       "--adapted", "matched+lora,anchored+bm25+lora", "--lora-layers", "4",
                       "--windowed", "anchored+bm25", "--teachers", "likelihood"]):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), "--dry-run", "--work", str(tmp_path / "w"),
             "--runs", str(tmp_path / "r"), *extra],
            capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        argvs = [shlex.split(line.split(" ", 1)[1])[1:] for line in done.stdout.splitlines()
                 if line.startswith("+ spdrank ")]
        for argv in argvs:
            parser.parse_args(argv)  # exits (fails the test) on an unknown flag or value
        trains = [argv for argv in argvs if argv[0] == "train"]
        adapted = [argv for argv in trains if "--lora-layers" in argv]
        windowed = [argv for argv in trains if argv[argv.index("--positions") + 1] == "20"]
        assert len(trains) == 6 + len(adapted) + len(windowed)
        assert len(adapted) == (2 if extra else 0) and len(windowed) == (1 if extra else 0)
        # The windowed student learns from windows of the same training queries and ranks by
        # windows; every other student ranks the whole top 100 in one pass.
        assert all(argv[argv.index("--slates") + 1].endswith("dl22-train.windows.jsonl")
                   for argv in windowed)
        evals = [argv for argv in argvs if argv[0] == "eval" and "--window" in argv]
        assert len(evals) == (2 if extra else 0)
        assert all("@windows=" in argv[argv.index("--model") + 1] for argv in evals)
        trains = [argv for argv in trains if argv not in windowed]
        # A LoRA student adapts its top layers over cached states, from its frozen student.
        assert all("--frozen" not in argv and "--cache-states" in argv and
                   argv[argv.index("--init-from") + 1].endswith(("matched", "anchored+bm25"))
                   for argv in adapted)
        assert all(argv[argv.index("--positions") + 1] == "100" and "--eval-slates" in argv
                   for argv in trains)
        # The fusion teacher labels every set; a teacher scored beside it labels each test set
        # and is replayed as one row of its own.
        teachers = [argv for argv in argvs if argv[0] == "teacher"]
        assert len(teachers) == 3 + (2 if extra else 0)
        scored = [argv for argv in teachers if "likelihood" in argv]
        assert all(argv[argv.index("--slates") + 1].endswith(("dl19.jsonl", "dl21.jsonl"))
                   for argv in scored) and len(scored) == (2 if extra else 0)
        replayed = [argv for argv in argvs if argv[0] == "eval" and "--labels" in argv
                    and argv[argv.index("--labels") + 1].startswith("likelihood=")]
        assert len(replayed) == len(scored)
