"""Dataset builders: slates from interaction logs, and the bundled Amazon Beauty 2014."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from spdrank.commands import data as data_command
from spdrank.core.files import sha256_file
from spdrank.core.slates import SlateError, load_slates
from spdrank.datasets import build as build_module
from spdrank.datasets.build import build_from_files
from spdrank.datasets.candidates import read_candidate_lists
from spdrank.datasets.log import read_sequences
from spdrank.datasets.options import BuildOptions
from spdrank.datasets.split import eval_count, split_users, validation_users, warn_small_eval
from spdrank.datasets.titles import clean_title, read_titles
from spdrank.rankers.baselines import CooccurrenceRanker, PopularityRanker

OUTPUTS = ("train.jsonl", "eval.jsonl", "manifest.json")


# -- helpers --------------------------------------------------------------------------------


def _log(n_users: int = 40, n_items: int = 200, length: int = 8) -> list[str]:
    """``n_users`` lines of ``length`` distinct items each, deterministic."""
    lines = []
    for u in range(n_users):
        items = [f"i{(u * 7 + k * 13) % n_items}" for k in range(length)]
        assert len(set(items)) == length
        lines.append(" ".join([f"u{u}", *items]))
    return lines


def _titles(n_items: int = 200) -> list[str]:
    return [f"i{i}\tTitle of item {i}" for i in range(n_items)]


def _write(path: Path, lines: list[str], header: str | None = None) -> Path:
    text = "".join(line + "\n" for line in ([header] if header else []) + lines)
    path.write_text(text, encoding="utf-8")
    return path


def _inputs(tmp_path: Path, seq_lines=None, title_lines=None) -> tuple[Path, Path]:
    seqs = _write(tmp_path / "seq.txt", _log() if seq_lines is None else seq_lines)
    titles = _write(
        tmp_path / "titles.tsv", _titles() if title_lines is None else title_lines, "item_id\ttitle"
    )
    return seqs, titles


def _build(tmp_path: Path, out: str = "out", candidate_file=None, **options):
    seqs, titles = tmp_path / "seq.txt", tmp_path / "titles.tsv"
    if not seqs.exists():
        _inputs(tmp_path)
    options.setdefault("candidates", 10)
    return build_from_files(
        seqs, titles, tmp_path / out, BuildOptions(**options), candidate_file=candidate_file,
        progress=False,
    )


def _slates(out: Path) -> list:
    return load_slates(out / "train.jsonl") + load_slates(out / "eval.jsonl")


def _user_items(seq_path: Path) -> dict[str, list[str]]:
    return {u: items for u, items in read_sequences(seq_path).users}


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


# -- slates from a log ----------------------------------------------------------------------


def test_counts_and_manifest(tmp_path):
    result = _build(tmp_path)
    c = result.manifest["counts"]
    assert (c["users"], c["train"], c["eval"]) == (40, 38, 2)
    n_items = len(read_sequences(tmp_path / "seq.txt").item_counts)
    assert (c["items"], c["interactions"]) == (n_items, 320)
    assert (c["empty_lines"], c["short_users"]) == (0, 0)
    assert (c["untitled_items"], c["unknown_items"]) == (0, 0)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest == result.manifest
    assert manifest["parameters"] == {
        "history": 10, "candidates": 10, "negatives": "uniform", "seed": 0, "eval_fraction": 0.05,
    }
    assert manifest["inputs"]["sequences"]["sha256"] == sha256_file(tmp_path / "seq.txt")
    assert manifest["inputs"]["titles"]["sha256"] == sha256_file(tmp_path / "titles.tsv")
    for name in ("train.jsonl", "eval.jsonl"):
        out = manifest["outputs"][name]
        assert out["sha256"] == sha256_file(tmp_path / "out" / name)
        assert out["candidates"] == 10 * out["slates"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(OUTPUTS)


@pytest.mark.parametrize("negatives", ["uniform", "popularity"])
def test_target_is_a_candidate_and_negatives_are_new_to_the_user(tmp_path, negatives):
    _build(tmp_path, negatives=negatives)
    items = _user_items(tmp_path / "seq.txt")
    slates = _slates(tmp_path / "out")
    assert len(slates) == 40
    for slate in slates:
        user_items = items[slate.query.qid]
        target = user_items[-1]
        assert slate.clicked == [target]
        assert target in slate.docids
        assert len(slate.docids) == 10 == len(set(slate.docids))
        assert not (set(slate.docids) - {target}) & set(user_items)
        assert slate.teacher is None
        assert all(c.score == 0.0 for c in slate.candidates)
        assert all(c.doc == {"title": f"Title of item {c.docid[1:]}"} for c in slate.candidates)


def test_history_cut_and_text(tmp_path):
    seq = _log(n_users=30, length=15)
    _inputs(tmp_path, seq_lines=seq)
    _build(tmp_path, history=4)
    slate = next(s for s in _slates(tmp_path / "out") if s.query.qid == "u3")
    items = seq[3].split()[1:]
    assert slate.query.history == items[-5:-1]  # the 4 items before the target, oldest first
    assert slate.query.text == "\n".join(
        f"{k}. Title of item {item[1:]}" for k, item in enumerate(items[-5:-1], start=1)
    )


@pytest.mark.parametrize("n_items", [2, 3, 8, 11, 12])
def test_history_shorter_than_the_cut(tmp_path, n_items):
    user = " ".join(["u0", *(f"i{k}" for k in range(1, n_items + 1))])
    _inputs(tmp_path, seq_lines=[user, *_log()[1:]])
    _build(tmp_path, history=10)
    slate = next(s for s in _slates(tmp_path / "out") if s.query.qid == "u0")
    expected = [f"i{k}" for k in range(1, n_items)][-10:]
    assert slate.query.history == expected
    assert slate.query.text == "\n".join(
        f"{j}. Title of item {item[1:]}" for j, item in enumerate(expected, start=1)
    )
    assert slate.clicked == [f"i{n_items}"]


def test_history_zero(tmp_path):
    _build(tmp_path, history=0)
    assert all(s.query.history == [] and s.query.text == "" for s in _slates(tmp_path / "out"))


def test_candidates_are_shuffled(tmp_path):
    _build(tmp_path)
    positions = Counter(s.docids.index(s.clicked[0]) for s in _slates(tmp_path / "out"))
    assert len(positions) > 3  # the target moves around
    assert max(positions.values()) < 20


@pytest.mark.parametrize(
    ("n_users", "fraction", "n_eval"), [(40, 0.05, 2), (100, 0.29, 29), (41, 0.1, 4), (40, 0.0, 0)]
)
def test_split_sizes(tmp_path, n_users, fraction, n_eval):
    _inputs(tmp_path, seq_lines=_log(n_users=n_users))
    result = _build(tmp_path, eval_fraction=fraction)
    assert (result.counts["train"], result.counts["eval"]) == (n_users - n_eval, n_eval)
    train = {s.query.qid for s in load_slates(tmp_path / "out" / "train.jsonl")}
    evals = {s.query.qid for s in load_slates(tmp_path / "out" / "eval.jsonl")}
    assert len(evals) == n_eval and not train & evals and len(train | evals) == n_users
    assert eval_count(n_users, fraction) == n_eval


def test_deterministic(tmp_path):
    _build(tmp_path, out="a", negatives="popularity")
    _build(tmp_path, out="b", negatives="popularity")
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")


def test_a_users_slate_does_not_depend_on_line_order(tmp_path):
    _build(tmp_path, out="a")
    _write(tmp_path / "seq.txt", list(reversed(_log())))
    _build(tmp_path, out="b")
    a = {s.query.qid: s.to_dict() for s in _slates(tmp_path / "a")}
    b = {s.query.qid: s.to_dict() for s in _slates(tmp_path / "b")}
    assert a == b


def test_different_seed_differs(tmp_path):
    _build(tmp_path, out="a", seed=0)
    _build(tmp_path, out="b", seed=1)
    a, b = _snapshot(tmp_path / "a"), _snapshot(tmp_path / "b")
    assert a["train.jsonl"] != b["train.jsonl"]
    assert a["eval.jsonl"] != b["eval.jsonl"]


def test_popularity_prefers_popular_items(tmp_path):
    # i0 is in 60 users' logs but never the target of u-others; rare items appear once.
    lines = [f"p{u} i0 h{u}" for u in range(60)]
    lines += [f"u{u} r{u} s{u}" for u in range(60)]
    titles = ["i0\tPopular"] + [f"{p}{u}\tT" for p in "hrs" for u in range(60)]
    _inputs(tmp_path, seq_lines=lines, title_lines=titles)
    _build(tmp_path, out="pop", negatives="popularity", candidates=5)
    _build(tmp_path, out="uni", negatives="uniform", candidates=5)
    users = [f"u{u}" for u in range(60)]

    def share(out):
        slates = {s.query.qid: s for s in _slates(tmp_path / out)}
        return sum("i0" in slates[u].docids for u in users) / len(users)

    assert share("pop") > 0.4  # weight 60 of 240 interactions, 4 draws: about 1 - 0.75**4
    assert share("uni") < 0.15  # 1 of 181 items, 4 draws: about 0.02


def test_too_few_items_for_negatives(tmp_path):
    _inputs(tmp_path, seq_lines=["u0 a b c", "u1 c d e"], title_lines=[])
    with pytest.raises(ValueError, match=r"user 'u0': only 2 .* cannot draw 9 negatives"):
        _build(tmp_path)
    assert not (tmp_path / "out").exists()
    result = _build(tmp_path, candidates=3)  # exactly enough: each draws the other 2 items
    assert all(len(s) == 3 for s in _slates(tmp_path / "out"))
    assert result.counts["untitled_items"] == 5


# -- candidate file -------------------------------------------------------------------------


def test_candidate_file(tmp_path):
    seq = _log(n_users=6)
    many = [f"c{k}" for k in range(30)]  # retriever items, none in the log
    _inputs(tmp_path, seq_lines=seq, title_lines=_titles() + [f"{c}\tRetrieved {c}" for c in many])
    items = {line.split()[0]: line.split()[1:] for line in seq}
    lists = [
        f"u0 {' '.join(many[:5])}",  # target missing: added
        f"u1 {' '.join(many[:20])} {items['u1'][-1]}",  # target beyond the cut: added
        f"u2 {items['u2'][-1]} {' '.join(many[:20])}",  # target first, list cut
        f"u3 {' '.join(many[:3])} {many[0]} {items['u3'][-1]}",  # a repeat, short list
        f"u4 {' '.join(many[:9])}",
        "",
        "stranger i1 i2",  # not in the log
    ]
    cands = _write(tmp_path / "cands.txt", lists)
    result = _build(tmp_path, candidate_file=cands, eval_fraction=0.0)
    slates = {s.query.qid: s for s in _slates(tmp_path / "out")}
    assert sorted(slates) == ["u0", "u1", "u2", "u3", "u4"]  # u5 has no list: skipped
    assert set(slates["u0"].docids) == {*many[:5], items["u0"][-1]}
    assert set(slates["u1"].docids) == {*many[:9], items["u1"][-1]}
    assert set(slates["u2"].docids) == {*many[:9], items["u2"][-1]}
    assert set(slates["u3"].docids) == {*many[:3], items["u3"][-1]}
    assert set(slates["u4"].docids) == {*many[:9], items["u4"][-1]}
    for user, slate in slates.items():
        assert slate.clicked == [items[user][-1]]
    c = result.counts
    assert c["users_without_candidate_list"] == 1
    assert c["unused_candidate_lists"] == 1
    assert c["repeated_candidates_dropped"] == 1
    assert c["candidate_list_empty_lines"] == 1
    assert (c["targets_added"], c["lists_cut"], c["short_lists"]) == (3, 2, 2)
    assert c["targets_below_cut"] == 1
    assert result.manifest["parameters"]["negatives"] == "candidate-file"
    assert "candidate_file" in result.manifest["inputs"]
    assert c["untitled_items"] == 0
    assert slates["u0"].candidates[0].doc["title"].startswith(("Retrieved", "Title of item"))


def test_candidate_file_duplicate_user(tmp_path):
    cands = _write(tmp_path / "cands.txt", ["u0 i1", "u1 i2", "u0 i3"])
    with pytest.raises(SlateError, match=r"cands.txt:3: duplicate user 'u0' \(first seen at"):
        read_candidate_lists(cands)


# -- input handling -------------------------------------------------------------------------


def test_untitled_and_unknown_items(tmp_path):
    titles = _titles()
    titles[5] = "i5\t   "  # an empty title
    del titles[7]  # i7 has no row at all
    _inputs(tmp_path, title_lines=titles)
    result = _build(tmp_path, history=10)
    assert (result.counts["untitled_items"], result.counts["unknown_items"]) == (2, 1)
    assert result.manifest["untitled_examples"] == ["i5", "i7"]
    slates = {s.query.qid: s for s in _slates(tmp_path / "out")}
    assert slates["u1"].query.history[0] == "i7"  # u1: i7 i20 ... i98
    assert slates["u1"].query.text.startswith("1. Item i7\n2. Title of item 20\n")
    assert "\n6. Item i5\n" in slates["u20"].query.text  # u20: ... i192 i5 i18 i31
    docs = {c.docid: c.doc["title"] for s in _slates(tmp_path / "out") for c in s.candidates}
    assert docs.get("i5", "Item i5") == "Item i5" and docs.get("i7", "Item i7") == "Item i7"


def test_empty_lines_and_short_users(tmp_path):
    lines = _log()
    lines[3:3] = ["", "   ", "short i1", "lonely"]
    _inputs(tmp_path, seq_lines=lines)
    result = _build(tmp_path)
    c = result.counts
    assert (c["lines"], c["empty_lines"], c["short_users"], c["users"]) == (44, 2, 2, 40)
    assert c["train"] + c["eval"] == 40
    assert {"short", "lonely"}.isdisjoint(s.query.qid for s in _slates(tmp_path / "out"))


def test_titles_are_cleaned(tmp_path):
    assert clean_title("  Caf&eacute;\t &amp;  Co &#9733;\n") == "Café & Co ★"
    path = _write(tmp_path / "t.tsv", ["a\tL&#39;Or&eacute;al  Paris", "b\t"], "id\ttitle")
    assert read_titles(path) == {"a": "L'Oréal Paris", "b": ""}


@pytest.mark.parametrize(
    ("lines", "line", "problem"),
    [
        (["item_id\ttitle", "a\tfine", "no tab here"], 3, "expected 2 tab-separated fields"),
        (["item_id\ttitle", "a\tone\ttwo"], 2, "got 3"),
        (["just a header"], 1, "in the header line"),
        (["item_id\ttitle", "\tno id"], 2, "empty item id"),
        (["item_id\ttitle", "a\tx", "a\ty"], 3, "item 'a' has a second title (first at line 2)"),
    ],
)
def test_malformed_titles(tmp_path, lines, line, problem):
    path = _write(tmp_path / "t.tsv", lines)
    with pytest.raises(SlateError) as info:
        read_titles(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert problem in str(info.value)


def test_empty_titles_file(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("", encoding="utf-8")
    with pytest.raises(SlateError, match="empty: expected a header line"):
        read_titles(path)


def test_not_utf8(tmp_path):
    path = tmp_path / "seq.txt"
    path.write_bytes(b"u1 a b\nu2 \xff\xfe c\n")
    with pytest.raises(SlateError, match=r"seq.txt:2: not UTF-8"):
        read_sequences(path)


def test_duplicate_user_names_file_and_line(tmp_path):
    seq = _log(n_users=5)
    seq.append(seq[2])
    path = _write(tmp_path / "seq.txt", seq)
    with pytest.raises(SlateError) as info:
        read_sequences(path)
    assert str(info.value) == (
        f"{path}:6: duplicate user 'u2' (first seen at line 3): each user must be on one line"
    )


def test_a_first_line_of_column_names_is_skipped_with_a_warning(tmp_path, caplog):
    path = _write(tmp_path / "seq.txt", ["u1 i1 i2 i3", "user i2 i3"], header="user_id item_id_list")
    with caplog.at_level("WARNING", logger="spdrank.datasets.log"):
        log = read_sequences(path)
    assert log.users == [("u1", ["i1", "i2", "i3"]), ("user", ["i2", "i3"])]
    assert "item_id_list" not in log.item_counts
    assert log.lines == 3
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"{path}:1: skipped 'user_id item_id_list': ")


def test_a_first_line_of_ids_is_data_and_warns_nothing(tmp_path, caplog):
    path = _write(tmp_path / "seq.txt", ["u1 i1 i2", "user_id item_ids"])
    with caplog.at_level("WARNING", logger="spdrank.datasets.log"):
        log = read_sequences(path)
    assert log.users == [("u1", ["i1", "i2"])]
    assert log.item_counts == {"i1": 1, "i2": 1, "item_ids": 1}
    assert caplog.records == []


def test_out_is_a_file(tmp_path):
    (tmp_path / "out").write_text("keep me", encoding="utf-8")
    with pytest.raises(ValueError, match="not a directory"):
        _build(tmp_path)
    assert (tmp_path / "out").read_text(encoding="utf-8") == "keep me"


def test_missing_input_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_sequences(tmp_path / "nope.txt")


def test_bad_options():
    with pytest.raises(ValueError, match="negatives must be one of"):
        BuildOptions(negatives="hard")
    for candidates in (0, 1):
        with pytest.raises(ValueError, match="candidates must be >= 2"):
            BuildOptions(candidates=candidates)
    with pytest.raises(ValueError, match="eval_fraction"):
        BuildOptions(eval_fraction=1.5)


# -- errors leave the previous output alone -------------------------------------------------


def test_input_error_leaves_previous_output(tmp_path):
    _build(tmp_path)
    before = _snapshot(tmp_path / "out")
    seq = _log()
    seq.append(seq[0])
    _write(tmp_path / "seq.txt", seq)
    with pytest.raises(SlateError, match="duplicate user"):
        _build(tmp_path)
    _write(tmp_path / "seq.txt", _log())
    _write(tmp_path / "titles.tsv", ["item_id\ttitle", "broken line"])
    with pytest.raises(SlateError, match="titles.tsv:2"):
        _build(tmp_path)
    assert _snapshot(tmp_path / "out") == before


def test_error_half_way_leaves_previous_output(tmp_path, monkeypatch):
    _build(tmp_path)
    before = _snapshot(tmp_path / "out")
    real = build_module.dumps_slate
    calls = {"n": 0}

    def flaky(slate):
        calls["n"] += 1
        if calls["n"] == 25:
            raise OSError("disk full")
        return real(slate)

    monkeypatch.setattr(build_module, "dumps_slate", flaky)
    with pytest.raises(OSError, match="disk full"):
        _build(tmp_path, seed=5)
    assert calls["n"] == 25
    assert _snapshot(tmp_path / "out") == before  # nothing replaced, no temporaries left


def test_error_on_a_fresh_directory_leaves_no_files(tmp_path, monkeypatch):
    _inputs(tmp_path)
    monkeypatch.setattr(build_module, "dumps_slate", lambda slate: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        _build(tmp_path, out="fresh")
    assert list((tmp_path / "fresh").iterdir()) == []


# -- the command ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spdrank")
    data_command.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_command_sequences(tmp_path, capsys):
    seqs, titles = _inputs(tmp_path)
    out = tmp_path / "cli"
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out", str(out),
         "--candidates", "8", "--history", "3", "--negatives", "popularity", "--seed", "3",
         "--eval-fraction", "0.1"]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "36 train + 4 eval slates" in printed and str(out / "train.jsonl") in printed
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["parameters"] == {
        "history": 3, "candidates": 8, "negatives": "popularity", "seed": 3, "eval_fraction": 0.1,
    }
    assert all(c.features is None for s in _slates(out) for c in s.candidates)
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out",
         str(tmp_path / "featured"), "--features", "--no-progress"]
    )
    assert args.func(args) == 0
    featured = _slates(tmp_path / "featured")
    names = {"popularity", "cooccurrence", "transition", "title_similarity"}
    assert all(set(c.features) == names for s in featured for c in s.candidates)


def test_command_candidate_file(tmp_path, capsys):
    seqs, titles = _inputs(tmp_path)
    cands = _write(tmp_path / "c.txt", [f"u{u} i1 i2 i3" for u in range(30)])
    out = tmp_path / "o"
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out",
         str(out), "--candidate-file", str(cands), "--candidates", "3", "--no-progress"]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "from the candidate file" in printed
    assert "10 users without a candidate list" in printed
    assert all(len(s) == 3 for s in _slates(out))


def test_command_candidate_file_and_negatives_exclude(tmp_path):
    seqs, titles = _inputs(tmp_path)
    cands = _write(tmp_path / "c.txt", ["u0 i1"])
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out",
         str(tmp_path / "o"), "--candidate-file", str(cands), "--negatives", "uniform"]
    )
    with pytest.raises(ValueError, match="exclude each other"):
        args.func(args)


@pytest.mark.parametrize(
    "bad", [["--candidates", "0"], ["--eval-fraction", "2"], ["--history", "-1"]]
)
def test_command_rejects_bad_numbers(tmp_path, bad):
    with pytest.raises(SystemExit):
        _parser().parse_args(["data", "beauty", "--out", str(tmp_path), *bad])


# -- upstream features ----------------------------------------------------------------------


def _log1p(x: float) -> float:
    return round(math.log1p(x), 6)


INTERACTIONS = ("popularity", "cooccurrence", "transition")


def _interactions(features: dict[str, float]) -> dict[str, float]:
    """The interaction features of a candidate (``title_similarity`` has its own tests)."""
    return {k: features[k] for k in INTERACTIONS}


def _assert_features_from_others(slate, train) -> None:
    """``slate``'s features equal the baselines' scores fitted on the OTHER users' slates."""
    rest = [s for s in train if s.query.qid != slate.query.qid]
    popularity, cooccurrence = PopularityRanker(), CooccurrenceRanker()
    transition = CooccurrenceRanker(window=1, recent=1, backward=0.0)
    for ranker in (popularity, cooccurrence, transition):
        ranker.fit(rest)
    expected = [
        {"popularity": _log1p(p), "cooccurrence": _log1p(c), "transition": _log1p(t)}
        for p, c, t in zip(
            popularity.scores(slate), cooccurrence.scores(slate), transition.scores(slate)
        )
    ]
    assert [_interactions(c.features) for c in slate.candidates] == expected, slate.query.qid


