"""Search slates from the field's files, and search slates through eval: retrieve results,
TREC runs with topics and corpora, qrels, the lexical baseline, runs in and out."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import ir_measures
import pytest

from spdrank.commands.named_rankers import build_rankers
from spdrank.core.slates import Slate, SlateError, read_slates
from spdrank.core.trec import read_corpus, read_qrels, read_run
from spdrank.datasets.search import slates_from_retrieve_results, slates_from_run
from spdrank.rankers.baselines import baseline_names
from spdrank.rankers.bm25 import BM25Ranker

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "trec-dl19"


def _spdrank(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spdrank", *map(str, args)], capture_output=True, text=True,
        timeout=300, check=False,
    )


def _retrieved(path: Path) -> Path:
    records = [
        {"query": "how do fleas live", "hits": [
            {"qid": 7, "docid": "p1", "content": "The flea life cycle has four stages.",
             "rank": 2, "score": 9.0},
            {"qid": 7, "docid": "p2", "content": "Cats and dogs carry fleas.", "rank": 1,
             "score": 11.0},
            {"qid": 7, "docid": "p3", "content": "Stock markets fell today.", "rank": 3,
             "score": 2.0},
        ]},
        {"query": "tides", "hits": [
            {"qid": 8, "docid": "t1", "content": "The moon drives the tides.", "rank": 1,
             "score": 5.0},
        ]},
    ]
    path.write_text(json.dumps(records))
    return path


def _qrels(path: Path) -> Path:
    path.write_text("7 0 p1 3\n7 0 p3 0\n7 0 elsewhere 2\n8 0 t1 0\n")
    return path


def test_retrieve_results_become_graded_slates(tmp_path: Path) -> None:
    slates = list(slates_from_retrieve_results(_retrieved(tmp_path / "r.json"),
                                               read_qrels(_qrels(tmp_path / "q.txt"))))
    assert [s.query.qid for s in slates] == ["7", "8"]
    first = slates[0]
    assert first.docids == ["p2", "p1", "p3"]  # by the hits' rank
    assert [c.score for c in first.candidates] == [11.0, 9.0, 2.0]
    # Every judgement of the query, the one the retriever missed included.
    assert first.relevance == {"p1": 3, "p3": 0, "elsewhere": 2}
    assert first.query.history is None and first.clicked is None


def test_qrels_json_and_negative_grades(tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"1": {"a": "2", "b": -1, "c": 0}}))
    assert read_qrels(path) == {"1": {"a": 2, "b": 0, "c": 0}}
    bad = tmp_path / "bad.txt"
    bad.write_text("1 0 a 2\n1 0 b\n")
    with pytest.raises(SlateError, match=r"bad.txt:2: a qrels line has 4 fields"):
        read_qrels(bad)


def test_trec_run_reads_in_trec_evals_order(tmp_path: Path) -> None:
    path = tmp_path / "run.trec"
    # Ranks contradict the scores, and b and c tie: trec_eval reads score descending, ties
    # by docid descending.
    path.write_text("1 Q0 a 1 1.0 x\n1 Q0 b 2 3.0 x\n1 Q0 c 3 3.0 x\n")
    assert read_run(path) == {"1": [("c", 3.0), ("b", 3.0), ("a", 1.0)]}
    path.write_text("1 Q0 a 1 nan x\n")
    with pytest.raises(SlateError, match="run.trec:1: .* not finite"):
        read_run(path)


@pytest.mark.parametrize(
    ("name", "lines", "doc"),
    [
        ("corpus.jsonl", ['{"_id": "a", "title": "Fleas", "text": "They jump."}'],
         {"title": "Fleas", "text": "They jump."}),
        ("corpus.jsonl", ['{"docid": "a", "title": "", "segment": "A v2 segment."}'],
         {"text": "A v2 segment."}),
        ("corpus.jsonl", ['{"id": "a", "contents": "Pyserini contents."}'],
         {"text": "Pyserini contents."}),
        ("corpus.tsv", ["a\tA passage."], {"text": "A passage."}),
        ("corpus.tsv", ["a\tA title\tA body."], {"title": "A title", "text": "A body."}),
    ],
)
def test_corpus_formats(tmp_path: Path, name: str, lines: list[str], doc: dict) -> None:
    path = tmp_path / name
    path.write_text("\n".join([*lines, lines[0].replace('"a"', '"z"').replace("a\t", "z\t")])
                    + "\n")
    assert read_corpus(path, {"a"}) == {"a": doc}


def test_title_and_text_are_both_read() -> None:
    slate = Slate.from_dict({
        "query": "fleas",
        "candidates": [{"docid": "a", "doc": {"title": "Fleas", "text": "They jump."}},
                       {"docid": "b", "doc": {"title": "Ticks?", "text": "They bite."}},
                       {"docid": "c", "doc": {"title": "Mites"}}],
    })
    assert slate.candidate_texts() == ["Fleas. They jump.", "Ticks? They bite.", "Mites"]


def test_slates_from_a_run_topics_and_corpus(tmp_path: Path) -> None:
    (tmp_path / "run.trec").write_text("7 Q0 a 1 2.0 bm25\n7 Q0 b 2 1.0 bm25\n")
    (tmp_path / "topics.tsv").write_text("7\tflea bites\n")
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "a", "title": "Fleas", "text": "Flea bites itch."}\n'
        '{"_id": "b", "text": "Tides."}\n{"_id": "c", "text": "unused"}\n'
    )
    (tmp_path / "qrels.txt").write_text("7 0 a 2\n")
    slates = list(slates_from_run(tmp_path / "run.trec", tmp_path / "topics.tsv",
                                  tmp_path / "corpus.jsonl", read_qrels(tmp_path / "qrels.txt")))
    assert len(slates) == 1
    assert slates[0].query.text == "flea bites"
    assert slates[0].candidate_texts() == ["Fleas. Flea bites itch.", "Tides."]
    assert slates[0].relevance == {"a": 2}
    (tmp_path / "topics.tsv").write_text("8\tother\n")
    with pytest.raises(SlateError, match="holds no query '7'"):
        list(slates_from_run(tmp_path / "run.trec", tmp_path / "topics.tsv",
                             tmp_path / "corpus.jsonl"))


def test_bm25_ranks_the_matching_passage_first() -> None:
    slate = Slate.from_dict({
        "query": "flea life cycle",
        "candidates": [{"docid": "x", "doc": {"text": "Stock markets fell."}},
                       {"docid": "y", "doc": {"text": "The flea life cycle: egg, larva, adult."}},
                       {"docid": "z", "doc": {"text": "Flea collars for dogs."}}],
    })
    ranking = BM25Ranker().rank(slate)
    assert ranking.docids == ["y", "z", "x"]
    assert ranking.scores[0] > ranking.scores[1] > ranking.scores[2] == 0.0
    no_match = Slate.from_dict({"query": "zzz", "candidates": slate.to_dict()["candidates"]})
    assert BM25Ranker().rank(no_match).docids == ["x", "y", "z"]  # all 0: slate order


def test_search_defaults_leave_out_history_rankers(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.name for r in build_rankers(None, search=True)] == [
        "random", "retriever", "slate_bm25"]
    kept = build_rankers(["popularity", "slate_bm25"], search=True)
    assert [r.name for r in kept] == ["slate_bm25"]
    assert "skipped popularity" in caplog.text


def test_bm25_is_a_deprecated_alias_of_slate_bm25_that_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The slate's own BM25 is named for what it is; ``bm25``, which reads as the first
    stage's BM25, still builds it, under its own name, with one line saying so."""
    with caplog.at_level(logging.WARNING):
        rankers = build_rankers(["bm25", "slate_bm25", "retriever"], search=True)
    assert [r.name for r in rankers] == ["slate_bm25", "retriever"]  # the alias counts once
    (line,) = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert line.startswith("ranker 'bm25' is deprecated: it is 'slate_bm25', BM25 with the "
                           "slate's own passages as its collection, not the first stage's BM25")
    assert "\n" not in line
    assert "bm25" not in baseline_names() and "slate_bm25" in baseline_names()


