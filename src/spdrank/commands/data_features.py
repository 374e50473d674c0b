"""``spdrank data features``: any ranker's score of each candidate, added as a feature.

    spdrank data features --slates train.jsonl --out train.feat.jsonl --add dense \\
        --add sasrec --add bm25=slate_bm25 --add run:runs/bm25.trec \\
        --add 'fused=fusion:rrf:dense+retriever' [--train TRAIN.jsonl] [--extra-sequences FILE]

Each ``--add [FEATURE=]RANKER`` writes one feature, ``candidate.features[FEATURE]``, which
``spdrank train --features FEATURE`` reads. RANKER is any name ``spdrank eval --ranker``
takes (``popularity``, ``cooccurrence``, ``slate_bm25``, ``dense``, ``sasrec``,
``feature:NAME``, ``fusion:...``), ``run:PATH`` (a TREC run, replayed as ``eval --run``
replays it) or a trained checkpoint's folder. FEATURE defaults to the ranker's name made a
plain word (``dense``; ``run:runs/bm25.trec``: ``bm25``; a checkpoint: its folder's name).

**The value** is the number the ranker ranks by, what ``spdrank eval --ranker RANKER`` orders
the slate by: its own score of the candidate when its ranking is by its scores alone
(``ranks_by_scores``: dense's cosine, popularity's count, SASRec's logit, a run's score, a
fusion's fused score), else the rank-derived score ``1 - r/n`` of the candidate's rank ``r``
(:func:`spdrank.core.ranking.rank_scores`: co-occurrence, whose ties popularity orders, and a
trained checkpoint). A value that is not finite is refused, naming the slate and the candidate.

**Fitting.** Rankers that learn from histories are fitted as ``spdrank eval`` fits them
(:func:`spdrank.commands.named_rankers.fit_rankers`): on ``--train`` (default: ``train.jsonl``
beside ``--slates``) and the extra sequences (``--extra-sequences``, default
``extra_sequences.txt`` beside the training file), every history the user gives.

**No slate counts its own target** (leakage). A slate's user is its qid, as the builders write
it. When a slate's user is in a fit (``--slates`` is the training file, or a copy of it such
as the teacher's labelled slates):

- a count-based ranker (popularity, co-occurrence, alone or inside a fusion) leaves that
  user's fitted sequence out of its counts, exactly (``leave_out``: the counts of a fit
  without it), as the builder's features do (:mod:`spdrank.datasets.interaction_features`);
  slates whose user is not in the fit (eval, validation) see every fitted user;
- SASRec learned from the training slates' targets, and a network has no exact leave-one-out,
  so it is refused, pointing to the builder's feature (``spdrank data sequences --features
  ...,sasrec``, fitted on every history and no target); except where it loads the fit that
  build made (the build's ``manifest.json`` beside ``--train``, as ``eval`` loads it), which
  holds no target of any of its slates: then its scores equal the builder's feature, to its
  rounding, on every file of that build;
- any other ranker fitted on the users' slates is refused the same way.

**Each distinct text is embedded once** by ``dense``, whichever ``--add`` or fusion reads it
(one encoder serves them all): slates are ranked in chunks of :data:`CHUNK` and each chunk's
texts not embedded yet go through one encoder call; vectors are kept by text up to :data:`spdrank.rankers.dense.CACHE_TEXTS`
(about 75 MiB), the least recently used dropped first
(:meth:`spdrank.rankers.dense.DenseRanker.scores_many`).

**Resumable.** The slates are counted first (the progress's total). The output is written as
it goes to ``OUT.partial`` (a header line naming the command, then one slate a line, each
chunk flushed and synced), and a rerun of the same command continues after its last whole
slate: a line a kill cut short is dropped, the partial's slates must be ``--slates``' first
ones (else it is refused, naming both lines; ``--restart`` discards it), and the header must
name the same features, rankers and inputs: the sha256 of each file a ranker reads (a run, a
fusion's ``run:`` and ``labels:`` components, a checkpoint's ``config.json`` and weights, the
training files), so a resume after one changed is refused rather than mixing two versions'
values; each named by its path resolved (absolute, symlinks followed), so the same command
from another directory, or with the paths spelled otherwise, continues it. ``OUT`` is written
atomically from the partial only once every slate is, so it is never seen half-written, and
nothing already written is lost when the run is killed. A run holds an exclusive lock on the
partial from its start to its end, as the teacher's label journal does
(:class:`spdrank.core.journal.Journal`): a second run on the same ``--out`` is refused at
once, naming the partial, instead of appending its slates to the first's. A resumed file
equals an uninterrupted one byte for byte, except that ``dense``'s vectors depend on which
texts share an encoder batch to float rounding.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spdrank.core.ranking import Ranker, Ranking
    from spdrank.core.slates import Slate
    from spdrank.datasets.fitted_users import FittedUsers

log = logging.getLogger(__name__)

#: Slates ranked together: one encoder call for their new texts, one SASRec forward.
CHUNK = 64

#: The suffix of the side file the output is written to until it is whole.
PARTIAL_SUFFIX = ".partial"

#: The key of the partial's header line.
HEADER_KEY = "spdrank data features"

#: A feature name given before ``=`` in ``--add``.
_FEATURE_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "features",
        help="add any ranker's score of each candidate as a feature (dense, sasrec, a run, ...)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--slates", required=True, metavar="FILE", help="the slates (JSONL, .gz too)")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the slates with the features added (JSONL, .gz too); written to "
                        "FILE.partial as it goes, a rerun continuing it, and replaced "
                        "atomically once whole")
    p.add_argument("--add", action="append", required=True, metavar="[FEATURE=]RANKER",
                   help="a feature to add: RANKER any `spdrank eval --ranker` name, run:PATH "
                        "(a TREC run) or a trained checkpoint's folder; FEATURE defaults to "
                        "the ranker's name as a plain word (run:PATH: the file's stem); "
                        "repeatable")
    p.add_argument("--train", metavar="FILE",
                   help="training slates for the rankers that learn from histories (default: "
                        "train.jsonl beside --slates)")
    p.add_argument("--extra-sequences", metavar="FILE",
                   help="more sequences ('user item item ...') those rankers learn from "
                        "(default: extra_sequences.txt beside --train, when there is one)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a feature the candidates already hold (without it, refused)")
    p.add_argument("--restart", action="store_true",
                   help="discard FILE.partial left by an earlier run instead of continuing it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


# -- what to add ----------------------------------------------------------------------------


@dataclass
class Added:
    """One ``--add``: the feature's name, the ranker's spec, the ranker, and what it cost."""

    feature: str
    spec: str
    ranker: Any = None
    rows: Chunked | None = None
    candidates: int = 0
    seconds: float = 0.0


def parse_add(text: str) -> tuple[str, str]:
    """``--add [FEATURE=]RANKER`` -> (FEATURE, RANKER), FEATURE defaulting to
    :func:`feature_name` of RANKER; ``ValueError`` for a name a feature cannot have."""
    name, sep, rest = text.partition("=")
    if sep and rest and _FEATURE_NAME.fullmatch(name) and not Path(text).exists():
        feature, spec = name, rest
    else:
        feature, spec = feature_name(text), text
    if not spec:
        raise ValueError(f"--add {text!r} names no ranker")
    from spdrank.core.slates import SCORE_FEATURE

    if feature == SCORE_FEATURE:
        raise ValueError(f"--add {text!r}: 'score' is the candidate's own score field, not a "
                         "feature name; name it otherwise (--add NAME=RANKER)")
    return feature, spec


def feature_name(spec: str) -> str:
    """The default feature name of a ranker spec: its name made a plain word (letters, digits,
    ``_``); a TREC run's file stem, a checkpoint's folder name."""
    from spdrank.rankers.fusion import RUN_PREFIX

    if spec.startswith(RUN_PREFIX):
        path = Path(spec[len(RUN_PREFIX) :])
        base = path.name.removesuffix(".gz")
        text = base.rsplit(".", 1)[0] if "." in base.strip(".") else base
    elif Path(spec).is_dir():
        text = Path(spec).resolve().name
    else:
        text = spec
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_") or "feature"


def parse_adds(texts: Sequence[str]) -> list[Added]:
    """Every ``--add``, two with one feature name refused."""
    adds = [Added(*parse_add(text)) for text in texts]
    seen: dict[str, str] = {}
    for add, text in zip(adds, texts):
        if add.feature in seen:
            raise ValueError(f"--add {seen[add.feature]!r} and --add {text!r} both write the "
                             f"feature {add.feature!r}: name one otherwise (--add NAME=RANKER)")
        seen[add.feature] = text
    return adds


def check_spec(spec: str) -> None:
    """A ranker spec checked before anything is built: a run that exists, a checkpoint folder,
    or a baseline's name (``ValueError`` naming the choices otherwise)."""
    from spdrank.rankers.baselines import baseline_factory
    from spdrank.rankers.fusion import RUN_PREFIX

    if spec.startswith(RUN_PREFIX):
        path = Path(spec[len(RUN_PREFIX) :])
        if not path.is_file():
            raise ValueError(f"--add {spec!r}: no such TREC run file {path}")
    elif not Path(spec).is_dir():
        try:
            baseline_factory(spec)
        except ValueError as exc:
            raise ValueError(f"--add {spec!r}: {exc}; or run:PATH, or a checkpoint's folder") \
                from None


