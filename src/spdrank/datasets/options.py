"""What a slate build is asked to do: :class:`BuildOptions` and the choices it accepts.

The options are checked when they are made, so a build (or the CLI flags of the same names,
:mod:`spdrank.commands.data`) refuses a bad combination before reading any input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spdrank.core.features import TITLE_SIMILARITY
from spdrank.datasets.interaction_features import FEATURES as INTERACTION_FEATURES
from spdrank.rankers.sasrec_config import SASREC, SASRecConfig

#: The features a build with ``features`` adds to every candidate.
FEATURES: tuple[str, ...] = (*INTERACTION_FEATURES, TITLE_SIMILARITY)

#: Every feature a build can add, in the order a candidate carries them: ``features`` may
#: name any of them; SASRec's (:mod:`spdrank.datasets.sasrec_features`) fits a model
#: (minutes), so only a build that names it has it.
ALL_FEATURES: tuple[str, ...] = (*FEATURES, SASREC)

#: Retrievers a build can take its candidates from instead of negatives or a candidate file.
RETRIEVERS = (SASREC,)

#: Ways to draw negatives.
NEGATIVES = ("uniform", "popularity")

#: What a candidate file holds: a retriever's lists (ordered, optionally scored; a target the
#: retriever missed is a fact about it) or negatives sampled for each user (LLMRank's and
#: RecBole's sampled evaluation: the target always sits beside them, by the protocol).
CANDIDATE_KINDS = ("retrieved", "sampled")


@dataclass(frozen=True)
class BuildOptions:
    """The parameters of a build (the CLI flags of the same names)."""

    #: How many of the most recent items before the target go into the history.
    history: int = 10
    #: Candidates per slate, the target included.
    candidates: int = 50
    #: How negatives are drawn: ``uniform`` or ``popularity`` (ignored with candidate lists).
    negatives: str = "uniform"
    seed: int = 0
    #: Share of users in the eval split: ``floor(n_users * eval_fraction)`` of them.
    eval_fraction: float = 0.05
    #: Per-candidate features: True for :data:`FEATURES`, or names from :data:`ALL_FEATURES`
    #: (kept as a tuple in that order; off: the files are unchanged).
    features: bool | tuple[str, ...] = False
    #: Training users whose slates form ``valid.jsonl`` instead (0: no validation split).
    validation: int = 0
    #: With candidate lists: add a target the retriever did not return to its slate. Off, the
    #: slate keeps the retriever's list alone and its target counts as a miss.
    insert_target: bool = True
    #: What the candidate lists are (:data:`CANDIDATE_KINDS`): a retriever's, where a missed
    #: target says something, or sampled negatives, beside which the target always goes.
    candidates_are: str = "retrieved"
    #: Take candidates from this retriever's top ``candidates`` (no target inserted).
    retriever: str | None = None
    #: The SASRec a ``sasrec`` feature or retriever fits.
    sasrec: SASRecConfig = field(default_factory=SASRecConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _feature_names(self.features))
        if self.retriever is not None and self.retriever not in RETRIEVERS:
            raise ValueError(
                f"retriever must be one of {list(RETRIEVERS)}, got {self.retriever!r}"
            )
        if self.candidates_are not in CANDIDATE_KINDS:
            raise ValueError(
                f"candidates_are must be one of {list(CANDIDATE_KINDS)}, "
                f"got {self.candidates_are!r}"
            )
        if self.candidates_are == "sampled" and not self.insert_target:
            raise ValueError(
                "--no-insert-target contradicts --candidates-are sampled: sampled negatives "
                "are drawn to sit beside the target, so it is always inserted"
            )
        if self.history < 0:
            raise ValueError(f"history must be >= 0, got {self.history}")
        if self.candidates < 2:
            raise ValueError(f"candidates must be >= 2 (the target and at least one other: one "
                             f"candidate has no order to learn or judge), got {self.candidates}")
        if self.negatives not in NEGATIVES:
            raise ValueError(f"negatives must be one of {list(NEGATIVES)}, got {self.negatives!r}")
        if not 0.0 <= self.eval_fraction <= 1.0:
            raise ValueError(f"eval_fraction must be within [0, 1], got {self.eval_fraction}")
        if self.validation < 0:
            raise ValueError(f"validation must be >= 0, got {self.validation}")


def _feature_names(features: bool | Sequence[str]) -> tuple[str, ...]:
    """``features`` as names in :data:`ALL_FEATURES` order; unknown or repeated ones refused."""
    if isinstance(features, bool):
        return FEATURES if features else ()
    names = list(features)
    unknown = [n for n in names if n not in ALL_FEATURES]
    if unknown:
        raise ValueError(f"unknown features {unknown}: choose from {list(ALL_FEATURES)}")
    if len(set(names)) != len(names):
        raise ValueError(f"features {names} name one feature twice")
    return tuple(n for n in ALL_FEATURES if n in names)