def test_data_search_then_eval_writes_runs_that_ir_measures_scores_alike(tmp_path: Path) -> None:
    slates = tmp_path / "s.jsonl"
    done = _spdrank("data", "search", "--retrieved", _retrieved(tmp_path / "r.json"),
                    "--qrels", _qrels(tmp_path / "q.txt"), "--rel-level", "2", "--out", slates)
    assert done.returncode == 0, done.stderr
    assert "judged with no passage of grade >= 2" in done.stdout  # query 8, not dropped
    out = tmp_path / "runs"
    done = _spdrank("eval", "--slates", slates, "--k", "1,10", "--rel-level", "2",
                    "--trec-dir", out, "--json", tmp_path / "e.json", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "AUC" not in done.stdout and "nDCG@10" in done.stdout
    ours = json.loads((tmp_path / "e.json").read_text())["rankers"]
    assert set(ours) == {"random", "retriever", "slate_bm25"}
    qrels = read_qrels(tmp_path / "q.txt")
    for name, row in ours.items():
        run = list(ir_measures.read_trec_run(str(out / f"{name}.trec")))
        theirs = ir_measures.calc_aggregate(
            [ir_measures.parse_measure(m) for m in ("nDCG@10", "AP(rel=2)", "RR(rel=2)")],
            qrels, run,
        )
        for measure, value in theirs.items():
            assert row["metrics"][str(measure)]["mean"] == pytest.approx(value, abs=1e-6)
    # The written run replays as a ranker with the same numbers.
    done = _spdrank("eval", "--slates", slates, "--run", f"again={out / 'slate_bm25.trec'}",
                    "--k", "10", "--rel-level", "2", "--json", tmp_path / "r.json2",
                    "--no-progress")
    assert done.returncode == 0, done.stderr
    again = json.loads((tmp_path / "r.json2").read_text())["rankers"]["again"]["metrics"]
    assert again["nDCG@10"] == ours["slate_bm25"]["metrics"]["nDCG@10"]


def test_eval_qrels_override_the_slates_judgements(tmp_path: Path) -> None:
    slates = tmp_path / "s.jsonl"
    assert _spdrank("data", "search", "--retrieved", _retrieved(tmp_path / "r.json"),
                    "--out", slates).returncode == 0
    assert all(s.relevance is None for s in read_slates(slates))
    done = _spdrank("eval", "--slates", slates, "--ranker", "retriever", "--qrels",
                    _qrels(tmp_path / "q.txt"), "--k", "10", "--json", tmp_path / "e.json",
                    "--no-progress")
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "e.json").read_text())["rankers"]["retriever"]["metrics"]
    assert metrics["nDCG@10"]["n"] == 2


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared TREC DL19 files are not here")
def test_dl19_bm25_reads_the_fields_506(tmp_path: Path) -> None:
    slates = tmp_path / "dl19.jsonl"
    done = _spdrank("data", "search", "--retrieved", SHARED / "retrieve_results_dl19.json",
                    "--qrels", SHARED / "qrels_dl19.json", "--out", slates)
    assert done.returncode == 0, done.stderr
    done = _spdrank("eval", "--slates", slates, "--ranker", "retriever", "--k", "10",
                    "--rel-level", "2", "--json", tmp_path / "e.json", "--no-progress")
    assert done.returncode == 0, done.stderr
    ndcg = json.loads((tmp_path / "e.json").read_text())["rankers"]["retriever"]["metrics"]
    assert round(ndcg["nDCG@10"]["mean"], 3) == 0.506
    assert ndcg["nDCG@10"]["n"] == 43


