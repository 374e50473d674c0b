"""Slates from any interaction log: one user a line, items in time order, plus item titles.

The setup is leave-one-out next-item prediction, as in the SPD paper:

- **target** = the user's last item; **history** = the items before it (the most recent
  ``history``, oldest first), rendered with their titles into ``query.text`` as
  ``"1. <title>\\n2. <title>..."`` and kept as ids in ``query.history``;
- **candidates** = the target plus ``candidates - 1`` negatives drawn from the items of the log
  the user never interacted with (``uniform``, or ``popularity``: proportional to the item's
  interaction count in the log), or taken from an upstream retriever's lists; the candidate
  order is shuffled so the target's position carries no signal; ``clicked = [target]``;
- users are split into train and eval: ``floor(n_users * eval_fraction)`` eval users;
- with ``validation`` N > 0 (opt-in), N of the training users are held out as a validation
  split (``valid.jsonl``) for model selection, so ``eval.jsonl`` stays untouched until the
  end. A user makes one slate, so a validation user's last training slate (its target is the
  user's last item) is their slate: it moves from ``train.jsonl`` to ``valid.jsonl`` and
  nothing of that user is trained on;
- with ``features`` (opt-in), each candidate carries ``features: {popularity, cooccurrence,
  transition}`` counted over the training slates, leaving the slate's own user out
  (:mod:`spdrank.datasets.interaction_features` says why), and ``title_similarity``, a lexical
  retriever's score from the titles alone (:mod:`spdrank.datasets.title_similarity`);
  ``features`` may instead name any of :data:`ALL_FEATURES`, among them ``sasrec``;
- with ``retriever`` ``sasrec`` (opt-in), the candidates are SASRec's top ``candidates``
  items with its scores, the target never inserted (a missed one is a miss in eval). SASRec,
  as a feature or a retriever, is fitted on the training users' items but their last, so no
  slate's target is ever a label it saw (:mod:`spdrank.datasets.sasrec_features`).

Leakage: the statistics the baselines fit on ``train.jsonl`` and the builder's ``features``
count the same sequences: those of the users in ``train.jsonl``. Validation users are treated
like eval users: their sequences are never counted, so no validation target shows up in any
count, in any split's features, and a validation slate's features (like an eval slate's) see
the training users only.

Inputs (:func:`read_sequences`, :func:`read_titles`, :func:`read_candidate_lists`):

- sequences: ``user item item ...`` (whitespace-separated), or a RecBole ``.inter`` file
  (recognised by its ``name:type`` header line, :mod:`spdrank.datasets.recbole`). Empty lines
  and users with fewer than 2 items are skipped and counted; a user on two lines, or a
  ``name:type`` header field anywhere but an atomic file's first line, is an error naming
  ``file:line``.
- titles: TSV ``item_id<TAB>title`` with a header line, or a RecBole ``.item`` file; a line
  without the header's fields, an empty item id or a repeated item id is an error naming
  ``file:line``. A TSV whose first row names an item of the log has no header line: that row
  is read as a title, with a warning. Titles are HTML-unescaped and their whitespace collapsed
  (:func:`clean_title`).
- candidate lists: ``user cand cand ...`` best first, each candidate optionally
  ``item:score`` (the retriever's score, written to the candidate's ``score``, which models
  and baselines read as the feature ``score``). The list is cut to ``candidates`` keeping the
  target (retriever order decides what is kept). A target the retriever did not return is
  added (with the list's lowest score) and a warning says how often, since a ranker can learn
  to spot inserted items; with ``insert_target`` off the slate keeps the list alone, no
  ``clicked``, and names the target in ``clicked_not_retrieved``, which the click metrics count
  as a miss. With ``candidates_are`` ``sampled`` the lists are negatives sampled per user
  (unscored), and the target is always inserted beside them, without a warning: that is the
  sampled-negative protocol, not a retriever's miss. A candidate repeated within a list is kept once. Users without a list make no
  slate but their sequences still count, as training users' do: in the features and, through
  ``extra_sequences.txt`` beside ``train.jsonl``, in the baselines ``spdrank eval`` fits.

Untitled items: an item whose title is empty, or that has no row in the titles (an *unknown*
item), is rendered as ``Item <item_id>`` (:data:`UNTITLED`); the manifest counts both
(``untitled_items`` includes the ``unknown_items``).

Determinism: every user's slate comes from its own ``random.Random`` seeded with
``(seed, user id)`` (string seeds are hashed with SHA-512, not Python's randomized ``hash``),
the split from one seeded with ``(seed, "split")`` over the sorted user ids, the validation
users from one seeded with ``(seed, "validation")`` over the sorted training users, and
nothing iterates a set; so the same inputs and parameters give byte-identical files, and a
user's slate does not depend on the other users, the line order, ``eval_fraction`` or
``validation`` (which file it lands in does; its ``features``, counted over the other
training users, do depend on them, but not on the order).

Output (:func:`build_slates`): ``train.jsonl``, ``eval.jsonl``, ``valid.jsonl`` (only with
``validation``), ``extra_sequences.txt`` (only for users without a candidate list) and
``manifest.json`` (counts, parameters, sha256 of inputs and outputs; no timestamps). An eval
split under :data:`MIN_EVAL_SLATES` slates is warned about, with a fraction that would give
that many. All are written to temporary files renamed only once everything is written, so
an error leaves a previous build in the output directory as it was. A build without
``validation`` writes exactly what builds did before the option existed.
"""

