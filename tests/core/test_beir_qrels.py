"""BEIR's qrels (``qrels/test.tsv``: ``query-id corpus-id score``, under an optional header
line) are read wherever qrels are, beside TREC's four fields, and judge alike; a file that
mixes the two, or a header anywhere but its first line, is refused at its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import SlateError, read_slates
from spdrank.core.trec import read_qrels

TREC = "7 0 p1 3\n7 0 p3 0\n8 0 t1 1\n"
BEIR = "7\tp1\t3\n7\tp3\t0\n8\tt1\t1\n"
HEADER = "query-id\tcorpus-id\tscore\n"
JUDGED = {"7": {"p1": 3, "p3": 0}, "8": {"t1": 1}}


@pytest.mark.parametrize("text", [TREC, BEIR, HEADER + BEIR], ids=["trec", "beir", "header"])
def test_trec_and_beir_qrels_read_alike(tmp_path: Path, text: str) -> None:
    # BEIR's lines were refused: "a qrels line has 4 fields, got 3".
    path = tmp_path / "test.tsv"
    path.write_text(text)
    assert read_qrels(path) == JUDGED


@pytest.mark.parametrize(("text", "line", "said"), [
    ("7\tp1\t3\n7 0 p3 0\n", 2, (r"a qrels line has 3 fields \(BEIR's query-id corpus-id "
                                r"score\), as the file's first line has, got 4")),
    ("7 0 p1 3\n7\tp3\t0\n", 2, (r"a qrels line has 4 fields \(TREC's .*\), as the file's "
                                r"first line has, got 3")),
    ("7\tp1\t3\n" + HEADER, 2, r"the grade must be an integer grade, got 'score'"),
    ("7 p1\n", 1, (r"a qrels line has 4 fields \(TREC's qid iter docid grade\) or 3 \(BEIR's "
                  r"query-id corpus-id score\), got 2")),
    (HEADER + "7\tp1\tyes\n", 2, r"the grade must be an integer grade, got 'yes'"),
])
def test_a_qrels_file_mixing_formats_or_misplacing_the_header_is_refused_at_its_line(
    tmp_path: Path, text: str, line: int, said: str
) -> None:
    path = tmp_path / "q.tsv"
    path.write_text(text)
    with pytest.raises(SlateError, match=rf"q.tsv:{line}: {said}"):
        read_qrels(path)


def _retrieved(path: Path) -> Path:
    hits = [{"qid": "7", "docid": d, "content": f"Passage {d}.", "rank": r, "score": 9.0 - r}
            for r, d in enumerate(["p1", "p2", "p3"], start=1)]
    path.write_text(json.dumps([{"query": "fleas", "hits": hits}]))
    return path


def test_data_search_and_eval_take_beir_qrels(tmp_path: Path, capsys) -> None:
    results = {}
    for name, text in (("trec", TREC), ("beir", HEADER + BEIR)):
        qrels = tmp_path / f"{name}.tsv"
        qrels.write_text(text)
        slates = tmp_path / f"{name}.jsonl"
        assert main(["data", "search", "--retrieved", str(_retrieved(tmp_path / "r.json")),
                     "--qrels", str(qrels), "--out", str(slates)]) == 0
        (slate,) = read_slates(slates)
        assert slate.relevance == JUDGED["7"]
        out = tmp_path / f"{name}-eval.json"
        assert main(["eval", "--slates", str(slates), "--ranker", "retriever", "--qrels",
                     str(qrels), "--k", "10", "--json", str(out), "--no-progress"]) == 0
        results[name] = json.loads(out.read_text())["rankers"]["retriever"]["metrics"]
    assert results["beir"] == results["trec"]
    assert results["beir"]["nDCG@10"]["mean"] > 0
