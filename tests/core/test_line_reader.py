"""Every line-based input a user brings, read strictly: the hostile files of search's readers
(retrieve results, TREC runs, qrels, topics, corpora), label and rankings files, slate files
and prompt templates. Each is refused with one line naming ``file:line`` (and the field), or
read whole; never a traceback, never silently changed.

The rules themselves (which files, how much, which bytes) are core/inputs.py's, tested in
test_inputs.py; here each reader is held to them, one case of the field at a time.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.templates import load_template
from spdrank.commands.cli import main
from spdrank.core.slates import Slate, SlateError, read_slates
from spdrank.core.trec import read_corpus, read_qrels, read_run, read_topics
from spdrank.datasets.log import read_sequences
from spdrank.datasets.search import read_retrieve_results, slates_from_retrieve_results
from spdrank.datasets.titles import read_titles
from spdrank.model.config import SPDConfig
from spdrank.teacher.backends import read_rankings
from spdrank.teacher.labels import read_labels
from spdrank.teacher.servers import collect_base_urls
from spdrank.training.slate_source import open_slate_source

BOM = b"\xef\xbb\xbf"


def _write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def _hit(docid: Any = "p1", **fields: Any) -> dict[str, Any]:
    return {"qid": "7", "docid": docid, "content": "A passage.", "rank": 1, "score": 1.0,
            **fields}


def _retrieved(path: Path, *records: dict[str, Any]) -> Path:
    if path.suffix == ".json":
        return _write(path, json.dumps(list(records)))
    return _write(path, "".join(json.dumps(r) + "\n" for r in records))


def _slate_line(qid: str = "7") -> str:
    return json.dumps({"query": {"qid": qid, "text": "fleas"},
                       "candidates": [{"docid": "a", "doc": {"text": "A."}}]})


# -- every reader, with a file of its format -------------------------------------------------

#: name -> (a file of the format holding one record, its name, how to read it)
READERS: dict[str, tuple[str, str, Callable[[Path], Any]]] = {
    "qrels": ("7 0 a 2\n", "q.txt", read_qrels),
    "qrels JSON": ('{"7": {"a": 2}}', "q.json", read_qrels),
    "run": ("7 Q0 a 1 2.5 bm25\n", "run.trec", read_run),
    "topics TSV": ("7\tfleas\n", "topics.tsv", read_topics),
    "topics JSONL": ('{"_id": "7", "text": "fleas"}\n', "topics.jsonl", read_topics),
    "corpus TSV": ("a\tA passage.\n", "corpus.tsv", read_corpus),
    "corpus JSONL": ('{"_id": "a", "text": "A passage."}\n', "corpus.jsonl", read_corpus),
    "retrieve results JSON": (json.dumps([{"query": "fleas", "hits": [_hit()]}]), "r.json",
                              lambda p: list(read_retrieve_results(p))),
    "retrieve results JSONL": (json.dumps({"query": "fleas", "hits": [_hit()]}) + "\n",
                               "r.jsonl", lambda p: list(read_retrieve_results(p))),
    "slates": (_slate_line() + "\n", "s.jsonl", lambda p: list(read_slates(p))),
    "training slates": (_slate_line() + "\n", "t.jsonl",
                        lambda p: len(open_slate_source(p, seed=0))),
    "labels": ('{"qid": "7", "ranking": ["a"]}\n', "labels.jsonl", read_labels),
    "rankings run": ("7 Q0 a 1 2.5 x\n", "rankings.trec", read_rankings),
    "rankings JSONL": ('{"qid": "7", "ranking": ["a"]}\n', "rankings.jsonl", read_rankings),
    "log": ("u1 i1 i2 i3\n", "log.txt", read_sequences),
    "titles": ("i1\tA title\n", "titles.tsv", read_titles),
    "server list": ("http://localhost:8000/v1\n", "servers.txt",
                    lambda p: collect_base_urls(file=p)),
    "prompt template": ('{"name": "mine", "base": "search"}', "mine.json", load_template),
}


@pytest.mark.parametrize("name", READERS)
def test_a_byte_order_mark_at_the_start_is_skipped_by_every_reader(
    tmp_path: Path, name: str
) -> None:
    # Qrels, runs and teacher files dropped their first line; JSON readers refused the file.
    text, filename, read = READERS[name]
    path = tmp_path / filename
    plain = read(_write(path, text))
    with_bom = read(_write(path, BOM + text.encode()))
    if name == "labels":
        plain, with_bom = ({q: e.record for q, e in labels.items()}
                           for labels in (plain, with_bom))
    assert with_bom == plain


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("special", ["/dev/zero", "directory", "socket"])
def test_a_device_a_directory_or_a_socket_is_refused_by_every_reader(
    tmp_path: Path, name: str, special: str
) -> None:
    # /dev/zero read as a corpus, qrels or retrieve results grew until MemoryError.
    path: Path
    if special == "directory":
        path = tmp_path / "dir"
        path.mkdir()
    elif special == "socket":
        path = tmp_path / "sock"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path = Path(special)
    kind = {"/dev/zero": "a character device", "directory": "a directory",
            "socket": "a socket"}[special]
    try:
        with pytest.raises((SlateError, ValueError), match=rf"^{path} is {kind}") as caught:
            READERS[name][2](path)
        assert "\n" not in str(caught.value)
    finally:
        if special == "socket":
            sock.close()


@pytest.mark.parametrize("name", ["qrels", "run", "topics TSV", "corpus JSONL",
                                  "retrieve results JSONL", "slates", "labels"])
def test_a_file_without_newlines_fails_at_its_first_line(tmp_path: Path, name: str) -> None:
    # A 2 GB file without a newline was read whole into one line: MemoryError, or the OOM
    # killer. The file is sparse: it costs no disk, and only the bound's bytes are read.
    from spdrank.core.defaults import MAX_LINE_BYTES

    _, filename, read = READERS[name]
    path = tmp_path / filename
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)
    with pytest.raises(SlateError, match=rf"^{path}:1: a line longer than "
                                         rf"{MAX_LINE_BYTES:,} bytes"):
        read(path)


def test_a_pipe_is_read_like_a_file(tmp_path: Path) -> None:
    # A corpus may be streamed (``--corpus <(zcat corpus.tsv.gz)``).
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as fh:
            fh.write(b"a\tA passage.\nb\tAnother.\n")

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        corpus = read_corpus(f"/dev/fd/{read_end}")
    finally:
        writer.join()
        os.close(read_end)
    assert corpus == {"a": {"text": "A passage."}, "b": {"text": "Another."}}


def test_a_training_file_must_be_a_regular_file(tmp_path: Path) -> None:
    # Training reads its slates more than once (an index, then each epoch): a pipe would be
    # empty the second time.
    fifo = tmp_path / "slates.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(SlateError, match=r"is a pipe: a slate file is read more than once"):
        open_slate_source(fifo, seed=0)


# -- retrieve results: the hits' fields ------------------------------------------------------


@pytest.mark.parametrize("rank", ["2", None, True, 1.5, [1]])
def test_a_hits_rank_that_is_not_an_integer_is_refused_naming_the_field(
    tmp_path: Path, rank: Any
) -> None:
    # A string or null beside integers raised TypeError in the sort.
    path = _retrieved(tmp_path / "r.json", {"query": "fleas", "hits": [
        _hit("p1", rank=1), _hit("p2", rank=rank)]})
    with pytest.raises(SlateError, match=r"record 0: hits\[1\]\.rank must be an integer"):
        list(slates_from_retrieve_results(path))


@pytest.mark.parametrize(("score", "says"), [
    ([1.0], "must be a number, got list"),
    (10**400, "is an integer of 401 digits, beyond the float range"),
    ("9.5", "must be a number, got str"),
    (True, "must be a number, got bool"),
])
def test_a_hits_score_that_is_not_a_float_is_refused_naming_the_field(
    tmp_path: Path, score: Any, says: str
) -> None:
    # A list raised TypeError, a 400-digit integer OverflowError.
    path = _retrieved(tmp_path / "r.jsonl", {"query": "fleas", "hits": [_hit(score=score)]})
    with pytest.raises(SlateError, match=rf"r.jsonl:1: hits\[0\]\.score {says}"):
        list(slates_from_retrieve_results(path))


@pytest.mark.parametrize("docid", [None, {"a": 1}, True, [1], 1.5])
def test_a_docid_that_is_not_a_string_is_refused(tmp_path: Path, docid: Any) -> None:
    # They were turned into the text 'None', "{'a': 1}", 'True'.
    path = _retrieved(tmp_path / "r.jsonl", {"query": "fleas", "hits": [_hit(docid)]})
    with pytest.raises(SlateError, match=r"r.jsonl:1: hits\[0\]\.docid must be a string"):
        list(read_retrieve_results(path))
    corpus = _write(tmp_path / "c.jsonl", json.dumps({"_id": docid, "text": "A."}) + "\n")
    with pytest.raises(SlateError, match=r"c.jsonl:1: _id must be a string"):
        read_corpus(corpus)
    rankings = _write(tmp_path / "l.jsonl", json.dumps({"qid": "7", "ranking": [docid]}) + "\n")
    with pytest.raises(SlateError, match=r"l.jsonl:1: ranking\[0\] must be a string"):
        read_rankings(rankings)


def test_two_records_of_one_query_are_refused_naming_both(tmp_path: Path) -> None:
    # Both became slates of one qid, in a file spdrank's own readers then refused.
    for name, first in (("r.jsonl", "r.jsonl:1"), ("r.json", "record 0")):
        path = _retrieved(tmp_path / name, {"query": "fleas", "hits": [_hit("p1")]},
                          {"query": "fleas again", "hits": [_hit("p2")]})
        with pytest.raises(SlateError, match=rf"query '7' appears twice \(first at .*{first}"):
            list(read_retrieve_results(path))


def test_a_hit_of_another_query_is_refused(tmp_path: Path) -> None:
    # It was merged into the record's slate without a word.
    path = _retrieved(tmp_path / "r.jsonl", {"query": "fleas", "hits": [
        _hit("p1"), {**_hit("p2"), "qid": "8"}]})
    with pytest.raises(SlateError, match=r"r.jsonl:1: hits\[1\]\.qid '8' is not the record's"):
        list(read_retrieve_results(path))


# -- ids, duplicates, texts ------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["\x00", "\u202e12", "a\x1bb", "\u200bx"])
@pytest.mark.parametrize("reader", ["qrels", "run", "topics TSV", "corpus TSV"])
def test_an_id_with_a_control_or_format_character_is_refused_where_read(
    tmp_path: Path, bad: str, reader: str
) -> None:
    text = {"qrels": f"7 0 {bad} 2\n", "run": f"7 Q0 {bad} 1 2.5 x\n",
            "topics TSV": f"{bad}\tfleas\n", "corpus TSV": f"{bad}\tA passage.\n"}[reader]
    _, filename, read = READERS[reader]
    with pytest.raises(SlateError, match=rf"{filename}:1: the (qid|docid) .* holds a control"):
        read(_write(tmp_path / filename, text))


def test_an_empty_id_is_refused_where_read(tmp_path: Path) -> None:
    # Empty docids were kept, then written as TREC lines of five fields no reader accepts.
    cases = [
        ("topics.tsv", "\tfleas\n", read_topics, r"topics.tsv:1: the qid '' is empty"),
        ("corpus.tsv", "\tA passage.\n", read_corpus, r"corpus.tsv:1: the docid '' is empty"),
        ("corpus.jsonl", '{"_id": "", "text": "A."}\n', read_corpus, r"_id '' is empty"),
        ("q.json", '{"7": {"": 1}}', read_qrels, r"the docid of qrels\['7'\] '' is empty"),
        ("r.jsonl", json.dumps({"query": "fleas", "hits": [_hit("")]}) + "\n",
         lambda p: list(read_retrieve_results(p)), r"hits\[0\]\.docid '' is empty"),
        ("labels.jsonl", '{"qid": "7", "ranking": ["a", ""]}\n', read_labels,
         r"labels.jsonl:1: ranking\[1\] '' is empty"),
        ("rankings.jsonl", '{"qid": "7", "ranking": ["a", ""]}\n', read_rankings,
         r"rankings.jsonl:1: ranking\[1\] '' is empty"),
    ]
    for filename, text, read, says in cases:
        with pytest.raises(SlateError, match=says):
            read(_write(tmp_path / filename, text))


@pytest.mark.parametrize("grades", [("2", "0"), ("2", "2")])
def test_a_document_judged_twice_is_refused_naming_both_lines(
    tmp_path: Path, grades: tuple[str, str]
) -> None:
    # The last judgement won. An identical one is refused too: one rule for every repeat.
    path = _write(tmp_path / "q.txt", f"7 0 a {grades[0]}\n7 0 b 1\n7 0 a {grades[1]}\n")
    with pytest.raises(SlateError, match=rf"q.txt:3: the judgement of docid 'a' for query '7' "
                                         rf"appears twice \(first at {path}:1\)"):
        read_qrels(path)


def test_a_qrels_json_judging_twice_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "q.json", '{"7": {"a": 2, "a": 0}}')
    with pytest.raises(SlateError, match=r"q.json: the key 'a' appears twice in one object"):
        read_qrels(path)
    path = _write(tmp_path / "q.json", '{"7": {"a": 2}, "7": {"b": 1}}')
    with pytest.raises(SlateError, match=r"q.json: the key '7' appears twice"):
        read_qrels(path)


def test_a_passage_twice_in_the_corpus_is_refused_naming_both_lines(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "c.tsv", "a\tOne.\nb\tTwo.\na\tThree.\n")
    with pytest.raises(SlateError, match=rf"c.tsv:3: docid 'a' appears twice \(first at {tsv}:1"):
        read_corpus(tsv)
    jsonl = _write(tmp_path / "c.jsonl", '{"_id": "a", "text": "1"}\n{"_id": "a", "text": "2"}\n')
    with pytest.raises(SlateError, match=r"c.jsonl:2: docid 'a' appears twice"):
        read_corpus(jsonl, wanted={"a"})
    # A passage no run asks for is not kept, nor remembered.
    assert read_corpus(jsonl, wanted={"b"}) == {}


def test_a_topic_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    tsv = _write(tmp_path / "t.tsv", "7\tfleas\n8\ttides\n7\tcats\n")
    with pytest.raises(SlateError, match=rf"t.tsv:3: query '7' appears twice \(first at {tsv}:1"):
        read_topics(tsv)
    jsonl = _write(tmp_path / "t.jsonl", '{"_id": "7", "text": "a"}\n{"qid": 7, "query": "b"}\n')
    with pytest.raises(SlateError, match=r"t.jsonl:2: query '7' appears twice"):
        read_topics(jsonl)


def test_a_tab_in_a_topic_stays_in_its_query(tmp_path: Path) -> None:
    # The text after the tab was dropped.
    path = _write(tmp_path / "t.tsv", "7\thow do fleas\tlive\r\n")
    assert read_topics(path) == {"7": "how do fleas\tlive"}


@pytest.mark.parametrize(("filename", "text"), [
    ("t.tsv", "7\t\n"), ("t.tsv", "7\t   \n"), ("t.jsonl", '{"_id": "7", "text": ""}\n'),
])
def test_an_empty_query_is_refused(tmp_path: Path, filename: str, text: str) -> None:
    with pytest.raises(SlateError, match=rf"{filename}:1: query '7' has an empty text"):
        read_topics(_write(tmp_path / filename, text))
    retrieved = _retrieved(tmp_path / "r.jsonl", {"query": " ", "hits": [_hit()]})
    with pytest.raises(SlateError, match=r"r.jsonl:1: 'query' must be a string that shows "
                                         r"something, not empty or only whitespace"):
        list(read_retrieve_results(retrieved))


@pytest.mark.parametrize(("filename", "data"), [
    ("q.txt", b"7 0 a 2\n7 0 caf\xe9 1\n"),
    ("run.trec", b"7 Q0 caf\xe9 1 2.5 x\n"),
    ("t.tsv", b"7\tfleas\n8\tcaf\xe9\n"),
    ("c.tsv", b"a\tOne.\nb\tT\xffwo.\n"),
])
def test_text_that_is_not_utf8_is_refused_with_its_byte_offset(
    tmp_path: Path, filename: str, data: bytes
) -> None:
    # It became U+FFFD, and a qid or docid that then matched nothing.
    read = {"q.txt": read_qrels, "run.trec": read_run, "t.tsv": read_topics,
            "c.tsv": read_corpus}[filename]
    offset = min(i for i in (data.find(b"\xe9"), data.find(b"\xff")) if i >= 0)
    line = data[:offset].count(b"\n") + 1
    with pytest.raises(SlateError, match=rf"{filename}:{line}: not UTF-8 text \(.*byte offset "
                                         rf"{offset} of the file"):
        read(_write(tmp_path / filename, data))


def test_a_template_file_past_its_bound_is_refused_when_read(tmp_path: Path) -> None:
    # A 50 MB instruction was copied into every label record, and a model trained with a
    # template past a checkpoint's bound could not be loaded.
    from spdrank.core.defaults import MAX_TEMPLATE_BYTES

    path = _write(tmp_path / "big.json", json.dumps({"instruction": "rank " * 10_000_000}))
    with pytest.raises(SlateError, match=rf"big.json: the prompt template is longer than "
                                         rf"{MAX_TEMPLATE_BYTES:,} bytes"):
        load_template(str(path))


def test_a_template_within_its_bound_fits_a_checkpoint(tmp_path: Path) -> None:
    """The largest template a file may hold, non-ASCII throughout, still leaves its
    checkpoint's config.json within the bound it is loaded under."""
    from spdrank.core.defaults import MAX_SETTINGS_BYTES, MAX_TEMPLATE_BYTES

    head = '{"base": "search", "instruction": "'
    body = "é" * ((MAX_TEMPLATE_BYTES - len(head) - 2) // 2)
    path = _write(tmp_path / "wide.json", head + body + '"}')
    assert path.stat().st_size <= MAX_TEMPLATE_BYTES
    config = SPDConfig(prompt=PromptSettings(template=load_template(str(path))))
    assert len(json.dumps(config.to_dict(), indent=2)) < MAX_SETTINGS_BYTES


# -- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["data", "search", "--run", "{run}", "--topics", "{topics}", "--corpus", "/dev/zero"],
    ["data", "search", "--retrieved", "/dev/zero"],
    ["data", "search", "--run", "{run}", "--topics", "{topics}", "--corpus", "{topics}",
     "--qrels", "/dev/zero"],
    ["eval", "--slates", "{slates}", "--ranker", "random", "--qrels", "/dev/zero"],
    ["eval", "--slates", "{slates}", "--ranker", "random", "--run", "bm25=/dev/zero"],
])
def test_the_commands_refuse_a_device_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    files = {"run": _write(tmp_path / "run.trec", "7 Q0 a 1 2.5 x\n"),
             "topics": _write(tmp_path / "t.tsv", "7\tfleas\n"),
             "slates": _write(tmp_path / "s.jsonl", _slate_line() + "\n")}
    args = [a.format(**files) for a in argv]
    if args[0] == "data":
        args += ["--out", str(tmp_path / "out.jsonl")]
    else:
        args += ["--no-progress", "--train", str(files["slates"])]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "WARNING" not in line]
    assert len(err) == 1 and "/dev/zero is a character device" in err[0]
    assert not (tmp_path / "out.jsonl").exists()