from __future__ import annotations

import hashlib
import html
import itertools
import json
import logging
import math
import os
import random
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

from spdrank import __version__
from spdrank.core.features import TITLE_SIMILARITY
from spdrank.core.files import atomic_writer, sha256_file
from spdrank.core.slates import (
    NOT_RETRIEVED,
    Candidate,
    Query,
    Slate,
    SlateError,
    dumps_slate,
)
from spdrank.datasets import recbole
from spdrank.datasets.interaction_features import FEATURES as INTERACTION_FEATURES
from spdrank.datasets.interaction_features import InteractionFeatures
from spdrank.datasets.sasrec_features import (
    SASREC_POLICY,
    SASRecScores,
    fit_for_build,
    retrieval_counts,
    retriever_lists,
)
from spdrank.datasets.title_similarity import TitleSimilarity
from spdrank.rankers.sasrec_config import SASREC, SASREC_FIT, SASRecConfig

logger = logging.getLogger(__name__)

#: How an item without a usable title is rendered.
UNTITLED = "Item {item_id}"

#: The features a build with ``features`` adds to every candidate.
FEATURES: tuple[str, ...] = (*INTERACTION_FEATURES, TITLE_SIMILARITY)

#: Every feature a build can add, in the order a candidate carries them: ``features`` may
#: name any of them; SASRec's (:mod:`spdrank.datasets.sasrec_features`) fits a model
#: (minutes), so only a build that names it has it.
ALL_FEATURES: tuple[str, ...] = (*FEATURES, SASREC)

#: Retrievers a build can take its candidates from instead of negatives or a candidate file.
RETRIEVERS = (SASREC,)

#: How the manifest describes the features, when a build adds them.
FEATURES_POLICY = (
    "log1p of each candidate's count (popularity), co-occurrence score with the user's "
    "history (cooccurrence) and count right after the user's last item (transition) over the "
    "training slates' history + target, as the baselines count them, leaving the slate's own "
    "user out; title_similarity: the largest TF-IDF cosine of the candidate's title with a "
    "history title, IDF over the log's item titles (no interactions); rounded to 6 decimals"
)

#: How the manifest describes the validation split, when a build makes one.
VALIDATION_POLICY = (
    "a seeded sample of the training users (sorted ids); each one's slate, whose target is "
    "the user's last item, is written to valid.jsonl instead of train.jsonl; like eval users, "
    "their sequences are not counted in the features, so no count holds a validation target"
)

#: Ways to draw negatives.
NEGATIVES = ("uniform", "popularity")

#: What a candidate file holds: a retriever's lists (ordered, optionally scored; a target the
#: retriever missed is a fact about it) or negatives sampled for each user (LLMRank's and
#: RecBole's sampled evaluation: the target always sits beside them, by the protocol).
CANDIDATE_KINDS = ("retrieved", "sampled")

#: How the manifest describes a file of sampled negatives.
SAMPLED_POLICY = (
    "the candidate file holds negatives sampled for each user (--candidates-are sampled): "
    "each user's target is inserted beside them, as the sampled-negative protocol has it"
)

#: How the manifest describes the sequences of users without a candidate list.
EXTRA_SEQUENCES_POLICY = (
    "users without a candidate list make no slate, but their sequences (history + target, as "
    "a slate would hold them) are written to extra_sequences.txt and counted like training "
    "slates: in the features, and by the baselines `spdrank eval` fits beside train.jsonl"
)

#: How the manifest describes the scores a scored candidate file gives.
CANDIDATE_SCORES_POLICY = (
    "each candidate's score is the retriever's (item:score); an inserted target, which the "
    "retriever did not return, gets the lowest score of the user's list"
)

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
VALID_FILE = "valid.jsonl"
MANIFEST_FILE = "manifest.json"
#: The sequences of users who make no slate (no candidate list), for the counts only.
EXTRA_SEQUENCES_FILE = "extra_sequences.txt"

#: Fewer eval slates than this give metric intervals too wide to tell close rankers apart.
MIN_EVAL_SLATES = 1000


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
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1 (the target), got {self.candidates}")
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


@dataclass
class InteractionLog:
    """Parsed sequences: the users that make a slate, and the statistics of the whole log."""

    source: str
    #: ``(user, items)`` of every user with at least 2 items, in input order.
    users: list[tuple[str, list[str]]] = field(default_factory=list)
    #: Interactions per item over every user line (short users included).
    item_counts: dict[str, int] = field(default_factory=dict)
    lines: int = 0
    empty_lines: int = 0
    #: Users skipped for having fewer than 2 items.
    short_users: int = 0

    @property
    def interactions(self) -> int:
        return sum(self.item_counts.values())


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
    #: The line whose first candidate made the file a scored one.
    scored_from: int = 0


