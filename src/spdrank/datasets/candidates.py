"""Where a slate's candidates come from: negatives drawn for its user, or a candidate file.

- **Negatives**: the target plus ``candidates - 1`` items of the log the user never interacted
  with, drawn ``uniform`` or by ``popularity`` (proportional to the item's interaction
  count in the log) with the user's own seeded ``random.Random`` (:class:`NegativeSampler`).
- **Candidate lists** (:func:`read_candidate_lists`): ``user cand cand ...`` best first, each
  candidate optionally ``item:score`` (the retriever's score, written to the candidate's
  ``score``, which models and baselines read as the feature ``score``). The list is cut to
  its top ``candidates``, what a reranker behind that retriever is given. A target the
  retriever did not return in them (or at all) is added (with its own score, or the list's
  lowest) and a warning says how often, since a ranker can learn to spot inserted items;
  with ``insert_target`` off the slate
  keeps the list alone, no ``clicked``, and names the target in ``clicked_not_retrieved``,
  which the click metrics count as a miss. With ``candidates_are`` ``sampled`` the lists are
  negatives sampled per user (unscored), and the target is always inserted beside them,
  without a warning: that is the sampled-negative protocol, not a retriever's miss. A
  candidate repeated within a list is kept once. Users without a list make no slate (their
  sequences are still counted: :mod:`spdrank.datasets.extra_sequences`).

Everything a slate needs from its candidates is checked by :func:`slate_candidates` before
any file is opened.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spdrank.core.slates import SlateError
from spdrank.datasets.lines import numbered_lines, user_lines
from spdrank.datasets.log import InteractionLog
from spdrank.datasets.options import BuildOptions

logger = logging.getLogger(__name__)

#: How the manifest describes a file of sampled negatives.
SAMPLED_POLICY = (
    "the candidate file holds negatives sampled for each user (--candidates-are sampled): "
    "each user's target is inserted beside them, as the sampled-negative protocol has it"
)

#: How the manifest describes the scores of a plain (unscored) retriever's file.
RANK_SCORES_POLICY = (
    "each candidate's score is its place in the retriever's list, 1 - r/n (r from 0, n the "
    "list's length), so the order survives the slate's shuffle; an inserted target gets the "
    "lowest of the user's list, or its own when the list ranks it below the cut"
)

#: How the manifest describes the scores a scored candidate file gives.
CANDIDATE_SCORES_POLICY = (
    "each candidate's score is the retriever's (item:score); an inserted target, which the "
    "retriever did not return in its top --candidates, keeps its own score when the list ranks "
    "it further down, else gets the lowest score of the user's list"
)


@dataclass
class CandidateLists:
    """An upstream retriever's candidates per user, in its order."""

    source: str
    lists: dict[str, list[str]] = field(default_factory=dict)
    lines: int = 0
    empty_lines: int = 0
    #: Candidates dropped for repeating an earlier one in the same list.
    repeated_candidates: int = 0
    #: The retriever's score of each candidate, per user, when the file gives ``item:score``.
    scores: dict[str, dict[str, float]] | None = None
    #: The line whose first candidate made the file a scored one, and its candidates.
    scored_from: int = 0
    scored_tokens: list[str] = field(default_factory=list)
    #: Scored lists whose scores rise somewhere along the list, and the first one's line.
    rising: int = 0
    rising_from: int = 0


def read_candidate_lists(path: str | os.PathLike[str]) -> CandidateLists:
    """Read an upstream retriever's lists: one user a line, ``user cand cand ...``, best first.

    Candidates may carry the retriever's score as ``item:score`` (``u1 i7:0.93 i2:0.41``). The
    file's first candidate decides: if it ends in ``:<number>`` every candidate of the file
    must, else every candidate is a plain id (which may then hold colons).
    """
    path = Path(path)
    out = CandidateLists(source=str(path))
    for fields, lineno, where in user_lines(numbered_lines(path), str(path), out):
        user = fields[0]
        if out.scores is None and fields[1:] and _scored(fields[1]) is not None:
            out.scores, out.scored_from, out.scored_tokens = {}, lineno, fields[1:]
        candidates = _candidates(fields[1:], out, where)
        out.repeated_candidates += len(fields) - 1 - len(candidates)
        out.lists[user] = list(candidates)
        if out.scores is not None:
            out.scores[user] = candidates
            if any(b > a for a, b in itertools.pairwise(candidates.values())):
                out.rising += 1
                out.rising_from = out.rising_from or lineno
    if out.rising:
        logger.warning(
            "%s of the %s lists of %s hold a score above the one before it (the first at line "
            "%s): a list is read best first and its scores as higher-is-better (the feature "
            "`score`, the ranker `retriever`); if the score is a distance, negate it",
            f"{out.rising:,}", f"{len(out.lists):,}", path, out.rising_from,
        )
    return out


