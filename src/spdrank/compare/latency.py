"""The latency decomposition of an SPD checkpoint (the paper's Table 5), at several slate sizes.

For each slate size N, on the same slates:

- the stages ``SPDRanker.rank`` reports (:data:`~spdrank.core.ranking.STAGES`: tokenize, prefill,
  readout, head, assign) and the rest of the call (the Python around them, building the :class:`~spdrank.core.ranking.Ranking`), per slate;
  the table gives each one's median over the slates, and the end-to-end median and p95.
  Per slate the stages and the rest add up to the end-to-end time exactly; medians need not;
- a bare prefill of the same tokens: the backbone's forward alone, the one pass every LLM
  ranker pays, timed in the same loop as SPD (slate by slate, alternating). SPD end to end
  over bare prefill is reported two ways: the ratio of the medians, and the median over the
  slates of each slate's own ratio (its SPD call over its bare prefill, timed back to back),
  which a machine whose speed drifts between slates moves less. Before either is timed on a slate, one
  untimed forward of its prompt lets the backend build what it builds per shape (oneDNN's
  bfloat16 kernels on a CPU, for each new prompt length), which a server pays once per
  length, not per request, and which would otherwise land on whichever call came first;
- the overhead: everything of a slate's ``rank()`` but its prefill (end to end minus the
  prefill stage, per slate: tokenizing, the readout, the head, the assignment and the rest), its median in
  milliseconds and that median over the bare prefill's;
- throughput: slates per second through ``rank_batch`` in padded batches of a given size;
- at a latency batch B > 1 (``--latency-batch``), the same decomposition of ``rank_batch``
  calls on B slates at once (one padded prefill), each time the call's: the slates taken B
  at a time in order (a last partial batch is left out), the bare prefill of the same padded
  batch, and the throughput that of the timed calls;
- peak memory at batch size 1 and during the batched run: on CUDA,
  ``torch.cuda.max_memory_allocated`` since that part began; on CPU, the process's peak
  resident set (``ru_maxrss``), which cannot be reset: it includes the model and everything
  measured before.

The per-slate timings come from :func:`spdrank.eval.evaluate.evaluate`, the loop every other number
of a report comes from (warm-up calls, garbage collection paused while timing).

Slates of N candidates are made from real evaluation slates, so prompts hold real titles and
realistic token counts: N at most a slate's size keeps its first N candidates; a larger N adds
N - n candidates drawn without replacement, seeded, from the items of the other slates given,
never one the slate already holds.

torch is imported inside the functions that run the model, so a report that only reads
:class:`LatencyRow` does not load it.
"""

from __future__ import annotations

import gc
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from spdrank.core.defaults import LATENCY_SIZES
from spdrank.core.ranking import STAGES, Ranking
from spdrank.core.slates import Candidate, Slate, batched
from spdrank.eval.evaluate import evaluate, percentile

T = TypeVar("T")

if TYPE_CHECKING:
    import torch

    from spdrank.model.ranker import SPDRanker

DEFAULT_SIZES = LATENCY_SIZES


@dataclass
class LatencyRow:
    """One checkpoint at one slate size N: what Table 5 reports, and what it rests on."""

    model: str
    n: int
    slates: int
    #: Median milliseconds of each stage in :data:`STAGES`, and of the ``rest``.
    stages_ms: dict[str, float]
    #: End-to-end milliseconds of ``rank()``: ``median`` and ``p95``.
    total_ms: dict[str, float]
    bare_prefill_ms: float
    #: Median over the slates of the end-to-end milliseconds minus the prefill stage's.
    overhead_ms: float
    batch_size: int
    #: Slates per second through ``rank_batch`` at ``batch_size``.
    throughput: float
    #: Peak memory (MiB) while ranking one slate at a time, and while ranking batches.
    peak_memory_mb: float
    peak_memory_batch_mb: float
    memory_kind: str
    #: Slates per timed call: 1 times ``rank()``; B > 1 times ``rank_batch`` on B slates, and
    #: every time in the row is then the whole call's.
    latency_batch: int = 1
    #: The checkpoint's backbone (``name_or_path``), and whether its weights are random (a
    #: ``config:`` backbone: its timings stand, its rankings mean nothing).
    backbone: str = ""
    random_weights: bool = False
    #: Median over the slates (batch: the calls) of end-to-end ms over the bare prefill's ms
    #: of the same slate, timed back to back; None where no bare prefill was timed.
    paired_ratio: float | None = None

    @property
    def label(self) -> str:
        """The row's name in tables and plots: the checkpoint, and its batch when above 1."""
        return self.model if self.latency_batch == 1 else f"{self.model} (batch {self.latency_batch})"

    @property
    def overhead(self) -> float | None:
        """SPD end to end over a bare prefill of the same tokens (ratio of medians)."""
        return self.total_ms["median"] / self.bare_prefill_ms if self.bare_prefill_ms else None

    @property
    def overhead_ratio(self) -> float | None:
        """What SPD adds around the prefill, over a bare prefill (ratio of medians)."""
        return self.overhead_ms / self.bare_prefill_ms if self.bare_prefill_ms else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overhead": self.overhead, "overhead_ratio": self.overhead_ratio}