@dataclass
class BuildResult:
    out_dir: Path
    train_path: Path
    eval_path: Path
    manifest_path: Path
    manifest: dict[str, Any]
    #: ``valid.jsonl``, when the build made a validation split.
    valid_path: Path | None = None
    #: ``extra_sequences.txt``, when users without a candidate list were counted.
    extra_path: Path | None = None

    @property
    def counts(self) -> dict[str, int]:
        return self.manifest["counts"]


# -- inputs ---------------------------------------------------------------------------------


def clean_title(raw: str) -> str:
    """HTML-unescape a title and collapse its whitespace (``""`` for a blank title)."""
    return " ".join(html.unescape(raw).split())


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """Numbered lines of a UTF-8 text file (a BOM is dropped), with errors naming file:line."""
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    with open(path, "rb") as fh:  # decoded line by line, so a decoding error names its line
        for lineno, raw in enumerate(fh, start=1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise SlateError(f"not UTF-8 text ({exc.reason})", f"{path}:{lineno}") from None


def parse_sequences(lines: Iterable[tuple[int, str]], source: str) -> InteractionLog:
    """Parse numbered ``user item item ...`` lines (``source`` names them in errors)."""
    out = InteractionLog(source=source)
    return _collect(out, _sequence_rows(lines, source, out))


def _sequence_rows(
    lines: Iterable[tuple[int, str]], source: str, out: InteractionLog
) -> Iterator[tuple[str, list[str]]]:
    """``(user, items)`` per non-blank line; ``out`` counts the lines and the blank ones.

    A line that cannot be a user is an error naming it: a user seen before, or a RecBole
    header field (``user_id:token``), which means an atomic file whose header is not its first
    line (a header first is read as one: :func:`read_sequences`).
    """
    seen: dict[str, int] = {}
    for lineno, line in lines:
        out.lines += 1
        fields = line.split()
        if not fields:
            out.empty_lines += 1
            continue
        where = f"{source}:{lineno}"
        header = next((f for f in fields if recbole.is_header_field(f)), None)
        if header is not None:
            raise SlateError(
                f"{header!r} is a RecBole header field (name:type), not a user or an item: "
                "an atomic file's header must be its first line",
                where,
            )
        user, items = fields[0], fields[1:]
        _first_line_of(user, seen, lineno, where)
        yield user, items


def _collect(out: InteractionLog, rows: Iterable[tuple[str, list[str]]]) -> InteractionLog:
    """Count every row's items into ``out``; keep the users with 2+ items, count the rest."""
    counts: dict[str, int] = {}
    for user, items in rows:
        for item in items:
            counts[item] = counts.get(item, 0) + 1
        if len(items) < 2:
            out.short_users += 1
            continue
        out.users.append((user, items))
    out.item_counts = counts
    return out


def _first_line(
    lines: Iterator[tuple[int, str]],
) -> tuple[str | None, Iterator[tuple[int, str]]]:
    """The first non-blank line's text (None if there is none), and all the lines again."""
    held: list[tuple[int, str]] = []
    for numbered in lines:
        held.append(numbered)
        if numbered[1].strip():
            return numbered[1], itertools.chain(held, lines)
    return None, iter(held)


def _first_line_of(user: str, seen: dict[str, int], lineno: int, where: str) -> None:
    """Record that ``user``'s line is ``lineno``; a SlateError at ``where`` naming the first
    line when the user already had one."""
    if user in seen:
        raise SlateError(
            f"duplicate user {user!r} (first seen at line {seen[user]}): "
            "each user must be on one line",
            where,
        )
    seen[user] = lineno


def read_sequences(path: str | os.PathLike[str]) -> InteractionLog:
    """Read a log: ``user item item ...`` lines in time order, or a RecBole ``.inter`` file
    (recognised by its ``name:type`` header, :mod:`spdrank.datasets.recbole`)."""
    path = Path(path)
    first, lines = _first_line(_lines(path))
    if first is None or recbole.header_names(first) is None:
        return parse_sequences(lines, str(path))
    atomic = recbole.read_inter(lines, str(path))
    out = InteractionLog(source=str(path), lines=atomic.lines, empty_lines=atomic.empty_lines)
    return _collect(out, atomic.users)


def read_titles(
    path: str | os.PathLike[str], known_items: Collection[str] | None = None
) -> dict[str, str]:
    """Read a TSV ``item_id<TAB>title`` with a header line, or a RecBole ``.item`` file (its
    ``item_id`` and title columns); titles cleaned, may be ``""``.

    ``known_items`` (the log's) tell a TSV without its header line: a first row whose item id
    is one of them is read as a title, with a warning, instead of dropped as a header.
    """
    path = Path(path)
    first, lines = _first_line(_lines(path))
    if first is None:
        raise SlateError(f"{path} is empty: expected a header line and item_id<TAB>title rows")
    if recbole.header_names(first) is not None:
        rows = recbole.read_item_titles(lines, str(path))
    else:
        rows = _title_rows(lines, path, known_items)
    titles: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    for lineno, item, title in rows:
        where = f"{path}:{lineno}"
        if item in titles:
            raise SlateError(
                f"item {item!r} has a second title (first at line {first_seen[item]})", where
            )
        first_seen[item] = lineno
        titles[item] = clean_title(title)
    return titles


def _title_rows(
    lines: Iterable[tuple[int, str]], path: Path, known_items: Collection[str] | None = None
) -> Iterator[tuple[int, str, str]]:
    """``(line, item, raw title)`` per row of a titles TSV, its header line skipped: the first
    row, unless its item id is one of ``known_items`` (then the file has no header)."""
    header = False
    for lineno, line in lines:
        where = f"{path}:{lineno}"
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise SlateError(
                f"expected 2 tab-separated fields (item_id<TAB>title), got {len(fields)}"
                + (" in the header line" if not header else ""),
                where,
            )
        if not header:
            header = True
            if known_items is None or fields[0].strip() not in known_items:
                continue
            logger.warning(
                "%s has no header line: its first row names item %r of the log, so it is read "
                "as that item's title (add an 'item_id<TAB>title' header line to silence this)",
                where, fields[0].strip(),
            )
        item = fields[0].strip()
        if not item:
            raise SlateError("empty item id", where)
        yield lineno, item, fields[1]


def read_candidate_lists(path: str | os.PathLike[str]) -> CandidateLists:
    """Read an upstream retriever's lists: one user a line, ``user cand cand ...``, best first.

    Candidates may carry the retriever's score as ``item:score`` (``u1 i7:0.93 i2:0.41``). The
    file's first candidate decides: if it ends in ``:<number>`` every candidate of the file
    must, else every candidate is a plain id (which may then hold colons).
    """
    path = Path(path)
    out = CandidateLists(source=str(path))
    seen: dict[str, int] = {}
    for lineno, line in _lines(path):
        out.lines += 1
        fields = line.split()
        if not fields:
            out.empty_lines += 1
            continue
        where = f"{path}:{lineno}"
        user = fields[0]
        _first_line_of(user, seen, lineno, where)
        if out.scores is None and fields[1:] and _scored(fields[1]) is not None:
            out.scores, out.scored_from = {}, lineno
        candidates = _candidates(fields[1:], out, where)
        out.repeated_candidates += len(fields) - 1 - len(candidates)
        out.lists[user] = list(candidates)
        if out.scores is not None:
            out.scores[user] = candidates
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
                f"candidate {token!r} has no score: the file's first candidate (line "
                f"{lists.scored_from}) is item:score, so every candidate must be",
                where,
            )
        item, score = scored
        if not math.isfinite(score):
            raise SlateError(f"candidate {item!r} has a non-finite score {score}", where)
        out.setdefault(item, score)
    return out


