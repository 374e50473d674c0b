import functools
import json
import random

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from spdrank.commands.cli import main
from spdrank.core.slates import SlateError, load_slates, write_slates
from spdrank.eval.metrics import is_valid_permutation
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache
from spdrank.training.train import TrainConfig, train
from tests.helpers import make_slate, signal_slates
from tests.helpers import train_config as config


def weights(run_dir):
    model = run_dir / "model"
    out = {f"head.{k}": v for k, v in load_file(str(model / "head.safetensors")).items()}
    adapter = model / "adapter" / "adapter_model.safetensors"
    if adapter.exists():
        out |= {f"lora.{k}": v for k, v in load_file(str(adapter)).items()}
    return out


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all(), k


def test_overfits_eight_slates_to_their_exact_teacher_permutations(tmp_path, tiny_backbone, train_file):
    cfg = config(
        tmp_path, tiny_backbone, eval_slates=str(train_file), max_steps=60, lr=1e-2,
        head_lr=1e-2, head_dropout=0.0, warmup_steps=5,
    )
    summary = train(cfg)
    assert summary["finished"] and summary["eval"]["tau"] == 1.0
    model = SPDRanker.from_pretrained(tmp_path / "run")
    for slate in load_slates(train_file):
        assert model.rank(slate).docids == slate.teacher


def test_same_seed_same_weights(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, out="a", max_steps=3))
    train(config(tmp_path, tiny_backbone, out="b", max_steps=3))
    train(config(tmp_path, tiny_backbone, out="c", max_steps=3, seed=1))
    assert_same(weights(tmp_path / "a"), weights(tmp_path / "b"))
    c = weights(tmp_path / "c")
    assert any(not (c[k] == v).all() for k, v in weights(tmp_path / "a").items())


@pytest.mark.parametrize("name", ["train.jsonl", "train.jsonl.gz"])
def test_interrupted_run_resumes_to_the_same_weights(tmp_path, tiny_backbone, slates, name):
    # 8 slates, batch 4: 6 steps cross an epoch boundary and the resume point. A gzip file is
    # streamed, and the resumed run replays its place in the epoch by skipping slates.
    write_slates(tmp_path / name, slates)
    run = functools.partial(config, tmp_path, tiny_backbone, slates=str(tmp_path / name), max_steps=6)
    train(run(out="straight"))
    first = train(run(out="resumed", stop_after=3))
    assert not first["finished"] and (tmp_path / "resumed" / "state").exists()
    second = train(run(out="resumed"))
    assert second["finished"] and not (tmp_path / "resumed" / "state").exists()
    assert_same(weights(tmp_path / "straight"), weights(tmp_path / "resumed"))


def test_resume_with_other_settings_is_refused(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, max_steps=4, stop_after=1))
    with pytest.raises(ValueError, match=r"other settings \(--lr: 0\.0002 in that run, 0\.5 "
                       r"now\): rerun with that run's settings to resume it, or pass another "
                       r"--out"):
        train(config(tmp_path, tiny_backbone, max_steps=4, lr=0.5))


def test_a_run_saved_before_a_setting_existed_resumes(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, max_steps=4, stop_after=1))
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    del meta["settings"]["prompt"]  # a setting added after the run was saved: its default then
    meta_file.write_text(json.dumps(meta))
    assert train(config(tmp_path, tiny_backbone, max_steps=4))["finished"]


def test_a_run_saved_with_a_since_removed_option_off_resumes(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, max_steps=4, stop_after=1))
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    meta["settings"]["standardise_states"] = False
    meta_file.write_text(json.dumps(meta))
    assert train(config(tmp_path, tiny_backbone, max_steps=4))["finished"]


def test_a_run_saved_with_a_since_removed_option_on_is_refused(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, max_steps=4, stop_after=1))
    meta_file = tmp_path / "run" / "state" / "trainer.json"
    meta = json.loads(meta_file.read_text())
    meta["settings"]["standardise_states"] = True
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"other settings \(standardise_states: true in that "
                       r"run, a setting this version no longer has\)"):
        train(config(tmp_path, tiny_backbone, max_steps=4))