def test_a_slate_made_from_retrieve_results_is_what_the_gate_accepts(tmp_path: Path) -> None:
    path = _retrieved(tmp_path / "r.json", {"query": "fleas", "hits": [
        _hit("p2", rank=2, score=1.0), _hit("p1", rank=1, score=2.0)]})
    (slate,) = slates_from_retrieve_results(path)
    assert Slate.from_dict(slate.to_dict()).docids == ["p1", "p2"]


def test_eval_refuses_a_pipe_it_would_read_twice(tmp_path: Path, capsys) -> None:
    # eval reads its slates more than once (the first slate tells the rankers' kind, the
    # lines are counted): a pipe would be empty the second time and the run would wait.
    fifo = tmp_path / "slates.jsonl"
    os.mkfifo(fifo)
    assert main(["eval", "--slates", str(fifo), "--ranker", "retriever", "--no-progress"]) == 2
    assert "is a pipe: a slate file is read more than once" in capsys.readouterr().err


# -- a key given twice in one JSON object -----------------------------------------------------

_DOC = '"candidates": [{"docid": "a", "doc": {"text": "A."}}]'

#: name (of READERS) -> a file of that format whose one record gives ``key`` twice
REPEATED_KEYS: dict[str, tuple[str, str]] = {
    "topics JSONL": ('{"_id": "7", "text": "fleas", "text": "dogs"}\n', "text"),
    "corpus JSONL": ('{"_id": "a", "text": "A passage.", "_id": "b"}\n', "_id"),
    "retrieve results JSON": ('[{"query": "fleas", "query": "dogs", "hits": '
                              + json.dumps([_hit()]) + "}]", "query"),
    "retrieve results JSONL": ('{"query": "fleas", "hits": ' + json.dumps([_hit()])
                               + ', "hits": []}\n', "hits"),
    "slates": ('{"query": {"qid": "7", "text": "fleas", "qid": "8"}, ' + _DOC + "}\n", "qid"),
    "training slates": ('{"query": {"qid": "7", "text": "fleas"}, ' + _DOC + ", "
                        '"clicked": ["a"], "clicked": []}\n', "clicked"),
    "labels": ('{"qid": "7", "ranking": ["a"], "ranking": ["b"]}\n', "ranking"),
    "rankings JSONL": ('{"qid": "7", "ranking": ["a"], "qid": "8"}\n', "qid"),
    "prompt template": ('{"name": "mine", "base": "search", "base": "recommendation"}',
                        "base"),
}