def iter_extra_sequences(path: str | os.PathLike[str]) -> Iterator[list[str]]:
    """The item sequences of an ``extra_sequences.txt`` (``user item item ...`` lines), for
    fitting count baselines on users who make no slate."""
    for _, line in _lines(Path(path)):
        fields = line.split()
        if len(fields) > 1:
            yield fields[1:]


def default_extra_sequences(train: str | os.PathLike[str]) -> Path | None:
    """``extra_sequences.txt`` beside a training file, when a build wrote one there."""
    path = Path(train).parent / EXTRA_SEQUENCES_FILE
    return path if path.is_file() else None


# -- slates ---------------------------------------------------------------------------------


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


class _NegativeSampler:
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


class _Titles:
    """Titles by item id, with the untitled policy."""

    def __init__(self, titles: Mapping[str, str]) -> None:
        self.titles = titles

    def __call__(self, item: str) -> str:
        title = self.titles.get(item)
        return title if title else UNTITLED.format(item_id=item)

    def untitled(self, items: Iterable[str]) -> tuple[list[str], list[str]]:
        """The sorted untitled items among ``items``, and the unknown ones among those."""
        untitled = sorted(i for i in set(items) if not self.titles.get(i))
        unknown = [i for i in untitled if i not in self.titles]
        return untitled, unknown


def render_history(titles: Sequence[str]) -> str:
    """The query text: ``"<k>. <title>"`` one line per item, oldest first, from 1."""
    return "\n".join(f"{k}. {title}" for k, title in enumerate(titles, start=1))


def _user_rng(seed: int, user: str) -> random.Random:
    return random.Random(f"{seed}\x00{user}")


def _history_and_target(items: list[str], history: int) -> tuple[list[str], str]:
    """A user's last item, and the (at most) ``history`` items before it."""
    before = items[:-1]
    return before[max(0, len(before) - history) :], items[-1]


@dataclass(frozen=True)
class _Retrieved:
    """One user's slate candidates, taken from the retriever's list."""

    docids: tuple[str, ...]
    #: The retriever's score by docid (empty for a plain candidate file).
    scores: Mapping[str, float]
    #: The target was not in the list and was added to the slate.
    inserted: bool
    #: The target was not in the list and was not added: the slate holds no target.
    missed: bool
    #: The list held more candidates than the slate takes.
    cut: bool


