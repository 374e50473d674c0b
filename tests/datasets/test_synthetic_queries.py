"""Synthetic queries from a corpus alone (``spdrank data queries``): sampling, the screen's
drops by reason, the slates (read back by ``eval`` and ``train``), resuming from the journal,
bad input named, a fake OpenAI-compatible server, and (slow) the bundled SmolLM2 end to end.

The corpus is generated: passage i says ``topic<i>`` and ``colour<i>``, words no other passage
holds, and ``shape<i % 4>``, which a few share; the fake writer answers with those three words
unless a test tells it otherwise, so BM25 finds the passage first and a few others after it."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.core.journal import read_journal
from spdrank.core.slates import SlateError, read_slates
from spdrank.datasets.synthetic_queries import (
    CorpusBM25,
    PromptJob,
    QueryOptions,
    Written,
    build_synthetic,
    clean_query,
    journal_path,
    load_prompt,
    prompt_from_json,
    sample_passages,
    screen,
)
from tests.helpers import JSONHandler, LoopbackHTTPServer


def _corpus(path: Path, n: int = 20, fmt: str = "beir") -> Path:
    """``n`` passages in one of the corpus formats ``data search`` reads."""
    texts = [f"The topic{i} passage explains colour{i} and shape{i % 4} in some detail."
             for i in range(n)]
    if fmt == "tsv":
        path.write_text("".join(f"p{i}\t{t}\n" for i, t in enumerate(texts)))
        return path
    fields = {"beir": ("_id", "text"), "pyserini": ("id", "contents"),
              "msmarco": ("docid", "segment")}[fmt]
    path.write_text("".join(
        json.dumps({fields[0]: f"p{i}", fields[1]: t, **({"title": f"Title {i}"}
                   if fmt == "msmarco" else {})}) + "\n"
        for i, t in enumerate(texts)))
    return path


def _passage(prompt: str) -> str:
    return prompt.rsplit("Document: ", 1)[1].split("\nRelevant Query:")[0]


class FakeWriter:
    """Answers with the passage's own numbered words (``topic3 colour3 shape3``), or ``answers``'
    ``(raw, hit_max_tokens)`` for a docid; fails the docids of ``fail``; raises after
    ``crash_after`` answers, as a killed run stops."""

    name = "fake"

    def __init__(self, answers: dict[str, tuple[str, bool]] | None = None,
                 fail: Iterable[str] = (), crash_after: int | None = None) -> None:
        self.answers = answers or {}
        self.fail = set(fail)
        self.crash_after = crash_after
        self.settings = {"max_new_tokens": 8, "temperature": 0.0}
        self.calls: list[str] = []

    def write(self, jobs: Iterable[PromptJob]) -> Iterator[Written]:
        for job in jobs:
            if self.crash_after is not None and len(self.calls) >= self.crash_after:
                raise KeyboardInterrupt
            self.calls.append(job.docid)
            if job.docid in self.fail:
                yield Written(job.docid, error="the server said no")
                continue
            words = [w for w in _passage(job.prompt).split() if re.search(r"\d", w)][:3]
            raw, hit = self.answers.get(job.docid, (" " + " ".join(words) + "?\n", False))
            yield Written(job.docid, raw, hit_max_tokens=hit)

    def close(self) -> None:
        pass


def test_prompt_is_data_and_renders_inpars_few_shot(tmp_path: Path) -> None:
    prompt = load_prompt()
    assert prompt.name == "inpars" and len(prompt.examples) == 3
    text = prompt.render("Fleas live a year.")
    assert text.startswith("Example 1:\nDocument: We don't know")
    assert "Relevant Query: What fruit is native to Australia?\n\n" in text
    assert text.endswith("Example 4:\nDocument: Fleas live a year.\nRelevant Query:")
    own = tmp_path / "p.json"
    own.write_text(json.dumps({"name": "mine", "instruction": "Ask.", "examples": [
        {"document": "d", "query": "q"}], "query_label": "Question"}))
    mine = load_prompt(own)
    assert mine.render("x").endswith("Document: x\nQuestion:")
    assert mine.digest() != prompt.digest()
    with pytest.raises(SlateError, match=r"examples\[0\].query must be a non-blank string"):
        prompt_from_json({"name": "n", "instruction": "i", "examples": [{"document": "d"}]},
                         "p.json")


def test_sample_is_seeded_and_a_prefix_of_larger_samples() -> None:
    ids = [f"p{i}" for i in range(50)]
    assert sample_passages(ids, 10, 3) == sample_passages(ids, 10, 3)
    assert sample_passages(ids, 30, 3)[:10] == sample_passages(ids, 10, 3)
    assert sample_passages(ids, 10, 4) != sample_passages(ids, 10, 3)
    assert sorted(sample_passages(ids, 99, 0)) == sorted(ids)


def test_clean_query_takes_the_first_line_without_labels_or_quotes() -> None:
    assert clean_query(" How long do fleas live?\n") == "How long do fleas live?"
    assert clean_query('\n\n Relevant Query: "what is a flea"\nExample 5:') == "what is a flea"
    assert clean_query("query -  tides\x00 and\u200b moons ") == "tides and moons"
    assert clean_query("  \n ") == ""


def test_clean_query_drops_format_characters_that_would_print_raw() -> None:
    """A right-to-left override reorders the text a terminal shows after it; a zero-width
    space hides between words: neither is kept in a query, nor printed."""
    assert clean_query("what is \u202eevil\u202c text") == "what is evil text"
    assert clean_query("\ufeffflea\u2066 life\u2069") == "flea life"
    assert clean_query("\u202e\u200b\n") == ""


def test_screen_drops_by_reason_in_order() -> None:
    ids = [f"p{i}" for i in range(6)]
    bm25 = CorpusBM25(ids, [f"topic{i} colour{i} shape{i}" for i in range(6)])
    answers = [
        ("p0", " topic0 colour0?\n", False),          # kept
        ("p1", "\n", False),                           # empty
        ("p2", " what about topic2 colour2 and", True),  # cut at the token cap
        ("p3", " Topic0, colour0\n", False),           # repeats p0's (case, punctuation)
        ("p4", " topic5 shape5\n", False),             # finds p5, never p4
        ("p5", " " + " ".join(["shape5"] * 9) + "\n", False),  # over --max-query-words
    ]
    out = screen(answers, bm25, QueryOptions(keep_top=2, depth=3, max_query_words=8))
    assert [(d, q) for d, q, _ in out.kept] == [("p0", "topic0 colour0?")]
    assert out.kept[0][2][0][0] == "p0"
    assert dict(out.dropped) == {"empty": 1, "too_long": 2, "duplicate": 1, "not_retrieved": 1}


def test_rank_and_top_break_ties_by_corpus_order() -> None:
    bm25 = CorpusBM25(["a", "b", "c", "d"], ["flea", "cat", "flea", "flea dog"])
    scores = bm25.scores("flea")
    assert [d for d, _ in bm25.top(scores, 2)] == ["a", "c"]  # a and c tie, before d
    assert bm25.rank_of(scores, "c") == 1 and bm25.rank_of(scores, "b") is None
    assert [d for d, _ in bm25.top(scores, 9)] == ["a", "c", "d"]  # b scores 0: not retrieved
    assert bm25.top(bm25.scores("unknownword"), 5) == []


@pytest.mark.parametrize("fmt", ["beir", "pyserini", "msmarco", "tsv"])
def test_build_writes_valid_slates_from_each_corpus_format(tmp_path: Path, fmt: str) -> None:
    corpus = _corpus(tmp_path / ("c.tsv" if fmt == "tsv" else "c.jsonl"), fmt=fmt)
    out = tmp_path / "synth.jsonl"
    writer = FakeWriter(answers={"p4": (" topic5 colour5\n", False), "p7": ("   ", False)})
    build = build_synthetic(corpus, out, writer, QueryOptions(passages=12, seed=1, keep_top=3,
                                                              depth=5), progress=False)
    sampled = sample_passages([f"p{i}" for i in range(20)], 12, 1)
    assert writer.calls == sampled and build.written == 12 and build.reused == 0
    dropped = {"not_retrieved": int("p4" in sampled), "empty": int("p7" in sampled)}
    assert build.dropped == {k: v for k, v in dropped.items() if v}
    assert build.kept == build.slates == 12 - sum(dropped.values())
    slates = list(read_slates(out))
    assert [s.query.qid for s in slates] == [f"synth-{d}" for d in sampled
                                             if d not in ("p4", "p7")]
    for slate in slates:
        source = slate.query.qid.removeprefix("synth-")
        assert slate.relevance == {source: 1}
        assert slate.docids[0] == source  # its own words: BM25's best
        scores = [c.score for c in slate.candidates]
        assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
        assert 1 <= len(slate) <= 5
    if fmt == "msmarco":  # the title travels with the passage, and into the prompt
        assert slates[0].candidates[0].doc["title"].startswith("Title")


def test_a_retrieve_results_file_is_read_as_the_corpus_of_its_distinct_passages(
        tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c.jsonl")
    passages = [json.loads(line) for line in corpus.read_text().splitlines()]
    # Two queries whose hits overlap: each passage once, in the order first seen.
    records = [{"query": {"text": f"q{q}", "qid": f"q{q}"},
                "hits": [{"docid": p["_id"], "content": p["text"], "rank": r + 1}
                         for r, p in enumerate(passages[q * 10:q * 10 + 12])]}
               for q in range(2)]
    retrieved = tmp_path / "retrieve_results.json"
    retrieved.write_text(json.dumps(records))
    options = QueryOptions(passages=12, seed=1, keep_top=3, depth=5)
    by_corpus = build_synthetic(corpus, tmp_path / "a.jsonl", FakeWriter(), options,
                                progress=False)
    by_results = build_synthetic(retrieved, tmp_path / "b.jsonl", FakeWriter(), options,
                                 progress=False)
    assert by_results.corpus == by_corpus.corpus == 20
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_a_rerun_resumes_from_the_journal_without_rewriting(tmp_path: Path) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "synth.jsonl"
    options = QueryOptions(passages=10, keep_top=3, depth=5)
    with pytest.raises(KeyboardInterrupt):
        build_synthetic(corpus, out, FakeWriter(crash_after=4), options, progress=False)
    assert not out.exists() and len(read_journal(journal_path(out), "docid")) == 4
    # A torn last line, as a kill mid-write leaves: cut away, that passage written again.
    with open(journal_path(out), "a") as fh:
        fh.write('{"docid": "p1", "raw": "half')
    second = FakeWriter()
    build = build_synthetic(corpus, out, second, options, progress=False)
    assert build.reused == 4 and build.written == 6
    assert second.calls == sample_passages([f"p{i}" for i in range(20)], 10, 0)[4:]
    first = out.read_bytes()
    third = FakeWriter()
    build = build_synthetic(corpus, out, third, options, progress=False)
    assert third.calls == [] and build.reused == 10 and out.read_bytes() == first
    # More passages later: the same sample extended, only the new ones written.
    build = build_synthetic(corpus, out, third, QueryOptions(passages=14, keep_top=3, depth=5),
                            progress=False)
    assert len(third.calls) == 4 and build.reused == 10 and build.slates == 14


def test_failed_passages_are_retried_and_no_slates_are_written_until_done(
        tmp_path: Path) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "synth.jsonl"
    options = QueryOptions(passages=10, keep_top=3, depth=5, max_failures=2)
    sample = sample_passages([f"p{i}" for i in range(20)], 10, 0)
    writer = FakeWriter(fail=sample[2:4])
    build = build_synthetic(corpus, out, writer, options, progress=False)
    assert build.failed == 2 and writer.calls == sample[:4]  # stopped at --max-failures
    assert build.missing == 8 and build.errors[0].endswith("the server said no")
    assert not out.exists()
    build = build_synthetic(corpus, out, FakeWriter(), options, progress=False)
    assert build.written == 8 and build.missing == 0 and build.slates == 10


def test_a_journal_of_other_settings_or_another_corpus_is_refused(tmp_path: Path) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "synth.jsonl"
    options = QueryOptions(passages=3, keep_top=3, depth=5)
    build_synthetic(corpus, out, FakeWriter(), options, progress=False)
    other = FakeWriter()
    other.settings = {"max_new_tokens": 8, "temperature": 0.7, "seed": 0}
    with pytest.raises(SlateError, match=r"synth.queries.jsonl:1: .*temperature"):
        build_synthetic(corpus, out, other, options, progress=False)
    assert other.calls == []
    with pytest.raises(SlateError, match=r"synth.queries.jsonl:\d: docid 'p\d+' is not a "
                                         r"passage of .*small.jsonl"):
        build_synthetic(_shifted(tmp_path / "small.jsonl"), out, FakeWriter(), options,
                        progress=False)


def test_a_journal_written_from_other_passage_text_or_cut_is_refused(tmp_path: Path,
                                                                      caplog) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "synth.jsonl"
    options = QueryOptions(passages=3, keep_top=3, depth=5)
    build_synthetic(corpus, out, FakeWriter(), options, progress=False)
    # The same docids with other text: each query was written from a passage that is gone.
    changed = _corpus(tmp_path / "c2.jsonl")
    changed.write_text(changed.read_text().replace("in some detail", "and nothing else"))
    writer = FakeWriter()
    with pytest.raises(SlateError, match=r"synth.queries.jsonl:1: this query was written from "
                                         r"other text than docid 'p\d+' shows now: its text "
                                         r"in .*c2.jsonl, cut to its first 256 words"):
        build_synthetic(changed, out, writer, options, progress=False)
    # The same text cut elsewhere: the prompt shows other words than the query was written from.
    with pytest.raises(SlateError, match=r"cut to its first 3 words \(--max-passage-words\)"):
        build_synthetic(corpus, out, writer, QueryOptions(passages=3, keep_top=3, depth=5,
                                                          max_passage_words=3), progress=False)
    assert writer.calls == []
    # A cut past every passage's end shows the same text: the queries are this run's.
    build = build_synthetic(corpus, out, writer, QueryOptions(passages=3, keep_top=3, depth=5,
                                                              max_passage_words=50),
                            progress=False)
    assert build.reused == 3 and writer.calls == [] and "no digest" not in caplog.text
    # A record without the digest cannot be checked: reused, and said.
    journal = journal_path(out)
    journal.write_text("".join(
        json.dumps({k: v for k, v in json.loads(line).items() if k != "passage"}) + "\n"
        for line in journal.read_text().splitlines()))
    build = build_synthetic(changed, out, writer, options, progress=False)
    assert build.reused == 3 and "3 queries in" in caplog.text and "no digest" in caplog.text


def _shifted(path: Path) -> Path:
    path.write_text("".join(json.dumps({"_id": f"q{i}", "text": f"topic{i} colour{i}"}) + "\n"
                            for i in range(5)))
    return path


def test_the_command_refuses_bad_input_naming_the_place(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"_id": "a", "text": "fine"}\n{"_id": "b"}\n')
    out = str(tmp_path / "s.jsonl")
    assert main(["data", "queries", "--corpus", str(corpus), "--out", out]) == 2
    assert f"{corpus}:2: a corpus record needs one of" in capsys.readouterr().err
    good = str(_corpus(tmp_path / "g.jsonl"))
    assert main(["data", "queries", "--corpus", good, "--out", out, "--keep-top", "30",
                 "--depth", "10"]) == 2
    assert "--keep-top (30) must not exceed --depth (10)" in capsys.readouterr().err
    assert main(["data", "queries", "--corpus", good, "--out", out, "--generator", "openai",
                 "--model", "m"]) == 2
    assert "--generator openai needs --base-url" in capsys.readouterr().err
    assert main(["data", "queries", "--corpus", good, "--out", out, "--base-url",
                 "http://127.0.0.1:9/v1"]) == 2
    assert ("--base-url http://127.0.0.1:9/v1 has no effect here: it applies to --generator "
            "openai" in capsys.readouterr().err)
    assert main(["data", "queries", "--corpus", good, "--out", good]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["data", "queries", "--corpus", good, "--out", "/dev/null"]) == 2
    assert "--out /dev/null: the queries are journalled beside it" in capsys.readouterr().err
    assert not Path("/dev/null.queries.jsonl").exists()
    blank = tmp_path / "blank.tsv"
    blank.write_text("a\t \n")
    assert main(["data", "queries", "--corpus", str(blank), "--out", out]) == 2
    assert "holds no passage with text" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "queries", "--corpus", good, "--out", out, "--passages", "0"])
    assert "--passages: must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("writer,flags,said", [
    (["--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
     ["--batch-size", "4"], "--batch-size 4 has no effect here: it applies to the local writers"),
    (["--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
     ["--device", "cuda"], "--device cuda has no effect here: it applies to the local writers"),
    (["--generator", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
     ["--trust-remote-code"], "--trust-remote-code has no effect here"),
    ([], ["--concurrency", "4"], "--concurrency 4 has no effect here: it applies to --generator"),
    ([], ["--timeout", "30"], "--timeout 30.0 has no effect here"),
    (["--generator", "hf", "--model", "some/model"], ["--retries", "1"],
     "--retries 1 has no effect here: it applies to --generator openai"),
    ([], ["--api-key", "s3cret"], "--api-key has no effect here"),
])
def test_a_flag_of_another_writer_is_refused_by_name(tmp_path: Path, capsys, writer, flags,
                                                     said) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "s.jsonl"
    assert main(["data", "queries", "--corpus", str(corpus), "--out", str(out), "--passages",
                 "2", *writer, *flags]) == 2
    err = capsys.readouterr().err
    assert said in err and "drop it" in err and "s3cret" not in err
    assert not out.exists() and not journal_path(out).exists()


# -- an OpenAI-compatible server ----------------------------------------------------------------


class QueryServer(LoopbackHTTPServer):
    """Answers a chat completion with the last document's numbered words, after a line the
    screen must drop (a query is the first line only)."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        lock = threading.Lock()
        fake = self

        class Handler(JSONHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    fake.requests.append(body)
                words = [w for w in _passage(body["messages"][-1]["content"]).split()
                         if re.search(r"\d", w)][:3]
                self.send_json(200, {
                    "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant",
                        "content": "Query: " + " ".join(words) + "\nExample 5: more"}}],
                    "usage": {"prompt_tokens": 50, "completion_tokens": 4, "total_tokens": 54}})

        super().__init__(Handler)


