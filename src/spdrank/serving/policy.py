"""The batch policy: how the slates the batcher collected share prefills
(``spdrank serve --batch-policy``; the measurements behind the default are in
docs/serving.md and ``benchmarks/batch_cost.py``):

* ``padded``: one prefill over all of them, right-padded to the longest prompt;
* ``bucketed``: sorted by prompt length and cut into groups whose padding stays within
  ``max_padding`` (padded positions over real tokens), one prefill each;
* ``single``: one prefill per slate; the server's collector then takes one slate at a time
  and never waits (:func:`collector_limits`), since nothing would be shared;
* ``auto`` (the default): ``single`` on a CPU, where a batched prefill costs at least as
  much per slate as the slates alone and any padding costs more; ``bucketed`` on an
  accelerator, where one prompt does not fill the device; ``padded`` for a features-only
  model, which has no prefill to pad.

Plain Python (no torch, no FastAPI): ``spdrank serve``'s flags read their choices and
defaults from here, when the command line is parsed.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The batch policies ``spdrank serve --batch-policy`` accepts.
BATCH_POLICIES = ("auto", "padded", "bucketed", "single")
#: The one source of these defaults (flags, ServeSettings, Engine): the policy, and
#: ``bucketed``'s cap on padded positions as a share of a prefill's real tokens.
DEFAULT_BATCH_POLICY = "auto"
DEFAULT_MAX_PADDING = 0.1


def check_policy(policy: str) -> None:
    """Refuse a name that is not one of :data:`BATCH_POLICIES`."""
    if policy not in BATCH_POLICIES:
        raise ValueError(f"unknown batch policy {policy!r}: use one of {', '.join(BATCH_POLICIES)}")


def check_max_padding(max_padding: float) -> None:
    """Refuse a negative padding cap (a prefill cannot hold fewer positions than tokens)."""
    if max_padding < 0:
        raise ValueError("max_padding must be >= 0")


def resolve_policy(policy: str, device: str, features_only: bool = False) -> str:
    """The policy ``policy`` means on ``device`` ("cpu", "cuda:0", ...): ``auto`` resolved."""
    check_policy(policy)
    if policy != "auto":
        return policy
    if features_only:
        return "padded"
    return "single" if device.split(":")[0] == "cpu" else "bucketed"


def plan_prefills(
    lengths: Sequence[int], policy: str, max_padding: float = DEFAULT_MAX_PADDING
) -> list[list[int]]:
    """Which slates (indices into ``lengths``, their prompts' token counts) share a prefill.

    ``policy`` is a resolved one (not ``auto``). ``bucketed`` sorts by length (ties in
    request order) and grows each group while ``longest * count <= (1 + max_padding) * sum``,
    i.e. while its padded positions stay within ``max_padding`` of its real tokens. Groups
    are returned in the order of their oldest request, so the request that waited longest
    is answered first; within a group, indices are in increasing order.
    """
    n = len(lengths)
    if policy == "single":
        return [[i] for i in range(n)]
    if policy == "padded" or n <= 1:
        return [list(range(n))] if n else []
    if policy != "bucketed":
        raise ValueError(f"unknown batch policy {policy!r}")
    check_max_padding(max_padding)
    groups: list[list[int]] = []
    total = 0
    for i in sorted(range(n), key=lambda j: (lengths[j], j)):
        longest = lengths[i]  # sorted: the newest member is the longest
        if groups and longest * (len(groups[-1]) + 1) <= (1 + max_padding) * (total + longest):
            groups[-1].append(i)
            total += longest
        else:
            groups.append([i])
            total = longest
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


def collector_limits(policy: str, max_batch_size: int, max_wait_ms: float) -> tuple[int, float]:
    """The batch size and wait the server's collector uses under the resolved ``policy``.

    Under ``single`` nothing is shared, so the collector takes one slate at a time and never
    waits: exactly the unbatched server (collecting several only to run them one by one
    would cost the event loop and the worker a little more per request). Other policies
    collect up to the settings' ``max_batch_size`` for at most ``max_wait_ms``.
    """
    if policy == "single":
        return 1, 0.0
    return max_batch_size, max_wait_ms


def padding_waste(lengths: Sequence[int]) -> float:
    """Padded positions over real tokens of one right-padded prefill over ``lengths``."""
    real = sum(lengths)
    return (max(lengths) * len(lengths) - real) / real if real else 0.0
