"""Fuzzing every reader of a file a user brings: qrels, runs, topics, corpora, retrieve
results, slates, labels, rankings, logs, titles, candidate lists, server lists and templates.

Property-based (hypothesis), derandomized and small, so it runs the same examples every time
in seconds. A valid file is generated with what its reader must return; then it is changed in
one way whose outcome is known (a byte order mark, blank lines and CRLF endings change
nothing; a byte that is not UTF-8, a line past the bound, a record repeated or a field of the
wrong type is refused naming its line, and the first line for a repeat), or damaged in a way
whose outcome is not (truncated, a byte flipped, random bytes), where the property is only its
shape. Either way a reader returns what the file says, or raises an error the command line
prints as one line naming the file; never anything else.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from spdrank.backbone.templates import load_template
from spdrank.core.slates import SlateError, read_unique_slates
from spdrank.core.trec import read_corpus, read_qrels, read_run, read_topics, trec_order
from spdrank.core.validation import is_blank
from spdrank.datasets.candidates import read_candidate_lists
from spdrank.datasets.log import InteractionLog, read_sequences
from spdrank.datasets.search import Hit, read_retrieve_results
from spdrank.datasets.titles import read_titles
from spdrank.teacher.backends import read_rankings
from spdrank.teacher.labels import read_labels
from spdrank.teacher.servers import collect_base_urls

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=12,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- what a file may hold --------------------------------------------------------------------

#: Ids as odd as a valid one may be: visible text without whitespace, control or format
#: characters.
ids = st.text(
    st.characters(exclude_categories=["Cs", "Cc", "Cf", "Zs", "Zl", "Zp"]), min_size=1,
    max_size=8,
)
#: Text within a TSV field: anything but a tab, a line's end or a lone surrogate.
field_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\t\r\n"),
                     max_size=20)
query_text = field_text.filter(lambda t: not is_blank(t))
#: Any JSON string.
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
#: Values no id, text, rank or ranking may be.
WRONG = [None, True, [1], {"a": 1}, 1.5]


@dataclass(frozen=True)
class Format:
    """A line-based format: valid records, each one a line, and what its reader returns."""

    name: str
    filename: str
    read: Callable[[Path], Any]
    records: st.SearchStrategy[list[Any]]
    line: Callable[[Any], str]
    expected: Callable[[list[Any]], Any]
    #: A record with one field of a wrong type, as a line (None: the format has no types).
    wrong: Callable[[st.DrawFn, Any], str] | None = None
    #: Lines before the records (a header).
    header: str = ""
    #: Whether damage to the last line is a torn write, cut away (a journal's).
    torn_tail: bool = False


def _unique(records: st.SearchStrategy[Any], key: Callable[[Any], Any]) -> st.SearchStrategy:
    return st.lists(records, min_size=1, max_size=5, unique_by=key)


#: Values no ranking may be: not a list of ids.
WRONG_RANKINGS = [None, True, {"a": 1}, 1.5, "a", [None], [[1]], [True], [""]]


def _json_wrong(draw: st.DrawFn, record: dict[str, Any], fields: list[str]) -> str:
    name = draw(st.sampled_from(fields))
    bad = WRONG_RANKINGS if name == "ranking" else WRONG
    return json.dumps({**record, name: draw(st.sampled_from(bad))})


qrels_records = _unique(st.tuples(ids, ids, st.integers(-2, 1000)), lambda r: r[:2])
run_records = _unique(
    st.tuples(ids, ids, st.floats(allow_nan=False, allow_infinity=False)), lambda r: r[:2]
)
topic_records = _unique(st.tuples(ids, query_text), lambda r: r[0])
corpus_tsv_records = _unique(
    st.tuples(ids, st.one_of(st.none(), field_text), field_text), lambda r: r[0]
)
corpus_json_records = _unique(
    st.fixed_dictionaries({"_id": ids, "text": any_text}, optional={"title": any_text}),
    lambda r: r["_id"],
)
label_records = _unique(
    st.fixed_dictionaries({"qid": ids, "ranking": st.lists(ids, max_size=3)}),
    lambda r: r["qid"],
)


@st.composite
def retrieved_record(draw: st.DrawFn) -> dict[str, Any]:
    qid = draw(ids)
    docids = draw(st.lists(ids, min_size=1, max_size=3, unique=True))
    hits = [{"qid": qid, "docid": d, "content": draw(any_text), "rank": i + 1,
             "score": draw(st.floats(allow_nan=False, allow_infinity=False))}
            for i, d in enumerate(docids)]
    return {"query": draw(query_text), "hits": hits}


def _retrieved_expected(records: list[dict[str, Any]]) -> list[Any]:
    return [(r["hits"][0]["qid"], r["query"],
             [Hit(h["docid"], {"text": h["content"]}, h["score"], h["rank"]) for h in r["hits"]])
            for r in records]


def _retrieved_wrong(draw: st.DrawFn, record: dict[str, Any]) -> str:
    hits = [dict(h) for h in record["hits"]]
    name = draw(st.sampled_from(["docid", "rank", "score", "content", "qid"]))
    bad = [w for w in WRONG if not (name == "score" and (w is None or w == 1.5))]
    hits[draw(st.integers(0, len(hits) - 1))][name] = draw(st.sampled_from(bad))
    return json.dumps({**record, "hits": hits})


#: A log's ids: a ``name:type`` field would be a RecBole header's.
log_ids = ids.filter(lambda t: ":" not in t)


def _log_result(log: InteractionLog) -> tuple[list[tuple[str, list[str]]], dict[str, int]]:
    return log.users, log.item_counts


def _log_expected(
    records: list[tuple[str, list[str]]],
) -> tuple[list[tuple[str, list[str]]], dict[str, int]]:
    return ([(u, items) for u, items in records if len(items) >= 2],
            dict(Counter(item for _, items in records for item in items)))


def _corpus_json_expected(records: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for r in records:
        title = r.get("title")
        out[r["_id"]] = ({"title": title} if title and title.strip() else {}) | {"text": r["text"]}
    return out


FORMATS = [
    Format("qrels", "q.txt", read_qrels, qrels_records,
           lambda r: f"{r[0]} 0 {r[1]} {r[2]}",
           lambda rs: _grouped({(q, d): max(g, 0) for q, d, g in rs})),
    Format("run", "run.trec", read_run, run_records,
           lambda r: f"{r[0]} Q0 {r[1]} 1 {r[2]!r} tag",
           lambda rs: {q: trec_order(docs) for q, docs in
                       _grouped({(q, d): s for q, d, s in rs}).items()}),
    Format("topics TSV", "topics.tsv", read_topics, topic_records,
           lambda r: f"{r[0]}\t{r[1]}", dict),
    Format("topics JSONL", "topics.jsonl", read_topics, topic_records,
           lambda r: json.dumps({"_id": r[0], "text": r[1]}), dict,
           lambda draw, r: _json_wrong(draw, {"_id": r[0], "text": r[1]}, ["_id", "text"])),
    Format("corpus TSV", "corpus.tsv", read_corpus, corpus_tsv_records,
           lambda r: "\t".join([r[0], *([] if r[1] is None else [r[1]]), r[2]]),
           lambda rs: {d: ({} if t is None else {"title": t}) | {"text": x} for d, t, x in rs}),
    Format("corpus JSONL", "corpus.jsonl", read_corpus, corpus_json_records, json.dumps,
           _corpus_json_expected, lambda draw, r: _json_wrong(draw, r, ["_id", "text"])),
    Format("retrieve results JSONL", "r.jsonl", lambda p: list(read_retrieve_results(p)),
           _unique(retrieved_record(), lambda r: r["hits"][0]["qid"]), json.dumps,
           _retrieved_expected, _retrieved_wrong),
    Format("labels", "labels.jsonl",
           lambda p: {q: e.record["ranking"] for q, e in read_labels(p).items()},
           label_records, json.dumps, lambda rs: {r["qid"]: r["ranking"] for r in rs},
           lambda draw, r: _json_wrong(draw, r, ["qid", "ranking"]), torn_tail=True),
    Format("rankings", "rankings.jsonl", read_rankings, label_records, json.dumps,
           lambda rs: {r["qid"]: r["ranking"] for r in rs},
           lambda draw, r: _json_wrong(draw, r, ["ranking"])),
    Format("log", "log.txt", lambda p: _log_result(read_sequences(p)),
           _unique(st.tuples(log_ids, st.lists(log_ids, min_size=1, max_size=3)),
                   lambda r: r[0]),
           lambda r: " ".join([r[0], *r[1]]), _log_expected),
    Format("titles", "titles.tsv", read_titles, topic_records,
           lambda r: f"{r[0]}\t{r[1]}", lambda rs: {i: " ".join(t.split()) for i, t in rs},
           header="item_id\ttitle\n"),
]
FORMAT = {f.name: f for f in FORMATS}
#: Formats whose reader refuses a record read twice.
REPEAT_REFUSED = [f.name for f in FORMATS]
#: Formats with typed fields.
TYPED = [f.name for f in FORMATS if f.wrong is not None]


def _grouped(pairs: dict[tuple[str, str], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (q, d), value in pairs.items():
        out.setdefault(q, {})[d] = value
    return out


# -- reading ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readers")


def outcome(read: Callable[[Path], Any], path: Path) -> tuple[str, Any]:
    """``("read", result)``, or ``("refused", message)`` for an error the command line prints
    as one line (cli.main's); the message must be one line naming the file."""
    try:
        return "read", read(path)
    except (SlateError, ValueError, FileNotFoundError) as exc:
        message = str(exc)
        assert not isinstance(exc, UnicodeError), message
        assert "\n" not in message, message
        assert str(path) in message, message
        return "refused", message


def write(workdir: Path, fmt: Format, data: bytes) -> Path:
    path = workdir / fmt.filename
    path.write_bytes(data)
    return path


def render(fmt: Format, lines: list[str]) -> bytes:
    return (fmt.header + "".join(line + "\n" for line in lines)).encode("utf-8")


def refused_at(result: tuple[str, Any], path: Path, line: int) -> str:
    kind, message = result
    assert kind == "refused", f"read what should be refused: {message!r}"
    assert re.match(rf"{re.escape(str(path))}:{line}\b", message) or \
        f"{path}:{line}" in message, message
    return message


# -- changes whose outcome is known ----------------------------------------------------------


@pytest.mark.parametrize("name", FORMAT)
@FUZZ
@given(data=st.data())
def test_a_valid_file_is_read_whole_with_a_mark_blank_lines_or_crlf(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    fmt = FORMAT[name]
    records = data.draw(fmt.records)
    lines = [fmt.line(r) for r in records]
    plain = outcome(fmt.read, write(workdir, fmt, render(fmt, lines)))
    assert plain == ("read", fmt.expected(records))
    blanks = data.draw(st.lists(st.integers(0, len(lines)), max_size=3))
    for at in sorted(blanks, reverse=True):
        lines.insert(at, data.draw(st.sampled_from(["", " ", "\t"])))
    changed = render(fmt, lines)
    if data.draw(st.booleans()):
        changed = changed.replace(b"\n", b"\r\n")
    path = write(workdir, fmt, b"\xef\xbb\xbf" + changed)
    assert outcome(fmt.read, path) == plain


@pytest.mark.parametrize("name", FORMAT)
@FUZZ
@given(data=st.data())
def test_a_byte_that_is_not_utf8_is_refused_at_its_line(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    fmt = FORMAT[name]
    records = data.draw(fmt.records)
    lines = [fmt.line(r) for r in records]
    i = data.draw(st.integers(0, len(lines) - 1))
    raw = lines[i].encode("utf-8")
    at = data.draw(st.integers(0, len(raw)))
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
    encoded = [line.encode("utf-8") for line in lines]
    encoded[i] = raw[:at] + bad + raw[at:]
    path = write(workdir, fmt, fmt.header.encode() + b"".join(e + b"\n" for e in encoded))
    number = i + 1 + fmt.header.count("\n")
    if fmt.torn_tail and i == len(lines) - 1:
        if i > 0 or at >= len(b'{"qid":'):  # a torn last write: the rest is read
            assert outcome(fmt.read, path) == ("read", fmt.expected(records[:-1]))
            return
        # The only line, damaged before a record's start: no write of this journal's.
        assert "not written by this command" in refused_at(outcome(fmt.read, path), path, number)
        return
    message = refused_at(outcome(fmt.read, path), path, number)
    assert "not UTF-8" in message or "corrupt record" in message


@pytest.mark.parametrize("name", FORMAT)
@FUZZ
@given(data=st.data())
def test_a_line_past_the_bound_is_refused_at_its_line(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    fmt = FORMAT[name]
    lines = [fmt.line(r) for r in data.draw(fmt.records)]
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = lines[i] + " " * data.draw(st.integers(1, 200))  # a huge field's worth
    sizes = [len(line.encode("utf-8")) + 1 for line in lines]
    bound = max(sizes) - 1
    first = sizes.index(max(sizes))
    assume(len(fmt.header.encode()) <= bound)
    path = write(workdir, fmt, render(fmt, lines))
    with mock.patch("spdrank.core.inputs.MAX_LINE_BYTES", bound):
        message = refused_at(outcome(fmt.read, path), path, first + 1 + fmt.header.count("\n"))
    assert "a line longer than" in message


@pytest.mark.parametrize("name", REPEAT_REFUSED)
@FUZZ
@given(data=st.data())
def test_a_record_read_twice_is_refused_naming_both_lines(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    fmt = FORMAT[name]
    lines = [fmt.line(r) for r in data.draw(fmt.records)]
    i = data.draw(st.integers(0, len(lines) - 1))
    lines.append(lines[i])
    path = write(workdir, fmt, render(fmt, lines))
    skip = fmt.header.count("\n")
    message = refused_at(outcome(fmt.read, path), path, len(lines) + skip)
    assert f"{path}:{i + 1 + skip}" in message or f"line {i + 1 + skip}" in message, message


@pytest.mark.parametrize("name", TYPED)
@FUZZ
@given(data=st.data())
def test_a_field_of_a_wrong_type_is_refused_at_its_line(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    fmt = FORMAT[name]
    assert fmt.wrong is not None
    records = data.draw(fmt.records)
    lines = [fmt.line(r) for r in records]
    i = data.draw(st.integers(0, len(lines) - 1))
    lines[i] = fmt.wrong(data.draw, records[i])
    path = write(workdir, fmt, render(fmt, lines))
    refused_at(outcome(fmt.read, path), path, i + 1)


# -- damage whose outcome is not known -------------------------------------------------------

#: Every reader, line-based or not, with a file of its format.
ALL_READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    **{f.name: (f.filename, f.read) for f in FORMATS},
    "qrels JSON": ("q.json", read_qrels),
    "retrieve results JSON": ("r.json", lambda p: list(read_retrieve_results(p))),
    "slates": ("s.jsonl", lambda p: list(read_unique_slates(p))),
    "candidate lists": ("cands.txt", read_candidate_lists),
    "server list": ("servers.txt", lambda p: collect_base_urls(file=p)),
    "prompt template": ("t.json", lambda p: load_template(str(p))),
}
#: A valid file of each format, to damage.
SAMPLES = {
    "qrels": b"7 0 a 2\n7 0 b 0\n8 0 a 1\n",
    "run": b"7 Q0 a 1 2.5 bm25\n7 Q0 b 2 1.25 bm25\n8 Q0 c 1 -3e2 bm25\n",
    "topics TSV": "7\tfleas\n8\twhat is caf\u00e9\tau lait\n".encode(),
    "topics JSONL": b'{"_id": "7", "text": "fleas"}\n{"qid": 8, "query": "tides"}\n',
    "corpus TSV": b"a\tA passage.\nb\tA title\tAnother.\n",
    "corpus JSONL": b'{"_id": "a", "title": "T", "text": "A."}\n{"id": "b", "contents": "B."}\n',
    "retrieve results JSONL": (json.dumps({"query": "fleas", "hits": [
        {"qid": "7", "docid": "a", "content": "A.", "rank": 1, "score": 2.0},
        {"qid": "7", "docid": "b", "content": "B.", "rank": 2, "score": 1.0}]}) + "\n").encode(),
    "labels": b'{"qid": "7", "ranking": ["a", "b"]}\n{"qid": "8", "ranking": []}\n',
    "rankings": b'{"qid": "7", "ranking": ["a", "b"]}\n{"qid": "8", "ranking": ["c"]}\n',
    "log": b"u1 i1 i2 i3\nu2 i2 i4\n",
    "titles": b"item_id\ttitle\ni1\tArgan oil\ni2\tA &amp; B\n",
    "qrels JSON": b'{"7": {"a": 2, "b": "1"}, "8": {"c": 0}}',
    "retrieve results JSON": json.dumps([{"query": "fleas", "hits": [
        {"qid": "7", "docid": "a", "content": "A.", "rank": 1, "score": 2.0}]}]).encode(),
    "slates": b"".join((json.dumps({"query": {"qid": q, "text": "fleas"}, "candidates": [
        {"docid": "a", "doc": {"text": "A."}}, {"docid": "b", "doc": {"text": "B."}}]})
        + "\n").encode() for q in ("7", "8")),
    "candidate lists": b"u1 i1:0.5 i2:0.25\nu2 i3:1 i1:0\n",
    "server list": b"http://localhost:8000/v1  # one\nhttp://127.0.0.1:9000/v1\n",
    "prompt template": b'{"name": "mine", "base": "search", "instruction": "Rank {n}."}',
}


def test_every_sample_is_read(workdir: Path) -> None:
    """The damage below starts from files each reader reads."""
    assert SAMPLES.keys() == ALL_READERS.keys()
    for name, (filename, read) in ALL_READERS.items():
        path = workdir / filename
        path.write_bytes(SAMPLES[name])
        assert outcome(read, path)[0] == "read", name


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` cut short, a byte changed or inserted, or replaced by random bytes."""
    how = draw(st.sampled_from(["cut", "flip", "insert", "random"]))
    if how == "random":
        return draw(st.binary(max_size=200))
    at = draw(st.integers(0, max(len(data) - 1, 0)))
    if how == "cut":
        return data[:at]
    byte = bytes([draw(st.integers(0, 255))])
    if how == "insert":
        return data[:at] + byte + data[at:]
    return data[:at] + byte + data[at + 1:]


@pytest.mark.parametrize("name", ALL_READERS)
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_a_damaged_file_is_read_or_refused_in_one_line(
    workdir: Path, name: str, data: st.DataObject
) -> None:
    filename, read = ALL_READERS[name]
    path = workdir / filename
    path.write_bytes(data.draw(damaged(SAMPLES[name])))
    outcome(read, path)


@pytest.mark.parametrize("name", ALL_READERS)
@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "directory"])
def test_a_special_file_is_refused_in_one_line(tmp_path: Path, name: str, special: str) -> None:
    path = tmp_path if special == "directory" else Path(special)
    kind, message = outcome(ALL_READERS[name][1], path)
    assert kind == "refused" and " is a " in message, message
