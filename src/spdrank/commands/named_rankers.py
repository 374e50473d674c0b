"""Rankers by name: the baselines, teacher label files and trained checkpoints a command names,
built in one place and fitted on training slates.

``spdrank eval``, ``spdrank bench`` and the teacher's ``ranker:NAME`` backend all rank with
what is built and fitted here, so a ranker means the same thing in each. No torch is imported
at module level: a model-backed ranker imports its modules only when one is asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from spdrank.core.files import same_file
from spdrank.core.ranking import Ranker
from spdrank.rankers.baselines import (
    BASELINES,
    DEPRECATED_NAMES,
    SEARCH_DEFAULTS,
    make_baseline,
)
from spdrank.rankers.fusion import FUSION_PREFIX
from spdrank.rankers.fusion_choice import BEST_PREFIX, is_chosen

log = logging.getLogger(__name__)


def split_named(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); a plain path (even one holding '=') -> (None, PATH)."""
    name, sep, path = spec.partition("=")
    if not sep or not name or "/" in name or Path(spec).exists():
        return None, spec
    return name, path


def default_train_path(slates: str | Path) -> Path:
    """``train.jsonl`` beside the evaluation slates (``train.jsonl.gz`` if only that exists)."""
    base = Path(slates).parent
    plain = base / "train.jsonl"
    gz = base / "train.jsonl.gz"
    return gz if not plain.exists() and gz.exists() else plain


def replayed_labels(path: str, name: str) -> Ranker:
    """A ``labels:PATH`` fusion component: the label file's rankings
    (:class:`spdrank.teacher.replay.LabelRanking`)."""
    from spdrank.teacher.replay import LabelRanking

    return LabelRanking(path, name=name)


def make_ranker(name: str, *, seed: int = 0, choose_on: str | Path | None = None) -> Ranker:
    """A baseline by name as the commands build it: ``random`` seeded, a fusion's
    ``labels:PATH`` components replayed, a ``fusion:best:...`` given its validation slates
    (``choose_on``, which it needs; it chooses when :func:`fit_rankers` runs)."""
    kwargs: dict[str, Any] = {"seed": seed} if name == "random" else {}
    if name.startswith(FUSION_PREFIX):
        kwargs["replay"] = replayed_labels
    if is_chosen(name):
        if choose_on is None:
            raise ValueError(f"{name!r} chooses its fusion on validation slates: add "
                             "--choose-on FILE (slates with graded relevance, or clicks)")
        kwargs["choose_on"] = Path(choose_on)
    return make_baseline(name, **kwargs)


def check_choose_on(names: Sequence[str], choose_on: str | Path | None) -> None:
    """Refuse ``--choose-on`` when no ranker named chooses on it, and a file that is not
    there, before anything is built."""
    if choose_on is None:
        return
    if not any(is_chosen(name) for name in names):
        raise ValueError(f"--choose-on {choose_on} has no effect here: it chooses the fusion "
                         f"of a {BEST_PREFIX}... ranker, and none is named; drop it")
    if not Path(choose_on).is_file():
        raise FileNotFoundError(f"--choose-on: no such slate file: {choose_on}")


def build_rankers(
    names: Sequence[str] | None,
    *,
    seed: int = 0,
    labels: Sequence[str] = (),
    models: Sequence[str] = (),
    runs: Sequence[str] = (),
    device: str = "auto",
    dtype: str | None = None,
    decoder: str | None = None,
    trust_remote_code: bool = False,
    search: bool = False,
    windows: Any = None,
    choose_on: str | Path | None = None,
) -> list[Ranker]:
    """The rankers named, unfitted, in the order given: baselines (``names``; without any,
    and without labels or models, every baseline), then label files replayed (``labels``),
    then TREC runs replayed (``runs``), then trained checkpoints (``models``); labels, runs and
    models are ``[NAME=]PATH``.

    ``seed`` seeds the random baseline; ``device`` and ``dtype`` load the checkpoints, and
    ``decoder``, when given, replaces each checkpoint's own; ``trust_remote_code`` lets a
    checkpoint's backbone run its folder's Python (the user's choice, never a checkpoint's).
    ``search``: the slates' queries carry no history, so the default baselines are search's
    (:data:`~spdrank.rankers.baselines.SEARCH_DEFAULTS`) and every ranker that learns from histories
    is left out with a note (:func:`without_history`). ``windows``
    (:class:`spdrank.rankers.windows.Windows`) runs every checkpoint over sliding windows.
    ``choose_on``: the validation slates every ``fusion:best:...`` among ``names`` is chosen on.
    """
    defaults = SEARCH_DEFAULTS if search else tuple(BASELINES)
    names = names or ([] if models or labels or runs else list(defaults))
    check_choose_on(names, choose_on)
    rankers: list[Ranker] = []
    built: set[str] = set()
    for name in names:  # a name repeated, or given by its deprecated alias too, counts once
        current = DEPRECATED_NAMES.get(name, (name,))[0]
        if current in built:
            continue
        built.add(current)
        rankers.append(make_ranker(name, seed=seed, choose_on=choose_on))
    for spec in labels:
        from spdrank.teacher.replay import LabelReplayRanker

        name, path = split_named(spec)
        rankers.append(LabelReplayRanker(path, name=name))
    for spec in runs:
        from spdrank.rankers.run_ranker import RunRanker

        name, path = split_named(spec)
        rankers.append(RunRanker(path, name=name))
    if models:
        from spdrank.backbone.load import resolve_device
        from spdrank.model.ranker import SPDRanker

        for spec in models:
            name, path = split_named(spec)
            model = SPDRanker.from_pretrained(
                path, device=resolve_device(device), dtype=dtype,
                trust_remote_code=trust_remote_code,
            )
            if decoder:
                model.decoding(decoder)  # an unknown name fails before any ranking
                model.config.decoder = decoder
            if name:
                model.name = name
            elif len(models) > 1:
                model.name = f"spd:{Path(path).name}"
            if windows is not None:
                from spdrank.rankers.windows import WindowedRanker

                rankers.append(WindowedRanker(model, windows, whose=f"{path}'s"))
            else:
                rankers.append(model)
    return without_history(rankers) if search else rankers