def _scored(token: str) -> tuple[str, float] | None:
    """``item:score`` as (item, score); None when the token does not end in ``:<number>``."""
    item, sep, score = token.rpartition(":")
    if not sep or not item:
        return None
    try:
        return item, float(score)
    except ValueError:
        return None


def _candidates(tokens: list[str], lists: CandidateLists, where: str) -> dict[str, float]:
    """One list's candidates in order, each kept once, with its score (0.0 in a plain file)."""
    out: dict[str, float] = {}
    for token in tokens:
        if lists.scores is None:
            out.setdefault(token, 0.0)
            continue
        scored = _scored(token)
        if scored is None:
            raise SlateError(
                f"candidate {token!r} has no score: the file's first candidate "
                f"({lists.scored_tokens[0]!r}, line {lists.scored_from}) reads as item:score, so "
                "every candidate must be",
                where,
            )
        item, score = scored
        if not math.isfinite(score):
            raise SlateError(f"candidate {item!r} has a non-finite score {score}", where)
        out.setdefault(item, score)
    return out


def check_sampled(lists: CandidateLists | None, options: BuildOptions) -> None:
    """Sampled negatives need a file to be sampled in, and carry no scores: the target
    inserted beside them would have none, and the lowest a list's score could give it would
    mark it."""
    if options.candidates_are != "sampled":
        return
    if lists is None:
        raise ValueError("--candidates-are sampled describes a --candidate-file: give one")
    if lists.scores is not None:
        raise ValueError(
            f"{lists.source}: --candidates-are sampled, but the candidates carry scores "
            "(item:score); sampled negatives have none to give the target inserted beside "
            "them: drop the scores, or build with --candidates-are retrieved"
        )


class NegativeSampler:
    """Draws ``k`` distinct items outside a user's items, uniformly or by popularity."""

    def __init__(self, item_counts: Mapping[str, int], how: str) -> None:
        self.items = sorted(item_counts)
        self.how = how
        self.weights = [item_counts[i] for i in self.items]
        self.cum_weights = list(itertools.accumulate(self.weights))

    def available(self, exclude: set[str]) -> int:
        return len(self.items) - len(exclude)

    def draw(self, rng: random.Random, k: int, exclude: set[str]) -> list[str]:
        """``k`` distinct items not in ``exclude`` (``exclude`` must hold log items only)."""
        if k <= 0:
            return []
        if self.available(exclude) < k:
            raise ValueError(
                f"only {self.available(exclude)} items outside the user's own, cannot draw {k}"
            )
        if self.how == "uniform":
            return self._uniform(rng, k, exclude)
        return self._popularity(rng, k, exclude)

    def _uniform(self, rng: random.Random, k: int, exclude: set[str]) -> list[str]:
        items = self.items
        if 2 * k > self.available(exclude):  # dense: rejection would spin, sample directly
            return rng.sample([i for i in items if i not in exclude], k)
        chosen: list[str] = []
        taken = set(exclude)
        while True:  # batches of draws with replacement; repeats and the user's items rejected
            for item in rng.choices(items, k=2 * (k - len(chosen)) + 8):
                if item not in taken:
                    taken.add(item)
                    chosen.append(item)
                    if len(chosen) == k:
                        return chosen

    def _popularity(self, rng: random.Random, k: int, exclude: set[str]) -> list[str]:
        # Successive draws proportional to the count, rejecting the user's items and repeats.
        chosen: list[str] = []
        taken = set(exclude)
        for _ in range(8):
            need = k - len(chosen)
            for item in rng.choices(self.items, cum_weights=self.cum_weights, k=2 * need + 8):
                if item not in taken:
                    taken.add(item)
                    chosen.append(item)
                    if len(chosen) == k:
                        return chosen
        # The excluded items hold most of the mass: the same distribution, exactly, through
        # exponential clocks (Efraimidis-Spirakis) over what is left.
        rest = [(i, w) for i, w in zip(self.items, self.weights) if i not in taken]
        keys = [(-math.log(1.0 - rng.random()) / w, i) for i, w in rest]
        keys.sort()
        chosen.extend(i for _, i in keys[: k - len(chosen)])
        return chosen