def test_training_windows_restrict_the_labels_and_keep_the_judgements() -> None:
    from spdrank.datasets.search import training_windows

    slate = Slate.from_dict({
        "query": {"qid": "7", "text": "q"},
        "candidates": [{"docid": f"d{i}", "doc": {"text": f"t{i}"}} for i in range(10)],
        "teacher": [f"d{i}" for i in reversed(range(10))],
        "teacher_scores": [float(i) for i in reversed(range(10))],
        "relevance": {"d3": 2, "elsewhere": 1},
    })
    windows = training_windows(slate, window=4, stride=2, subsets=3)
    assert len(windows) == 4 + 3  # spans (6,10) (4,8) (2,6) (0,4), then the subsets
    assert [w.docids for w in windows[:4]] == [
        [f"d{i}" for i in range(a, b)] for a, b in ((6, 10), (4, 8), (2, 6), (0, 4))]
    for w in windows:
        assert len(w) == 4 and sorted(w.teacher) == sorted(w.docids)
        assert w.teacher_scores == sorted(w.teacher_scores, reverse=True)
        assert w.relevance == slate.relevance
        Slate.from_dict(w.to_dict())  # each a valid slate
    assert len({w.query.qid for w in windows}) == 7
    assert training_windows(slate, window=10, stride=5, subsets=3)[0].docids == slate.docids
    assert len(training_windows(slate, window=10, stride=5, subsets=3)) == 1