def test_slates_training_cannot_use_fail_before_training_with_file_and_line(tmp_path, tiny_backbone):
    rng = random.Random(0)
    slates = [make_slate(rng, 4), make_slate(rng, 4, teacher=False), make_slate(rng, 17)]
    write_slates(tmp_path / "train.jsonl", slates)
    with pytest.raises(ValueError, match=r"train\.jsonl:2: slate 'q' has no 'teacher' ranking"):
        train(config(tmp_path, tiny_backbone, max_steps=1))
    with pytest.raises(ValueError, match=r"train\.jsonl:3: slate 'q' has 17 candidates, more than "
                       r"the model's 16 rank positions \(--positions\)"):
        train(config(tmp_path, tiny_backbone, target="clicks", max_steps=1))


@pytest.mark.parametrize("head,frozen", [("linear", True), ("attn", False)])
def test_cli_train_then_rank(tmp_path, tiny_backbone, train_file, head, frozen, capsys):
    out = tmp_path / "cli"
    args = [
        "train", "--slates", str(train_file), "--out", str(out), "--target", "teacher+clicks",
        "--head", head, "--backbone", tiny_backbone, "--positions", "16", "--head-width", "16",
        "--lora-r", "4", "--max-steps", "2", "--batch-size", "2", "--eval-slates",
        str(train_file), "--eval-limit", "3", "--no-progress",
    ] + (["--frozen"] if frozen else [])
    assert main(args) == 0
    summary = json.loads((out / "train.json").read_text())
    assert summary["config"]["frozen"] is frozen and summary["eval_slates"] == 3
    assert main([
        "rank", "--model", str(out), "--input", str(train_file), "--output",
        str(tmp_path / "ranked.jsonl"), "--trec", str(tmp_path / "run.txt"), "--batch-size", "3",
    ]) == 0
    ranked = [json.loads(line) for line in (tmp_path / "ranked.jsonl").read_text().splitlines()]
    slates = load_slates(train_file)
    assert len(ranked) == len(slates)
    for rec, slate in zip(ranked, slates):
        assert is_valid_permutation([c["docid"] for c in rec["candidates"]], slate.docids)
    trec = (tmp_path / "run.txt").read_text().splitlines()
    assert len(trec) == sum(len(s) for s in slates)
    assert trec[0].split()[1] == "Q0" and trec[0].split()[3] == "1"


def test_bad_slate_file_is_reported_with_file_and_line(tmp_path, tiny_backbone, capsys):
    (tmp_path / "train.jsonl").write_text('{"query": {"text": "x"}, "candidates": []}\n')
    code = main(["train", "--slates", str(tmp_path / "train.jsonl"), "--out", str(tmp_path / "r"),
                 "--backbone", tiny_backbone, "--no-progress"])
    assert code == 2
    assert "train.jsonl:1: 'candidates' is empty" in capsys.readouterr().err


@pytest.mark.slow
def test_real_bundled_backbone_trains_and_ranks(tmp_path, train_file):
    """The production path: bundled SmolLM2 (first 2 layers), LoRA, attention head."""
    summary = train(config(tmp_path, "bundled", layers=2, max_steps=2, batch_size=2,
                           eval_slates=str(train_file), eval_limit=2))
    assert summary["finished"] and summary["eval"]["valid"] == 1.0
    model = SPDRanker.from_pretrained(tmp_path / "run")
    assert model.backbone.base_model.model.config.num_hidden_layers == 2
    slate = load_slates(train_file)[0]
    assert is_valid_permutation(model.rank(slate).docids, slate.docids)


@pytest.mark.parametrize("head", ["scalar", "first"])
def test_single_pass_peers_overfit_the_same_targets(tmp_path, tiny_backbone, train_file, head):
    """FIRST and scalar+argsort train on exactly SPD's targets, through the same loop."""
    cfg = config(
        tmp_path, tiny_backbone, head=head, eval_slates=str(train_file), max_steps=60,
        lr=1e-2, head_lr=1e-2, head_dropout=0.0, warmup_steps=5,
    )
    summary = train(cfg)
    assert summary["eval"]["valid"] == 1.0
    assert summary["eval"]["top1"] == 1.0 and summary["eval"]["tau"] > 0.7
    model = SPDRanker.from_pretrained(tmp_path / "run")
    slate = load_slates(train_file)[0]
    ranking = model.rank(slate)
    assert ranking.docids[0] == slate.teacher[0]
    assert all(a >= b for a, b in zip(ranking.scores, ranking.scores[1:]))


def test_first_with_a_frozen_backbone_has_nothing_to_train(tmp_path, tiny_backbone, train_file):
    with pytest.raises(ValueError, match="nothing to train"):
        train(config(tmp_path, tiny_backbone, head="first", frozen=True, max_steps=1))