@dataclass(frozen=True)
class Retrieved:
    """One user's slate candidates, taken from the retriever's list."""

    docids: tuple[str, ...]
    #: The retriever's score by docid (empty for a plain candidate file).
    scores: Mapping[str, float]
    #: The target was not in the list's top ``candidates`` and was added to the slate.
    inserted: bool
    #: The target was not in the list's top ``candidates`` and was not added: the slate
    #: holds no target.
    missed: bool
    #: The list held more candidates than the slate takes.
    cut: bool
    #: The target was in the list, but below its top ``candidates``.
    below_cut: bool = False


def retrieved_for(
    lists: CandidateLists, user: str, target: str, options: BuildOptions
) -> Retrieved:
    """The user's list cut to its top ``options.candidates``, in the retriever's order.

    A reranker is given the retriever's top N, so the slate is that: a target the retriever
    ranked below it was not retrieved for this slate, as one it did not return at all. Such a
    target is added (``insert_target``) with its own score, or the list's lowest for one the
    list lacks (an upper bound on its real one), or left out, so the slate measures what the
    retriever's top N found.
    """
    ranked = lists.lists[user]
    scores: Mapping[str, float] = (
        lists.scores[user] if lists.scores is not None
        else rank_scores(ranked) if options.candidates_are != "sampled" else {}
    )
    top = ranked[: options.candidates]
    found = target in top
    others = [c for c in ranked if c != target]
    keep_target = found or options.insert_target
    kept = others[: options.candidates - 1] if keep_target else others[: options.candidates]
    inserted = not found and options.insert_target
    if inserted and scores and target not in scores:
        scores = {**scores, target: min(scores.values())}
    return Retrieved(
        docids=tuple(kept + [target] if keep_target else kept),
        scores=scores,
        inserted=inserted,
        missed=not keep_target,
        cut=len(kept) < len(others),
        below_cut=not found and target in ranked,
    )


def rank_scores(ranked: list[str]) -> dict[str, float]:
    """A plain list's scores from its order, ``1 - r / n`` (r from 0, n the list's length): a
    slate shuffles its candidates, so without them the retriever's order would be lost, and
    its ``score`` (the ranker ``retriever``, the feature) would rank at random."""
    return {d: round(1.0 - r / len(ranked), 6) for r, d in enumerate(ranked)}


def count_list(stats: dict[str, int], got: Retrieved, size: int) -> None:
    """Add one slate's list to the manifest's counts of what the lists lacked."""
    stats["targets_added"] += got.inserted
    stats["targets_below_cut"] += got.below_cut
    stats["lists_cut"] += got.cut
    stats["short_lists"] += len(got.docids) < size
    if got.missed:
        stats["targets_not_retrieved"] += 1


def _split_by_lists(
    users: list[tuple[str, list[str]]], lists: CandidateLists
) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """(users who make a slate, users counted without one). A list of nothing but the user's
    target, or of nothing, has nothing to rank it against (a slate of the target alone ranks
    it first whatever the ranker), so it counts as no list."""
    have = [
        (u, items) for u, items in users
        if any(c != items[-1] for c in lists.lists.get(u, ()))
    ]
    listed = {u for u, _ in have}
    return have, [(u, items) for u, items in users if u not in listed]


def _warn_own_items(users: list[tuple[str, list[str]]], lists: CandidateLists) -> None:
    """Say how many sampled lists hold items of their user's own history: a sampled negative
    is an item the user never touched (the builder's own sampler leaves those out), and one
    the user did touch is a positive ranked as a miss."""
    own = [u for u, items in users if set(lists.lists[u]) & set(items[:-1])]
    if own:
        logger.warning(
            "%s of the %s sampled lists of %s hold items of their user's own history (e.g. "
            "user %r): a sampled negative is an item the user never touched", f"{len(own):,}",
            f"{len(users):,}", lists.source, own[0],
        )


