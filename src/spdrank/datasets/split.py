"""Leave-one-out splits: of each user's items into history and target, and of the users into
train, eval and (opt-in) validation files.

A user's **target** is their last item and their **history** the items before it (the most
recent ``history``, oldest first): :func:`history_and_target`. Users are split into train and
eval, ``floor(n_users * eval_fraction)`` eval users (:func:`split_users`); with
``validation`` N > 0, N of the training users are held out for model selection
(:func:`validation_users`), so ``eval.jsonl`` stays untouched until the end. A user makes one
slate, so a validation user's slate moves from ``train.jsonl`` to ``valid.jsonl`` and nothing
of that user is trained on.

Both samples are seeded and drawn from the sorted user ids, so a split depends on neither the
line order nor Python's randomized ``hash``; the SASRec retriever
(:mod:`spdrank.datasets.sasrec_features`) calls the same functions to split exactly as the
builder does. An eval split under :data:`MIN_EVAL_SLATES` slates is warned about, with a
fraction that would give that many.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable
from fractions import Fraction

from spdrank.datasets.options import BuildOptions

logger = logging.getLogger(__name__)

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
VALID_FILE = "valid.jsonl"

#: How the manifest describes the validation split, when a build makes one.
VALIDATION_POLICY = (
    "a seeded sample of the training users (sorted ids); each one's slate, whose target is "
    "the user's last item, is written to valid.jsonl instead of train.jsonl; like eval users, "
    "their sequences are not counted in the features, so no count holds a validation target"
)

#: Fewer eval slates than this give metric intervals too wide to tell close rankers apart.
MIN_EVAL_SLATES = 1000


def history_and_target(items: list[str], history: int) -> tuple[list[str], str]:
    """A user's last item, and the (at most) ``history`` items before it."""
    before = items[:-1]
    return before[max(0, len(before) - history) :], items[-1]


def counted_sequence(items: list[str], history: int) -> list[str]:
    """What the counts take of a user: the history a slate shows, then the target."""
    before, target = history_and_target(items, history)
    return [*before, target]


def eval_count(n_users: int, eval_fraction: float) -> int:
    """``floor(n_users * eval_fraction)``, exact for decimal fractions (0.29 * 100 is 29)."""
    return math.floor(Fraction(str(eval_fraction)) * n_users)


def split_users(users: Iterable[str], eval_fraction: float, seed: int) -> set[str]:
    """The eval users: a seeded sample of the sorted ids, so input order does not matter."""
    ordered = sorted(users)
    rng = random.Random(f"{seed}\x00split")
    return set(rng.sample(ordered, eval_count(len(ordered), eval_fraction)))


def validation_users(train_users: Iterable[str], n: int, seed: int) -> set[str]:
    """``n`` of the training users, for ``valid.jsonl``: a seeded sample of the sorted ids.

    At least one training user must remain, or there would be nothing to train on.
    """
    ordered = sorted(train_users)
    if n and n >= len(ordered):
        raise ValueError(
            f"--validation {n} would take all {len(ordered)} training users: "
            "choose fewer, so some remain to train on"
        )
    rng = random.Random(f"{seed}\x00validation")
    return set(rng.sample(ordered, n))


def assign_splits(users: list[tuple[str, list[str]]], options: BuildOptions) -> dict[str, str]:
    """The file each user's slate goes to: the eval users', the validation users' (drawn from
    the others), and the rest's ``train.jsonl``."""
    eval_users = split_users((u for u, _ in users), options.eval_fraction, options.seed)
    valid_users = validation_users(
        (u for u, _ in users if u not in eval_users), options.validation, options.seed
    )
    split_of = {u: TRAIN_FILE for u, _ in users} | dict.fromkeys(eval_users, EVAL_FILE)
    return split_of | dict.fromkeys(valid_users, VALID_FILE)


def _fraction_for(n_slates: int, n_users: int) -> Fraction:
    """The smallest two-significant-digit ``--eval-fraction`` giving ``n_slates`` of ``n_users``."""
    exact = Fraction(n_slates, n_users)
    scale = Fraction(10) ** (1 - math.floor(math.log10(exact)))
    return Fraction(math.ceil(exact * scale)) / scale


def warn_small_eval(n_eval: int, n_users: int, fraction: float) -> None:
    """Say when the eval split is too small for metrics to separate close rankers."""
    if fraction == 0 or n_eval >= MIN_EVAL_SLATES or not n_users:
        return
    if not n_eval:
        one = _fraction_for(1, n_users)
        logger.warning(
            "0 eval slates: --eval-fraction %g of this log's %s users rounds down to none, so "
            "eval.jsonl is empty; %s", fraction, f"{n_users:,}",
            f"--eval-fraction {float(one):g} sets one user aside" if one <= Fraction(1, 2)
            else "the log is too small to set a user aside for evaluation")
        return
    spread = f"±{1.96 * math.sqrt(0.25 / n_eval):.2f}"
    suggestion = _fraction_for(MIN_EVAL_SLATES, n_users)
    advice = (
        f"--eval-fraction {float(suggestion):g} would give about {MIN_EVAL_SLATES:,}"
        if suggestion <= Fraction(1, 2)
        else f"this log's {n_users:,} users cannot spare {MIN_EVAL_SLATES:,}; compare rankers "
        "slate by slate (spdrank eval --reference ROW's paired intervals) rather than by their "
        "means"
    )
    logger.warning(
        "%s eval slates: a metric near 0.5 has a 95%% confidence interval of about %s, too "
        "wide to tell close rankers apart; %s",
        f"{n_eval:,}", spread, advice,
    )