def build_ranker(spec: str) -> Ranker:
    """The ranker a spec names, unfitted, as ``eval`` builds it; a fusion's components each
    wrapped in a :class:`Chunked`, so a chunk of slates is ranked by each together."""
    from spdrank.commands.named_rankers import build_rankers
    from spdrank.rankers.fusion import RUN_PREFIX, FusionRanker

    if spec.startswith(RUN_PREFIX):
        return build_rankers(None, runs=[spec[len(RUN_PREFIX) :]])[0]
    if Path(spec).is_dir():
        return build_rankers(None, models=[spec])[0]
    ranker = build_rankers([spec])[0]
    if isinstance(ranker, FusionRanker):
        ranker.components = [Chunked(c) for c in ranker.components]
    return ranker


def share_encoders(rows: Sequence[Chunked]) -> None:
    """One dense ranker for every ``--add`` and fusion component that names the same encoder,
    so a text any of them reads is embedded once (a dense ranker learns nothing: any instance
    of one encoder scores alike)."""
    shared: dict[tuple[Any, ...], Any] = {}
    for row in [*rows, *(c for r in rows for c in components(r.inner))]:
        if hasattr(row.inner, "scores_many"):
            inner = row.inner
            key = (type(inner), inner.model_name, inner.max_tokens, inner.batch_tokens)
            row.inner = shared.setdefault(key, inner)