def test_data_windows_writes_trainable_slates(tmp_path: Path) -> None:
    slates = tmp_path / "s.jsonl"
    assert _spdrank("data", "search", "--retrieved", _retrieved(tmp_path / "r.json"),
                    "--out", slates).returncode == 0
    done = _spdrank("data", "windows", "--slates", slates, "--window", "2", "--stride", "1",
                    "--subsets", "1", "--out", tmp_path / "w.jsonl")
    assert done.returncode == 0, done.stderr
    windows = list(read_slates(tmp_path / "w.jsonl"))
    assert [len(w) for w in windows] == [2, 2, 2, 1]  # query 7: 2 spans + 1 subset; 8: whole
    done = _spdrank("data", "windows", "--slates", slates, "--out", slates)
    assert done.returncode != 0 and "--out" in done.stderr


def _one_record(path: Path, ranks: list, query: str = "fleas") -> Path:
    hits = [{"qid": 7, "docid": f"p{i}", "content": f"passage {i}", "score": 1.0,
             **({"rank": r} if r is not None else {})} for i, r in enumerate(ranks)]
    path.write_text(json.dumps([{"query": query, "hits": hits}]))
    return path


@pytest.mark.parametrize(("ranks", "said"), [
    ([1, 1, 2], r"hits\[1\]\.rank 1 is also hits\[0\]'s"),
    ([2, -1, 3], r"hits\[1\]\.rank must be between 1 and 1,000,000,000, got -1"),
    ([0, 1, 2], r"hits\[0\]\.rank must be between 1 and"),
    ([1, 10**400, 2], r"hits\[1\]\.rank must be between 1 and .*, got an integer of 401 digits"),
    ([1, None, 2], r"hits\[1\] has no 'rank' and hits\[0\] has one"),
])
def test_a_hit_rank_that_is_no_order_is_refused_naming_the_hit(tmp_path: Path, ranks, said):
    path = _one_record(tmp_path / "r.json", ranks)
    with pytest.raises(SlateError, match=said):
        list(slates_from_retrieve_results(path))


def test_ranks_that_are_an_order_sort_the_hits(tmp_path: Path) -> None:
    path = _one_record(tmp_path / "r.json", [3, 1, 2])
    assert next(slates_from_retrieve_results(path)).docids == ["p1", "p2", "p0"]


@pytest.mark.parametrize("query", ["", "   ", "   \u200b ", "\u202e\u2066"])
def test_a_query_that_shows_nothing_is_refused(tmp_path: Path, query: str) -> None:
    path = _one_record(tmp_path / "r.json", [1], query=query)
    with pytest.raises(SlateError, match="'query' must be a string that shows something"):
        list(slates_from_retrieve_results(path))
    (tmp_path / "run.trec").write_text("7 Q0 a 1 2.0 bm25\n")
    (tmp_path / "topics.tsv").write_text(f"7\t{query}\n")
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a", "text": "Flea bites itch."}\n')
    with pytest.raises(SlateError, match=r"topics.tsv:1.*query '7' has an empty text"):
        list(slates_from_run(tmp_path / "run.trec", tmp_path / "topics.tsv",
                             tmp_path / "corpus.jsonl"))


def test_an_empty_passage_is_named_at_its_corpus_line(tmp_path: Path) -> None:
    (tmp_path / "run.trec").write_text("7 Q0 a 1 2.0 bm25\n7 Q0 b 2 1.0 bm25\n")
    (tmp_path / "topics.tsv").write_text("7\tflea bites\n")
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": "a", "text": "Flea bites itch."}\n{"_id": "c", "text": ""}\n'
        '{"_id": "b", "title": " ", "text": "\\u200b"}\n')
    with pytest.raises(SlateError) as raised:
        list(slates_from_run(tmp_path / "run.trec", tmp_path / "topics.tsv",
                             tmp_path / "corpus.jsonl"))
    message = str(raised.value)
    assert f"{tmp_path / 'corpus.jsonl'}:3" in message and "passage 'b' has an empty text" \
        in message, message
    assert "run.trec" not in message