@pytest.mark.parametrize("name", REPEATED_KEYS)
def test_a_key_given_twice_is_refused_by_every_json_reader(tmp_path: Path, name: str) -> None:
    # JSON kept the last value without a word: a slate's qid, a label's ranking, a
    # template's base were whichever the parser saw last.
    text, key = REPEATED_KEYS[name]
    _, filename, read = READERS[name]
    path = _write(tmp_path / filename, text)
    line = "" if filename.endswith(".json") else ":1"
    said = rf"{filename}{line}: (not a JSON prompt template \()?the key '{key}' appears twice"
    with pytest.raises(ValueError, match=said):
        read(path)


def test_a_settings_file_giving_a_key_twice_is_refused(tmp_path: Path) -> None:
    from spdrank.backbone.settings import read_json

    path = _write(tmp_path / "config.json", '{"model_type": "llama", "model_type": "gpt2"}')
    with pytest.raises(ValueError, match=r"config.json: .*the key 'model_type' appears twice"):
        read_json(path)


def test_a_request_body_giving_a_key_twice_is_refused_naming_the_key() -> None:
    from spdrank.core.validation import loads

    with pytest.raises(SlateError, match=r"the key 'query' appears twice") as raised:
        loads(b'{"query": "a", "documents": ["x"], "query": "b"}')
    assert raised.value.field == "query" and not raised.value.syntax


@pytest.mark.parametrize("name", ["a\u0000b", "two\nlines", "\u202emine", "a\u200bb"])
def test_a_template_name_with_a_control_or_format_character_is_refused(
    tmp_path: Path, name: str
) -> None:
    # Accepted, and printed raw into messages, checkpoints and label records.
    path = _write(tmp_path / "t.json", json.dumps({"name": name, "base": "search"}))
    with pytest.raises(ValueError, match=r"its name holds a control or format character") as e:
        load_template(str(path))
    assert "\n" not in str(e.value)
    assert load_template(str(_write(tmp_path / "ok.json", json.dumps(
        {"name": "my own", "base": "search"})))).name == "my own"