def components(ranker: Ranker) -> list[Chunked]:
    """A fusion's wrapped components; none for another ranker."""
    return [c for c in getattr(ranker, "components", ()) if isinstance(c, Chunked)]


# -- ranking a chunk ------------------------------------------------------------------------


class Chunked:
    """A ranker's rankings of a chunk of slates, computed together where the ranker can (dense:
    each text embedded once, :meth:`~spdrank.rankers.dense.DenseRanker.scores_many`; SASRec:
    one forward, ``rank_batch``), a count-based one leaving each slate's own user out
    (``own``), handed out one slate at a time: a fusion asks its components slate by slate."""

    def __init__(self, inner: Ranker) -> None:
        self.inner = inner
        self.name = inner.name
        self.ranks_by_scores = getattr(inner, "ranks_by_scores", False)
        self.needs_train = getattr(inner, "needs_train", False)
        self.needs_history = getattr(inner, "needs_history", False)
        #: Each fitted user's sequence by qid, for a ranker that leaves one out; None: none.
        self.own: FittedUsers | None = None
        self._ready: dict[int, Ranking] = {}

    def fit(self, train: Any) -> None:
        """The inner ranker's fit (a fusion fits its components through this)."""
        self.inner.fit(train)

    def prepare(self, slates: Sequence[Slate], places: Sequence[str]) -> None:
        """Rank ``slates`` (read at ``places``) now, for :meth:`rank` to hand out."""
        for slate, ranking in zip(slates, self.rankings(slates, places)):
            self._ready[id(slate)] = ranking

    def clear(self) -> None:
        self._ready.clear()

    def rank(self, slate: Slate) -> Ranking:
        ready = self._ready.pop(id(slate), None)
        return ready if ready is not None else self.rankings([slate], ["?"])[0]

    def rankings(self, slates: Sequence[Slate], places: Sequence[str]) -> list[Ranking]:
        """The inner ranker's ranking of each slate, batched where it can be."""
        from spdrank.core.ranking import Ranking

        inner: Any = self.inner
        for sub in components(inner):
            sub.prepare(slates, places)
        try:
            if hasattr(inner, "scores_many"):
                out = []
                for slate, scores in zip(slates, inner.scores_many(slates)):
                    docids = slate.docids
                    # DenseRanker.rank's order: by score, ties in candidate order.
                    order = sorted(range(len(docids)), key=lambda i: -scores[i])
                    out.append(Ranking(docids=[docids[i] for i in order],
                                       scores=[scores[i] for i in order]))
                return out
            if self.own is not None:
                return [inner.rank(s, leave_out=self.own.sequence(s, where))
                        for s, where in zip(slates, places)]
            if hasattr(inner, "rank_batch"):
                return list(inner.rank_batch(list(slates)))
            return [inner.rank(s) for s in slates]
        finally:
            for sub in components(inner):
                sub.clear()


