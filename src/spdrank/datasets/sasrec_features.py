"""SASRec for the builders: a score per candidate (``--features ...,sasrec``) and a retriever
(``--retriever sasrec``), from one model fitted per build.

**What the model sees.** It is fitted on every history the build has, as a team fits its
SASRec on every interaction it holds, and never on a slate's target:

- every user who makes a slate (train, validation and eval alike): their items without their
  last, ``items[:-1]``, the history their slate shows (and any older items), never the
  slate's target, which is that last item;
- every user given only to be counted (``extra_sequences.txt``, users without a candidate
  list, :mod:`spdrank.datasets.extra_sequences`): their whole sequence, since they make no
  slate and so hold no target.

So no slate's target was ever a training label, in any split: a user makes one slate, and its
target is the one item of theirs the fit dropped. Train, validation and eval slates are also
treated alike (each one's history was a training sequence, and the state that scores a slate's
candidates, after its last history item, was never trained to predict anything for that
user), so the feature has no train/eval asymmetry of its own. Eval histories are what a
deployed model would see at serving time; fitting on them is what a team does before it ranks,
and it holds no label. Leaving each user out, as the interaction features do by subtracting
exact counts, has no exact counterpart for a trained network (it would take a fit per user),
and with no target in the fit it is not needed.

The vocabulary is the whole log's item set (titles and ids, no interactions), so every
candidate has an embedding; items no training user touched are only ever sampled negatives.

A candidate's score is the model's logit for it after the slate's own history (the items the
slate shows, oldest first), rounded to 6 decimals like the other features. The retriever
returns the ``candidates`` best-scored items outside everything the user did before the
target; the target is not added when missed (:mod:`spdrank.datasets.build` keeps such a
slate, without a clicked item, as a retrieval miss).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from spdrank.datasets.candidates import CandidateLists
from spdrank.datasets.log import InteractionLog
from spdrank.datasets.options import BuildOptions
from spdrank.datasets.split import history_and_target
from spdrank.rankers.sasrec_config import SASREC, SASRecConfig

if TYPE_CHECKING:
    from spdrank.rankers.sasrec import SASRec

logger = logging.getLogger(__name__)

#: Decimals kept of each score, as for the interaction features.
DECIMALS = 6

#: How the manifest describes the SASRec feature and retriever, when a build uses them.
SASREC_POLICY = (
    "SASRec (Kang & McAuley 2018, spdrank.rankers.sasrec) fitted on every user's items but their "
    "last (train, validation and eval users alike: each slate's history, never its target) and "
    "on the whole sequences of users without a slate (extra_sequences.txt), "
    "vocabulary: the log's items; a candidate's score is its logit after the slate's history, "
    "rounded to 6 decimals; the retriever takes the top-N items outside the user's earlier "
    "items and never adds the target"
)


class SASRecScores:
    """One fitted SASRec and each user's history state, for a build's slates."""

    def __init__(
        self,
        train_sequences: Iterable[Sequence[str]],
        catalogue: Iterable[str],
        histories: Mapping[str, Sequence[str]],
        config: SASRecConfig | None = None,
    ) -> None:
        """Fit (or load from the cache) and encode every user's history once.

        ``train_sequences``: what the fit learns from (:func:`fit_sequences`);
        ``histories``: each user's slate history, by user id.
        """
        from spdrank.rankers.sasrec import SASRec, default_cache_dir

        t0 = time.perf_counter()
        self.model: SASRec = SASRec.fit(
            train_sequences, config, items=catalogue, cache=default_cache_dir()
        )
        self.users = list(histories)
        self.row = {u: i for i, u in enumerate(self.users)}
        self.states = self.model.encode([histories[u] for u in self.users])
        logger.info(
            "%s: fitted (or loaded) and encoded %d histories in %.1f s",
            SASREC, len(self.users), time.perf_counter() - t0,
        )

    def __call__(self, user: str, docids: Sequence[str]) -> list[float]:
        """The score of each of ``docids`` after ``user``'s history, in order."""
        values = self.model.scores_from(self.states[self.row[user]], docids)
        unknown = [d for d, v in zip(docids, values) if v is None]
        if unknown:
            raise ValueError(
                f"{SASREC}: user {user!r}: candidates {unknown[:5]} are not in the log's items"
            )
        return [round(v, DECIMALS) for v in values if v is not None]

    def retrieve(
        self, n: int, earlier: Mapping[str, Sequence[str]]
    ) -> dict[str, list[tuple[str, float]]]:
        """Each user's ``n`` best items outside ``earlier[user]``, best first, with scores."""
        top = self.model.top_n_from(self.states, n, [earlier[u] for u in self.users])
        return {
            u: [(d, round(s, DECIMALS)) for d, s in hits] for u, hits in zip(self.users, top)
        }


def fit_sequences(
    users: Sequence[tuple[str, list[str]]], extra: Sequence[Sequence[str]] = ()
) -> list[list[str]]:
    """What the build's SASRec is fitted on (the module's docstring says why): each slate's
    user's items but their last (the target), then the whole sequence of each user who makes no
    slate (``extra``)."""
    return [items[:-1] for _, items in users] + [list(s) for s in extra]


def fit_for_build(
    users: Sequence[tuple[str, list[str]]],
    catalogue: Iterable[str],
    options: BuildOptions,
    extra: Sequence[Sequence[str]] = (),
) -> SASRecScores:
    """The model a build's slates read, fitted on :func:`fit_sequences`: every slate's user's
    items but their target, in every split, and ``extra``, the whole sequences of users who make
    no slate (``extra_sequences.txt``).

    ``users``: every user that makes a slate (``(user, items)``, oldest first); ``catalogue``:
    every item a slate may show (the vocabulary).
    """
    return SASRecScores(
        fit_sequences(users, extra),
        catalogue,
        {user: history_and_target(items, options.history)[0] for user, items in users},
        options.sasrec,
    )


def retriever_lists(
    log: InteractionLog, options: BuildOptions
) -> tuple[SASRecScores, CandidateLists]:
    """SASRec's top ``options.candidates`` of every user, as a scored candidate file would be.

    The retriever decides which users make a slate, so it runs before the builder's split; the
    fit does not depend on the split, since it takes every user's items but their last (every
    user gets a list: one whose earlier items are the whole catalogue, leaving nothing to
    retrieve, is an error).
    """
    users = log.users
    scores = fit_for_build(users, sorted(log.item_counts), options)
    top = scores.retrieve(options.candidates, {user: items[:-1] for user, items in users})
    empty = [u for u, hits in top.items() if not hits]
    if empty:
        raise ValueError(
            f"--retriever {SASREC}: users {empty[:5]} have interacted with every item of the "
            "log before their target, leaving nothing to retrieve"
        )
    lists = CandidateLists(
        source=f"retriever:{SASREC}",
        lists={u: [d for d, _ in hits] for u, hits in top.items()},
        scores={u: dict(hits) for u, hits in top.items()},
    )
    return scores, lists


def retrieval_counts(
    users: Sequence[tuple[str, list[str]]],
    lists: CandidateLists,
    split_of: Mapping[str, str],
) -> dict[str, int]:
    """``targets_retrieved_<split>``: the users of each split file whose target was retrieved.

    Over the split's slate count it is the retriever's Recall@N against the whole catalogue.
    """
    out: dict[str, int] = {}
    for user, items in users:
        key = f"targets_retrieved_{split_of[user].split('.')[0]}"
        out[key] = out.get(key, 0) + (items[-1] in lists.lists[user])
    return dict(sorted(out.items()))