def _retrieved(lists: CandidateLists, user: str, target: str, options: BuildOptions) -> _Retrieved:
    """The user's list cut to ``options.candidates``, in the retriever's order (best first).

    The target is kept wherever it was ranked. A target the retriever did not return is added
    (``insert_target``) with the list's lowest score, an upper bound on its real one, or left
    out, so the slate measures what the retriever found.
    """
    ranked = lists.lists[user]
    scores: Mapping[str, float] = lists.scores[user] if lists.scores is not None else {}
    others = [c for c in ranked if c != target]
    found = len(others) < len(ranked)
    keep_target = found or options.insert_target
    kept = others[: options.candidates - 1] if keep_target else others[: options.candidates]
    inserted = not found and options.insert_target
    if inserted and scores:
        scores = {**scores, target: min(scores.values())}
    return _Retrieved(
        docids=tuple(kept + [target] if keep_target else kept),
        scores=scores,
        inserted=inserted,
        missed=not keep_target,
        cut=len(kept) < len(others),
    )


def _counted_sequence(items: list[str], history: int) -> list[str]:
    """What the counts take of a user: the history a slate shows, then the target."""
    before, target = _history_and_target(items, history)
    return [*before, target]


def _split_by_lists(
    users: list[tuple[str, list[str]]], lists: CandidateLists, options: BuildOptions
) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """(users who make a slate, users counted without one). Without ``insert_target`` an
    empty list has nothing to rank, so it counts as no list."""
    have = [
        (u, items) for u, items in users
        if u in lists.lists and (options.insert_target or lists.lists[u])
    ]
    listed = {u for u, _ in have}
    return have, [(u, items) for u, items in users if u not in listed]


def _fraction_for(n_slates: int, n_users: int) -> Fraction:
    """The smallest two-significant-digit ``--eval-fraction`` giving ``n_slates`` of ``n_users``."""
    exact = Fraction(n_slates, n_users)
    scale = Fraction(10) ** (1 - math.floor(math.log10(exact)))
    return Fraction(math.ceil(exact * scale)) / scale


def _warn_small_eval(n_eval: int, n_users: int, fraction: float) -> None:
    """Say when the eval split is too small for metrics to separate close rankers."""
    if fraction == 0 or n_eval >= MIN_EVAL_SLATES or not n_users:
        return
    spread = f"±{1.96 * math.sqrt(0.25 / n_eval):.2f}" if n_eval else "undefined"
    suggestion = _fraction_for(MIN_EVAL_SLATES, n_users)
    advice = (
        f"--eval-fraction {float(suggestion):g} would give about {MIN_EVAL_SLATES:,}"
        if suggestion <= Fraction(1, 2)
        else f"this log's {n_users:,} users cannot spare {MIN_EVAL_SLATES:,}; compare rankers "
        "slate by slate (spdrank bench's paired intervals) rather than by their means"
    )
    logger.warning(
        "%s eval slates: a metric near 0.5 has a 95%% confidence interval of about %s, too "
        "wide to tell close rankers apart; %s",
        f"{n_eval:,}", spread, advice,
    )


def _warn_inserted(inserted: int, slates: int, kind: str = "retrieved") -> None:
    """Say where target insertion made slates a ranker can read the label off: a retriever's
    list that missed the target. Beside sampled negatives insertion is the protocol, so it is
    only counted."""
    if not inserted:
        return
    if kind == "sampled":
        logger.info(
            "%s of %s targets inserted beside their sampled negatives (the sampled-negative "
            "protocol)", f"{inserted:,}", f"{slates:,}",
        )
        return
    logger.warning(
        "%s of %s targets were not among the retriever's candidates and were inserted into "
        "their slates: an inserted item has no real retriever score or rank, and a ranker can "
        "learn to spot it, so metrics on such slates flatter it; to measure on what the "
        "retriever found, build with --no-insert-target (those slates keep no target and "
        "count as misses); if the file holds sampled negatives rather than a retriever's "
        "lists, build with --candidates-are sampled",
        f"{inserted:,}", f"{slates:,}",
    )


