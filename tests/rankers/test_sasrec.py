"""SASRec: what it learns, its cache, and its three uses (eval ranker, builder feature,
builder retriever), on tiny synthetic logs where item i is always followed by item i+1."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from spdrank.commands import data as data_command
from spdrank.commands import eval as eval_command
from spdrank.core.slates import NOT_RETRIEVED, load_slates
from spdrank.datasets.build import build_from_files
from spdrank.datasets.options import BuildOptions
from spdrank.rankers.sasrec import CONFIG_FILE, SASRec, SASRecRanker, cache_key
from spdrank.rankers.sasrec_config import SASRecConfig

#: Small enough to fit in about a second on one thread, big enough to learn i -> i+1.
TINY = SASRecConfig(dim=16, epochs=30, batch_size=16, dropout=0.1, max_len=8, lr=1e-2)
#: For tests that only compare fits with each other.
QUICK = SASRecConfig(**{**TINY.to_dict(), "epochs": 2})
N_ITEMS = 30


@pytest.fixture(autouse=True)
def _one_thread_and_cache(tmp_path, monkeypatch):
    """One thread (the machine is shared) and a private cache for the builder's fits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained() -> SASRec:
    """SASRec fitted on 60 users who each walk i, i+1, ...: it should know what comes next."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return SASRec.fit([items for _, items in _runs()], TINY)
    finally:
        torch.set_num_threads(threads)


def _runs(n_users: int = 60, length: int = 6, noise: int = 0, seed: int = 0):
    """Users whose items are consecutive (i, i+1, ... mod N_ITEMS), then ``noise`` users
    with random items, as ``(user, items)``."""
    rng = random.Random(seed)
    users = []
    for u in range(n_users):
        start = rng.randrange(N_ITEMS)
        users.append((f"u{u}", [f"i{(start + k) % N_ITEMS}" for k in range(length)]))
    for u in range(noise):
        users.append((f"n{u}", [f"i{k}" for k in rng.sample(range(N_ITEMS), length)]))
    return users


def _next_item_accuracy(model: SASRec) -> float:
    """Share of items i whose top-1 after (i-2, i-1, i) is i+1."""
    hits = 0
    for i in range(N_ITEMS):
        history = [f"i{(i + k) % N_ITEMS}" for k in (-2, -1, 0)]
        (best, _), = model.top_n(history, 1)
        hits += best == f"i{(i + 1) % N_ITEMS}"
    return hits / N_ITEMS


def _spy_fits(monkeypatch) -> list[list[list[str]]]:
    """Record the sequences of every SASRec fit."""
    seen: list[list[list[str]]] = []
    original = SASRec.fit.__func__

    def spy(cls, sequences, *args, **kwargs):
        seqs = [list(s) for s in sequences]
        seen.append(seqs)
        return original(cls, seqs, *args, **kwargs)

    monkeypatch.setattr(SASRec, "fit", classmethod(spy))
    return seen


def _write_log(tmp_path: Path, users) -> tuple[Path, Path]:
    seqs = tmp_path / "seq.txt"
    seqs.write_text("".join(" ".join([u, *items]) + "\n" for u, items in users), "utf-8")
    titles = tmp_path / "titles.tsv"
    titles.write_text(
        "item_id\ttitle\n" + "".join(f"i{i}\tItem number {i}\n" for i in range(N_ITEMS)), "utf-8"
    )
    return seqs, titles


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spdrank")
    sub = parser.add_subparsers(dest="command", required=True)
    data_command.register(sub)
    eval_command.register(sub)
    return parser


# -- the model -------------------------------------------------------------------------------


def test_learns_that_item_i_is_followed_by_i_plus_1(trained):
    model = trained
    assert _next_item_accuracy(model) >= 0.9
    # The check tells a trained model from an untrained one of the same shape.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        untrained = SASRec(model.items, TINY)
    assert _next_item_accuracy(untrained) < 0.3
    assert model.stats.losses[-1] < model.stats.losses[0]


@pytest.mark.parametrize("sampled", [None, 7], ids=["whole-catalogue", "sampled"])
def test_the_softmax_loss_learns_it_too(sampled, monkeypatch):
    """``loss="ce"`` over the whole catalogue, and over a sample of it for a catalogue larger
    than the sample (7 of 30 items here)."""
    from spdrank.rankers import sasrec

    if sampled is not None:
        monkeypatch.setattr(sasrec, "SAMPLED_NEGATIVES", sampled)
    config = SASRecConfig(**{**TINY.to_dict(), "loss": "ce"})
    model = SASRec.fit([items for _, items in _runs()], config)
    assert _next_item_accuracy(model) >= 0.9
    assert model.stats.losses[-1] < model.stats.losses[0]


def test_a_fit_saved_before_the_loss_was_a_setting_was_trained_with_one_negative():
    old = {k: v for k, v in TINY.to_dict().items() if k != "loss"}
    assert SASRecConfig.from_dict(old).loss == "bce"
    assert SASRecConfig.from_dict({**old, "loss": "ce"}).loss == "ce"


def test_fit_is_seeded_and_leaves_the_global_random_state_alone():
    items = [items for _, items in _runs(20)]
    before = torch.get_rng_state()
    a = SASRec.fit(items, QUICK)
    assert torch.equal(torch.get_rng_state(), before)
    b = SASRec.fit(items, QUICK)
    c = SASRec.fit(items, SASRecConfig(**{**QUICK.to_dict(), "seed": 1}))
    history, candidates = ["i3", "i4"], ["i5", "i9", "i20"]
    assert a.score(history, candidates) == b.score(history, candidates)
    assert a.score(history, candidates) != c.score(history, candidates)


def test_scores_do_not_depend_on_the_batch_or_its_padding(trained):
    model = trained
    short, long = ["i3"], [f"i{k}" for k in range(12)]  # longer than max_len: cut
    together = model.encode([short, long, []])
    assert np.allclose(together[0], model.encode([short])[0], atol=1e-6)
    assert np.allclose(together[1], model.encode([long[-TINY.max_len :]])[0], atol=1e-6)


def test_score_and_top_n_agree_and_unknown_candidates_rank_last(trained):
    model = trained
    history = ["i6", "i7", "i8"]
    top = model.top_n(history, 5)
    assert len(top) == 5 and not {d for d, _ in top} & set(history)
    assert [s for _, s in top] == sorted((s for _, s in top), reverse=True)
    docids = [d for d, _ in top]
    assert model.score(history, docids) == pytest.approx([s for _, s in top], abs=1e-5)
    scores = model.score(history, [*docids, "never-seen"])
    assert scores[-1] == pytest.approx(min(scores[:-1]) - 1.0)
    everything = model.top_n(history, len(model.items), exclude=[])
    assert {d for d, _ in everything} == set(model.items)  # the history too, when asked
    with pytest.raises(ValueError, match="n >= 1"):
        model.top_n(history, 0)


def test_cache_is_hit_by_the_same_inputs_and_missed_by_others(tmp_path, monkeypatch):
    items = [items for _, items in _runs(20)]
    cache = tmp_path / "fits"
    first = SASRec.fit(items, QUICK, cache=cache)
    assert len(list(cache.iterdir())) == 1
    assert json.loads((next(cache.iterdir()) / CONFIG_FILE).read_text())["key"] == first.key

    def no_training(self, *args):
        raise AssertionError("a cached fit was trained again")

    with monkeypatch.context() as patch:
        patch.setattr(SASRec, "_train", no_training)
        again = SASRec.fit(items, QUICK, cache=cache)
    assert again.score(["i1"], ["i2", "i3"]) == first.score(["i1"], ["i2", "i3"])
    assert again.stats.losses == pytest.approx(first.stats.losses, abs=1e-6)

    # Any input that moves the fit moves the key: a sequence, the order, a setting, the vocab.
    changed = [items[:-1], items[::-1], [[*items[0], "i0"], *items[1:]]]
    keys = {cache_key(s, sorted({i for x in s for i in x}), QUICK) for s in changed}
    keys.add(cache_key(items, first.items, SASRecConfig(**{**QUICK.to_dict(), "epochs": 3})))
    keys.add(cache_key(items, [*first.items, "extra"], QUICK))
    assert first.key not in keys and len(keys) == 5
    SASRec.fit(items[:-1], QUICK, cache=cache)
    assert len(list(cache.iterdir())) == 2


def test_load_names_what_is_wrong(tmp_path):
    model = SASRec.fit([items for _, items in _runs(10)], QUICK)
    model.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / CONFIG_FILE).read_text())
    meta["format"] = 999
    (tmp_path / "m" / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format 999"):
        SASRec.load(tmp_path / "m")
    with pytest.raises(ValueError, match="not a saved SASRec"):
        SASRec.load(tmp_path / "nothing")


def test_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        SASRecConfig(epochs=0)
    with pytest.raises(ValueError, match="multiple of heads"):
        SASRecConfig(dim=10, heads=3)
    with pytest.raises(ValueError, match="loss must be one of bce, ce, got 'softmax'"):
        SASRecConfig(loss="softmax")


# -- eval ranker ----------------------------------------------------------------------------


def test_eval_ranker_fits_on_the_training_slates_only(tmp_path, monkeypatch, capsys):
    seqs, titles = _write_log(tmp_path, _runs(80, length=7))
    out = tmp_path / "slates"
    build_from_files(seqs, titles, out, BuildOptions(candidates=8, eval_fraction=0.25),
                     progress=False)
    seen = _spy_fits(monkeypatch)
    monkeypatch.setattr(SASRecRanker, "__init__", _tiny_ranker_init)
    args = _parser().parse_args(
        ["eval", "--slates", str(out / "eval.jsonl"), "--ranker", "sasrec", "--ranker",
         "random", "--json", str(tmp_path / "res.json"), "--no-progress"]
    )
    assert args.func(args) == 0
    train = load_slates(out / "train.jsonl")
    assert seen == [[[*s.query.history, *s.clicked] for s in train]]
    res = json.loads((tmp_path / "res.json").read_text())["rankers"]
    assert res["sasrec"]["valid_pct"] == 100.0
    assert res["sasrec"]["metrics"]["R@1"]["mean"] > 0.8 > res["random"]["metrics"]["R@1"]["mean"]
    assert "sasrec" in capsys.readouterr().out


def test_eval_ranker_also_fits_on_the_users_without_a_slate(tmp_path, monkeypatch):
    """``extra_sequences.txt`` beside the training file (users without a candidate list)
    feeds SASRec as it feeds the count baselines: after the training slates' sequences."""
    seqs, titles = _write_log(tmp_path, _runs(40, length=7))
    out = tmp_path / "slates"
    build_from_files(seqs, titles, out, BuildOptions(candidates=8, eval_fraction=0.25),
                     progress=False)
    extra = [("x0", ["i1", "i2", "i3"]), ("x1", ["i7", "i8"])]
    (out / "extra_sequences.txt").write_text(
        "".join(" ".join([u, *items]) + "\n" for u, items in extra), "utf-8"
    )
    seen = _spy_fits(monkeypatch)
    monkeypatch.setattr(SASRecRanker, "__init__", _tiny_ranker_init)
    args = _parser().parse_args(
        ["eval", "--slates", str(out / "eval.jsonl"), "--ranker", "sasrec", "--no-progress"]
    )
    assert args.func(args) == 0
    train = load_slates(out / "train.jsonl")
    assert seen == [[*([*s.query.history, *s.clicked] for s in train), *(i for _, i in extra)]]


