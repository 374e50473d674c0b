"""Paired comparisons of rankers over the same slates: mean difference and a bootstrap CI.

Every ranker of one :func:`spdrank.eval.evaluate.evaluate` run ranks the same slates, so two rows
are best compared slate by slate: the difference ``row - reference`` on each slate removes
what the slates themselves contribute (an easy slate is easy for both), and its spread over
slates is the uncertainty of the comparison. Two rows' means with separate error bars would
hide exactly that pairing and overstate the noise.

Pairs are formed by slate index (:attr:`spdrank.eval.evaluate.SlateRecord.index`) over the slates
where *both* rows define the metric; a slate where either value is ``None`` or NaN (no
informative click, no teacher ranking) is left out of that metric's pairs.

The interval is a **percentile bootstrap** over slates: resample the per-slate differences
with replacement, ``resamples`` times, and take the central ``level`` of the resampled means.
Chosen over a t-interval because the per-slate differences are far from normal: R@1 and top1
differences take only the values -1, 0 and 1, and MRR's are skewed. The bootstrap assumes no
shape and stays inside the attainable range; where a t-interval is valid (many slates) the two
agree (tested). With few slates it is somewhat too narrow, as every interval from so little
data is; benchmarks here pair hundreds. It is seeded, and each (row, metric) starts from the
same seed, so equal numbers of pairs are resampled identically: the intervals do not depend on
row order, and rerunning gives the same numbers. Below two pairs there is no spread to
estimate, and the interval is ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spdrank.eval.evaluate import RankerResult, Results

RESAMPLES = 2000
#: The most resamples an interval is drawn from: each resample's mean is kept (8 bytes) and
#: draws as many indices as there are slates, and the interval's Monte Carlo error is already
#: far below its width at the default; a larger number costs memory and time for nothing.
MAX_RESAMPLES = 1_000_000
LEVEL = 0.95
METHOD = "percentile bootstrap over slates"
#: Resampled values drawn at once (a bound on the index array's size, 32 MB as int64).
_CHUNK = 1 << 22


@dataclass(frozen=True)
class PairedDifference:
    """``row - reference`` on one metric: mean over the paired slates, and its interval."""

    n: int
    mean: float | None
    low: float | None
    high: float | None

    @property
    def excludes_zero(self) -> bool:
        """True when the interval lies strictly on one side of zero."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "low": self.low, "high": self.high}

    def text(self, digits: int = 3, missing: str = "-") -> str:
        """A table cell: ``+mean [low, high]``, the mean alone without an interval (too few
        pairs), ``missing`` without a pair."""
        if self.mean is None:
            return missing
        if self.low is None or self.high is None:
            return f"{self.mean:+.{digits}f}"
        return f"{self.mean:+.{digits}f} [{self.low:+.{digits}f}, {self.high:+.{digits}f}]"


def paired_values(row: RankerResult, reference: RankerResult, metric: str) -> np.ndarray:
    """Per-slate ``row - reference`` on ``metric``, over the slates where both define it.

    Slates are matched by index, in the reference's order; a slate one row lacks is skipped.
    """
    mine = {rec.index: rec.metrics.values.get(metric) for rec in row.records}
    diffs = []
    for rec in reference.records:
        ref = rec.metrics.values.get(metric)
        value = mine.get(rec.index)
        if _defined(ref) and _defined(value):
            diffs.append(value - ref)
    return np.asarray(diffs, dtype=np.float64)


