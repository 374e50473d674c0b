"""docs/search.md, run: every command of its ``bash`` blocks, in order, on a small generated
example written where the page reads DL19 (``../shared/data/trec-dl19/``, the same file
shapes), so the walkthrough cannot drift from what spdrank does.

Commands run as docs/own-data.md's test runs them (in-process, ``spdrank serve`` building its
app), plus the two this page adds: ``python -c`` in a fresh interpreter, and a ``curl`` request
sent to the app through FastAPI's TestClient instead of a port.
"""

from __future__ import annotations

import json
import random
import re
import shlex
from pathlib import Path

import pytest

from tests.benchmarks.test_own_data import Shell as DocShell
from tests.benchmarks.test_own_data import blocks, commands, python
from tests.helpers import ROOT

DOC = ROOT / "docs" / "search.md"

TOPICS = {
    "flea": ("how long is the life cycle of a flea",
             "The flea life cycle runs from egg to adult flea in weeks"),
    "tide": ("what causes the ocean tides", "The moon pulls the ocean and causes the tides"),
    "bread": ("how to bake sourdough bread", "Bake sourdough bread with a starter and flour"),
    "volcano": ("why do volcanoes erupt", "Volcanoes erupt when magma pressure builds up"),
    "tea": ("how is green tea made", "Green tea is made by steaming fresh tea leaves"),
    "chess": ("who invented the game of chess", "Chess was invented in India as chaturanga"),
}
FILLER = ["The stock market closed lower on Friday.", "A new phone was released this week.",
          "The city council met to discuss parking.", "Rain is expected over the weekend.",
          "The museum opens a new exhibit.", "A recipe for lemon cake with icing."]


def write_example(folder: Path, passages: int = 30, seed: int = 0) -> None:
    """DL19's two files in their shapes: BM25-like retrieve results and graded qrels."""
    rng = random.Random(seed)
    results, qrels = [], {}
    for q, (name, (query, answer)) in enumerate(TOPICS.items()):
        qid = 1000 + q
        docs = []
        for i in range(passages):
            kind = rng.random()
            if kind < 0.2:
                text, grade = f"{answer}, part {i}.", rng.choice([2, 3])
            elif kind < 0.4:
                text, grade = f"Something about {name}: {rng.choice(FILLER)}", 1
            else:
                text, grade = rng.choice(FILLER) + f" Item {i}.", 0
            docs.append((f"{name}{i}", text, grade))
        docs.sort(key=lambda d: (-d[2] + rng.random() * 3))  # BM25: a noisy order
        results.append({"query": query, "hits": [
            {"content": text, "qid": qid, "docid": docid, "rank": r,
             "score": round(30.0 - r * 0.25, 3)}
            for r, (docid, text, _) in enumerate(docs, start=1)]})
        qrels[str(qid)] = {docid: str(grade) for docid, _, grade in docs}
        qrels[str(qid)][f"{name}-unretrieved"] = "2"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "retrieve_results_dl19.json").write_text(json.dumps(results))
    (folder / "qrels_dl19.json").write_text(json.dumps(qrels))


class Shell(DocShell):
    """Runs the page's commands: own-data's, and ``python -c`` and a plain ``curl``."""

    def run(self, command: str) -> None:
        argv = shlex.split(command.removesuffix("&"))
        if argv[:2] == ["python", "-c"]:
            print(python(argv[2]), end="")
        elif argv[0] == "curl":
            self.curl(argv)
        else:
            super().run(command)
            return
        self.outputs.append(self.capsys.readouterr().out)

    def curl(self, argv: list[str]) -> None:
        """``curl ... URL ... -d BODY``, through TestClient."""
        from fastapi.testclient import TestClient

        url = next(a for a in argv if a.startswith("localhost:"))
        body = argv[argv.index("-d") + 1]
        assert self.app is not None, "the page sends a request before starting the server"
        with TestClient(self.app) as client:
            answer = client.post(url.split(":8000", 1)[1], content=body,
                                 headers={"content-type": "application/json"})
        assert answer.status_code == 200, answer.text
        print(answer.text)


@pytest.mark.slow  # the bundled SmolLM2 as teacher and student backbone
def test_the_search_walkthrough_runs_as_written(tmp_path, monkeypatch, capsys):
    write_example(tmp_path / "shared" / "data" / "trec-dl19")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shell = Shell(capsys, monkeypatch)
    for block in blocks(DOC.read_text(encoding="utf-8"), "bash"):
        for command in commands(block):
            shell.run(command)
    outputs = "\n".join(shell.outputs)
    assert "wrote 6 slates (180 candidates)" in outputs
    # eval's table, and ir-measures' number for the same run.
    table = next(o for o in shell.outputs if o.startswith("ranker"))
    row = next(line for line in table.splitlines() if line.startswith("retriever"))
    ours = float(row.split()[3])
    theirs = next(o for o in shell.outputs if o.startswith("{nDCG@10"))
    assert float(theirs.split(":")[1].strip(" }\n")) == pytest.approx(ours, abs=1e-4)
    assert "slate_bm25" in table and "popularity" not in table
    # The student in one pass: chosen on held-out queries and judged against the first
    # stage, by train and by eval; its TREC run and the server's answer.
    trained = next(o for o in shell.outputs if "kept the model of step" in o)
    assert "the first stage's order on its 1 eval slates, nDCG@10" in trained
    student = next(o for o in shell.outputs if "student" in o and o.startswith("ranker"))
    assert "tau" in student
    assert re.search(r"^student ranks (not )?below the first stage's order on these 6 slates: "
                     r"nDCG@10 ", student, flags=re.MULTILINE)
    run = Path("search/student.trec").read_text().splitlines()
    assert len(run) == 180 and {line.split()[0] for line in run} == {str(1000 + q)
                                                                     for q in range(6)}
    answer = json.loads(next(o for o in shell.outputs if o.startswith("{") and '"results"' in o))
    assert answer["model"] == "student" and len(answer["results"]) == 1
    assert "document" not in answer["results"][0]
    # A corpus alone: the bundled model's queries, screened, as slates eval reads.
    synth = next(o for o in shell.outputs if o.startswith("passages: 8 sampled of 180"))
    assert "queries: 8 written now" in synth and "dropped: empty" in synth
    slates = [json.loads(line) for line in Path("search/synth.jsonl").read_text().splitlines()]
    assert slates and all(s["query"]["qid"].startswith("synth-") for s in slates)
    assert all(s["relevance"] == {s["query"]["qid"].removeprefix("synth-"): 1} for s in slates)
    assert re.search(rf"^retriever +{len(slates)} ", shell.outputs[-1], flags=re.MULTILINE)