def _tiny_ranker_init(self, config=None, cache="default", name="sasrec"):
    self.config, self.cache, self.name, self.model = TINY, None, name, None


def test_eval_ranker_is_not_a_default_baseline():
    from spdrank.rankers.baselines import BASELINES, baseline_names

    assert "sasrec" not in BASELINES and "sasrec" in baseline_names()


# -- builder: feature and retriever --------------------------------------------------------


def test_feature_is_fitted_on_every_users_history_without_their_targets(tmp_path, monkeypatch):
    users = _runs(60, length=7)
    seqs, titles = _write_log(tmp_path, users)
    seen = _spy_fits(monkeypatch)
    options = BuildOptions(candidates=6, eval_fraction=0.2, validation=5, history=4,
                           features=("sasrec", "popularity"), sasrec=TINY)
    result = build_from_files(seqs, titles, tmp_path / "out", options, progress=False)
    train = load_slates(result.train_path)
    held_out = [*load_slates(result.eval_path), *load_slates(result.valid_path)]
    items = dict(users)
    # Every user's items but the last (its slate's target), in every split, nothing else.
    assert sorted(map(tuple, seen[0])) == sorted(
        tuple(items[s.query.qid][:-1]) for s in [*train, *held_out]
    )
    assert len(seen) == 1 and held_out

    model = SASRec.fit(seen[0], TINY, items=[f"i{i}" for i in range(N_ITEMS)])
    for slate in [*train, *held_out]:
        assert all(list(c.features) == ["popularity", "sasrec"] for c in slate.candidates)
        expected = model.score(slate.query.history, slate.docids)
        got = [c.features["sasrec"] for c in slate.candidates]
        assert got == pytest.approx(expected, abs=1e-5)
    m = result.manifest
    assert m["parameters"]["features"] == ["popularity", "sasrec"]
    assert m["parameters"]["sasrec"] == TINY.to_dict() and "sasrec" in m["policies"]