def test_features_by_hand_leave_the_slates_own_user_out(tmp_path):
    # Training sequences (history + target): u1 a b c, u2 a b d, u3 b c; u4 is the eval user.
    # Counts over all three: a 2, b 3, c 2, d 1. Co-occurrence (window 20, forward 1,
    # backward 0.5): a->b 2, a->c 1, a->d 1, b->a 1, b->c 2, b->d 1, c->a .5, c->b 1, ...
    assert split_users(["u1", "u2", "u3", "u4"], 0.25, seed=0) == {"u4"}
    _inputs(tmp_path, seq_lines=["u1 a b c", "u2 a b d", "u3 b c", "u4 a c"], title_lines=[])
    cands = _write(tmp_path / "c.txt", ["u1 c d e", "u2 d c e", "u3 c a e", "u4 c d e"])
    result = _build(tmp_path, candidate_file=cands, candidates=3, eval_fraction=0.25,
                    features=True)
    features = {
        s.query.qid: {c.docid: _interactions(c.features) for c in s.candidates}
        for s in _slates(result.out_dir)
    }
    # u1 (train), history [a, b]: without u1's own a b c, the counts are c 1, d 1, e 0 and
    # co(b->c) = 1, co(a->c) = 0, co(b->d) = 1, co(a->d) = 1; the most recent item (b)
    # weighs 1, the one before (a) 0.8. Counting u1 too would give c 2 and 1 + 1 + 0.8 * 1:
    # the target ahead of every negative, read off the label. Transition counts the pairs
    # (last history item -> candidate) adjacent in a sequence: b->d (u2), b->c (u3).
    zero = {"popularity": 0.0, "cooccurrence": 0.0, "transition": 0.0}
    assert features["u1"] == {
        "c": {"popularity": _log1p(1), "cooccurrence": _log1p(1 * 1 + 0.8 * 0),
              "transition": _log1p(1)},
        "d": {"popularity": _log1p(1), "cooccurrence": _log1p(1 * 1 + 0.8 * 1),
              "transition": _log1p(1)},
        "e": zero,
    }
    # u2 (train), history [a, b], target d: without a b d, d is never counted at all.
    assert features["u2"] == {
        "d": zero,
        "c": {"popularity": _log1p(2), "cooccurrence": _log1p(1 * 2 + 0.8 * 1),
              "transition": _log1p(2)},
        "e": zero,
    }
    # u3 (train), history [b], target c: without b c; a never came right after b.
    assert features["u3"] == {
        "c": {"popularity": _log1p(1), "cooccurrence": _log1p(1), "transition": _log1p(1)},
        "a": {"popularity": _log1p(2), "cooccurrence": _log1p(1), "transition": 0.0},
        "e": zero,
    }
    # u4 (eval), history [a]: its sequence was never counted, so nothing is left out; a is
    # followed by b only.
    assert features["u4"] == {
        "c": {"popularity": _log1p(2), "cooccurrence": _log1p(1), "transition": 0.0},
        "d": {"popularity": _log1p(1), "cooccurrence": _log1p(1), "transition": 0.0},
        "e": zero,
    }
    assert result.manifest["parameters"]["features"] == [
        "popularity", "cooccurrence", "transition", "title_similarity",
    ]
    assert "own user out" in result.manifest["policies"]["features"]