# -- upstream features -----------------------------------------------------------------------


@pytest.fixture
def signal_files(tmp_path):
    write_slates(tmp_path / "train.jsonl", signal_slates(32, seed=1, teacher=False))
    write_slates(tmp_path / "eval.jsonl", signal_slates(24, seed=2, teacher=False))
    return tmp_path / "train.jsonl", tmp_path / "eval.jsonl"


def top1(model: SPDRanker, path) -> float:
    slates = load_slates(path)
    return sum(model.rank(s).docids[0] == s.clicked[0] for s in slates) / len(slates)


def test_the_head_learns_from_features_what_the_text_does_not_say(
    tmp_path, tiny_backbone, signal_files
):
    """Clicked = the top 'signal' on held-out slates: found with --features, not without."""
    _, eval_file = signal_files
    common = {"target": "clicks", "frozen": True, "max_steps": 40, "head_lr": 1e-2,
              "head_dropout": 0.0, "warmup_steps": 4}
    # The head alone, not started as the signal's order: what it learns from the feature.
    train(config(tmp_path, tiny_backbone, out="with", features="signal", anchor="none",
                 **common))
    train(config(tmp_path, tiny_backbone, out="without", **common))
    with_features = SPDRanker.from_pretrained(tmp_path / "with")
    assert with_features.config.features.names == ("signal",)
    assert top1(with_features, eval_file) >= 0.8
    assert top1(SPDRanker.from_pretrained(tmp_path / "without"), eval_file) <= 0.4


def test_features_only_trains_resumes_ranks_and_evals_without_the_backbone(
    tmp_path, signal_files, monkeypatch, capsys
):
    def no_llm(*args, **kwargs):
        raise AssertionError("--features-only must not load the LLM")

    monkeypatch.setattr("spdrank.model.parts.load_backbone", no_llm)
    monkeypatch.setattr("spdrank.model.parts.load_tokenizer", no_llm)
    train_file, eval_file = signal_files
    out = tmp_path / "run"
    args = [
        "train", "--slates", str(train_file), "--out", str(out), "--target", "clicks",
        "--features", "signal", "--features-only", "--backbone", "no/such/model",
        "--positions", "8", "--head-width", "16", "--head-dropout", "0", "--head-lr", "1e-2",
        "--max-steps", "60", "--batch-size", "4", "--warmup-steps", "4", "--no-progress",
    ]
    assert main(args + ["--stop-after", "25"]) == 0 and (out / "state").exists()
    assert main(args) == 0  # resumes to the end
    summary = json.loads((out / "train.json").read_text())
    assert summary["finished"] and summary["config"]["features_only"] is True
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["features_only"] and saved["backbone"] is None  # no LLM read, none named
    assert not (out / "model" / "adapter").exists()
    assert top1(SPDRanker.from_pretrained(out), eval_file) >= 0.8
    ranked = tmp_path / "ranked.jsonl"
    assert main(["rank", "--model", str(out), "--input", str(eval_file), "--output", str(ranked)]) == 0
    assert len(ranked.read_text().splitlines()) == 24
    capsys.readouterr()
    assert main(["eval", "--slates", str(eval_file), "--model", f"features={out}", "--no-progress"]) == 0
    assert "features" in capsys.readouterr().out


def test_feature_settings_that_cannot_work_fail_before_training(
    tmp_path, tiny_backbone, signal_files
):
    def run(**kw):
        train(config(tmp_path, tiny_backbone, target="clicks", max_steps=1, **kw))

    with pytest.raises(ValueError, match="features-only model needs features"):
        run(features_only=True)
    with pytest.raises(ValueError, match="cannot run on features alone"):
        run(head="first", features="signal", features_only=True)
    with pytest.raises(SlateError, match=r"candidates\[0\] \(docid 'd0'\) has no feature 'pop'"):
        run(features="signal,pop")
    assert not (tmp_path / "run").exists()


