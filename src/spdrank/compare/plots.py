"""The benchmark's figures, as PNG files: quality vs latency, and where the latency goes.

Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no global backend), so a
benchmark on a machine without a display, or inside a test, draws the same files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spdrank.compare.latency import STAGES, LatencyRow
from spdrank.eval.evaluate import Results

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

#: One colour per stage, the same in every figure; "rest" is the time outside the stages.
STAGE_COLOURS = {
    "tokenize": "#8da0cb",
    "prefill": "#fc8d62",
    "readout": "#ffd92f",
    "head": "#66c2a5",
    "assign": "#e78ac3",
    "rest": "#b3b3b3",
}
QUALITY_METRICS = ("AUC", "NDCG@10")


def require_matplotlib() -> None:
    """Fail before the measuring starts, not after, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            "spdrank bench draws its plots with matplotlib: pip install 'spdrank[plots]'"
        ) from None


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def quality_vs_latency(
    results: Results,
    teachers: Sequence[str],
    path: str | os.PathLike[str],
    metrics: Sequence[str] = QUALITY_METRICS,
) -> list[str]:
    """Each row as a point: median latency (log x) against a quality metric, one panel each.

    Rows without a positive latency (a replayed ranking computed for free) cannot sit on a
    log axis; their names are returned so the report can say so.
    """
    fig = _figure(6.0 * len(metrics), 4.5)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    skipped = []
    points = []
    for r in results.rankers:
        d = r.to_dict()
        latency = d["latency_ms"]["median"]
        if latency is None or latency <= 0:
            skipped.append(r.name)
            continue
        kind = (
            "teacher" if r.name in teachers
            else "baseline" if not d["decode_passes_mean"]
            else "single pass"
        )
        points.append((r.name, latency, kind, d["metrics"]))
    style = {
        "teacher": ("s", "#d95f02"),
        "baseline": ("^", "#7570b3"),
        "single pass": ("o", "#1b9e77"),
    }
    for ax, metric in zip(axes, metrics):
        seen = set()
        for name, latency, kind, values in points:
            value = values.get(metric, {}).get("mean")
            if value is None:
                continue
            marker, colour = style[kind]
            ax.scatter(latency, value, marker=marker, color=colour, s=40,
                       label=None if kind in seen else kind)
            seen.add(kind)
            ax.annotate(name, (latency, value), textcoords="offset points", xytext=(4, 4),
                        fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("median latency per slate (ms, log scale)")
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} vs latency ({results.n_slates} slates)")
        ax.grid(True, which="both", alpha=0.3)
        if seen:
            ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    return skipped


def _stacked(ax: Axes, labels: Sequence[str], parts: dict[str, list[float]]) -> None:
    """Horizontal bars, one per label (first on top), stacked from ``parts`` (stage -> values)."""
    y = list(range(len(labels)))
    left = [0.0] * len(labels)
    for stage, values in parts.items():
        ax.barh(y, values, left=left, height=0.6, label=stage, color=STAGE_COLOURS.get(stage))
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)


def _legend(ax: Axes) -> None:
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))


def stage_bars(results: Results, path: str | os.PathLike[str]) -> bool:
    """Mean milliseconds per stage for every row that reports stages; False if none does.

    Means, not medians, so that the stages and the rest add up to the row's mean latency.
    """
    rows = [r for r in results.rankers if r.stage_ms()]
    if not rows:
        return False
    stages = list(dict.fromkeys(s for r in rows for s in r.stage_ms()))
    parts: dict[str, list[float]] = {s: [r.stage_ms().get(s, 0.0) for r in rows] for s in stages}
    parts["rest"] = [
        max(0.0, (r.latency()["mean"] or 0.0) - sum(r.stage_ms().values())) for r in rows
    ]
    fig = _figure(8.0, 1.2 + 0.45 * len(rows))
    ax = fig.subplots()
    _stacked(ax, [r.name for r in rows], parts)
    _legend(ax)
    ax.set_xlabel("mean ms per slate")
    ax.set_title("Where the time goes (mean per slate)")
    fig.savefig(path, dpi=120)
    return True


def latency_decomposition(rows: Sequence[LatencyRow], path: str | os.PathLike[str]) -> None:
    """Median ms per stage at each slate size, with the bare prefill marked, per checkpoint."""
    models = list(dict.fromkeys(r.label for r in rows))
    per_model = max(sum(r.label == m for r in rows) for m in models)
    fig = _figure(8.0, 0.5 + (1.0 + 0.4 * per_model) * len(models))
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    for ax, model in zip(axes, models):
        mine = [r for r in rows if r.label == model]
        labels = [f"N={r.n}" for r in mine]
        parts = {s: [r.stages_ms[s] for r in mine] for s in (*STAGES, "rest")}
        _stacked(ax, labels, parts)
        # a thin bar under each size's stack: the backbone's forward alone, same tokens
        ax.barh([i + 0.38 for i in range(len(mine))], [r.bare_prefill_ms for r in mine],
                height=0.12, color="black", label="bare prefill")
        _legend(ax)
        batch = mine[0].latency_batch
        ax.set_xlabel("median ms per slate" if batch == 1 else f"median ms per call of {batch} slates")
        ax.set_title(f"{mine[0].model}: latency decomposition (batch size {batch})")
    fig.savefig(path, dpi=120)