def counts_extra(ranker: Ranker, extra: Path | None) -> bool:
    """Whether ``fit_rankers`` fits ``ranker`` on the extra sequences too (a ranker that fits
    on sequences, when there are some); a fusion's components fit on the training slates."""
    return extra is not None and hasattr(ranker, "fit_sequences")


# -- the partial file -----------------------------------------------------------------------


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + PARTIAL_SUFFIX)


def header_line(key: Mapping[str, Any]) -> bytes:
    return (json.dumps({HEADER_KEY: key}, ensure_ascii=False, sort_keys=True) + "\n").encode()


def without(slate: Slate, names: Sequence[str]) -> dict[str, Any]:
    """``slate`` as a dict, the features ``names`` taken off each candidate: what a partial's
    slate and the input's must agree on."""
    out = slate.to_dict()
    for candidate in out["candidates"]:
        features = candidate.get("features")
        if features is not None:
            kept = {k: v for k, v in features.items() if k not in names}
            if kept:
                candidate["features"] = kept
            else:
                candidate.pop("features")
    return out


def partial_lines(partial: Path) -> Iterator[tuple[int, bytes]]:
    """The whole lines of a partial after its header, with their line numbers; a last line
    without its newline (a kill cut it short) is cut off the file."""
    with open(partial, "rb") as fh:
        fh.readline()  # the header, checked by the caller
        lineno = 1
        while True:
            start = fh.tell()
            line = fh.readline()
            if not line:
                return
            lineno += 1
            if not line.endswith(b"\n"):
                os.truncate(partial, start)
                log.info("%s: dropped its last line, cut short when the run stopped", partial)
                return
            yield lineno, line


def partial_slates(partial: Path) -> Iterator[tuple[str, Slate]]:
    """The whole slates of a partial after its header (:func:`partial_lines`), with
    ``file:line``."""
    from spdrank.core.files import parse_json_line
    from spdrank.core.slates import Slate

    for lineno, line in partial_lines(partial):
        where = f"{partial}:{lineno}"
        yield where, Slate.from_dict(parse_json_line(line, where), where=where)


def read_header(partial: Path) -> Any:
    from spdrank.core.files import parse_json_line

    with open(partial, "rb") as fh:
        first = fh.readline()
    if not first.endswith(b"\n"):
        return None
    data = parse_json_line(first, f"{partial}:1")
    return data.get(HEADER_KEY) if isinstance(data, dict) else None


def open_partial(partial: Path, out: Path) -> IO[bytes]:
    """``partial`` opened for appending and locked for the run's whole life, as the label
    journal is (:func:`spdrank.core.journal.open_locked`): two runs appending to one partial
    would write slates twice, and the one finishing second would find the partial gone."""
    from spdrank.core.journal import open_locked

    return open_locked(partial, "ab", f"{partial} is being written by another `spdrank data "
                       f"features` run (--out {out}): let it finish, or choose another --out")


def close_partial(fh: IO[bytes], partial: Path) -> None:
    """Let the lock go; a partial this run left empty (it failed before its header) is
    removed first, while still held, so no other run's file is removed."""
    try:
        if os.fstat(fh.fileno()).st_size == 0:
            partial.unlink(missing_ok=True)
    finally:
        fh.close()


def start_partial(fh: IO[bytes], key: Mapping[str, Any]) -> None:
    """Empty the locked partial and write its header, synced: a kill part-way leaves a header
    without its newline, which :func:`resume` replaces."""
    os.ftruncate(fh.fileno(), 0)
    fh.write(header_line(key))
    fh.flush()
    os.fsync(fh.fileno())