def test_features_equal_the_baselines_fitted_without_the_slates_user(tmp_path):
    """Every slate's features are the popularity and co-occurrence baselines' scores, fitted on
    the training slates other than its own: exactly, train and eval alike."""
    _inputs(tmp_path, seq_lines=_log(n_items=25))  # few items: candidates co-occur often
    _build(tmp_path, history=3, eval_fraction=0.25, features=True)
    train = load_slates(tmp_path / "out" / "train.jsonl")
    evals = load_slates(tmp_path / "out" / "eval.jsonl")
    assert len(train) == 30 and len(evals) == 10
    for slate in train + evals:
        _assert_features_from_others(slate, train)
    assert sum(c.features["cooccurrence"] > 0 for s in train for c in s.candidates) > 50


def test_features_are_byte_identical_across_rebuilds_and_hash_seeds(tmp_path):
    _inputs(tmp_path, seq_lines=_log(n_items=25))
    _build(tmp_path, out="a", history=3, features=True)
    code = (
        "import sys; from spdrank.datasets.build import build_from_files; "
        "from spdrank.datasets.options import BuildOptions; "
        "build_from_files(sys.argv[1], sys.argv[2], sys.argv[3], "
        "BuildOptions(candidates=10, history=3, features=True), progress=False)"
    )
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "seq.txt"), str(tmp_path / "titles.tsv"),
         str(tmp_path / "b")],
        env={**os.environ, "PYTHONHASHSEED": "4242"}, check=True,
    )
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")
    _build(tmp_path, out="plain", history=3)
    plain, featured = _slates(tmp_path / "plain"), _slates(tmp_path / "a")
    for p, f in zip(plain, featured):  # the same slates, only with features
        assert all(c.features is None for c in p.candidates)
        for c in f.candidates:
            c.features = None
        assert p == f