def _defined(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def bootstrap_interval(
    values: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> tuple[float, float] | None:
    """The percentile bootstrap interval of the mean of ``values``; ``None`` below two values."""
    if not 1 <= resamples <= MAX_RESAMPLES:
        raise ValueError(f"resamples must be between 1 and {MAX_RESAMPLES:,}, got {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    n = len(values)
    if n < 2:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    per_chunk = max(1, _CHUNK // n)
    for start in range(0, resamples, per_chunk):
        stop = min(resamples, start + per_chunk)
        means[start:stop] = values[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def paired_difference(
    row: RankerResult,
    reference: RankerResult,
    metric: str,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> PairedDifference:
    """The mean paired difference ``row - reference`` on ``metric``, with its interval."""
    return difference_of(paired_values(row, reference, metric), resamples, level, seed)


def difference_of(
    diffs: np.ndarray, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> PairedDifference:
    """The mean of per-slate differences ``diffs``, with its percentile-bootstrap interval."""
    if not len(diffs):
        return PairedDifference(n=0, mean=None, low=None, high=None)
    interval = bootstrap_interval(diffs, resamples, level, seed)
    low, high = interval if interval is not None else (None, None)
    return PairedDifference(n=len(diffs), mean=float(diffs.mean()), low=low, high=high)


@dataclass
class PairedComparison:
    """Every row of a run against one reference row, metric by metric."""

    reference: str
    metrics: list[str]
    resamples: int
    level: float
    seed: int
    #: row name -> metric -> difference; every row of the run but the reference, in order.
    rows: dict[str, dict[str, PairedDifference]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "method": METHOD,
            "metrics": self.metrics,
            "resamples": self.resamples,
            "level": self.level,
            "seed": self.seed,
            "rows": {
                name: {m: d.to_dict() for m, d in diffs.items()} for name, diffs in self.rows.items()
            },
        }


def compare(
    results: Results,
    reference: str,
    metrics: Sequence[str],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> PairedComparison:
    """Each row of ``results`` minus the row named ``reference``, on each of ``metrics``."""
    names = [r.name for r in results.rankers]
    if reference not in names:
        raise ValueError(f"no row named {reference!r} to compare against; rows: {names}")
    ref = results[reference]
    rows = {
        r.name: {m: paired_difference(r, ref, m, resamples, level, seed) for m in metrics}
        for r in results.rankers
        if r.name != reference
    }
    return PairedComparison(reference, list(metrics), resamples, level, seed, rows)


def format_paired(paired: PairedComparison, digits: int = 4) -> str:
    """The comparison as fixed-width text under ``spdrank eval``'s table: one line a metric,
    one column a row compared with the reference (metrics down the side, as the cells are
    wide), each cell ``+mean [low, high]``, starred when the interval excludes zero.

    ``slates`` is how many slates were paired on that metric: the same for every row when each
    defines the metric wherever the reference does, as rankings of one slate set do; where rows
    differ, each cell says its own count.
    """
    names = list(paired.rows)
    head_line = (
        f"paired vs {paired.reference}: mean over slates of (row - {paired.reference}), "
        f"{paired.level:.0%} {METHOD} ({paired.resamples:,} resamples, seed {paired.seed}); "
        "* the interval excludes 0"
    )
    if not names:
        return head_line + "\n(no other row to compare)"
    cells: dict[str, list[str]] = {}
    counts: dict[str, str] = {}
    for metric in paired.metrics:
        diffs = [paired.rows[name][metric] for name in names]
        same = len({d.n for d in diffs}) == 1
        counts[metric] = str(diffs[0].n) if same else "-"
        cells[metric] = [
            d.text(digits) + ("*" if d.excludes_zero else "") + ("" if same else f" (n={d.n})")
            for d in diffs
        ]
    width = max([6, *(len(m) for m in paired.metrics)])
    columns = [
        max(len(name), *(len(cells[m][i]) for m in paired.metrics)) for i, name in enumerate(names)
    ]
    head = f"{'metric':<{width}} {'slates':>6} " + " ".join(
        f"{name:<{w}}" for name, w in zip(names, columns)
    )
    lines = [head_line, head.rstrip(), "-" * len(head.rstrip())]
    for metric in paired.metrics:
        row = f"{metric:<{width}} {counts[metric]:>6} " + " ".join(
            f"{cell:<{w}}" for cell, w in zip(cells[metric], columns)
        )
        lines.append(row.rstrip())
    return "\n".join(lines)