def build_slates(
    log: InteractionLog,
    titles: Mapping[str, str],
    out_dir: str | os.PathLike[str],
    options: BuildOptions | None = None,
    candidate_lists: CandidateLists | None = None,
    inputs: Mapping[str, Mapping[str, Any]] | None = None,
    command: str = "sequences",
    progress: bool | None = None,
) -> BuildResult:
    """Write ``train.jsonl``, ``eval.jsonl`` (``valid.jsonl``) and ``manifest.json`` into ``out_dir``.

    ``titles`` maps item ids to cleaned titles (``""`` for an item known to have none);
    ``inputs`` describes the input files for the manifest (``{"name": {"sha256": ...}}``);
    ``progress``: a tqdm bar on stderr always (True), never (False), or on a terminal and
    log lines elsewhere (None, :func:`spdrank.core.progress.track`).
    On any error nothing in ``out_dir`` changes: bad input raises :class:`SlateError` /
    :class:`ValueError` before writing, and files are renamed into place only at the end.
    With candidate lists, users without one make no slate but are counted like training
    users (``extra_sequences.txt``).
    """
    options = options or BuildOptions()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    retriever, candidate_lists, options = _retrieved_lists(log, candidate_lists, options)
    _check_sampled(candidate_lists, options)
    title_of = _Titles(titles)
    counts = _log_counts(log)

    # Which users make a slate, and the items they show: all checked before writing anything.
    users, extra, retrieved, sampler = _slate_users(log, candidate_lists, options, counts)
    shown_items, untitled = _shown_items(log, retrieved, title_of, counts)
    shown = {i: title_of(i) for i in shown_items}  # every title a slate shows, resolved once
    split_of = _splits(users, options)
    features = _fit_features(
        log, users, extra, split_of, shown_items, title_of, retriever, options
    )
    maker = _SlateMaker(options, shown, split_of, features, sampler, retrieved)

    files = {TRAIN_FILE: out / TRAIN_FILE, EVAL_FILE: out / EVAL_FILE}
    if options.validation:
        files[VALID_FILE] = out / VALID_FILE
    with ExitStack() as stack:
        # Entered first, so renamed into place last, once every slate file is.
        manifest_fh = stack.enter_context(atomic_writer(out / MANIFEST_FILE))
        handles = {name: stack.enter_context(atomic_writer(path)) for name, path in files.items()}
        extra_output = _write_extra_sequences(stack, out, extra, options.history)
        outputs = _write_slates(users, maker, handles, progress)

        if candidate_lists is not None:
            counts.update(maker.list_stats)
        if options.retriever is not None and candidate_lists is not None:
            counts.update(retrieval_counts(users, candidate_lists, split_of))
        counts["train"] = outputs[TRAIN_FILE]["slates"]
        counts["eval"] = outputs[EVAL_FILE]["slates"]
        if options.validation:
            counts["valid"] = outputs[VALID_FILE]["slates"]
        parameters, policies = _settings(options, candidate_lists, features, bool(extra))
        manifest: dict[str, Any] = {
            "spdrank": __version__,
            "command": command,
            "parameters": parameters,
            "policies": policies,
            "inputs": {k: dict(v) for k, v in (inputs or {}).items()},
            "counts": counts,
            "untitled_examples": untitled[:20],
            "outputs": outputs | extra_output,
        }
        if features.sasrec is not None:
            # The fit's cache key: `spdrank eval --ranker sasrec` on these slates loads it.
            manifest[SASREC_FIT] = {"key": features.sasrec.model.key}
        manifest_fh.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    if not extra:  # a previous build's, which the baselines beside train.jsonl would read
        (out / EXTRA_SEQUENCES_FILE).unlink(missing_ok=True)
    _warn_inserted(maker.list_stats["targets_added"], len(users), options.candidates_are)
    _warn_small_eval(counts["eval"], len(users), options.eval_fraction)
    return BuildResult(
        out_dir=out,
        train_path=files[TRAIN_FILE],
        eval_path=files[EVAL_FILE],
        manifest_path=out / MANIFEST_FILE,
        manifest=manifest,
        valid_path=files.get(VALID_FILE),
        extra_path=out / EXTRA_SEQUENCES_FILE if extra else None,
    )


def _retrieved_lists(
    log: InteractionLog, lists: CandidateLists | None, options: BuildOptions
) -> tuple[SASRecScores | None, CandidateLists | None, BuildOptions]:
    """With ``--retriever``: the retriever, its lists as the candidate lists, and the options
    without target insertion (its lists decide which users make a slate, so it runs first);
    otherwise no retriever and the lists and options as given."""
    if options.retriever is None:
        return None, lists, options
    if lists is not None:
        raise ValueError(
            f"--retriever {options.retriever} and --candidate-file exclude each other: "
            "choose one"
        )
    retriever, lists = retriever_lists(log, options)
    return retriever, lists, replace(options, insert_target=False)


def _check_sampled(lists: CandidateLists | None, options: BuildOptions) -> None:
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


def _log_counts(log: InteractionLog) -> dict[str, int]:
    """The manifest's counts of the interaction log, the first of its counts."""
    return {
        "lines": log.lines,
        "empty_lines": log.empty_lines,
        "short_users": log.short_users,
        "users": len(log.users),
        "items": len(log.item_counts),
        "interactions": log.interactions,
    }


def _shown_items(
    log: InteractionLog,
    retrieved: Mapping[str, _Retrieved],
    title_of: _Titles,
    counts: dict[str, int],
) -> tuple[list[str], list[str]]:
    """Every item a slate may show (the log's, then the retrieved lists'), and the sorted
    untitled ones among them, counted and said."""
    shown_items: list[str] = list(log.item_counts)
    for got in retrieved.values():
        shown_items.extend(got.docids)
    untitled, unknown = title_of.untitled(shown_items)
    counts["untitled_items"] = len(untitled)
    counts["unknown_items"] = len(unknown)
    if untitled:
        logger.info(
            "%d items have no title (%d not in the titles at all); shown as 'Item <item_id>'",
            len(untitled), len(unknown),
        )
    return shown_items, untitled