def without_history(rankers: Sequence[Ranker]) -> list[Ranker]:
    """The rankers that can rank slates without a user history; the others (popularity,
    co-occurrence, SASRec learn from interaction logs) are logged as skipped, by name."""
    kept = [r for r in rankers if not getattr(r, "needs_history", False)]
    skipped = [r.name for r in rankers if getattr(r, "needs_history", False)]
    if skipped:
        log.warning(
            "skipped %s: they learn from users' histories, and these slates' queries carry none "
            "(search slates)", ", ".join(skipped),
        )
    return kept


def is_search(path: str | Path) -> bool:
    """Whether a slate file holds search slates: its first slate has neither a history (a
    recommendation builder always writes one, empty or not) nor clicks, the interactions that
    popularity and co-occurrence count."""
    from spdrank.core.slates import read_slates

    first = next(iter(read_slates(path)), None)
    return first is not None and first.query.history is None and first.clicked is None


def fit_rankers(
    rankers: list[Ranker],
    train: Path | None,
    progress: bool | None = None,
    extra: Path | None = None,
    scored: Path | None = None,
) -> dict[str, float]:
    """Fit every ranker that needs training data, one streamed pass each; seconds per ranker.
    ``scored``, the slates the fitted rankers will be scored on, is refused as ``train``: a
    ranker fitted on them would count the very clicks it is judged by.

    Rankers that count sequences (popularity, co-occurrence) also count ``extra``, the
    sequences of users who make no slate (default: ``extra_sequences.txt`` beside ``train``).
    A ranker that can load what the build of ``train`` fitted for it (``fit_build``: SASRec,
    which the build's ``sasrec`` feature fitted) does so rather than fit again, unless
    ``extra`` names other sequences than the build's. Then each ``fusion:best:...`` chooses
    its fusion on its validation slates (:func:`choose_fusions`), its components fitted.
    """
    needing = [r for r in rankers if getattr(r, "needs_train", False)]
    if needing and train is not None and scored is not None and same_file(train, scored):
        raise ValueError(
            f"--train {train} is the file being scored (--slates): "
            f"{', '.join(r.name for r in needing)} would be fitted on the clicks they are "
            "judged by; pass the training slates (default: train.jsonl beside --slates)"
        )
    seconds = _fit(needing, train, progress, extra) if needing else {}
    if needing and scored is not None and train is not None:
        _leave_scored_users_out(rankers, train, extra, scored)
    choose_fusions(rankers, progress, scored)
    return seconds


class LeftOut:
    """A ranker fitted on the users of the slates it scores, ranking each slate of a fitted user
    with that user's own sequence left out of its counts, exactly (``rank(slate,
    leave_out=...)``): as ``spdrank teacher`` and ``spdrank data features`` rank them, so no
    slate is ranked by counts of its own target. Everything else is the inner ranker's."""

    def __init__(self, inner: Ranker, users: Any, source: Path) -> None:
        self.inner = inner
        self.users = users
        self.source = source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def rank(self, slate: Any) -> Any:
        return self.inner.rank(  # type: ignore[call-arg]
            slate, leave_out=self.users.sequence(slate, str(self.source)))


