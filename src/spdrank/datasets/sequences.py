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
  retriever's score from the titles alone (:mod:`spdrank.datasets.title_similarity`).

Leakage: the statistics the baselines fit on ``train.jsonl`` and the builder's ``features``
count the same sequences: those of the users in ``train.jsonl``. Validation users are treated
like eval users: their sequences are never counted, so no validation target shows up in any
count, in any split's features, and a validation slate's features (like an eval slate's) see
the training users only.

Inputs (:func:`read_sequences`, :func:`read_titles`, :func:`read_candidate_lists`):

- sequences: ``user item item ...`` (whitespace-separated). Empty lines and users with fewer
  than 2 items are skipped and counted; a user on two lines is an error naming ``file:line``.
- titles: TSV ``item_id<TAB>title`` with a header line; a line without exactly two fields, an
  empty item id or a repeated item id is an error naming ``file:line``. Titles are
  HTML-unescaped and their whitespace collapsed (:func:`clean_title`).
- candidate lists: ``user cand cand ...``; the target is added when missing and the list cut
  to ``candidates`` keeping the target (retriever order decides what is kept). Users without a
  list are skipped and counted. A candidate repeated within a list is kept once.

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
``validation``) and ``manifest.json`` (counts, parameters, sha256 of inputs and outputs; no
timestamps). All are written to temporary files renamed only once everything is written, so
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
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from spdrank import __version__
from spdrank.datasets.interaction_features import FEATURES as INTERACTION_FEATURES
from spdrank.datasets.interaction_features import InteractionFeatures
from spdrank.datasets.title_similarity import TITLE_SIMILARITY, TitleSimilarity
from spdrank.slates import Candidate, Query, Slate, SlateError, atomic_writer, dumps_slate

logger = logging.getLogger(__name__)

#: How an item without a usable title is rendered.
UNTITLED = "Item {item_id}"

#: The features a build with ``features`` adds to every candidate.
FEATURES: tuple[str, ...] = (*INTERACTION_FEATURES, TITLE_SIMILARITY)

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

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
VALID_FILE = "valid.jsonl"
MANIFEST_FILE = "manifest.json"


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
    #: Add per-candidate popularity and co-occurrence features (off: the files are unchanged).
    features: bool = False
    #: Training users whose slates form ``valid.jsonl`` instead (0: no validation split).
    validation: int = 0

    def __post_init__(self) -> None:
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


@dataclass
class BuildResult:
    out_dir: Path
    train_path: Path
    eval_path: Path
    manifest_path: Path
    manifest: dict[str, Any]
    #: ``valid.jsonl``, when the build made a validation split.
    valid_path: Path | None = None

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
    seen: dict[str, int] = {}
    counts: dict[str, int] = {}
    for lineno, line in lines:
        out.lines += 1
        fields = line.split()
        if not fields:
            out.empty_lines += 1
            continue
        user, items = fields[0], fields[1:]
        if user in seen:
            raise SlateError(
                f"duplicate user {user!r} (first seen at line {seen[user]}): "
                "each user must be on one line",
                f"{source}:{lineno}",
            )
        seen[user] = lineno
        for item in items:
            counts[item] = counts.get(item, 0) + 1
        if len(items) < 2:
            out.short_users += 1
            continue
        out.users.append((user, items))
    out.item_counts = counts
    return out


def read_sequences(path: str | os.PathLike[str]) -> InteractionLog:
    """Read a sequences file: one user a line, ``user item item ...`` in time order."""
    path = Path(path)
    return parse_sequences(_lines(path), str(path))