def test_slates_with_nothing_to_learn_are_refused_by_what_they_lack(tmp_path):
    """With --features the normalisation is fitted first: on slates none of which has a
    clicked item, the refusal says so (as the slate source does without features), not that
    the fit had nothing to read."""
    unclicked = signal_slates(5, seed=1, teacher=False)
    for slate in unclicked:
        slate.clicked = []
    write_slates(tmp_path / "train.jsonl", unclicked)
    cfg = config(tmp_path, "unused", target="clicks", features="signal", features_only=True,
                 max_steps=1)
    with pytest.raises(SlateError, match=r"train\.jsonl holds no slates to train on \(every "
                       r"one of its 5 slates has no clicked item\)"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_a_run_shorter_than_the_default_warmup_still_reaches_its_learning_rate(
    tmp_path, signal_files, caplog
):
    """16 steps against a default warm-up of 20: cut to a tenth of the run, and said so; a
    warm-up asked for is kept, and one as long as the run is warned about."""
    from spdrank.training.train import Trainer

    def schedule(warmup_steps=None):
        cfg = config(tmp_path, "unused", target="clicks", features="signal", features_only=True,
                     max_steps=16, warmup_steps=warmup_steps)
        with caplog.at_level("INFO"):
            trainer = Trainer(cfg)
        factor = trainer.scheduler.lr_lambdas[0]
        return trainer.warmup_steps, [factor(step) for step in range(16)]

    steps, factors = schedule()
    assert steps == 2 and factors[:3] == [0.5, 1.0, 1.0]
    assert ("warming up over 2 steps, 10% of this run's 16 (the default 20 would not end "
            "before the run does)") in caplog.text
    caplog.clear()
    assert schedule(warmup_steps=4)[0] == 4 and "warming up" not in caplog.text
    steps, factors = schedule(warmup_steps=20)
    assert steps == 20 and max(factors) < 1.0
    assert "--warmup-steps 20 is not below this run's 16 steps" in caplog.text


# -- training from cached states -------------------------------------------------------------


def test_training_from_cached_states_gives_the_weights_of_live_training(tmp_path, tiny_backbone, train_file):
    """The same batches, dropout, loss and optimizer: only where the states come from differs."""
    run = functools.partial(config, tmp_path, tiny_backbone, frozen=True, max_steps=6)
    train(run(out="live"))
    cached = functools.partial(run, cache_states=str(tmp_path / "states"), cache_dtype="float32")
    train(cached(out="cached"))
    live, from_cache = weights(tmp_path / "live"), weights(tmp_path / "cached")
    assert live.keys() == from_cache.keys()
    assert all(torch.allclose(live[k], from_cache[k], atol=1e-5) for k in live)
    assert not train(cached(out="resumed", stop_after=3))["finished"]
    assert train(cached(out="resumed"))["finished"]
    assert_same(weights(tmp_path / "resumed"), from_cache)


def test_a_cache_holds_the_slates_a_run_trains_on(tmp_path, tiny_backbone, slates):
    """Slates with nothing to train on (no click) are left out of the cache as of the run, so
    a cached run on such a file learns what a live one does."""
    for slate in slates[1::3]:
        slate.clicked = []
    write_slates(tmp_path / "train.jsonl", slates)
    run = functools.partial(config, tmp_path, tiny_backbone, frozen=True, max_steps=4,
                            target="clicks")
    live = train(run(out="live"))
    cached = train(run(out="cached", cache_states=str(tmp_path / "states"),
                       cache_dtype="float32"))
    assert live["skipped_slates"] == cached["skipped_slates"] == 3
    assert cached["train_slates"] == 5
    a, b = weights(tmp_path / "live"), weights(tmp_path / "cached")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_a_model_trained_from_cache_scores_as_its_cached_states_do(
    tmp_path, tiny_backbone, train_file
):
    cfg = config(tmp_path, tiny_backbone, frozen=True, max_steps=3, cache_states=str(tmp_path / "c"))
    train(cfg)
    assert not (tmp_path / "run" / "model" / "adapter").exists()
    model = SPDRanker.from_pretrained(tmp_path / "run")  # an ordinary checkpoint
    cache = open_state_cache(tmp_path / "c" / "train", model, train_file, 8, progress=False)
    for i, slate in enumerate(load_slates(train_file)):
        with torch.inference_mode():
            cached = model(cache.batch([i], [slate], model))[0, : len(slate)].numpy()
        assert np.abs(model.score_matrix(slate) - cached).max() < 2e-3  # float16 states


def test_training_from_cache_fits_the_teacher_permutations(tmp_path, tiny_backbone, train_file):
    summary = train(config(
        tmp_path, tiny_backbone, frozen=True, cache_states=str(tmp_path / "states"),
        eval_slates=str(train_file), max_steps=60, head_lr=1e-2, head_dropout=0.0,
        warmup_steps=5,
    ))
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").open()]
    losses = [event["loss"] for event in log if "loss" in event]
    assert losses[-1] < 0.25 * losses[0]
    assert summary["eval"]["tau"] > 0.8


def test_training_from_cache_learns_features_and_runs_no_prefill_once_cached(
    tmp_path, tiny_backbone, signal_files, monkeypatch
):
    from spdrank.backbone import readout as model_module

    prefills = []
    real = model_module.prompt_hidden

    def counted(backbone, prompt):
        prefills.append(prompt.input_ids.shape[0])
        return real(backbone, prompt)

    monkeypatch.setattr(model_module, "prompt_hidden", counted)
    _, eval_file = signal_files
    cfg = functools.partial(
        config, tmp_path, tiny_backbone, target="clicks", head="attn", frozen=True,
        features="signal", max_steps=40, head_lr=1e-2, head_dropout=0.0, warmup_steps=4, eval_every=20,
        eval_slates=str(eval_file), cache_states=str(tmp_path / "states"),
    )
    summary = train(cfg(out="first"))
    assert sum(prefills) == 32 + 24  # each training and eval slate once, in the cache build
    assert summary["eval"]["R@1"] >= 0.8  # evaluated from the eval slates' cached states
    prefills.clear()
    assert train(cfg(out="second"))["finished"] and prefills == []  # the cache is reused
    assert top1(SPDRanker.from_pretrained(tmp_path / "second"), eval_file) >= 0.8


def test_cache_settings_that_cannot_work_fail_before_anything_is_written(
    tmp_path, tiny_backbone, train_file, capsys
):
    states = str(tmp_path / "states")
    with pytest.raises(ValueError, match="--cache-states needs --frozen"):
        train(config(tmp_path, tiny_backbone, max_steps=1, cache_states=states))
    with pytest.raises(ValueError, match="--head first reads the LM's logits"):
        train(config(tmp_path, tiny_backbone, head="first", frozen=True, max_steps=1,
                     cache_states=states))
    with pytest.raises(ValueError, match="--features-only runs no backbone"):
        train(config(tmp_path, tiny_backbone, features="x", features_only=True, max_steps=1,
                     cache_states=states))
    assert main(["train", "--slates", str(train_file), "--out", str(tmp_path / "run"), "--frozen",
                 "--cache-states", states, "--batch-size", "2", "--num-processes", "2"]) == 2
    assert "--cache-states trains in one process" in capsys.readouterr().err
    assert not (tmp_path / "states").exists() and not (tmp_path / "run").exists()


def test_the_run_time_in_train_json_counts_the_state_cache_build(
    tmp_path, tiny_backbone, train_file, monkeypatch
):
    import time

    from spdrank.training import train as train_module

    real = train_module.open_state_cache

    def slow(*args, **kwargs):
        time.sleep(0.5)  # a cache build that takes time
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "open_state_cache", slow)
    train(config(tmp_path, tiny_backbone, frozen=True, max_steps=2,
                 cache_states=str(tmp_path / "states")))
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["state_cache_s"] >= 0.5
    assert summary["wall_s_this_run"] >= summary["state_cache_s"]


