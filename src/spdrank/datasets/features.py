"""The per-candidate features a build adds (opt-in ``features``), fitted before any slate.

``popularity``, ``cooccurrence`` and ``transition`` are counted over the training slates,
leaving the slate's own user out (:mod:`spdrank.datasets.interaction_features` says why);
``title_similarity`` is a lexical retriever's score from the titles alone
(:mod:`spdrank.datasets.title_similarity`); ``sasrec`` is the score of a SASRec fitted on every
history the build has, never a slate's target (:mod:`spdrank.datasets.sasrec_features`).

Leakage: the statistics the baselines fit on ``train.jsonl`` and these features count the
same sequences: those of the users in ``train.jsonl`` (and of the users only counted,
:mod:`spdrank.datasets.extra_sequences`). Validation users are treated like eval users: their
sequences are never counted, so no validation target shows up in any count, in any split's
features, and a validation slate's features (like an eval slate's) see the training users
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spdrank.core.features import TITLE_SIMILARITY
from spdrank.core.slates import Slate
from spdrank.datasets.interaction_features import InteractionFeatures
from spdrank.datasets.log import InteractionLog
from spdrank.datasets.options import FEATURES, BuildOptions
from spdrank.datasets.sasrec_features import SASRecScores, fit_for_build
from spdrank.datasets.split import TRAIN_FILE, counted_sequence
from spdrank.datasets.title_similarity import TitleSimilarity
from spdrank.datasets.titles import Titles
from spdrank.rankers.sasrec_config import SASREC

#: How the manifest describes the features, when a build adds them.
FEATURES_POLICY = (
    "log1p of each candidate's count (popularity), co-occurrence score with the user's "
    "history (cooccurrence) and count right after the user's last item (transition) over the "
    "training slates' history + target, as the baselines count them, leaving the slate's own "
    "user out; title_similarity: the largest TF-IDF cosine of the candidate's title with a "
    "history title, IDF over the log's item titles (no interactions); rounded to 6 decimals"
)


@dataclass(frozen=True)
class CandidateFeatures:
    """The features a build adds to its candidates, fitted before any slate is written."""

    names: tuple[str, ...]
    #: Popularity, co-occurrence and transition counts, with the title similarity beside them.
    interactions: InteractionFeatures | None = None
    similarity: TitleSimilarity | None = None
    #: The SASRec fitted for the build (as a feature, or as the retriever).
    sasrec: SASRecScores | None = None

    def add(
        self,
        slate: Slate,
        history: list[str],
        target: str,
        counted: bool,
        shown: Mapping[str, str],
    ) -> None:
        """Set the features of ``slate``'s candidates; ``counted``: its user's sequence is in
        the counts (a training user's), so the counts leave it out."""
        if self.interactions is not None and self.similarity is not None:
            own = [*history, target] if counted else None
            titles = self.similarity(
                [shown[i] for i in history], [shown[d] for d in slate.docids]
            )
            for candidate, values, title in zip(
                slate.candidates, self.interactions(slate, own), titles
            ):
                every = {**values, TITLE_SIMILARITY: title}
                candidate.features = {k: every[k] for k in self.names if k in every}
        if self.sasrec is not None and SASREC in self.names:
            scores = self.sasrec(slate.query.qid, slate.docids)
            for candidate, value in zip(slate.candidates, scores):
                candidate.features = {**(candidate.features or {}), SASREC: value}


def fit_features(
    log: InteractionLog,
    users: list[tuple[str, list[str]]],
    extra: list[tuple[str, list[str]]],
    split_of: Mapping[str, str],
    shown_items: list[str],
    title_of: Titles,
    retriever: SASRecScores | None,
    options: BuildOptions,
) -> CandidateFeatures:
    """The features ``options`` names: the counts over the training users (and the users only
    counted), as the baselines count them; SASRec fitted on every user's history and the users
    only counted, never a target (the retriever's SASRec, when there is one, serves as the
    feature's: it is fitted on the same)."""
    only_counted = [counted_sequence(items, options.history) for _, items in extra]
    sasrec = retriever
    if SASREC in options.features and sasrec is None:
        # Every history, the whole sequences of the users only counted included.
        sasrec = fit_for_build(users, shown_items, options, [items for _, items in extra])
    if not set(options.features) & set(FEATURES):
        return CandidateFeatures(options.features, sasrec=sasrec)
    similarity = TitleSimilarity(title_of(i) for i in sorted(log.item_counts))
    interactions = InteractionFeatures(
        [counted_sequence(items, options.history) for u, items in users
         if split_of[u] == TRAIN_FILE]
        + only_counted
    )
    return CandidateFeatures(options.features, interactions, similarity, sasrec)