def test_feature_also_learns_from_users_without_a_candidate_list(tmp_path, monkeypatch):
    """Users a candidate file does not list make no slate; their whole sequences reach the
    builder's SASRec, as every history does (``extra_sequences.txt`` holds what the counts
    take of them)."""
    users = _runs(30, length=7)
    seqs, _titles = _write_log(tmp_path, users)
    listed = dict(users[:20])
    lists = tmp_path / "lists.txt"
    lists.write_text("".join(f"{u} " + " ".join(f"i{k}" for k in range(6)) + "\n"
                             for u in listed), "utf-8")
    seen = _spy_fits(monkeypatch)
    options = BuildOptions(candidates=6, eval_fraction=0.2, validation=0, history=4,
                           features=("sasrec",), sasrec=TINY)
    result = build_from_files(seqs, _titles, tmp_path / "out", options, candidate_file=lists,
                              progress=False)
    slates = [*load_slates(result.train_path), *load_slates(result.eval_path)]
    assert (result.extra_path.read_text("utf-8").splitlines()
            == [" ".join([u, *items[-5:]]) for u, items in users[20:]])
    expected = ([tuple(listed[s.query.qid][:-1]) for s in slates]
                + [tuple(items) for _, items in users[20:]])
    assert len(seen) == 1 and sorted(map(tuple, seen[0])) == sorted(expected)