def resume(
    fh: IO[bytes], partial: Path, key: Mapping[str, Any], inputs: Iterator[tuple[str, Slate]],
    names: Sequence[str],
) -> int:
    """The number of whole slates ``partial`` (held open and locked as ``fh``) holds, each
    checked against the next of ``inputs`` (``--slates``' slates, which it consumes that far);
    only a new header in it when it holds no slate."""
    header = read_header(partial)
    if header != dict(key) and not any(True for _ in partial_lines(partial)):
        start_partial(fh, key)  # no slate in it: nothing to keep
        return 0
    if header != dict(key):
        raise ValueError(
            f"{partial} was left by another `spdrank data features` run (its features, "
            "rankers or their inputs differ): rerun that command to finish it, or pass "
            "--restart to discard it"
        )
    done = 0
    for where, slate in partial_slates(partial):
        given = next(inputs, None)
        if given is None:
            raise ValueError(f"{where}: the partial output holds more slates than --slates; "
                             "pass --restart to discard it")
        source, original = given
        if without(slate, names) != without(original, names):
            raise ValueError(
                f"{where}: this slate of the partial output is not {source}'s (qid "
                f"{slate.query.qid!r} against {original.query.qid!r}, or their candidates "
                "differ): --slates changed since it was written; pass --restart to discard it"
            )
        done += 1
    return done


def run_files(adds: Sequence[Added]) -> list[Path]:
    """The TREC runs ``--add run:PATH`` replays."""
    from spdrank.rankers.fusion import RUN_PREFIX

    return [Path(a.spec[len(RUN_PREFIX):]) for a in adds if a.spec.startswith(RUN_PREFIX)]


def fused_files(adds: Sequence[Added]) -> list[Path]:
    """The files a fusion's components read (``run:PATH``, ``labels:PATH``): inputs as much as
    a run added alone, which no output may overwrite and whose change a resume must see."""
    from spdrank.rankers.fusion import component_files

    return [Path(f) for a in adds for f in component_files(a.spec)]


def resume_key(adds: Sequence[Added], fitted: Sequence[Path]) -> dict[str, Any]:
    """What the partial's header records, which a rerun must match to continue it: the
    features and their rankers, and a fingerprint of every input the rankers read (runs,
    fusions' component files, checkpoints, and ``fitted``, the files they were fitted on).
    Paths are resolved (:func:`resolved`), so the same command run from another directory,
    with absolute paths or through a link, continues the partial."""
    from spdrank.model.checkpoint import model_folder

    folders = [model_folder(a.spec) for a in adds if Path(a.spec).is_dir()]
    return {
        "features": [[a.feature, resolved_spec(a.spec)] for a in adds],
        "inputs": {resolved(p): fingerprint(p)
                   for p in [*run_files(adds), *fused_files(adds), *folders, *fitted]},
    }


def resolved(path: str | Path) -> str:
    """``path`` absolute, its symlinks followed: one spelling for one file."""
    return os.path.realpath(path)


def resolved_spec(spec: str) -> str:
    """A ranker spec with each path it names :func:`resolved`: ``run:PATH``, a checkpoint's
    folder (a training run's resolved to its ``model/``), a fusion's ``run:`` and ``labels:``
    components; any other spec as given."""
    from spdrank.model.checkpoint import model_folder
    from spdrank.rankers.fusion import RUN_PREFIX, with_component_files

    if spec.startswith(RUN_PREFIX):
        return RUN_PREFIX + resolved(spec[len(RUN_PREFIX):])
    if Path(spec).is_dir():
        return resolved(model_folder(spec))
    return with_component_files(spec, resolved)


def fingerprint(path: Path) -> str | dict[str, str]:
    """What the partial's header records of an input a ranker reads: a file's sha256; a
    checkpoint's, the sha256 of each file it loads from (:func:`checkpoint_files`), by name, so
    a model retrained or its config edited in the same folder is another input."""
    from spdrank.core.files import sha256_file
    from spdrank.model.checkpoint import model_folder

    if path.is_file():
        return sha256_file(path)
    folder = model_folder(path)
    return {f.relative_to(folder).as_posix(): sha256_file(f) for f in checkpoint_files(folder)}


def checkpoint_files(folder: Path) -> list[Path]:
    """The files a checkpoint in ``folder`` is loaded from: its ``config.json``, its head's
    weights and a LoRA adapter's files; not what a training run keeps beside them (its log,
    its resumable state), which no ranking reads."""
    from spdrank.model.checkpoint import ADAPTER_DIR, CONFIG_NAME, HEAD_NAME

    adapter = folder / ADAPTER_DIR
    found = [folder / CONFIG_NAME, folder / HEAD_NAME,
             *(sorted(adapter.rglob("*")) if adapter.is_dir() else [])]
    return [f for f in found if f.is_file()]