def _splits(users: list[tuple[str, list[str]]], options: BuildOptions) -> dict[str, str]:
    """The file each user's slate goes to: the eval users', the validation users' (drawn from
    the others), and the rest's ``train.jsonl``."""
    eval_users = split_users((u for u, _ in users), options.eval_fraction, options.seed)
    valid_users = validation_users(
        (u for u, _ in users if u not in eval_users), options.validation, options.seed
    )
    split_of = {u: TRAIN_FILE for u, _ in users} | dict.fromkeys(eval_users, EVAL_FILE)
    return split_of | dict.fromkeys(valid_users, VALID_FILE)


@dataclass(frozen=True)
class _Features:
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


def _fit_features(
    log: InteractionLog,
    users: list[tuple[str, list[str]]],
    extra: list[tuple[str, list[str]]],
    split_of: Mapping[str, str],
    shown_items: list[str],
    title_of: _Titles,
    retriever: SASRecScores | None,
    options: BuildOptions,
) -> _Features:
    """The features ``options`` names, fitted on the training users (and the users only
    counted), as the baselines count them; the retriever's SASRec serves as the feature's."""
    only_counted = [_counted_sequence(items, options.history) for _, items in extra]
    sasrec = retriever
    if SASREC in options.features and sasrec is None:
        train_users = (u for u, name in split_of.items() if name == TRAIN_FILE)
        sasrec = fit_for_build(users, train_users, shown_items, options, only_counted)
    if not set(options.features) & set(FEATURES):
        return _Features(options.features, sasrec=sasrec)
    similarity = TitleSimilarity(title_of(i) for i in sorted(log.item_counts))
    interactions = InteractionFeatures(
        [_counted_sequence(items, options.history) for u, items in users
         if split_of[u] == TRAIN_FILE]
        + only_counted
    )
    return _Features(options.features, interactions, similarity, sasrec)


class _SlateMaker:
    """Each user's slate: the target among negatives drawn for the user or the retrieved
    list, shuffled by the user's seed, with features; counts what the lists lacked."""

    def __init__(
        self,
        options: BuildOptions,
        shown: Mapping[str, str],
        split_of: Mapping[str, str],
        features: _Features,
        sampler: _NegativeSampler | None,
        retrieved: Mapping[str, _Retrieved],
    ) -> None:
        self.options = options
        self.shown = shown
        self.split_of = split_of
        self.features = features
        self.sampler = sampler
        self.retrieved = retrieved
        self.list_stats = {"targets_added": 0, "lists_cut": 0, "short_lists": 0}
        if not options.insert_target:
            self.list_stats["targets_not_retrieved"] = 0

    def __call__(self, user: str, items: list[str]) -> Slate:
        options = self.options
        history, target = _history_and_target(items, options.history)
        rng = _user_rng(options.seed, user)
        got = None
        if self.sampler is not None:
            docids = [target, *self.sampler.draw(rng, options.candidates - 1, set(items))]
        else:
            got = self.retrieved[user]
            docids = list(got.docids)
            _count_list(self.list_stats, got, options.candidates)
        rng.shuffle(docids)
        slate = _slate(user, history, target, docids, self.shown, got)
        counted = self.split_of[user] == TRAIN_FILE
        self.features.add(slate, history, target, counted, self.shown)
        return slate


def _write_slates(
    users: list[tuple[str, list[str]]],
    maker: _SlateMaker,
    handles: Mapping[str, IO[str]],
    progress: bool | None,
) -> dict[str, dict[str, Any]]:
    """Write each user's slate to its split's file; per file, the manifest's entry: slates,
    candidates and the sha256 of what was written."""
    from spdrank.core.progress import track

    digests = {name: hashlib.sha256() for name in handles}
    written = {name: {"slates": 0, "candidates": 0} for name in handles}
    for user, items in track(users, "slates", unit="user", total=len(users), mode=progress):
        slate = maker(user, items)
        name = maker.split_of[user]
        line = dumps_slate(slate) + "\n"
        handles[name].write(line)
        digests[name].update(line.encode("utf-8"))
        written[name]["slates"] += 1
        written[name]["candidates"] += len(slate.candidates)
    return {name: {**written[name], "sha256": digests[name].hexdigest()} for name in handles}