def test_cli_trains_from_cache_then_ranks(tmp_path, tiny_backbone, train_file):
    out = tmp_path / "cli"
    assert main([
        "train", "--slates", str(train_file), "--out", str(out), "--target", "teacher",
        "--head", "linear", "--frozen", "--cache-states", str(tmp_path / "states"),
        "--cache-batch-size", "3", "--backbone", tiny_backbone, "--positions", "16",
        "--max-steps", "2", "--batch-size", "2", "--eval-slates", str(train_file),
        "--eval-limit", "3", "--no-progress",
    ]) == 0
    assert json.loads((out / "train.json").read_text())["config"]["cache_states"]
    key = json.loads((tmp_path / "states" / "eval" / "key.json").read_text())
    assert key["key"]["slates"]["count"] == 3 and key["key"]["storage"] == "float16"
    assert main(["rank", "--model", str(out), "--input", str(train_file), "--output",
                 str(tmp_path / "ranked.jsonl")]) == 0
    assert len((tmp_path / "ranked.jsonl").read_text().splitlines()) == 8


def test_a_click_trained_model_saves_its_decoder_and_expected_rank_orders_the_whole_slate(
    tmp_path, signal_files
):
    """Clicks say only which item goes first, so a click-trained matrix orders its tail
    arbitrarily under the Hungarian assignment; decoded by expected rank, the whole slate
    follows the learned signal. ``--decoder`` is saved with the model and used by rank."""
    from spdrank.eval.metrics import kendall_tau
    from spdrank.methods.spd.decode import decode

    train_file, eval_file = signal_files
    train(TrainConfig(
        slates=str(train_file), out=str(tmp_path / "run"), target="clicks", features="signal",
        features_only=True, positions=8, head_width=16, head_dropout=0.0, head_lr=1e-2,
        max_steps=60, batch_size=4, warmup_steps=4, eval_every=0, save_every=0, progress=False,
        position_weights="dcg", decoder="expected_rank", anchor="none",  # the head alone
    ))
    model = SPDRanker.from_pretrained(tmp_path / "run")
    assert model.config.decoder == "expected_rank"
    taus: dict[str, list[float]] = {"expected_rank": [], "hungarian": []}
    for slate in load_slates(eval_file):
        scores = model.score_matrix(slate)
        assert model.rank(slate).docids == [slate.docids[i] for i in decode(scores, "expected_rank")]
        by_signal = [c.docid for c in sorted(slate.candidates, key=lambda c: -c.features["signal"])]
        for name, found in taus.items():
            found.append(kendall_tau([slate.docids[i] for i in decode(scores, name)], by_signal))
    mean = {name: sum(found) / len(found) for name, found in taus.items()}
    assert mean["expected_rank"] > 0.6 and mean["expected_rank"] > mean["hungarian"] + 0.2


