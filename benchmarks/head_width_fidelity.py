"""Does a narrower head learn its teacher as well? One student at several head widths.

    .venv/bin/python benchmarks/head_width_fidelity.py [--row NAME] [--widths 256,128] [--dry-run]

A row of the fidelity report (``--row``: ``lex/words-tfidf/512``, the default student: the
history head on word states of 32-token titles, tfidf match; ``lex/paper/512``, the paper's
head: attention over the candidates' last-token states of 12-token titles; both on SmolLM2 x
2 layers frozen, 512 slates of the lexical teacher, 8 epochs; or
``clicks/words-tfidf+pop+co``, the default student with two features on the clicks of 2,048
slates, 2 epochs) trained once per head width, each from the same state cache, then scored
on the 1,118 eval slates through it, with paired differences against the first width. The
head's cost grows with the square of its width (its feed-forward products are most of its
arithmetic), so a narrower head that learns as well is the cheapest way to shrink the work
around the prefill. Builds the data and the
lexical teacher's labels where ``benchmarks/fidelity_beauty_cpu.py`` has not; writes
``benchmarks/results/head-width-fidelity/`` for the default student and its ``paper/`` and
``clicks/`` subfolders for the others (results.json, report.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import fidelity_beauty_cpu as fidelity

OUT = Path("benchmarks/results/head-width-fidelity")
#: The rows this script widens or narrows, the folder each one's report goes to, and its title.
BASES = {
    "lex/words-tfidf/512": (OUT, "The default student at two head widths"),
    "lex/paper/512": (OUT / "paper", "The paper's head at two head widths"),
    "clicks/words-tfidf+pop+co": (OUT / "clicks", "The default student on clicks, two widths"),
}


def width_row(base_name: str, width: int) -> fidelity.Row:
    """The row ``base_name`` at head ``width``, in a run directory of its own."""
    base = next(r for r in fidelity.rows() if r.name == base_name)
    stem, _, last = base_name.rpartition("/")
    name = f"{stem}-w{width}/{last}" if last.isdigit() else f"{base_name}-w{width}"
    return replace(base, name=name, extra=[*base.extra, "--head-width", str(width)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--row", default="lex/words-tfidf/512", choices=sorted(BASES))
    p.add_argument("--widths", default="256,128")
    p.add_argument("--dry-run", action="store_true", help="print the training commands only")
    args = p.parse_args()
    out, title = BASES[args.row]
    rows = [width_row(args.row, int(w)) for w in args.widths.split(",")]
    commands = [row.train_command() for row in rows]
    for cmd in fidelity.prepare({"lexical"}, args.dry_run):
        if args.dry_run:
            print(" ".join(cmd))
    for row, cmd in zip(rows, commands):
        print(" ".join(cmd))
        if not args.dry_run and not (row.run_dir() / "model").is_dir():
            fidelity.run(cmd)
    if args.dry_run:
        return 0
    validation = {row.name: json.loads((row.run_dir() / "train.json").read_text())
                  for row in rows}
    fidelity.REFERENCES = (rows[0].name,)  # paired differences against the first width
    evals = fidelity.evaluate_on_eval(rows, "lexical")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(
        {"commands": commands, "validation": {k: v.get("eval") for k, v in validation.items()},
         "train_s": {k: v.get("wall_s_this_run") for k, v in validation.items()},
         "eval": evals}, indent=2) + "\n")
    metrics = [*fidelity.FIDELITY, *fidelity.QUALITY]
    lines = ["| row | " + " | ".join(f"eval {m}" for m in metrics) + " | validation tau | "
             "validation top1 | training s |", "| --- " * (len(metrics) + 4) + "|"]
    for row in rows:
        cells = [fidelity.fmt(evals["rows"][row.name].get(m)) for m in metrics]
        val = validation[row.name].get("eval", {})
        lines.append(f"| {row.name} | " + " | ".join(cells) + f" | {fidelity.fmt(val.get('tau'))}"
                     f" | {fidelity.fmt(val.get('top1'))} | "
                     f"{validation[row.name].get('wall_s_this_run')} |")
    paired = evals["paired"].get(rows[0].name, {}).get("rows", {})
    lines += ["", (f"Paired differences against {rows[0].name}, mean [95% interval], "
              f"{evals['n_slates']} eval slates:"), ""]
    for row in rows[1:]:
        diffs = paired.get(row.name, {})
        lines.append(f"- {row.name}: " + ", ".join(
            f"{m} {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
            for m, d in diffs.items() if m in metrics))
    text = "\n".join(lines)
    print(text)
    (out / "report.md").write_text(
        f"# {title}\n\n" + (__doc__ or "").split("\n\n", 2)[2]
        + "\n\nCommand: `.venv/bin/python benchmarks/head_width_fidelity.py --row "
        f"{args.row}`; training commands in results.json.\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