def resize_slates(slates: Sequence[Slate], n: int, seed: int = 0) -> list[Slate]:
    """Every slate with exactly ``n`` candidates (see the module's docstring for how).

    The teacher ranking is dropped (it does not cover added items); clicks on kept items stay.
    """
    if n < 1:
        raise ValueError(f"a slate size must be at least 1, got {n}")
    pool: dict[str, Candidate] = {}
    for slate in slates:
        for c in slate.candidates:
            pool.setdefault(c.docid, c)
    items = list(pool.values())
    rng = random.Random(seed)
    out = []
    for slate in slates:
        own = set(slate.docids)
        need = n - len(slate)
        if need <= 0:
            candidates = slate.candidates[:n]
        elif len(items) - len(own) < need:
            raise ValueError(
                f"slates of {n} candidates need {need} more items for slate "
                f"{slate.query.qid!r}, but the slates given hold {len(items)} distinct items: "
                "use more slates"
            )
        else:
            # At most len(own) of the drawn items are the slate's own: `need` others remain.
            drawn = [c for c in rng.sample(items, need + len(own)) if c.docid not in own]
            candidates = slate.candidates + drawn[:need]
        kept = {c.docid for c in candidates}
        clicked = [d for d in slate.clicked or [] if d in kept] or None
        out.append(Slate(query=slate.query, candidates=list(candidates), clicked=clicked))
    return out


class BarePrefill:
    """The backbone's forward over a slate's prompt, nothing else: the floor of any LLM ranker.

    Its reported latency (``recorded_ms``) is the forward alone; building the prompt's tokens
    comes before the clock starts.
    """

    needs_train = False

    def __init__(self, model: SPDRanker, name: str = "bare-prefill") -> None:
        if model.method.reads_logits:
            raise ValueError(
                f"the latency decomposition is for SPD checkpoints; {model.method.title}'s "
                "backbone carries the LM head, so its forward is not a bare prefill"
            )
        self.model = model
        self.name = name

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn."""

    def rank(self, slate: Slate) -> Ranking:
        ms = self.prefill_ms([slate])
        return Ranking(list(slate.docids), timings={"prefill": ms}, decode_passes=1, recorded_ms=ms)

    def prefill_ms(self, slates: Sequence[Slate]) -> float:
        """Milliseconds of one forward over ``slates`` padded into one batch."""
        import torch

        model = self.model
        batch = model.collate([model.encode(s) for s in slates])
        model.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.backbone(input_ids=batch.prompt.input_ids,
                           attention_mask=batch.prompt.attention_mask)
        model.synchronize()
        return (time.perf_counter() - t0) * 1e3


def check_sizes(model: SPDRanker, sizes: Sequence[int]) -> None:
    """Refuse slate sizes beyond the checkpoint's K positions, naming it."""
    positions = model.config.head.positions
    too_big = [n for n in sizes if n > positions]
    if too_big:
        raise ValueError(
            f"{model.name} ranks at most K={positions} candidates, so it cannot be timed at "
            f"N={too_big[0]}: train with --positions {max(too_big)} or more, or pass smaller "
            "--latency-sizes"
        )


def decompose(
    model: SPDRanker,
    slates: Sequence[Slate],
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    batch_size: int = 8,
    latency_batches: Sequence[int] = (1,),
    seed: int = 0,
    warmup: int = 3,
    progress: bool | None = False,
) -> list[LatencyRow]:
    """The decomposition of ``model`` at each slate size and latency batch, over ``slates``
    resized to the size (see the module's docstring)."""
    if not slates:
        raise ValueError("the latency decomposition needs at least one slate")
    check_sizes(model, sizes)
    too_few = [b for b in latency_batches if b > len(slates)]
    if too_few:
        raise ValueError(
            f"a latency batch of {too_few[0]} slates needs at least that many slates, got "
            f"{len(slates)}: pass more --latency-slates"
        )
    model.eval()
    bare = BarePrefill(model)
    rows = []
    for n in sizes:
        sized = resize_slates(slates, n, seed)
        for b in latency_batches:
            if b == 1:
                row = _single_row(model, bare, sized, batch_size, warmup, progress)
            else:
                row = _batched_row(model, bare, sized, b, warmup)
            rows.append(row)
    return rows


def _backbone_fields(model: SPDRanker) -> dict[str, Any]:
    backbone = model.config.backbone
    return {"backbone": backbone.name_or_path, "random_weights": backbone.random_weights}


def _timing_fields(
    stages: dict[str, list[float]],
    totals: list[float],
    around: list[float],
    bare_ms: list[float],
) -> dict[str, Any]:
    """A row's timings from its calls' own: each stage's median, the whole call's median and
    p95, the bare prefill's median, the median time around the prefill, and the paired ratio
    of each call to its bare prefill."""
    return {
        "stages_ms": {k: _median(v) for k, v in stages.items()},
        "total_ms": {"median": _median(totals), "p95": float(percentile(totals, 95) or 0.0)},
        "bare_prefill_ms": _median(bare_ms),
        "overhead_ms": _median(around),
        "paired_ratio": _paired_ratio(totals, bare_ms),
    }