def test_a_hit_without_a_score_beside_scored_ones_is_refused(tmp_path: Path) -> None:
    """A missing score would read as 0: above a retriever's negative scores, below its
    positive ones, by chance."""
    hits = [{"docid": "a", "content": "x", "rank": 1, "score": -1.2},
            {"docid": "b", "content": "y", "rank": 2}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"query": "q", "qid": "1", "hits": hits}]))
    with pytest.raises(SlateError, match=r"hits\[1\] has no 'score' and hits\[0\] has one"):
        list(slates_from_retrieve_results(path))


def test_hits_without_scores_become_candidates_without_one(tmp_path: Path) -> None:
    """Results that carry only ranks give candidates whose score is not given, so a model
    reading the first stage's score refuses them instead of reading 0 for every one."""
    hits = [{"docid": "a", "content": "x", "rank": 2}, {"docid": "b", "content": "y", "rank": 1}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"query": "q", "qid": "1", "hits": hits}]))
    slate = next(slates_from_retrieve_results(path))
    assert slate.docids == ["b", "a"]
    assert [c.scored for c in slate.candidates] == [False, False]
    assert all("score" not in c for c in slate.to_dict()["candidates"])


def test_scores_that_rise_along_the_ranks_are_said(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Distances (lower is better) read as scores reverse the feature `score`."""
    hits = [{"docid": f"p{i}", "content": "x", "rank": i + 1, "score": s}
            for i, s in enumerate([0.12, 0.35, 0.91])]
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"query": "q", "qid": "1", "hits": hits}]))
    with caplog.at_level(logging.WARNING, logger="spdrank.datasets.search"):
        assert next(slates_from_retrieve_results(path)).docids == ["p0", "p1", "p2"]
        assert not caplog.records  # said once the file is read through
        list(slates_from_retrieve_results(path))
    (said,) = [r.getMessage() for r in caplog.records]
    assert "in 1 queries (e.g. '1') a hit scores above the one ranked before it" in said
    assert "negate it" in said


def test_judgements_that_match_no_candidate_are_said(tmp_path: Path) -> None:
    """Qrels whose docids are spelled otherwise than the run's leave every query at 0."""
    run = tmp_path / "run.trec"
    run.write_text("q1 Q0 d1 1 10.5 bm25\nq1 Q0 d2 2 9.1 bm25\n"
                   "q2 Q0 d1 1 3.0 bm25\nq2 Q0 d3 2 2.0 bm25\n")
    (tmp_path / "topics.tsv").write_text("q1\tflea life cycle\nq2\tstocks\n")
    (tmp_path / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": d, "text": t}) + "\n"
                for d, t in [("d1", "flea cycle"), ("d2", "fleas lay eggs"), ("d3", "stocks")]))
    args = ["data", "search", "--run", run, "--topics", tmp_path / "topics.tsv", "--corpus",
            tmp_path / "corpus.jsonl"]
    (tmp_path / "upper.txt").write_text("q1 0 D1 3\nq1 0 D2 1\nq2 0 D3 2\n")
    done = _spdrank(*args, "--qrels", tmp_path / "upper.txt", "--out", tmp_path / "a.jsonl")
    assert done.returncode == 0, done.stderr
    assert "not one judged passage of the 2 judged queries is among their candidates" in done.stderr
    assert "with no passage of grade >= 1 among their candidates" in done.stdout
    (tmp_path / "some.txt").write_text("q1 0 d1 3\nq2 0 elsewhere 2\nq2 0 d3 0\n")
    done = _spdrank(*args, "--qrels", tmp_path / "some.txt", "--out", tmp_path / "b.jsonl")
    assert done.returncode == 0, done.stderr
    assert "not one judged passage" not in done.stderr
    assert ("with no passage of grade >= 1 among their candidates (they score 0 whatever the "
            "ranking): 1, e.g. ['q2']") in done.stdout
