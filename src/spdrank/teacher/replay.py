"""A teacher's label file replayed as a ranker, so the teacher sits in the same results table.

The teacher ran offline (``spdrank teacher``); re-running a 50-candidate LLM ranking inside
an evaluation would cost minutes per slate and give the same answer. Replaying the label
file gives the evaluation what it needs to put the teacher next to the students: the
teacher's OWN output (as parsed, before repair, so an invalid answer counts against the
``valid%`` column and is repaired by the evaluator exactly as the label file repaired it),
the decode passes it spent and the latency measured when it ran.

:class:`LabelRanking` reads the same file as a fusion component (``labels:PATH`` in
``fusion:...`` and ``fusion:best:...``): the repaired rankings a student would learn from,
with the teacher's scores when it recorded them, so an LLM teacher can be fused with cheaper
rankers, and kept in a chosen fusion only where the validation slates say it adds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from spdrank.core.ranking import Ranking
from spdrank.core.slates import Slate, SlateError
from spdrank.teacher.labels import Label, check_ranking, read_labels
from spdrank.teacher.parse import repair

#: The docid standing for an id the teacher wrote that names no candidate (e.g. ``[57]`` of 50).
OUT_OF_RANGE = "<out-of-range:{}>"


def _label(labels: dict[str, Label], path: Path, slate: Slate) -> Label:
    label = labels.get(slate.query.qid)
    if label is None:
        raise SlateError(
            f"qid {slate.query.qid!r} has no record in the label file {path} "
            "(label these slates with `spdrank teacher` first)"
        )
    return label


def _check_order(label: Label, parsed: list[object], docids: list[str], ranking: list[str]) -> None:
    """Refuse a record whose answer, read against ``docids``, is not the ranking it was repaired
    to: the ids name candidates by their place, so a slate whose candidates come in another
    order (or are others of the same count) would be replayed as another ranking."""
    ids = [i for i in parsed if isinstance(i, int) and not isinstance(i, bool)]
    if [docids[j] for j in repair(ids, len(docids))] != ranking:
        raise SlateError(
            f"the record for qid {label.record['qid']!r} numbers its slate's candidates in another order "
            "than this slate lists them: its answer would name other candidates (labels made "
            "from other slates, or the candidates reordered since?)",
            label.where,
        )


class LabelRanking:
    """A label file's repaired ranking of each slate, with the teacher's scores when its
    record holds them (a teacher that ranks by a score alone): a fusion component."""

    needs_train = False
    #: Where a record has scores they decide its order, ties included; where it has none (an
    #: LLM's), the ranking comes without scores and fuses by rank alone.
    ranks_by_scores = True

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.labels: dict[str, Label] = read_labels(self.path)
        self.name = name or f"labels:{self.path}"

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the rankings were computed when the labels were made."""

    def rank(self, slate: Slate) -> Ranking:
        label = _label(self.labels, self.path, slate)
        ranking = check_ranking(label, slate)
        scores = label.scores
        return Ranking(docids=ranking,
                       scores=None if scores is None else [float(x) for x in scores])


class LabelReplayRanker:
    """Answers ``rank(slate)`` with the label file's record for that slate's qid."""

    needs_train = False

    def __init__(self, path: str | os.PathLike[str], name: str | None = None) -> None:
        self.path = Path(path)
        self.labels: dict[str, Label] = read_labels(self.path)
        self.name = name or f"teacher:{self.path.stem}"
        #: By qid of each slate replayed whose record says how many candidates its teacher
        #: ranked (``ranked``: a TREC run's labels), that count and the slate's size.
        self.ranked: dict[str, tuple[int, int]] = {}

    def fit(self, train: Iterable[Slate]) -> None:
        """Nothing to learn: the rankings were computed when the labels were made."""

    def rank(self, slate: Slate) -> Ranking:
        label = _label(self.labels, self.path, slate)
        rec = label.record
        docids = slate.docids
        if rec.get("n") not in (None, len(docids)):
            raise SlateError(
                f"the record for qid {slate.query.qid!r} was made for {rec['n']} candidates, "
                f"this slate has {len(docids)} (labels made from other slates?)",
                label.where,
            )
        if isinstance(rec.get("ranked"), int):
            self.ranked[slate.query.qid] = (rec["ranked"], len(docids))
        ranking = check_ranking(label, slate)
        parsed = rec.get("parsed")
        if isinstance(parsed, list):  # 1-based ids as the teacher wrote them
            _check_order(label, parsed, docids, ranking)
            answer = [
                docids[i - 1] if isinstance(i, int) and 1 <= i <= len(docids) else OUT_OF_RANGE.format(i)
                for i in parsed
            ]
        else:  # rankings computed elsewhere (file:, ranker:) carry only the permutation
            answer = ranking
        return Ranking(
            docids=answer,
            decode_passes=int(rec.get("decode_passes") or 0),
            recorded_ms=rec.get("latency_ms"),
        )

    def coverage_note(self) -> str | None:
        """For the labels of a TREC run (``file:RUN.trec``), the line ``eval --run`` of that run
        says of the candidates it did not rank (:func:`spdrank.rankers.run_ranker.coverage_line`)."""
        from spdrank.rankers.run_ranker import coverage_line

        return coverage_line(self.name, self.path,
                             ((qid, k, n) for qid, (k, n) in self.ranked.items()))