# -- the validation split -------------------------------------------------------------------


def _lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_validation_moves_whole_training_users_out_of_train(tmp_path):
    plain = _build(tmp_path, out="plain", eval_fraction=0.1)
    split = _build(tmp_path, out="split", eval_fraction=0.1, validation=5)
    c = split.counts
    assert (c["train"], c["valid"], c["eval"]) == (31, 5, 4)
    train, valid = load_slates(split.train_path), load_slates(split.valid_path)
    evals = {s.query.qid for s in load_slates(split.eval_path)}
    valid_users = {s.query.qid for s in valid}
    assert len(valid_users) == 5
    assert not valid_users & {s.query.qid for s in train} and not valid_users & evals
    items = _user_items(tmp_path / "seq.txt")
    assert all(s.clicked == [items[s.query.qid][-1]] for s in valid)  # the user's last item
    # The same slates, only sorted into three files: eval as before, train = train + valid.
    assert _lines_of(split.eval_path) == _lines_of(plain.eval_path)
    assert sorted(_lines_of(split.train_path) + _lines_of(split.valid_path)) == sorted(
        _lines_of(plain.train_path)
    )
    manifest = json.loads(split.manifest_path.read_text(encoding="utf-8"))
    assert manifest["parameters"]["validation"] == 5
    assert "valid.jsonl" in manifest["policies"]["validation"]
    assert manifest["outputs"]["valid.jsonl"] == {
        "slates": 5, "candidates": 50, "sha256": sha256_file(split.valid_path),
    }
    assert "validation" not in plain.manifest["parameters"] and "valid" not in plain.counts
    assert plain.valid_path is None and not (tmp_path / "plain" / "valid.jsonl").exists()