# -- the command ----------------------------------------------------------------------------


def count_slates(path: Path) -> int:
    """The slates of ``path``: its non-blank lines, read without parsing."""
    from spdrank.core.files import iter_lines

    return sum(1 for _ in iter_lines(path, "slate file"))


def set_values(add: Added, slate: Slate, ranking: Ranking, where: str) -> None:
    """Write ``add``'s feature into ``slate``'s candidates from ``ranking``."""
    from spdrank.core.ranking import rank_scores
    from spdrank.core.slates import SlateError

    docids = slate.docids
    if sorted(ranking.docids) != sorted(docids):
        raise SlateError(f"{add.spec} did not rank exactly the slate's candidates", where)
    if add.rows is not None and add.rows.ranks_by_scores and ranking.scores is not None:
        value = dict(zip(ranking.docids, (float(s) for s in ranking.scores)))
    else:
        value = dict(zip(ranking.docids, rank_scores(len(docids))))
    for i, candidate in enumerate(slate.candidates):
        v = value[candidate.docid]
        if not math.isfinite(v):
            raise SlateError(f"candidates[{i}] (docid {candidate.docid!r}): {add.spec} scores "
                             f"it {v}, not a finite number, for feature {add.feature!r}", where)
        candidate.features = {**(candidate.features or {}), add.feature: v}
    add.candidates += len(docids)


def check_held(slate: Slate, names: Sequence[str], where: str) -> None:
    """Refuse a slate whose candidates already hold a feature to be added (no ``--overwrite``)."""
    from spdrank.core.slates import SlateError

    for i, candidate in enumerate(slate.candidates):
        held = [n for n in names if candidate.features and n in candidate.features]
        if held:
            raise SlateError(
                f"candidates[{i}] (docid {candidate.docid!r}) already holds feature "
                f"{held[0]!r}: pass --overwrite to replace it, or name the new one otherwise "
                "(--add NAME=RANKER)", where, field=f"candidates[{i}].features.{held[0]}",
            )


def leak_message(spec: str, user: str) -> str:
    return (
        f"--add {spec}: user {user!r} of --slates is in its fit, which learned from that "
        "user's training slate, target included, and it cannot leave one user out: its "
        "score would hold the slate's own label. For SASRec, build the slates with `spdrank "
        "data sequences ... --features ...,sasrec` (fitted on every history, no target), whose "
        "fit this command then loads; else feature a file whose users are not in --train "
        "(eval, valid)"
    )


def run(args: argparse.Namespace) -> int:
    from spdrank.core.files import check_outputs, output_target
    from spdrank.core.inputs import check_rereadable

    slates_path, out = Path(args.slates), Path(args.out)
    check_rereadable(slates_path, "slate file")
    adds = parse_adds(args.add)
    for add in adds:
        check_spec(add.spec)
    partial = partial_path(out)
    if output_target(out).stream:
        raise ValueError(f"--out {out}: the output is written beside it as it goes "
                         f"({partial.name}), so it must be a file, not a stream")
    inputs: dict[str, Any] = {"--slates": slates_path, "--add run:": run_files(adds),
                              "--add fusion:'s component": fused_files(adds)}
    check_outputs(inputs, {"--out": out, "--out's partial": partial},
                  models={"--add": [a.spec for a in adds if Path(a.spec).is_dir()]})
    fh = open_partial(partial, out)
    try:
        return add_features(args, adds, inputs, fh)
    finally:
        close_partial(fh, partial)