def _settings(
    options: BuildOptions,
    lists: CandidateLists | None,
    features: _Features,
    extra: bool,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The manifest's parameters and policies; a setting the build did not use adds nothing
    to them."""
    parameters: dict[str, Any] = {
        "history": options.history,
        "candidates": options.candidates,
        "negatives": "candidate-file" if lists is not None else options.negatives,
        "seed": options.seed,
        "eval_fraction": options.eval_fraction,
    }
    policies = {
        "untitled": "an item with an empty title or no title row is shown as "
        "'Item <item_id>'",
        "titles": "html.unescape, then whitespace collapsed to single spaces",
        "skipped": "empty lines and users with fewer than 2 items",
    }
    if options.features:
        parameters["features"] = list(options.features)
        if features.interactions is not None:
            policies["features"] = FEATURES_POLICY
    if options.retriever is not None:
        parameters["negatives"] = "retriever"
        parameters["retriever"] = options.retriever
    if features.sasrec is not None:
        parameters[SASREC] = options.sasrec.to_dict()
        policies[SASREC] = SASREC_POLICY
    if options.validation:
        parameters["validation"] = options.validation
        policies["validation"] = VALIDATION_POLICY
    _describe_lists(parameters, policies, lists, options, extra)
    return parameters, policies


def _slate_users(
    log: InteractionLog,
    lists: CandidateLists | None,
    options: BuildOptions,
    counts: dict[str, int],
) -> tuple[
    list[tuple[str, list[str]]],
    list[tuple[str, list[str]]],
    dict[str, _Retrieved],
    _NegativeSampler | None,
]:
    """(users who make a slate, users only counted, their retrieved lists, the sampler).

    Everything a slate needs is checked here, before any file is opened.
    """
    users = log.users
    if lists is None:
        sampler = _NegativeSampler(log.item_counts, options.negatives)
        need = options.candidates - 1
        for u, items in users:
            if sampler.available(set(items)) < need:
                raise ValueError(
                    f"user {u!r}: only {sampler.available(set(items))} of the log's "
                    f"{len(sampler.items)} items are outside the user's own, cannot draw "
                    f"{need} negatives; lower --candidates"
                )
        return users, [], {}, sampler
    have, extra = _split_by_lists(users, lists, options)
    counts["users_without_candidate_list"] = len(extra)
    logged = {u for u, _ in users}
    counts["unused_candidate_lists"] = sum(1 for u in lists.lists if u not in logged)
    counts["repeated_candidates_dropped"] = lists.repeated_candidates
    counts["candidate_list_empty_lines"] = lists.empty_lines
    retrieved = {u: _retrieved(lists, u, items[-1], options) for u, items in have}
    return have, extra, retrieved, None


def _count_list(stats: dict[str, int], got: _Retrieved, size: int) -> None:
    stats["targets_added"] += got.inserted
    stats["lists_cut"] += got.cut
    stats["short_lists"] += len(got.docids) < size
    if got.missed:
        stats["targets_not_retrieved"] += 1


def _slate(
    user: str,
    history: list[str],
    target: str,
    docids: list[str],
    shown: Mapping[str, str],
    got: _Retrieved | None,
) -> Slate:
    """One user's slate; a target the retriever missed is recorded as a click not retrieved."""
    scores = got.scores if got is not None else {}
    missed = got is not None and got.missed
    return Slate(
        query=Query(
            qid=user,
            text=render_history([shown[i] for i in history]),
            history=list(history),
        ),
        candidates=[
            Candidate(docid=d, doc={"title": shown[d]}, score=scores.get(d, 0.0)) for d in docids
        ],
        clicked=[] if missed else [target],
        extra={NOT_RETRIEVED: [target]} if missed else {},
    )


def _write_extra_sequences(
    stack: ExitStack, out: Path, extra: list[tuple[str, list[str]]], history: int
) -> dict[str, dict[str, Any]]:
    """Write the only-counted users' sequences (renamed into place with the slates); their
    manifest entry, or none when there are none."""
    if not extra:
        return {}
    digest = hashlib.sha256()
    fh = stack.enter_context(atomic_writer(out / EXTRA_SEQUENCES_FILE))
    for user, items in extra:
        line = " ".join([user, *_counted_sequence(items, history)]) + "\n"
        fh.write(line)
        digest.update(line.encode("utf-8"))
    return {EXTRA_SEQUENCES_FILE: {"sequences": len(extra), "sha256": digest.hexdigest()}}


def _describe_lists(
    parameters: dict[str, Any],
    policies: dict[str, str],
    lists: CandidateLists | None,
    options: BuildOptions,
    extra: bool,
) -> None:
    """The manifest's word on candidate lists, added only where a build used them so."""
    if lists is None:
        return
    if not options.insert_target:
        parameters["insert_target"] = False
    if options.candidates_are == "sampled":
        parameters["candidates_are"] = "sampled"
        policies["candidates_are"] = SAMPLED_POLICY
    if lists.scores is not None:
        policies["candidate_scores"] = CANDIDATE_SCORES_POLICY
    if extra:
        policies["extra_sequences"] = EXTRA_SEQUENCES_POLICY


def build_from_files(
    sequences: str | os.PathLike[str],
    titles: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    options: BuildOptions | None = None,
    candidate_file: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
) -> BuildResult:
    """Read the sequences, titles (and candidate lists) files and :func:`build_slates`."""
    log = read_sequences(sequences)
    title_map = read_titles(titles, known_items=log.item_counts)
    lists = read_candidate_lists(candidate_file) if candidate_file is not None else None
    inputs: dict[str, dict[str, Any]] = {
        "sequences": {"path": str(sequences), "sha256": sha256_file(sequences)},
        "titles": {"path": str(titles), "sha256": sha256_file(titles)},
    }
    if candidate_file is not None:
        inputs["candidate_file"] = {
            "path": str(candidate_file),
            "sha256": sha256_file(candidate_file),
        }
    return build_slates(
        log, title_map, out_dir, options, candidate_lists=lists, inputs=inputs,
        command="sequences", progress=progress,
    )