def test_command_with_a_server_writes_slates_eval_and_train_read(tmp_path: Path, capsys) -> None:
    corpus, out = _corpus(tmp_path / "c.jsonl"), tmp_path / "synth.jsonl"
    with QueryServer() as server:
        args = ["data", "queries", "--corpus", str(corpus), "--out", str(out), "--passages",
                "8", "--depth", "8", "--keep-top", "4", "--generator", "openai", "--base-url",
                server.url, "--model", "fake-writer", "--temperature", "0.7", "--seed", "5"]
        assert main(args) == 0
        stdout = capsys.readouterr().out
        assert "kept 8 of 8 queries (100%)" in stdout and "wrote 8 slates" in stdout
        first = server.requests[0]
        assert first["model"] == "fake-writer" and first["max_tokens"] == 32
        assert first["temperature"] == 0.7 and first["seed"] == 5
        assert first["messages"][0]["role"] == "system"
        assert first["messages"][1]["content"].endswith("\nRelevant Query:")
        assert main(args) == 0 and len(server.requests) == 8  # resumed: nothing asked again
    record = next(iter(read_journal(journal_path(out), "docid").values())).record
    assert record["writer"] == "openai:fake-writer" and record["raw"].startswith("Query: ")
    slates = list(read_slates(out))
    assert all(not s.query.text.startswith("Query") for s in slates)
    assert main(["eval", "--slates", str(out), "--k", "1,8", "--rel-level", "1", "--json",
                 str(tmp_path / "e.json"), "--no-progress"]) == 0
    rankers = json.loads((tmp_path / "e.json").read_text())["rankers"]
    assert rankers["retriever"]["metrics"]["RR"]["mean"] == 1.0  # its source is first
    assert main(["train", "--slates", str(out), "--out", str(tmp_path / "run"), "--target",
                 "relevance", "--features", "score", "--features-only", "--positions", "8",
                 "--head-width", "16", "--max-steps", "2", "--batch-size", "4",
                 "--warmup-steps", "0", "--no-progress", "--device", "cpu"]) == 0
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["train_slates"] == 8