def _check_colon_ids(lists: CandidateLists, log: InteractionLog) -> None:
    """Refuse a file read as ``item:score`` whose first scored list names an item of the log
    whole, not split: its ids hold colons (``sku:1``), which a plain file may carry, and
    reading them as scores would rank every list by made-up items."""
    whole = next((t for t in lists.scored_tokens
                  if t in log.item_counts and t.rpartition(":")[0] not in log.item_counts), None)
    if lists.scores is not None and whole is not None:
        raise SlateError(
            f"candidate {whole!r} is an item of the log, but the file reads as item:score, "
            f"which makes it item {whole.rpartition(':')[0]!r}: ids that hold a colon and end "
            "in a number cannot be told from item:score; give every candidate a score "
            "(sku:1:0.93), or use ids without colons",
            f"{lists.source}:{lists.scored_from}",
        )


def slate_candidates(
    log: InteractionLog,
    lists: CandidateLists | None,
    options: BuildOptions,
    counts: dict[str, int],
) -> tuple[
    list[tuple[str, list[str]]],
    list[tuple[str, list[str]]],
    dict[str, Retrieved],
    NegativeSampler | None,
]:
    """(users who make a slate, users only counted, their retrieved lists, the sampler).

    Everything a slate needs is checked here, before any file is opened.
    """
    users = log.users
    if lists is None:
        sampler = NegativeSampler(log.item_counts, options.negatives)
        need = options.candidates - 1
        for u, items in users:
            if sampler.available(set(items)) < need:
                raise ValueError(
                    f"user {u!r}: only {sampler.available(set(items))} of the log's "
                    f"{len(sampler.items)} items are outside the user's own, cannot draw "
                    f"{need} negatives; lower --candidates"
                )
        return users, [], {}, sampler
    _check_colon_ids(lists, log)
    have, extra = _split_by_lists(users, lists)
    if options.candidates_are == "sampled":
        _warn_own_items(have, lists)
    counts["users_without_candidate_list"] = len(extra)
    logged = {u for u, _ in users}
    unused = [u for u in lists.lists if u not in logged]
    counts["unused_candidate_lists"] = len(unused)
    if len(unused) > len(lists.lists) - len(unused) > 0:  # none used: the build refuses
        logger.warning(
            "%s of the %s lists of %s name no user of the log with 2 or more items (e.g. %s): "
            "are the users spelled as in the log?", f"{len(unused):,}", f"{len(lists.lists):,}",
            lists.source, ", ".join(repr(u) for u in unused[:3]),
        )
    counts["repeated_candidates_dropped"] = lists.repeated_candidates
    counts["candidate_list_empty_lines"] = lists.empty_lines
    retrieved = {u: retrieved_for(lists, u, items[-1], options) for u, items in have}
    return have, extra, retrieved, None


def warn_inserted(inserted: int, slates: int, kind: str = "retrieved", held: int = 0,
                  below_cut: int = 0, size: int = 0) -> None:
    """Say where target insertion made slates a ranker can read the label off: a retriever's
    top ``size`` that missed the target (``below_cut`` of them held it further down). Beside
    sampled negatives insertion is the protocol, so it is only counted, and so are the
    ``held`` sampled lists that already held their target (kept where the list put it, once: a
    file of negatives that holds positives is worth knowing)."""
    if kind == "sampled":
        if inserted or held:
            also = (f"; {held:,} lists already held their user's target, kept where the list "
                    "put it and not inserted again" if held else "")
            logger.info(
                "%s of %s targets inserted beside their sampled negatives (the "
                "sampled-negative protocol)%s", f"{inserted:,}", f"{slates:,}", also,
            )
        return
    if not inserted:
        return
    further = f" ({below_cut:,} of them further down its list)" if below_cut else ""
    logger.warning(
        "%s of %s targets were not among the retriever's top %s candidates%s and were inserted "
        "into their slates: an inserted item is ranked (and scored) below every candidate the "
        "retriever gave, and a ranker can learn to spot it, so metrics on such slates flatter it; to measure on what the "
        "retriever found, build with --no-insert-target (those slates keep no target and "
        "count as misses); if the file holds sampled negatives rather than a retriever's "
        "lists, build with --candidates-are sampled",
        f"{inserted:,}", f"{slates:,}", size, further,
    )