def _single_row(
    model: SPDRanker,
    bare: BarePrefill,
    sized: Sequence[Slate],
    batch_size: int,
    warmup: int,
    progress: bool | None,
) -> LatencyRow:
    """The decomposition of ``rank()``, one slate at a time, with the throughput at
    ``batch_size``."""
    n = len(sized[0])
    _reset_peak_memory(model.device)
    results = evaluate([model, bare], sized, warmup=warmup, progress=progress,
                       prepare=bare.rank)
    records = results[model.name].records
    stages = {s: [r.timings[s] for r in records] for s in STAGES}
    stages["rest"] = [r.latency_ms - sum(r.timings[s] for s in STAGES) for r in records]
    totals = [r.latency_ms for r in records]
    around = [r.latency_ms - r.timings["prefill"] for r in records]
    bare_ms = [r.latency_ms for r in results[bare.name].records]
    memory_mb, memory_kind = peak_memory_mb(model.device)
    _reset_peak_memory(model.device)
    slates_per_s = throughput(model, sized, batch_size)
    batch_memory_mb, _ = peak_memory_mb(model.device)
    return LatencyRow(
        model=model.name,
        n=n,
        slates=len(records),
        **_timing_fields(stages, totals, around, bare_ms),
        batch_size=batch_size,
        throughput=slates_per_s,
        peak_memory_mb=memory_mb,
        peak_memory_batch_mb=batch_memory_mb,
        memory_kind=memory_kind,
        **_backbone_fields(model),
    )


def _batched_row(
    model: SPDRanker, bare: BarePrefill, sized: Sequence[Slate], size: int, warmup: int
) -> LatencyRow:
    """The decomposition of ``rank_batch`` on ``size`` slates at a time: each call's stages
    (shared by its slates), its rest, and a bare prefill of the same padded batch, alternating
    call by call as :func:`~spdrank.eval.evaluate.evaluate` alternates slates."""
    calls = [list(sized[i : i + size]) for i in range(0, len(sized) - size + 1, size)]
    for _ in range(warmup):
        model.rank_batch(calls[0])
        bare.prefill_ms(calls[0])
    _reset_peak_memory(model.device)
    stages: dict[str, list[float]] = {s: [] for s in (*STAGES, "rest")}
    totals, around, bare_ms = [], [], []
    for call in calls:
        bare.prefill_ms(call)
        rankings, total = _timed(model.rank_batch, call)
        timings = rankings[0].timings
        for s in STAGES:
            stages[s].append(timings[s])
        stages["rest"].append(total - sum(timings[s] for s in STAGES))
        totals.append(total)
        around.append(total - timings["prefill"])
        bare_ms.append(_timed(bare.prefill_ms, call)[0])
    memory_mb, memory_kind = peak_memory_mb(model.device)
    return LatencyRow(
        model=model.name,
        n=len(sized[0]),
        slates=len(calls) * size,
        **_timing_fields(stages, totals, around, bare_ms),
        batch_size=size,
        throughput=len(calls) * size / (sum(totals) / 1e3),
        peak_memory_mb=memory_mb,
        peak_memory_batch_mb=memory_mb,
        memory_kind=memory_kind,
        latency_batch=size,
        **_backbone_fields(model),
    )


def _timed(fn: Callable[[list[Slate]], T], slates: list[Slate]) -> tuple[T, float]:
    """``fn(slates)`` and its milliseconds, cyclic garbage collection paused meanwhile (as
    :func:`spdrank.eval.evaluate.evaluate` times a slate: a collection made due elsewhere would
    otherwise land in whichever call runs next)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        out = fn(slates)
        return out, (time.perf_counter() - t0) * 1e3
    finally:
        if was_enabled:
            gc.enable()


def throughput(model: SPDRanker, slates: Sequence[Slate], batch_size: int) -> float:
    """Slates per second through ``rank_batch`` in padded batches, after one warm-up batch."""
    batches = list(batched(slates, batch_size))
    model.rank_batch(batches[0])
    t0 = time.perf_counter()
    for batch in batches:
        model.rank_batch(batch)
    return len(slates) / (time.perf_counter() - t0)


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """Peak memory in MiB and what it measures (see the module's docstring)."""
    if device.type == "cuda":
        import torch

        return torch.cuda.max_memory_allocated(device) / 2**20, "CUDA allocated, peak"
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    scale = 1 if sys.platform == "darwin" else 1024
    return peak * scale / 2**20, "process RSS, peak"


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(device)


def _paired_ratio(totals: Sequence[float], bare_ms: Sequence[float]) -> float | None:
    """The median of ``totals[i] / bare_ms[i]``: each slate's SPD call over its own bare
    prefill, so a drift of the machine's speed between slates cancels in each ratio."""
    if len(totals) != len(bare_ms):
        raise ValueError(f"{len(totals)} SPD calls against {len(bare_ms)} bare prefills")
    ratios = [t / b for t, b in zip(totals, bare_ms) if b > 0]
    return _median(ratios) if ratios else None


def _median(values: Sequence[float]) -> float:
    return float(percentile(values, 50) or 0.0)