def test_validation_users_are_seeded_and_do_not_depend_on_line_order(tmp_path):
    a = _build(tmp_path, out="a", validation=6)
    _write(tmp_path / "seq.txt", list(reversed(_log())))
    b = _build(tmp_path, out="b", validation=6)
    assert sorted(_lines_of(a.valid_path)) == sorted(_lines_of(b.valid_path))  # file order: input's
    other = _build(tmp_path, out="c", validation=6, seed=1)
    qids = {s.query.qid for s in load_slates(a.valid_path)}
    assert qids != {s.query.qid for s in load_slates(other.valid_path)}
    train_users = [f"u{u}" for u in range(40) if f"u{u}" not in split_users(
        [f"u{u}" for u in range(40)], 0.05, seed=0)]
    assert qids == validation_users(reversed(train_users), 6, seed=0)


def test_validation_cannot_take_every_training_user(tmp_path):
    with pytest.raises(ValueError, match=r"--validation 38 would take all 38 training users"):
        _build(tmp_path, validation=38)
    assert not (tmp_path / "out").exists()
    assert _build(tmp_path, validation=37).counts["train"] == 1
    with pytest.raises(ValueError, match="validation must be >= 0"):
        BuildOptions(validation=-1)


def test_features_never_count_a_validation_target(tmp_path):
    # v's last item z appears in no other sequence. Counted, it would make z popular and
    # co-occurring with y in every slate showing it; as a validation user, v is never counted.
    log = ["u1 a b c", "u2 a b d", "u3 b c", "u4 a c", "v x y z"]
    users = ["u1", "u2", "u3", "u4", "v"]
    assert split_users(users, 0.2, seed=16) == {"u4"}
    assert validation_users(["u1", "u2", "u3", "v"], 1, seed=16) == {"v"}
    _inputs(tmp_path, seq_lines=log, title_lines=[])
    cands = _write(tmp_path / "c.txt", [f"{u} z c d" for u in users])
    result = _build(tmp_path, candidate_file=cands, candidates=3, eval_fraction=0.2, seed=16,
                    validation=1, features=True)
    slates = {s.query.qid: s for s in _slates(result.out_dir) + load_slates(result.valid_path)}
    assert {s.query.qid for s in load_slates(result.valid_path)} == {"v"}
    for slate in slates.values():
        z = next(c for c in slate.candidates if c.docid == "z")
        assert _interactions(z.features) == {
            "popularity": 0.0, "cooccurrence": 0.0, "transition": 0.0,
        }, slate.query.qid
    # v's own features, like an eval user's, are those of every training user (u1, u2, u3):
    # c 2, d 1; its history (x, y) co-occurs with nothing.
    assert {c.docid: _interactions(c.features) for c in slates["v"].candidates}["c"] == {
        "popularity": _log1p(2), "cooccurrence": 0.0, "transition": 0.0,
    }


def test_with_validation_features_equal_the_baselines_fitted_on_train(tmp_path):
    """Baselines fitted on train.jsonl see exactly the features' counts, in every split."""
    _inputs(tmp_path, seq_lines=_log(n_items=25))
    result = _build(tmp_path, history=3, eval_fraction=0.25, validation=8, features=True)
    train = load_slates(result.train_path)
    others = load_slates(result.valid_path) + load_slates(result.eval_path)
    assert (len(train), len(others)) == (22, 18)
    for slate in train + others:
        _assert_features_from_others(slate, train)


def test_command_validation(tmp_path, capsys):
    seqs, titles = _inputs(tmp_path)
    out = tmp_path / "cli"
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out",
         str(out), "--validation", "3", "--no-progress"]
    )
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "35 train + 3 valid + 2 eval slates" in printed and str(out / "valid.jsonl") in printed
    with pytest.raises(SystemExit):
        _parser().parse_args(["data", "beauty", "--out", str(tmp_path), "--validation", "-1"])