def read_titles(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a TSV ``item_id<TAB>title`` with a header line; titles cleaned, may be ``""``."""
    path = Path(path)
    titles: dict[str, str] = {}
    first_seen: dict[str, int] = {}
    header = False
    for lineno, line in _lines(path):
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
            continue
        item = fields[0].strip()
        if not item:
            raise SlateError("empty item id", where)
        if item in titles:
            raise SlateError(
                f"item {item!r} has a second title (first at line {first_seen[item]})", where
            )
        first_seen[item] = lineno
        titles[item] = clean_title(fields[1])
    if not header:
        raise SlateError(f"{path} is empty: expected a header line and item_id<TAB>title rows")
    return titles


def read_candidate_lists(path: str | os.PathLike[str]) -> CandidateLists:
    """Read an upstream retriever's lists: one user a line, ``user cand cand ...``."""
    path = Path(path)
    out = CandidateLists(source=str(path))
    seen: dict[str, int] = {}
    for lineno, line in _lines(path):
        out.lines += 1
        fields = line.split()
        if not fields:
            out.empty_lines += 1
            continue
        user = fields[0]
        if user in seen:
            raise SlateError(
                f"duplicate user {user!r} (first seen at line {seen[user]}): "
                "each user must be on one line",
                f"{path}:{lineno}",
            )
        seen[user] = lineno
        unique = list(dict.fromkeys(fields[1:]))
        out.repeated_candidates += len(fields) - 1 - len(unique)
        out.lists[user] = unique
    return out


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _cut_list(retrieved: list[str], target: str, size: int) -> tuple[list[str], bool, bool]:
    """The retriever's list with the target, cut to ``size``; (list, target added, was cut)."""
    others = [c for c in retrieved if c != target]
    added = len(others) == len(retrieved)
    kept = others[: size - 1]
    return kept + [target], added, len(kept) < len(others)


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
    ``progress``: a tqdm bar on stderr (``None``: only when stderr is a terminal).
    On any error nothing in ``out_dir`` changes: bad input raises :class:`SlateError` /
    :class:`ValueError` before writing, and files are renamed into place only at the end.
    """
    from tqdm import tqdm

    options = options or BuildOptions()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    title_of = _Titles(titles)
    counts: dict[str, int] = {
        "lines": log.lines,
        "empty_lines": log.empty_lines,
        "short_users": log.short_users,
        "users": len(log.users),
        "items": len(log.item_counts),
        "interactions": log.interactions,
    }

    # Which users make a slate, and the items they show: all checked before writing anything.
    users = log.users
    shown_items: list[str] = list(log.item_counts)
    if candidate_lists is not None:
        have = [(u, items) for u, items in users if u in candidate_lists.lists]
        counts["users_without_candidate_list"] = len(users) - len(have)
        logged = {u for u, _ in users}
        counts["unused_candidate_lists"] = sum(1 for u in candidate_lists.lists if u not in logged)
        counts["repeated_candidates_dropped"] = candidate_lists.repeated_candidates
        counts["candidate_list_empty_lines"] = candidate_lists.empty_lines
        users = have
        fixed_lists = {
            u: _cut_list(candidate_lists.lists[u], items[-1], options.candidates)
            for u, items in users
        }
        for docids, _, _ in fixed_lists.values():
            shown_items.extend(docids)
        sampler = None
    else:
        sampler = _NegativeSampler(log.item_counts, options.negatives)
        need = options.candidates - 1
        for u, items in users:
            if sampler.available(set(items)) < need:
                raise ValueError(
                    f"user {u!r}: only {sampler.available(set(items))} of the log's "
                    f"{len(sampler.items)} items are outside the user's own, cannot draw "
                    f"{need} negatives; lower --candidates"
                )
    untitled, unknown = title_of.untitled(shown_items)
    counts["untitled_items"] = len(untitled)
    counts["unknown_items"] = len(unknown)
    if untitled:
        logger.info(
            "%d items have no title (%d not in the titles at all); shown as 'Item <item_id>'",
            len(untitled), len(unknown),
        )
    shown = {i: title_of(i) for i in shown_items}  # every title a slate shows, resolved once
    eval_users = split_users((u for u, _ in users), options.eval_fraction, options.seed)
    valid_users = validation_users(
        (u for u, _ in users if u not in eval_users), options.validation, options.seed
    )
    split_of = {u: TRAIN_FILE for u, _ in users} | dict.fromkeys(eval_users, EVAL_FILE)
    split_of |= dict.fromkeys(valid_users, VALID_FILE)
    features = similarity = None
    if options.features:  # counted over train.jsonl's users only, as the baselines count
        similarity = TitleSimilarity(title_of(i) for i in sorted(log.item_counts))
        features = InteractionFeatures(
            [*history, target]
            for history, target in (
                _history_and_target(items, options.history)
                for u, items in users
                if split_of[u] == TRAIN_FILE
            )
        )

    files = {TRAIN_FILE: out / TRAIN_FILE, EVAL_FILE: out / EVAL_FILE}
    if valid_users:
        files[VALID_FILE] = out / VALID_FILE
    digests = {name: hashlib.sha256() for name in files}
    written = {name: {"slates": 0, "candidates": 0} for name in files}
    list_stats = {"targets_added": 0, "lists_cut": 0, "short_lists": 0}
    with ExitStack() as stack:
        # Entered first, so renamed into place last, once every slate file is.
        manifest_fh = stack.enter_context(atomic_writer(out / MANIFEST_FILE))
        handles = {name: stack.enter_context(atomic_writer(path)) for name, path in files.items()}
        bar = tqdm(
            users, desc="slates", unit="user", file=sys.stderr,
            disable=(not sys.stderr.isatty()) if progress is None else not progress,
        )
        for user, items in bar:
            history, target = _history_and_target(items, options.history)
            rng = _user_rng(options.seed, user)
            if sampler is not None:
                docids = [target, *sampler.draw(rng, options.candidates - 1, set(items))]
            else:
                docids, added, cut = fixed_lists[user]
                docids = list(docids)
                list_stats["targets_added"] += added
                list_stats["lists_cut"] += cut
                list_stats["short_lists"] += len(docids) < options.candidates
            rng.shuffle(docids)
            slate = Slate(
                query=Query(
                    qid=user,
                    text=render_history([shown[i] for i in history]),
                    history=list(history),
                ),
                candidates=[Candidate(docid=d, doc={"title": shown[d]}) for d in docids],
                clicked=[target],
            )
            name = split_of[user]
            if features is not None and similarity is not None:
                own = [*history, target] if name == TRAIN_FILE else None  # was it counted?
                titles = similarity([shown[i] for i in history], [shown[d] for d in docids])
                for candidate, values, title in zip(
                    slate.candidates, features(slate, own), titles
                ):
                    candidate.features = {**values, TITLE_SIMILARITY: title}
            line = dumps_slate(slate) + "\n"
            handles[name].write(line)
            digests[name].update(line.encode("utf-8"))
            written[name]["slates"] += 1
            written[name]["candidates"] += len(docids)
        bar.close()

        if candidate_lists is not None:
            counts.update(list_stats)
        counts["train"] = written[TRAIN_FILE]["slates"]
        counts["eval"] = written[EVAL_FILE]["slates"]
        if valid_users:  # only then, so a build without a validation split is as it was
            counts["valid"] = written[VALID_FILE]["slates"]
        parameters: dict[str, Any] = {
            "history": options.history,
            "candidates": options.candidates,
            "negatives": "candidate-file" if candidate_lists is not None else options.negatives,
            "seed": options.seed,
            "eval_fraction": options.eval_fraction,
        }
        policies = {
            "untitled": "an item with an empty title or no title row is shown as "
            "'Item <item_id>'",
            "titles": "html.unescape, then whitespace collapsed to single spaces",
            "skipped": "empty lines and users with fewer than 2 items",
        }
        if features is not None:  # only then, so a build without features is as it was
            parameters["features"] = list(FEATURES)
            policies["features"] = FEATURES_POLICY
        if valid_users:
            parameters["validation"] = options.validation
            policies["validation"] = VALIDATION_POLICY
        manifest: dict[str, Any] = {
            "spdrank": __version__,
            "command": command,
            "parameters": parameters,
            "policies": policies,
            "inputs": {k: dict(v) for k, v in (inputs or {}).items()},
            "counts": counts,
            "untitled_examples": untitled[:20],
            "outputs": {
                name: {**written[name], "sha256": digests[name].hexdigest()} for name in files
            },
        }
        manifest_fh.write(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return BuildResult(
        out_dir=out,
        train_path=files[TRAIN_FILE],
        eval_path=files[EVAL_FILE],
        manifest_path=out / MANIFEST_FILE,
        manifest=manifest,
        valid_path=files.get(VALID_FILE),
    )


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
    title_map = read_titles(titles)
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