def test_an_unknown_decoder_or_position_weighting_fails_before_training(tmp_path, signal_files):
    train_file, _ = signal_files
    base = {"slates": str(train_file), "target": "clicks", "features": "signal", "features_only": True,
                "positions": 8, "head_width": 16, "max_steps": 1, "eval_every": 0, "save_every": 0, "progress": False}
    with pytest.raises(ValueError, match="decoder"):
        train(TrainConfig(out=str(tmp_path / "a"), decoder="lapjv-missing", **base))
    with pytest.raises(ValueError, match="position weights"):
        train(TrainConfig(out=str(tmp_path / "b"), position_weights="top", **base))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("decoder", [None, "hungarian", "greedy"])
def test_the_checkpoint_carries_its_decoder_expected_rank_by_default(tmp_path, decoder):
    kw = {} if decoder is None else {"decoder": decoder}
    cfg = TrainConfig(slates=str(tmp_path / "t.jsonl"), out=str(tmp_path / "o"), **kw)
    assert cfg.model_config().decoder == (decoder or "expected_rank")


def test_lora_modules_choose_what_lora_adapts_and_are_saved(tmp_path, tiny_backbone, train_file):
    train(config(tmp_path, tiny_backbone, out="qv", max_steps=1, lora_modules="q_proj, v_proj"))
    adapted = {k.split(".lora_")[0].rsplit(".", 1)[1] for k in weights(tmp_path / "qv")
               if k.startswith("lora.")}
    assert adapted == {"q_proj", "v_proj"}
    saved = json.loads((tmp_path / "qv" / "model" / "config.json").read_text())
    assert saved["backbone"]["lora"]["target_modules"] == ["q_proj", "v_proj"]
    slate = load_slates(train_file)[0]
    assert is_valid_permutation(SPDRanker.from_pretrained(tmp_path / "qv").rank(slate).docids,
                                slate.docids)
    with pytest.raises(ValueError, match="--lora-modules is empty"):
        train(config(tmp_path, tiny_backbone, out="none", max_steps=1, lora_modules=" , "))


def test_the_defaults_are_the_recipe_that_learned_its_teachers():
    cfg = TrainConfig(slates="s.jsonl", out="o")
    assert (cfg.target, cfg.head, cfg.readout, cfg.match) == ("teacher", "history", "words", "tfidf")
    spd = cfg.model_config()
    assert spd.head.kind == "history" and spd.prompt.history_items and spd.prompt.readout == "words"
    assert spd.head.history.match == "tfidf"
    # the other heads read one state per item
    assert TrainConfig(slates="s.jsonl", out="o", head="attn").readout == "mean"
    # no states to read: the head over the candidates' features
    assert TrainConfig(slates="s.jsonl", out="o", features_only=True).head == "attn"
    assert TrainConfig(slates="s.jsonl", out="o", head="linear").head == "linear"