def test_retriever_builds_slates_without_inserting_the_target(tmp_path, monkeypatch, capsys):
    users = _runs(60, length=7, noise=30)
    seqs, titles = _write_log(tmp_path, users)
    seen = _spy_fits(monkeypatch)
    args = _parser().parse_args(
        ["data", "sequences", "--sequences", str(seqs), "--titles", str(titles), "--out",
         str(tmp_path / "out"), "--retriever", "sasrec", "--candidates", "4",
         "--eval-fraction", "0.3", "--features", "sasrec", "--sasrec-epochs", "30",
         "--no-progress"]
    )
    with monkeypatch.context() as patch:
        patch.setattr(data_command, "SASRecConfig",
                      lambda epochs, loss: SASRecConfig(**{**TINY.to_dict(), "epochs": epochs, "loss": loss}))
        assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "the sasrec retriever's top 4" in printed and "Recall@4" in printed
    assert len(seen) == 1  # one model serves the retriever and the feature

    out = tmp_path / "out"
    items = dict(users)
    train, evals = load_slates(out / "train.jsonl"), load_slates(out / "eval.jsonl")
    assert len(train) + len(evals) == len(users)  # misses stay in the files
    hits = {"train": 0, "eval": 0}
    for split, slates in (("train", train), ("eval", evals)):
        for slate in slates:
            earlier, target = items[slate.query.qid][:-1], items[slate.query.qid][-1]
            assert len(slate.candidates) == 4 and not set(slate.docids) & set(earlier)
            assert all(c.score == c.features["sasrec"] for c in slate.candidates)
            if target in slate.docids:
                hits[split] += 1
                assert slate.clicked == [target] and NOT_RETRIEVED not in slate.extra
            else:
                assert slate.clicked == [] and slate.extra[NOT_RETRIEVED] == [target]
    assert 0 < hits["eval"] < len(evals) and 0 < hits["train"] < len(train)
    manifest = json.loads((out / "manifest.json").read_text())
    c = manifest["counts"]
    assert (c["targets_retrieved_train"], c["targets_retrieved_eval"]) == (
        hits["train"], hits["eval"]
    )
    assert c["targets_not_retrieved"] == len(users) - hits["train"] - hits["eval"]
    assert manifest["parameters"]["retriever"] == "sasrec"

    # In eval a missed target counts as a miss: with 4 candidates, R@10 is the retriever's
    # recall against the whole catalogue, over every eval slate.
    args = _parser().parse_args(
        ["eval", "--slates", str(out / "eval.jsonl"), "--ranker", "feature:sasrec",
         "--json", str(tmp_path / "res.json"), "--no-progress"]
    )
    assert args.func(args) == 0
    res = json.loads((tmp_path / "res.json").read_text())["rankers"]["feature:sasrec"]
    assert res["metrics"]["R@10"] == {"mean": hits["eval"] / len(evals), "n": len(evals)}


def test_retriever_excludes_other_candidate_sources():
    with pytest.raises(ValueError, match="retriever must be one of"):
        BuildOptions(retriever="bm25")
    with pytest.raises(ValueError, match="unknown features"):
        BuildOptions(features=("sasrec", "nope"))
    assert BuildOptions(features=True).features == (
        "popularity", "cooccurrence", "transition", "title_similarity"
    )
    with pytest.raises(SystemExit):
        _parser().parse_args(["data", "beauty", "--out", "x", "--features", "nope"])
    args = _parser().parse_args(
        ["data", "beauty", "--out", "x", "--retriever", "sasrec", "--negatives", "uniform"]
    )
    with pytest.raises(ValueError, match="exclude each other"):
        args.func(args)