def add_features(
    args: argparse.Namespace, adds: Sequence[Added], inputs: Mapping[str, Any], fh: IO[bytes]
) -> int:
    """The run once its partial is held (``fh``): fit the rankers, resume the partial, write
    the rest of the slates to it, then ``--out`` from it."""
    from spdrank.commands.named_rankers import default_train_path, fit_rankers, is_search
    from spdrank.core.files import atomic_writer, check_outputs
    from spdrank.core.progress import Progress
    from spdrank.core.slates import batched, dumps_slate, iter_slates
    from spdrank.datasets.extra_sequences import default_extra_sequences
    from spdrank.datasets.fitted_users import fitted_users

    slates_path, out = Path(args.slates), Path(args.out)
    partial = partial_path(out)
    train = Path(args.train) if args.train else default_train_path(slates_path)
    for add in adds:
        add.ranker = build_ranker(add.spec)
        add.rows = Chunked(add.ranker)
    share_encoders([a.rows for a in adds if a.rows is not None])
    search = is_search(slates_path)
    for add in adds:
        if search and getattr(add.ranker, "needs_history", False):
            raise ValueError(f"--add {add.spec}: it learns from users' histories, and "
                             f"{slates_path}'s slates carry none (search slates)")
    needing = [a for a in adds if getattr(a.ranker, "needs_train", False)]
    extra_given = Path(args.extra_sequences) if args.extra_sequences else None
    extra = extra_given or (default_extra_sequences(train) if needing else None)
    if needing:
        check_outputs({**inputs, "--train": train, "--extra-sequences": extra},
                      {"--out": out, "--out's partial": partial})
    elif args.train or args.extra_sequences:
        log.warning("--train, --extra-sequences: not read, as no ranker added fits on them")
    progress = False if args.no_progress else None

    users = fitted_users(train, extra) if needing and train.is_file() else None
    in_fit = users is not None and any(
        slate.query.qid in users for _, slate in iter_slates(slates_path)
    )
    # The rankers that cannot leave a user out, where --slates' users are in their fit: SASRec
    # may load its build's fit (which holds no target); any other is refused before fitting.
    barred: dict[str, FittedUsers] = {}
    for add in needing:
        inner = add.ranker
        loads_build = (extra_given is None and hasattr(inner, "fit_build")
                       and in_fit and inner.fit_build(train))
        parts = components(inner) or [add.rows]
        unable = [p for p in parts if p.needs_train and not getattr(p.inner, "leaves_one_out",
                                                                    False)]
        if in_fit and unable and not loads_build and users is not None:
            barred[add.spec] = users
    if barred:
        spec, user = next(
            (spec, s.query.qid) for _, s in iter_slates(slates_path) for spec in barred
            if s.query.qid in barred[spec]
        )
        raise ValueError(leak_message(spec, user))

    total = count_slates(slates_path)
    fit_s = fit_rankers([a.ranker for a in needing], train, progress, extra_given)
    if users is not None:
        train_only = fitted_users(train, None) if extra is not None else users
        for add in needing:
            if getattr(add.ranker, "leaves_one_out", False) and add.rows is not None:
                add.rows.own = users if counts_extra(add.ranker, extra) else train_only
            for part in components(add.ranker):
                if getattr(part.inner, "leaves_one_out", False):
                    part.own = train_only

    key = resume_key(adds, [*([train] if needing else []),
                            *([extra] if needing and extra else [])])
    names = [a.feature for a in adds]
    if args.restart:
        os.ftruncate(fh.fileno(), 0)
    stream = iter_slates(slates_path)
    done = resume(fh, partial, key, stream, names)
    if done:
        log.info("data features: %d of %d slates already in %s, continuing after them",
                 done, total, partial)
    bar = Progress("features", unit="slate", total=total, initial=done, mode=progress)
    try:
        for chunk in batched(stream, CHUNK):
            places = [where for where, _ in chunk]
            slates = [slate for _, slate in chunk]
            for where, slate in chunk:
                if not args.overwrite:
                    check_held(slate, names, where)
            for add in adds:
                assert add.rows is not None
                t0 = time.perf_counter()
                rankings = add.rows.rankings(slates, places)
                for (where, slate), ranking in zip(chunk, rankings):
                    set_values(add, slate, ranking, where)
                add.seconds += time.perf_counter() - t0
            fh.write(b"".join((dumps_slate(s) + "\n").encode() for s in slates))
            fh.flush()
            os.fsync(fh.fileno())
            bar.update(len(slates))
    finally:
        bar.close()

    written = 0
    with atomic_writer(out) as dst:
        for _, line in partial_lines(partial):
            dst.write(line.decode("utf-8"))
            written += 1
    partial.unlink()
    resumed = f", {done:,} of them from {partial.name}" if done else ""
    print(f"wrote {written:,} slates -> {out}{resumed}")
    for add in adds:
        fit = fit_s.get(add.ranker.name)
        fitted = f" (fitted in {fit:.1f} s)" if fit is not None else ""
        print(f"  {add.feature}: {add.spec}, {add.candidates:,} candidates, "
              f"{add.seconds:.1f} s{fitted}")
    for add in adds:
        note = getattr(add.ranker, "coverage_note", None)
        line = note() if note is not None else None
        if line:
            log.warning(line)
    return 0