def test_the_words_readout_and_tfidf_match_reach_the_head():
    spd = TrainConfig(slates="s.jsonl", out="o", readout="words", match="tfidf").model_config()
    assert spd.prompt.readout == "words" and spd.head.history.match == "tfidf"
    with pytest.raises(ValueError, match="unknown match"):
        TrainConfig(slates="s.jsonl", out="o", readout="words", match="bm25").model_config()


def test_the_settings_read_no_file_and_the_run_fits_the_features_on_its_slates(
    tmp_path, signal_files
):
    """TrainConfig builds the model's config from settings alone; the normalisation of
    --features is fitted by the run, on the --limit slates it trains on."""
    from dataclasses import replace

    from spdrank.core.features import FeatureNormalizer
    from spdrank.training.train import fit_feature_normalizer

    absent = TrainConfig(slates=str(tmp_path / "absent.jsonl"), out="o", head="attn",
                         features="signal")
    absent.check()
    assert absent.model_config().features is None
    train_file, _ = signal_files
    cfg = replace(absent, slates=str(train_file), limit=5)
    fitted = fit_feature_normalizer(cfg)
    assert fitted == FeatureNormalizer.fit(("signal",), load_slates(train_file)[:5])
    assert fitted != FeatureNormalizer.fit(("signal",), load_slates(train_file))
    assert cfg.model_config(fitted).features is fitted
    assert fit_feature_normalizer(replace(cfg, features=None)) is None


def test_the_features_are_fitted_on_the_slates_the_run_learns_from(tmp_path, signal_files):
    """Slates a click-trained run leaves out (no clicked item) neither count towards --limit
    nor move the normalisation: it is fitted on the --limit slates the run trains on."""
    from dataclasses import replace

    from spdrank.core.features import FeatureNormalizer
    from spdrank.training.train import fit_feature_normalizer

    train_file, _ = signal_files
    slates = load_slates(train_file)
    mixed = [replace(s, clicked=()) if i % 2 else s for i, s in enumerate(slates)]
    write_slates(tmp_path / "mixed.jsonl", mixed)
    cfg = TrainConfig(slates=str(tmp_path / "mixed.jsonl"), out="o", head="attn",
                      features="signal", target="clicks", limit=5)
    clicked = [s for s in mixed if s.clicked]
    assert fit_feature_normalizer(cfg) == FeatureNormalizer.fit(("signal",), clicked[:5])
    assert fit_feature_normalizer(cfg) != FeatureNormalizer.fit(("signal",), mixed[:5])
    # A teacher-trained run reads every slate.
    teacher = replace(cfg, target="teacher")
    assert fit_feature_normalizer(teacher) == FeatureNormalizer.fit(("signal",), mixed[:5])


@pytest.mark.parametrize(("settings", "processes", "refusal"), [
    ({"target": "ranks"}, 1, "unknown --target 'ranks'"),
    ({"batch_size": 0}, 1, "--batch-size must be at least 1"),
    ({"batch_size": 3}, 2, "--batch-size 3 does not split evenly over 2 processes"),
    ({"frozen": True, "cache_states": "c", "batch_size": 2}, 2,
     "--cache-states trains in one process"),
    ({"cache_states": "c"}, 1, "--cache-states needs --frozen"),
    ({"head": "pointwise", "lora_layers": 1, "cache_states": "c"}, 1,
     "the pointwise method reads one sequence a candidate: cache with --frozen"),
    ({"frozen": True, "cache_states": "c", "cache_dtype": "int8"}, 1, "unknown --cache-dtype"),
    ({"frozen": True, "cache_states": "c", "cache_batch_size": 0}, 1,
     "--cache-batch-size must be at least 1"),
    ({"lora_modules": " , "}, 1, "--lora-modules is empty"),
])
def test_check_refuses_what_cannot_train_from_the_settings_alone(
    tmp_path, settings, processes, refusal
):
    cfg = TrainConfig(slates=str(tmp_path / "absent.jsonl"), out=str(tmp_path / "o"), **settings)
    with pytest.raises(ValueError, match=refusal):
        cfg.check(processes)
    assert not (tmp_path / "o").exists()


def test_check_accepts_what_lora_never_reads_when_no_lora_trains():
    for frozen in ({"frozen": True}, {"features_only": True, "features": "x"}):
        cfg = TrainConfig(slates="s.jsonl", out="o", lora_modules=" , ", **frozen)
        cfg.check()
        assert cfg.model_config().backbone.lora is None
