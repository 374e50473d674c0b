"""What a benchmark writes: speed-ups over the teachers, ``results.json``, ``report.md``, plots.

The speed-up of a row R over a teacher T is T's median latency over R's, both taken from the
same results: measured in the same run on the same slates (a replayed teacher's latency is the
one recorded when it ran). It is undefined (``None``, ``-`` in the table) when either median
is missing or R's is zero.

Paired differences against a reference row (:mod:`spdrank.eval.paired`) go into ``results.json``
under ``paired`` and into the report as their own table.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from spdrank import __version__
from spdrank.compare import plots
from spdrank.compare.latency import STAGES, LatencyRow
from spdrank.core.files import atomic_writer
from spdrank.eval.evaluate import Results, format_table
from spdrank.eval.metrics import TEACHER_METRICS, metric_names
from spdrank.eval.paired import METHOD, PairedComparison, PairedDifference

QUALITY_PLOT = "quality_vs_latency.png"
STAGES_PLOT = "latency_stages.png"
DECOMPOSITION_PLOT = "latency_decomposition.png"


def speedups(results: Results, teachers: Sequence[str]) -> dict[str, dict[str, float | None]]:
    """Per row, per teacher: the teacher's median latency over the row's."""
    medians = {r.name: r.latency()["median"] for r in results.rankers}
    missing = [t for t in teachers if t not in medians]
    if missing:
        raise ValueError(f"no row named {missing[0]!r} to compute speed-ups against")
    return {
        name: {
            t: medians[t] / median if medians[t] is not None and median else None
            for t in teachers
        }
        for name, median in medians.items()
    }


def environment() -> dict[str, Any]:
    """Where and when the numbers were measured (torch and the GPU only when torch is loaded)."""
    env: dict[str, Any] = {
        "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "spdrank": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = torch.__version__
        env["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
    return env


# -- tables -----------------------------------------------------------------------------------


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:,.0f}"


def _num(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table_metrics(results: Results) -> tuple[list[str], list[str]]:
    """The metrics a report shows: quality (vs clicks), and fidelity (vs a teacher) if any."""
    names = metric_names(results.ks)
    quality = [m for m in names if m not in TEACHER_METRICS]
    fidelity = list(TEACHER_METRICS) if results.n_with_teacher else []
    return quality, fidelity


def quality_table(results: Results, teachers: Sequence[str]) -> str:
    """The main table (Tables 2-4) in markdown: latency, speed-ups, passes, quality, fidelity."""
    quality, fidelity = table_metrics(results)
    names = quality + fidelity
    ratios = speedups(results, teachers)
    head = [
        "ranker", "p50 ms", "p95 ms", *(f"speed-up vs {t}" for t in teachers), "passes",
        *quality, "valid %", *fidelity,
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in results.rankers:
        d = r.to_dict()
        means = {m: d["metrics"].get(m, {}).get("mean") for m in names}
        lines.append(
            _row([
                r.name,
                _ms(d["latency_ms"]["median"]),
                _ms(d["latency_ms"]["p95"]),
                *("-" if (x := ratios[r.name][t]) is None else f"{x:,.1f}x" for t in teachers),
                _num(d["decode_passes_mean"], 1),
                *(_num(means[m]) for m in quality),
                _num(d["valid_pct"], 1),
                *(_num(means[m]) for m in fidelity),
            ])
        )
    return "\n".join(lines)


def latency_table(rows: Sequence[LatencyRow]) -> str:
    """The latency decomposition (Table 5) in markdown, one line per checkpoint and size."""
    head = [
        "checkpoint", "N", "slates", *(f"{s} ms" for s in (*STAGES, "rest")), "total p50 ms",
        "total p95 ms", "bare prefill ms", "SPD / bare prefill", "SPD / bare, per slate",
        "overhead ms",
        "overhead / bare prefill", "slates/s (batch)", "peak MiB (1 / batch)",
    ]
    lines = [_row(head), _row(["---"] * len(head))]
    for r in rows:
        lines.append(
            _row([
                r.label,
                str(r.n),
                str(r.slates),
                *(_ms(r.stages_ms[s]) for s in (*STAGES, "rest")),
                _ms(r.total_ms["median"]),
                _ms(r.total_ms["p95"]),
                _ms(r.bare_prefill_ms),
                "-" if r.overhead is None else f"{r.overhead:.2f}x",
                "-" if r.paired_ratio is None else f"{r.paired_ratio:.3f}x",
                _ms(r.overhead_ms),
                "-" if r.overhead_ratio is None else f"{r.overhead_ratio:.2%}",
                f"{r.throughput:,.1f} ({r.batch_size})",
                f"{r.peak_memory_mb:,.0f} / {r.peak_memory_batch_mb:,.0f}",
            ])
        )
    return "\n".join(lines)


def paired_table(paired: PairedComparison) -> str:
    """Paired differences in markdown: per row and metric, the mean and its interval.

    An interval that excludes zero is in bold. ``slates``: how many slates were paired. Every
    click metric is defined on the same slates (those with an informative click), so one count
    covers them; the teacher metrics have their own, and tau one of its own again (a slate
    whose teacher scored every candidate alike orders no pair).
    """
    tau = TEACHER_METRICS[0]
    click = [m for m in paired.metrics if m not in TEACHER_METRICS]
    ties = [m for m in paired.metrics if m == tau]
    teacher = [m for m in paired.metrics if m in TEACHER_METRICS and m != tau]
    groups = (
        ("slates", click), (f"slates ({tau})", ties), (f"slates ({', '.join(teacher)})", teacher)
    )
    counts = [(label, group[0]) for label, group in groups if group]
    head = ["ranker", *(label for label, _ in counts), *paired.metrics]
    lines = [_row(head), _row(["---"] * len(head))]
    for name, diffs in paired.rows.items():
        lines.append(_row([
            name, *(str(diffs[m].n) for _, m in counts), *(_diff(diffs[m]) for m in paired.metrics)
        ]))
    return "\n".join(lines)


def _diff(d: PairedDifference) -> str:
    cell = d.text(digits=4)
    return f"**{cell}**" if d.excludes_zero else cell


# -- files ------------------------------------------------------------------------------------


def bench_dict(
    results: Results,
    teachers: Sequence[str],
    latency: Sequence[LatencyRow],
    paired: PairedComparison | None = None,
) -> dict[str, Any]:
    """``results.json``: the evaluation's JSON, plus teachers, speed-ups, the decomposition
    and the paired differences (``None`` when there was nothing to compare)."""
    return {
        **results.to_dict(),
        "teachers": list(teachers),
        "speedup": speedups(results, teachers),
        "latency": [r.to_dict() for r in latency],
        "paired": paired.to_dict() if paired is not None else None,
    }


def write_report(
    out: str | os.PathLike[str],
    results: Results,
    teachers: Sequence[str],
    latency: Sequence[LatencyRow] = (),
    title: str = "spdrank bench",
    paired: PairedComparison | None = None,
    preamble: str | None = None,
) -> Path:
    """Write ``report.md``, ``results.json``, ``table.txt`` and the plots into ``out``.

    ``preamble`` (markdown) goes right under the title: how the rows were made, e.g. the scale
    and commands of the script that trained the checkpoints, which the benchmark cannot know.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_writer(out / "results.json") as fh:
        json.dump(bench_dict(results, teachers, latency, paired), fh, indent=2, ensure_ascii=False)
        fh.write("\n")
    table = format_table(results)
    with atomic_writer(out / "table.txt") as fh:
        fh.write(table + "\n")
    unplotted = plots.quality_vs_latency(results, teachers, out / QUALITY_PLOT)
    has_stages = plots.stage_bars(results, out / STAGES_PLOT)
    if latency:
        plots.latency_decomposition(latency, out / DECOMPOSITION_PLOT)
    # A plot an earlier run wrote here and this one does not is another run's rows: removed.
    for plot, drawn in ((STAGES_PLOT, has_stages), (DECOMPOSITION_PLOT, bool(latency))):
        if not drawn:
            (out / plot).unlink(missing_ok=True)

    meta = results.meta
    lines = [f"# {title}", ""]
    if preamble:
        lines += [preamble.strip(), ""]
    lines += [f"- {k}: {v}" for k, v in meta.get("environment", {}).items()]
    lines.append(
        f"- slates: {meta.get('slates', '?')} ({results.n_slates} evaluated, "
        f"{results.n_with_teacher} with a teacher ranking)"
    )
    if "eval_s" in meta:
        lines.append("- wall time of this benchmark: " + _wall_time(meta))
    settings = {k: v for k, v in meta.get("settings", {}).items() if v not in (None, False, [])}
    lines += ["- settings: " + ", ".join(f"`{k}={v}`" for k, v in settings.items()), ""]
    lines += ["## Quality, latency, speed-up (Tables 2-4)", ""]
    lines += [quality_table(results, teachers), ""]
    lines.append(
        "Latency is per slate, batch size 1, the wall time of one `rank()` call; a replayed "
        "teacher's is the one recorded when it ran. Speed-up vs T: T's median latency over the "
        "row's, both from this table. Passes: sequential forward passes to decode the ranking. "
        "Quality is measured against the clicks; tau, top1 and top10 (overlap of the top 10) "
        "against the slates' teacher field, counting candidates the teacher scored alike "
        "(`teacher_scores`) as ties. Rows `MODEL:DECODER` are one checkpoint under each "
        "decoder: they share one forward pass per slate, and each reports that forward plus its "
        "own decode."
    )
    lines += ["", f"![quality vs latency]({QUALITY_PLOT})", ""]
    if unplotted:
        lines += [f"Not on the log axis (no positive latency): {', '.join(unplotted)}.", ""]
    if has_stages:
        lines += [f"![latency stages]({STAGES_PLOT})", ""]
    lines += ["```", table, "```", ""]
    if paired is not None and paired.rows:
        lines += [
            f"## Paired differences vs `{paired.reference}` ({paired.level:.0%} CI over slates)",
            "", paired_table(paired), "",
            (
                f"Each cell: the mean over slates of (row - `{paired.reference}`) on that slate, "
                f"and a {paired.level:.0%} {METHOD} ({paired.resamples:,} resamples, seed "
                f"{paired.seed}); bold: the interval excludes zero. Only slates where both rows "
                "define the metric are paired (a slate with every candidate clicked, or without "
                "a teacher ranking, is left out)."
            ),
            "",
        ]
    if latency:
        lines += ["## Latency decomposition (Table 5)", "", latency_table(latency), ""]
        lines.append(
            "Medians over the slates of each stage of `rank()` at batch size 1 (rest: the call's "
            "time outside the stages); per slate they add up to the total, medians need not. "
            "Bare prefill: the backbone's forward alone over the same tokens, timed slate by "
            "slate in the same loop; SPD / bare prefill is the ratio of the medians, and "
            "per slate, the median of each slate's SPD call over its own bare prefill (timed "
            "back to back, so the machine's drift between slates cancels). Overhead: everything of `rank()` but its prefill (total "
            "minus the prefill stage, per slate: tokenize, head, assign and rest), its median, "
            "and that median over the bare prefill's. Tokenize reads the token ids of texts "
            "the model has tokenized before (here, in the evaluation above) from its prompt "
            "builder's cache, as a served catalogue's repeating titles would be. Slates of N "
            "candidates: the eval slates cut to their first N candidates, or filled up with "
            "candidates drawn (seeded, without replacement) from the other slates' items. "
            "Peak memory: "
            f"{latency[0].memory_kind}."
        )
        if any(r.latency_batch > 1 for r in latency):
            lines += ["", (
                "A row `(batch B)` times `rank_batch` on B slates at once (one padded prefill), "
                "B at a time in order: every time in it is the whole call's (divide by B for a "
                "slate's share), its bare prefill is the forward over the same padded batch, "
                "and its slates/s is that of the timed calls; peak memory is the batched calls'."
            )]
        random = sorted({r.backbone for r in latency if r.random_weights})
        if random:
            lines += ["", (
                f"**Random weights:** the backbone of {', '.join(f'`{b}`' for b in random)} is "
                "built from a config alone, with seeded random weights (nothing downloaded). "
                "Latency does not depend on the weights, so these timings stand for the real "
                "model of that shape; its rankings mean nothing."
            )]
        lines += ["", f"![latency decomposition]({DECOMPOSITION_PLOT})", ""]
    with atomic_writer(out / "report.md") as fh:
        fh.write("\n".join(lines))
    return out / "report.md"


def _wall_time(meta: dict[str, Any]) -> str:
    """Seconds spent fitting the baselines, evaluating, and decomposing the latency."""
    parts = [
        ("fitting", sum(meta["fit_s"].values()) if meta.get("fit_s") else None),
        ("evaluation", meta.get("eval_s")),
        ("latency decomposition", meta.get("latency_s")),
    ]
    return ", ".join(f"{name} {s:,.1f} s" for name, s in parts if s is not None)