# -- the bundled model ----------------------------------------------------------------------


@pytest.mark.slow
def test_bundled_model_writes_queries_end_to_end(tmp_path: Path, capsys) -> None:
    corpus = tmp_path / "c.jsonl"
    texts = [
        ("The flea life cycle has four stages: egg, larva, pupa and adult. Adult fleas live "
         "up to a year on a host."),
        "The moon's gravity pulls the oceans, and the tides rise and fall twice a day.",
        "Caffeine in coffee blocks adenosine receptors in the brain, which keeps you awake.",
        "Paris is the capital of France and its largest city, on the river Seine.",
    ]
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n"
                              for i, t in enumerate(texts)))
    out = tmp_path / "synth.jsonl"
    args = ["data", "queries", "--corpus", str(corpus), "--out", str(out), "--passages", "3",
            "--depth", "4", "--keep-top", "4", "--batch-size", "3", "--max-new-tokens", "24",
            "--device", "cpu"]
    assert main(args) == 0
    stdout = capsys.readouterr().out
    assert "queries: 3 written now" in stdout and "hf:bundled)" in stdout
    records = [e.record for e in read_journal(journal_path(out), "docid").values()]
    assert len(records) == 3 and all(r["writer"] == "hf:bundled" for r in records)
    queries = [clean_query(r["raw"]) for r in records]
    assert all(queries) and all(len(q.split()) <= 24 for q in queries), queries
    slates = list(read_slates(out))
    assert len(slates) >= 1 and all(s.relevance and len(s.relevance) == 1 for s in slates)
    assert main(args) == 0 and "queries: 0 written now" in capsys.readouterr().out


def test_a_journal_that_would_overwrite_an_input_names_the_flag_to_change(tmp_path, capsys):
    """The journal's path comes from --out, so --out is what to change."""
    corpus = tmp_path / "out.queries.jsonl"
    corpus.write_text('{"_id": "a", "text": "Flea bites itch."}\n')
    assert main(["data", "queries", "--corpus", str(corpus),
                 "--out", str(tmp_path / "out.jsonl")]) == 2
    err = capsys.readouterr().err
    assert (f"--out's queries journal {corpus} is the same file as --corpus {corpus}: writing "
            "it would destroy the input; choose another --out") in err, err