def _leave_scored_users_out(rankers: list[Ranker], train: Path, extra: Path | None,
                            scored: Path) -> None:
    """Where ``scored``'s users are in the fit on ``train`` (and the extra sequences), their
    targets are in it: each ranker that can leave a user out does so (replaced in ``rankers``
    by :class:`LeftOut`), and each that cannot (a SASRec fitted here, a fusion of fitted
    rankers) is said to measure the fit on those users."""
    from spdrank.datasets.extra_sequences import default_extra_sequences
    from spdrank.datasets.fitted_users import fitted_users, listed_users, possible_users

    extra = extra or default_extra_sequences(train)
    qids = listed_users(scored)
    if not possible_users(qids) & (listed_users(train) | _extra_users(extra)):
        return
    users = fitted_users(train, extra)
    scored_users = [q for q in qids if q in users]
    if not scored_users:
        return
    for i, ranker in enumerate(rankers):
        if not getattr(ranker, "needs_train", False) or getattr(ranker, "build", None) is not None:
            continue  # fits nothing, or loaded its build's fit, which holds no slate's target
        if getattr(ranker, "leaves_one_out", False):
            rankers[i] = LeftOut(ranker, users, scored)
            log.info("%s: %s users of %s are in its fit on %s; each is ranked with its own "
                     "sequence left out", ranker.name, f"{len(scored_users):,}", scored, train)
        else:
            log.warning("%s is fitted on %s, which holds %s users of %s (e.g. %r) with their "
                        "targets, and it cannot leave a user out: its row measures the fit on "
                        "them; score it on slates of users it was not fitted on", ranker.name,
                        train, f"{len(scored_users):,}", scored, scored_users[0])


def _extra_users(extra: Path | None) -> set[str]:
    """The users of an extra sequences file (the first field of each line)."""
    from spdrank.datasets.lines import numbered_lines

    if extra is None or not extra.is_file():
        return set()
    return {fields[0] for _, line in numbered_lines(extra) if (fields := line.split())}


#: What a checkpoint's row measures when the slates scoring it are ones its run read.
READ_BY_RUN = {
    "slates": "was trained on --slates {scored}: its row measures the fit, not held-out quality",
    "eval_slates": ("chose its epoch and starting input on --slates {scored} (its "
                    "--eval-slates): its row is biased upward; choose on validation slates"),
}


def note_trained_on(models: Sequence[str] | None, scored: Path) -> None:
    """Say, one line each, which ``--model`` checkpoints (``[NAME=]DIR``) read ``scored``,
    the slates about to score them, when they were trained: as training slates (the row is
    the fit) or as eval slates (the row is the best of several looks at them)."""
    from spdrank.model.checkpoint import run_slates

    for spec in models or ():
        for key, read in run_slates(split_named(spec)[1]).items():
            if read.exists() and same_file(read, scored):
                log.warning("--model %s %s", spec, READ_BY_RUN[key].format(scored=scored))
                break


def choose_fusions(rankers: Sequence[Ranker], progress: bool | None = None,
                   scored: Path | None = None) -> None:
    """Every :class:`~spdrank.rankers.fusion_choice.ChosenFusion` among ``rankers`` chooses on
    its validation slates; the choice and the candidates' scores are printed. A choice made on
    ``scored``, the slates its row is then scored on, is said to flatter that row."""
    from spdrank.core.slates import read_unique_slates
    from spdrank.rankers.fusion_choice import ChosenFusion, format_choice

    for ranker in rankers:
        if isinstance(ranker, ChosenFusion) and ranker.choice is None:
            if ranker.choose_on is None:
                raise ValueError(f"{ranker.name} has no validation slates: --choose-on FILE")
            if scored is not None and same_file(Path(ranker.choose_on), scored):
                log.warning("%s chooses its fusion on --choose-on %s, the slates it is scored "
                            "on: the best of several looks at them, its row is biased upward; "
                            "choose on validation slates", ranker.name, ranker.choose_on)
            t0 = time.perf_counter()
            choice = ranker.choose(read_unique_slates(ranker.choose_on), str(ranker.choose_on),
                                   progress)
            log.info("chose %s for %s in %.1f s", choice.spec, ranker.name,
                     time.perf_counter() - t0)
            print(format_choice(choice), flush=True)


def _fit(
    needing: list[Ranker], train: Path | None, progress: bool | None, extra: Path | None
) -> dict[str, float]:
    from spdrank.core.progress import track
    from spdrank.core.slates import read_slates, training_sequence
    from spdrank.datasets.extra_sequences import default_extra_sequences, iter_extra_sequences

    if train is None or not train.exists():
        raise FileNotFoundError(
            f"ranker(s) {', '.join(r.name for r in needing)} need training slates, but "
            f"{train} does not exist; pass --train FILE"
        )
    builds = extra is None  # the build's own sequences: what its fits learned from
    extra = extra or default_extra_sequences(train)
    if extra is not None and not extra.is_file():
        raise FileNotFoundError(f"no such extra sequences file: {extra}")
    seconds: dict[str, float] = {}
    for ranker in needing:
        t0 = time.perf_counter()
        if builds and hasattr(ranker, "fit_build") and ranker.fit_build(train):
            seconds[ranker.name] = time.perf_counter() - t0
            continue
        stream = track(read_slates(train), f"fit {ranker.name}", unit="slate", mode=progress)
        counts_extra = extra is not None and hasattr(ranker, "fit_sequences")
        if counts_extra:
            ranker.fit_sequences(  # type: ignore[attr-defined]
                chain(map(training_sequence, stream), iter_extra_sequences(extra))
            )
        else:
            ranker.fit(stream)
        seconds[ranker.name] = time.perf_counter() - t0
        also = f" and {extra}" if counts_extra else ""
        log.info("fitted %s on %s%s in %.1f s", ranker.name, train, also, seconds[ranker.name])
    return seconds