# -- the bundled Beauty ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def beauty_builds(tmp_path_factory):
    """Two builds: one here, one in a process with another hash seed, side by side."""
    from spdrank.datasets.beauty import build_beauty

    root = tmp_path_factory.mktemp("beauty")
    code = (
        "import sys; from spdrank.datasets.beauty import build_beauty; "
        "build_beauty(sys.argv[1], progress=False)"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code, str(root / "b")],
        env={**os.environ, "PYTHONHASHSEED": "4242"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        here = build_beauty(root / "a", progress=False)
        _, err = other.communicate(timeout=600)
    finally:
        if other.poll() is None:
            other.kill()
    assert other.returncode == 0, err.decode(errors="replace")
    return here, root / "b"


@pytest.mark.slow  # builds the whole bundled Beauty, twice
def test_beauty_counts(beauty_builds):
    result = beauty_builds[0]
    c = result.counts
    assert (c["train"], c["eval"]) == (21_245, 1_118)
    assert (c["users"], c["items"], c["interactions"]) == (22_363, 12_101, 198_502)
    assert (c["untitled_items"], c["unknown_items"]) == (7, 0)
    for path, expected in ((result.train_path, 21_245), (result.eval_path, 1_118)):
        n = 0
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                slate = json.loads(line)
                docids = [c["docid"] for c in slate["candidates"]]
                assert len(docids) == 50 == len(set(docids))
                assert slate["clicked"][0] in docids
                n += 1
        assert n == expected
    first = load_slates(result.eval_path, limit=1)[0]
    assert 1 <= len(first.query.history) <= 10
    assert first.query.text.startswith("1. ")


@pytest.mark.slow
def test_beauty_is_byte_identical(beauty_builds):
    here, other = beauty_builds
    # The default build is pinned: options added later (e.g. --features) must leave it as is.
    outputs = here.manifest["outputs"]
    assert outputs["train.jsonl"]["sha256"] == (
        "2a36ab5005f980b3c3b1f8df423868a00bf63d39a3a26898843a99b045644eac"
    )
    assert outputs["eval.jsonl"]["sha256"] == (
        "80f5b0275ab91c9d233bae6de17bd5aaae34bcc45f1a5b710f83263221b78ee1"
    )
    assert sorted(p.name for p in here.out_dir.iterdir()) == sorted(OUTPUTS)
    assert _snapshot(here.out_dir) == _snapshot(other)


# -- RecBole atomic files -------------------------------------------------------------------

INTER_HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"


def _atomic(tmp_path: Path, inter: list[str], item: list[str] | None = None) -> tuple[Path, Path]:
    items = item if item is not None else [
        "item_id:token\ttitle:token_seq\tbrand:token",
        *(f"i{k}\tTitle &amp; {k}\tbrand{k % 3}" for k in range(10)),
    ]
    return (_write(tmp_path / "log.inter", inter, INTER_HEADER),
            _write(tmp_path / "log.item", items))


def test_recbole_atomic_files_are_read_as_a_log_and_titles(tmp_path):
    """One interaction a line, users interleaved and out of time order: each user's items by
    timestamp (ties in file order), users in the order of their first line; the header is
    no user, and the .item file's title column gives the titles."""
    inter, item = _atomic(tmp_path, [
        "u2\ti5\t4\t300", "u1\ti1\t5\t200", "u1\ti0\t3\t100", "u2\ti6\t5\t100",
        "u1\ti2\t4\t200", "", "u2\ti7\t2\t500", "u3\ti9\t1\t7",
    ])
    log = read_sequences(inter)
    assert log.users == [("u2", ["i6", "i5", "i7"]), ("u1", ["i0", "i1", "i2"])]
    assert (log.short_users, log.lines, log.empty_lines) == (1, 9, 1)
    assert read_titles(item) == {f"i{k}": f"Title & {k}" for k in range(10)}
    result = build_from_files(inter, item, tmp_path / "out", BuildOptions(candidates=3),
                              progress=False)
    slates = {s.query.qid: s for s in _slates(tmp_path / "out")}
    assert sorted(slates) == ["u1", "u2"]
    assert slates["u1"].query.text == "1. Title & 0\n2. Title & 1"
    assert result.counts["untitled_items"] == 0


def test_recbole_sequential_form_keeps_each_users_longest_sequence(tmp_path):
    inter = _write(tmp_path / "seq.inter", [
        "u1\ti0 i1\ti2", "u1\ti0 i1 i2\ti3", "u2\ti4\ti5", "u1\ti0\ti1",
    ], "user_id:token\titem_id_list:token_seq\titem_id:token")
    assert read_sequences(inter).users == [("u1", ["i0", "i1", "i2", "i3"]), ("u2", ["i4", "i5"])]


def test_recbole_item_file_reads_a_title_named_otherwise(tmp_path):
    path = _write(tmp_path / "ml.item", ["1\tToy Story (1995)\t1995", "2\tJumanji\t1995"],
                  "item_id:token\tmovie_title:token_seq\trelease_year:token")
    assert read_titles(path) == {"1": "Toy Story (1995)", "2": "Jumanji"}


@pytest.mark.parametrize(
    ("name", "header", "lines", "line", "problem"),
    [
        ("seq.txt", None, ["u1 a b", "u2 c d", "user_id:token item_id:token"], 3,
         "'user_id:token' is a RecBole header field (name:type), not a user or an item"),
        ("log.inter", INTER_HEADER, ["u1\ti1\t5\t1", "u1\ti2\t5"], 3,
         "expected 4 tab-separated fields"),
        ("log.inter", INTER_HEADER, ["u1\ti1\t5\tyesterday"], 2,
         "timestamp 'yesterday' is not a number"),
        ("log.inter", INTER_HEADER, ["\ti1\t5\t1"], 2, "empty user_id"),
        ("log.inter", INTER_HEADER, ["u1\ti1\t5\t1", INTER_HEADER], 3,
         "a second RecBole header line"),
        ("log.inter", "user:token\titem_id:token", ["u1\ti1"], 1, "has no user_id column"),
        ("log.item", "item_id:token\tbrand:token", ["i1\tacme"], 1, "needs one title column"),
        ("log.item", "item_id:token\ttitle:token_seq", ["i1\tA", "i1\tB"], 3,
         "item 'i1' has a second title (first at line 2)"),
    ],
)
def test_a_line_that_cannot_be_a_user_or_an_item_names_file_and_line(
    tmp_path, name, header, lines, line, problem
):
    path = _write(tmp_path / name, lines, header)
    read = read_titles if name.endswith(".item") else read_sequences
    with pytest.raises(SlateError) as info:
        read(path)
    assert str(info.value).startswith(f"{path}:{line}: "), str(info.value)
    assert problem in str(info.value)


# -- retriever lists: scores, users without one, targets it missed --------------------------


def _listed(tmp_path: Path, lists: list[str], **options):
    """u1..u4 with lists (``lists``), u5 without one: its items x, y, c are counted."""
    _inputs(tmp_path, seq_lines=["u1 a b c", "u2 a b d", "u3 b c", "u4 a c", "u5 x y c"],
            title_lines=[])
    cands = _write(tmp_path / "c.txt", lists)
    options = {"candidates": 3, "eval_fraction": 0.0} | options
    return _build(tmp_path, candidate_file=cands, **options)


def test_users_without_a_list_still_count_in_features_and_baselines(tmp_path):
    from spdrank.commands.named_rankers import fit_rankers

    result = _listed(tmp_path, ["u1 c y e", "u2 d c e", "u3 c a e", "u4 c d e"], features=True)
    slates = {s.query.qid: s for s in _slates(result.out_dir)}
    assert sorted(slates) == ["u1", "u2", "u3", "u4"]  # u5: no list, no slate
    y = next(c for c in slates["u1"].candidates if c.docid == "y")
    assert y.features["popularity"] == _log1p(1)  # y is only in u5's sequence
    assert (result.out_dir / "extra_sequences.txt").read_text() == "u5 x y c\n"
    assert result.extra_path == result.out_dir / "extra_sequences.txt"
    assert result.counts["users_without_candidate_list"] == 1
    assert result.manifest["outputs"]["extra_sequences.txt"]["sequences"] == 1
    assert "extra_sequences.txt" in result.manifest["policies"]["extra_sequences"]
    popularity = PopularityRanker()
    fit_rankers([popularity], result.train_path, progress=False)
    assert popularity.counts["y"] == 1 and popularity.counts["c"] == 4
    # A later build where everyone has a list leaves no stale file for the baselines to read.
    _write(tmp_path / "c.txt", ["u1 c y", "u2 d c", "u3 c a", "u4 c d", "u5 c a"])
    assert _build(tmp_path, candidate_file=tmp_path / "c.txt", candidates=3).extra_path is None
    assert not (result.out_dir / "extra_sequences.txt").exists()


def test_a_scored_candidate_file_gives_each_candidate_the_retrievers_score(tmp_path):
    from spdrank.core.features import FeatureNormalizer
    from spdrank.rankers.baselines import make_baseline

    result = _listed(tmp_path, ["u1 c:0.9 y:0.5 e:-1.5", "u2 e:0.8 a:0.25", "u3 c:2 a:1e-3",
                                "u4 y:3 e:2.5 c:1"])
    scores = {s.query.qid: {c.docid: c.score for c in s.candidates} for s in _slates(result.out_dir)}
    assert scores["u1"] == {"c": 0.9, "y": 0.5, "e": -1.5}
    assert scores["u2"] == {"e": 0.8, "a": 0.25, "d": 0.25}  # d inserted: the lowest score
    assert scores["u4"] == {"y": 3.0, "e": 2.5, "c": 1.0}  # cut to 3, the target kept
    assert "lowest score" in result.manifest["policies"]["candidate_scores"]
    slate = next(s for s in _slates(result.out_dir) if s.query.qid == "u1")
    assert make_baseline("feature:score").rank(slate).docids == ["c", "y", "e"]
    assert FeatureNormalizer.fit(["score"], _slates(result.out_dir)).names == ("score",)
    # A plain list's order survives the slate's shuffle as its score: 1 - r/n.
    plain = _listed(tmp_path, ["u1 c y e", "u2 e a"], out="plain")
    scores = {s.query.qid: {c.docid: c.score for c in s.candidates} for s in _slates(plain.out_dir)}
    assert scores["u1"] == {"c": 1.0, "y": 0.666667, "e": 0.333333}
    assert scores["u2"] == {"e": 1.0, "a": 0.5, "d": 0.5}  # d inserted: the lowest score
    assert "1 - r/n" in plain.manifest["policies"]["candidate_scores"]
    slate = next(s for s in _slates(plain.out_dir) if s.query.qid == "u1")
    assert make_baseline("retriever").rank(slate).docids == ["c", "y", "e"]
    sampled = _listed(tmp_path, ["u1 y e", "u2 e a"], candidates_are="sampled", out="sampled")
    assert {c.score for s in _slates(sampled.out_dir) for c in s.candidates} == {0.0}


def test_a_target_listed_below_the_cut_was_not_retrieved_for_the_slate(tmp_path, caplog):
    """A reranker behind the retriever is given its top N: a target ranked below them is
    inserted like one the list lacks (with its own score), or a miss without insertion."""
    lists = ["u1 c:0.9 y:0.5 e:-1.5", "u2 e:0.8 a:0.5 b:0.4 d:0.25", "u3 a:2 e:1 c:0.5",
             "u4 y:3 e:2.5 c:1"]
    with caplog.at_level("WARNING", logger="spdrank.datasets.candidates"):
        result = _listed(tmp_path, lists)
    scores = {s.query.qid: {c.docid: c.score for c in s.candidates} for s in _slates(result.out_dir)}
    assert scores["u2"] == {"e": 0.8, "a": 0.5, "d": 0.25}  # d was 4th: its own score
    assert scores["u3"] == {"a": 2.0, "e": 1.0, "c": 0.5}  # c was 3rd: retrieved
    assert (result.counts["targets_added"], result.counts["targets_below_cut"]) == (1, 1)
    (warned,) = [r.getMessage() for r in caplog.records if "inserted" in r.getMessage()]
    assert warned.startswith("1 of 4 targets were not among the retriever's top 3 candidates "
                             "(1 of them further down its list)")
    missed = _listed(tmp_path, lists, insert_target=False, out="missed")
    slates = {s.query.qid: s for s in _slates(missed.out_dir)}
    assert sorted(slates["u2"].docids) == ["a", "b", "e"]  # the top 3, no target
    assert slates["u2"].clicked == [] and slates["u2"].extra == {"clicked_not_retrieved": ["d"]}
    assert missed.counts["targets_not_retrieved"] == 1


def test_a_scored_candidate_file_must_score_every_candidate(tmp_path):
    path = _write(tmp_path / "c.txt", ["u1 c:0.9 y:0.5", "u2 d:1", "u3 e f:0.1"])
    with pytest.raises(SlateError) as info:
        read_candidate_lists(path)
    assert str(info.value) == (
        f"{path}:3: candidate 'e' has no score: the file's first candidate ('c:0.9', line 1) "
        "reads as item:score, so every candidate must be"
    )
    with pytest.raises(SlateError, match=r"c.txt:1: candidate 'c' has a non-finite score"):
        read_candidate_lists(_write(tmp_path / "c.txt", ["u1 c:inf"]))
    assert read_candidate_lists(_write(tmp_path / "c.txt", ["u1 a:b:c d"])).lists == {
        "u1": ["a:b:c", "d"]  # the first candidate has no numeric score: plain ids
    }


def test_inserted_targets_are_warned_about(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="spdrank.datasets.candidates"):
        result = _listed(tmp_path, ["u1 c y e", "u2 e a", "u3 a e", "u4 c d e"])
    assert result.counts["targets_added"] == 2
    warned = [r.getMessage() for r in caplog.records if "inserted" in r.getMessage()]
    assert len(warned) == 1
    assert warned[0].startswith("2 of 4 targets were not among the retriever's top 3 candidates "
                                "and were inserted")
    assert "--no-insert-target" in warned[0]


def test_without_insertion_a_missed_target_stays_out_and_counts_as_a_miss(tmp_path, capsys):
    from spdrank.eval.evaluate import evaluate
    from spdrank.rankers.baselines import PopularityRanker as Popularity

    result = _listed(tmp_path, ["u1 c y e", "u2 e a", "u3 a e", "u4 c d e", "u5"],
                     insert_target=False)
    slates = {s.query.qid: s for s in _slates(result.out_dir)}
    assert sorted(slates) == ["u1", "u2", "u3", "u4"]  # u5's empty list: no slate, counted
    assert sorted(slates["u2"].docids) == ["a", "e"]  # the list as retrieved, no target
    assert slates["u2"].clicked == [] and slates["u2"].extra == {"clicked_not_retrieved": ["d"]}
    assert slates["u1"].clicked == ["c"] and "clicked_not_retrieved" not in slates["u1"].extra
    assert result.counts["targets_not_retrieved"] == 2 and result.counts["targets_added"] == 0
    assert result.manifest["parameters"]["insert_target"] is False
    popularity = Popularity()
    popularity.fit(slates.values())
    assert popularity.counts["d"] == 1  # the missed target is still the user's interaction
    records = evaluate([popularity], [slates["u2"], slates["u1"]], warmup=0)["popularity"].records
    assert records[0].metrics.values["R@10"] == 0.0 and records[0].metrics.values["MRR"] == 0.0
    args = _parser().parse_args([
        "data", "sequences", "--sequences", str(tmp_path / "seq.txt"), "--titles",
        str(tmp_path / "titles.tsv"), "--out", str(tmp_path / "cli"), "--candidate-file",
        str(tmp_path / "c.txt"), "--candidates", "3", "--no-insert-target", "--no-progress",
    ])
    assert args.func(args) == 0
    assert "2 targets not retrieved (kept without, counted as misses)" in capsys.readouterr().out
    args = _parser().parse_args([
        "data", "sequences", "--sequences", str(tmp_path / "seq.txt"), "--titles",
        str(tmp_path / "titles.tsv"), "--out", str(tmp_path / "cli"), "--no-insert-target",
    ])
    with pytest.raises(ValueError, match="--no-insert-target applies to --candidate-file"):
        args.func(args)


# -- the size of the eval split -------------------------------------------------------------


def test_a_small_eval_split_is_warned_about_with_a_fraction_that_fixes_it(tmp_path, caplog):
    _inputs(tmp_path, seq_lines=_log(n_users=4000))
    with caplog.at_level("WARNING", logger="spdrank.datasets.split"):
        result = _build(tmp_path, candidates=3, eval_fraction=0.05)
    assert result.counts["eval"] == 200
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith("200 eval slates: a metric near 0.5 has a 95% confidence "
                              "interval of about ±0.07")
    assert message.endswith("--eval-fraction 0.25 would give about 1,000")
    assert eval_count(4000, 0.25) == 1000
    caplog.clear()
    with caplog.at_level("WARNING", logger="spdrank.datasets.split"):
        _build(tmp_path, candidates=3, eval_fraction=0.25)
        _build(tmp_path, candidates=3, eval_fraction=0.0)
    assert caplog.records == []


def test_an_empty_eval_split_says_so_and_what_would_fill_it(tmp_path, caplog):
    _inputs(tmp_path, seq_lines=_log(n_users=4))
    with caplog.at_level("WARNING", logger="spdrank.datasets.split"):
        result = _build(tmp_path, candidates=3, eval_fraction=0.1)
        warn_small_eval(0, 1, 0.1)
    assert result.counts["eval"] == 0
    assert [r.getMessage() for r in caplog.records] == [
        ("0 eval slates: --eval-fraction 0.1 of this log's 4 users rounds down to none, so "
         "eval.jsonl is empty; --eval-fraction 0.25 sets one user aside"),
        ("0 eval slates: --eval-fraction 0.1 of this log's 1 users rounds down to none, so "
         "eval.jsonl is empty; the log is too small to set a user aside for evaluation"),
    ]


# -- inputs that would build nothing, or something else than meant ---------------------------


def test_lists_of_users_the_log_spells_otherwise_build_nothing_and_say_so(tmp_path, capsys):
    _inputs(tmp_path, seq_lines=["u1 a b c", "u2 a b d", "u3 b c"], title_lines=[])
    lists = _write(tmp_path / "c.txt", ["U1 c y", "U2 d y", "U3 c a"])
    with pytest.raises(ValueError, match=r"c.txt: none of its 3 lists names a user of .*seq.txt "
                       r"with 2 or more items \(the lists' users 'U1', 'U2', 'U3'; the log's "
                       r"'u1', 'u2', 'u3'\)"):
        _build(tmp_path, candidate_file=lists, candidates=2)
    assert not (tmp_path / "out").exists()


def test_most_lists_unused_is_warned_and_counted_in_the_summary(tmp_path, caplog, capsys):
    _inputs(tmp_path, seq_lines=["u1 a b c", "u2 a b d", "u3 b c"], title_lines=[])
    lists = _write(tmp_path / "c.txt", ["u1 c y", "U2 d y", "U3 c a"])
    with caplog.at_level("WARNING", logger="spdrank.datasets.candidates"):
        result = _build(tmp_path, candidate_file=lists, candidates=2, eval_fraction=0.0)
    assert result.counts["train"] == 1 and result.counts["unused_candidate_lists"] == 2
    assert any("2 of the 3 lists of" in r.getMessage() and "e.g. 'U2', 'U3'" in r.getMessage()
               for r in caplog.records)
    data_command.print_summary(result)
    assert ("2 candidate lists unused: their users are not in the log, or have fewer than 2 "
            "items") in capsys.readouterr().out


def test_a_log_of_no_user_with_a_target_is_refused(tmp_path):
    _inputs(tmp_path, seq_lines=["u1,a,b,c", "u2,a,b,d"], title_lines=[])
    with pytest.raises(ValueError, match=r"seq.txt: no user has 2 or more items, so no slate "
                       r"can be built \(2 lines, 0 empty, 2 users with fewer than 2 items; a "
                       r"plain log's line is 'user item item \.\.\.'"):
        _build(tmp_path, candidates=2)


def test_ids_no_slate_file_could_hold_are_refused_where_they_are_read(tmp_path):
    _inputs(tmp_path, seq_lines=["u1 a b\u200b c", "u2 a b d"], title_lines=[])
    with pytest.raises(SlateError, match=r"seq.txt:1: field 3 'b\\u200b' holds a control or "
                       r"format character \(U\+200B ZERO WIDTH SPACE\)"):
        _build(tmp_path, candidates=2)
    inter = _write(tmp_path / "log.inter", ["u1\tred shirt\t1", "u1\tcap\t2"],
                   "user_id:token\titem_id:token\ttimestamp:float")
    with pytest.raises(SlateError, match=r"log.inter:2: item_id 'red shirt' holds whitespace"):
        read_sequences(inter)


def test_a_titles_file_that_names_none_of_the_logs_items_is_refused(tmp_path, caplog):
    seq = ["u1 i1 i2 i3", "u2 i2 i3 i4", "u3 i1 i3 i4"]
    _inputs(tmp_path, seq_lines=seq, title_lines=["One\ti1", "Two\ti2"])  # columns swapped
    with pytest.raises(ValueError, match=r"titles.tsv gives a title to none of the log's 4 items "
                       r"\(its first ids 'One', 'Two'; the log's first 'i1', 'i2', 'i3'\)"):
        _build(tmp_path, candidates=2)
    _inputs(tmp_path, seq_lines=seq, title_lines=[])  # no titles at all: a features-only log
    assert _build(tmp_path, candidates=2, out="untitled").counts["untitled_items"] == 4
    _inputs(tmp_path, seq_lines=seq, title_lines=["i1\tOne"])
    with caplog.at_level("WARNING", logger="spdrank.datasets.build"):
        _build(tmp_path, candidates=2, out="few")
    assert any("gives a title to 1 of the log's 4 items" in r.getMessage()
               for r in caplog.records)


def test_scores_that_rise_along_a_list_are_said(tmp_path, caplog):
    path = _write(tmp_path / "c.txt", ["u1 a:0.1 b:0.5", "u2 a:0.9 b:0.5", "u3 c:0.2 a:0.3"])
    with caplog.at_level("WARNING", logger="spdrank.datasets.candidates"):
        read_candidate_lists(path)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(f"2 of the 3 lists of {path} hold a score above the one before it "
                           "(the first at line 1)")


def test_candidate_ids_that_hold_a_colon_are_not_read_as_scores(tmp_path):
    _inputs(tmp_path, seq_lines=["u1 sku:1 sku:2 sku:3", "u2 sku:2 sku:3 sku:4"], title_lines=[])
    lists = _write(tmp_path / "c.txt", ["u1 sku:4 sku:1", "u2 sku:1 sku:3"])
    with pytest.raises(SlateError, match=r"c.txt:1: candidate 'sku:4' is an item of the log, but "
                       r"the file reads as item:score, which makes it item 'sku'"):
        _build(tmp_path, candidate_file=lists, candidates=2)
    scored = _write(tmp_path / "s.txt", ["u1 sku:4:0.9 sku:1:0.5", "u2 sku:1:0.3 sku:3:0.2"])
    result = _build(tmp_path, candidate_file=scored, candidates=2, eval_fraction=0.0, out="ok")
    assert {d for s in _slates(result.out_dir) for d in s.docids} == {"sku:1", "sku:3", "sku:4"}
    with pytest.raises(SlateError, match=r"candidate 'd' has no score: the file's first "
                       r"candidate \('sku:1', line 1\) reads as item:score"):
        read_candidate_lists(_write(tmp_path / "m.txt", ["u1 sku:1 d"]))


def test_repeated_rows_of_an_atomic_file_are_dropped_and_said(tmp_path, caplog):
    """A row logged twice would make the user's target the item just before it."""
    inter = _write(tmp_path / "log.inter", ["u1\ti1\t1", "u1\ti2\t2", "u1\ti2\t2", "u1\ti2\t3"],
                   "user_id:token\titem_id:token\ttimestamp:float")
    with caplog.at_level("WARNING", logger="spdrank.datasets.recbole"):
        log = read_sequences(inter)
    assert log.users == [("u1", ["i1", "i2", "i2"])]  # the same item again later is kept
    assert any("1 rows repeat an earlier row's user, item and timestamp" in r.getMessage()
               for r in caplog.records)
