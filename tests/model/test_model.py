import dataclasses
import json
import random
import warnings

import numpy as np
import pytest
import torch

from spdrank.backbone.prompt import PromptSettings
from spdrank.backbone.settings import BackboneConfig, LoraSettings
from spdrank.core.features import FeatureNormalizer
from spdrank.core.ranking import STAGES
from spdrank.core.slates import SlateError
from spdrank.eval.metrics import is_valid_permutation
from spdrank.methods.first.method import first_prompt
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.spd.history_settings import HistorySettings
from spdrank.model.config import SPDConfig
from spdrank.model.parts import NoBackbone, NoTokenizer
from spdrank.model.ranker import SPDRanker
from tests.helpers import make_slate, tiny_config


@pytest.mark.parametrize("kind", ["attn", "linear"])
@pytest.mark.parametrize("frozen", [False, True])
def test_save_load_round_trip(tmp_path, tiny_backbone, slates, kind, frozen):
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone, kind, frozen))
    # Make the adapter non-trivial (peft initialises B = 0), so the round trip is meaningful.
    with torch.no_grad():
        for name, p in model.backbone.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    before = model.score_matrix(slates[0])
    model.save_pretrained(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    assert not [f for f in files if f.endswith((".bin", ".pt", ".pkl", ".pth"))], files
    assert ("adapter_model.safetensors" in files) == (not frozen)
    loaded = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.score_matrix(slates[0]), before, rtol=1e-5, atol=1e-5)
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["head"]["kind"] == kind


def test_rank_returns_valid_permutation_with_timings(tiny_backbone, slates):
    model = SPDRanker.build(tiny_config(tiny_backbone))
    for slate in slates:
        r = model.rank(slate)
        assert is_valid_permutation(r.docids, slate.docids)
        assert r.decode_passes == 1
        assert set(r.timings) == set(STAGES)
        assert all(a >= b for a, b in zip(r.scores, r.scores[1:]))
        assert all(0 < s <= 1 for s in r.scores)
    r = model.rank("my history", ["red gel", "blue soap", "green mask"])
    assert sorted(r.docids) == ["0", "1", "2"]


def test_rank_of_plain_texts_gives_their_indices_as_ints_and_keeps_the_top_n(tiny_backbone, slates):
    model = SPDRanker.build(tiny_config(tiny_backbone))
    texts = ["red gel", "blue soap", "green mask", "pink oil"]
    whole = model.rank("my history", texts)
    assert sorted(whole.indices) == [0, 1, 2, 3] and all(type(i) is int for i in whole.indices)
    assert whole.docids == [str(i) for i in whole.indices]
    top = model.rank("my history", texts, top_n=2)
    assert top.indices == whole.indices[:2] and top.docids == whole.docids[:2]
    assert top.scores == whole.scores[:2]
    assert len(model.rank("my history", texts, top_n=10).indices) == 4
    slate = slates[0]  # a slate keeps its docids; indices say where they sat in it
    ranked = model.rank(slate)
    assert [slate.docids[i] for i in ranked.indices] == ranked.docids
    with pytest.raises(ValueError, match="top_n must be a positive integer"):
        model.rank("my history", texts, top_n=0)
    assert model.rank("my history", texts, top_n=np.int64(2)).indices == whole.indices[:2]


def test_rank_holds_what_it_is_given_to_a_slate_files_rules(tiny_backbone, slates):
    """Objects built by hand skip the file reader's checks: rank() makes them, naming the
    field, rather than ranking a repeated docid twice or a blank passage as text."""
    from spdrank.core.slates import Candidate, Query, Slate, SlateError

    model = SPDRanker.build(tiny_config(tiny_backbone))
    twice = Slate(Query("q", "history"), [Candidate("a", {"title": "x"}),
                                          Candidate("a", {"title": "y"})])
    with pytest.raises(SlateError, match=r"rank\(\): duplicate docid 'a' at candidates\[1\]"):
        model.rank(twice)
    with pytest.raises(SlateError, match="is empty"):
        model.rank("my history", ["real", "   "])
    with pytest.raises(SlateError, match="a slate needs at least one candidate"):
        model.rank("my history", [])
    with pytest.raises(TypeError, match="query must be a string, a Query or a Slate, got NoneType"):
        model.rank(None, ["red gel"])
    with pytest.raises(TypeError, match="candidates must be a list of strings"):
        model.rank("my history", "abc")
    assert model.rank_batch([]) == []
    before = [c.docid for c in slates[0].candidates]
    model.rank(slates[0])
    assert [c.docid for c in slates[0].candidates] == before  # the caller's slate untouched


def test_spdranker_imports_from_the_package_without_torch_until_used():
    import subprocess
    import sys

    from tests.helpers import subprocess_env

    code = (
        "import sys, spdrank; assert 'torch' not in sys.modules, 'import spdrank loaded torch'; "
        "from spdrank import SPDRanker; from spdrank.model.ranker import SPDRanker as M; "
        "assert SPDRanker is M; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=subprocess_env(), check=False, timeout=300)
    assert done.stdout.strip() == "ok", done.stderr


def test_loading_a_cut_backbone_says_nothing_unless_debugging(tiny_backbone, capfd, caplog):
    """The first layer of two: the second's weights are unread, which transformers reports as
    UNEXPECTED keys, expected here, so shown only at debug level (spdrank -v)."""
    from transformers.utils import logging as hf_logging

    from spdrank.backbone.load import load_backbone

    verbosity = hf_logging.get_verbosity()
    config = BackboneConfig(name_or_path=tiny_backbone, layers=1, lora=LoraSettings(r=2, alpha=4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_backbone(config)
    quiet = capfd.readouterr()
    assert "UNEXPECTED" not in quiet.err + quiet.out + caplog.text
    assert "Loading weights" not in quiet.err  # transformers' bar
    assert not [w for w in caught if issubclass(w.category, FutureWarning)]
    assert hf_logging.get_verbosity() == verbosity  # restored after the load
    with caplog.at_level("DEBUG", logger="spdrank.backbone.load"):
        load_backbone(config)
    loud = capfd.readouterr()
    assert "UNEXPECTED" in loud.err + loud.out + caplog.text


def test_rank_batch_matches_rank_one_by_one(tiny_backbone, slates):
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone))
    alone = [model.score_matrix(s) for s in slates]
    together = [r.docids for r in model.rank_batch(slates)]
    assert together == [model.rank(s).docids for s in slates]
    batch = model.collate([model.encode(s) for s in slates])
    with torch.inference_mode():
        scores = model.eval()(batch)
    for i, s in enumerate(slates):
        np.testing.assert_allclose(scores[i, : len(s)].numpy(), alone[i], rtol=1e-4, atol=1e-4)


def test_ranking_leaves_training_mode_and_thread_count_as_they_were(tiny_backbone, slates):
    """rank() scores in eval mode (no dropout) whatever mode the model is in, and puts the mode
    back; the head may run on one thread, and the caller's thread count is restored."""
    torch.manual_seed(0)
    model = SPDRanker.build(tiny_config(tiny_backbone))
    model.eval()
    want = [model.score_batch([s])[0] for s in slates]
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = [model.score_batch([s])[0] for s in slates]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert model.training and all(m.training for m in model.modules())
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    model.eval()
    model.rank(slates[0])
    assert not any(m.training for m in model.modules())


def test_collate_pads_ids_spans_and_masks():
    from spdrank.backbone.batching import collate
    from spdrank.backbone.prompt import EncodedPrompt

    a = EncodedPrompt([5, 6, 7, 8], item_first=[0, 2], item_last=[1, 3], truncated=[False, False],
                      history=[(0, 0)], features=np.ones((2, 1), dtype=np.float32))
    b = EncodedPrompt([9, 10], item_first=[1], item_last=[1], truncated=[False], history=None,
                      features=np.full((1, 1), 2.0, dtype=np.float32))
    batch = collate([a, b], pad_id=0)
    prompt = batch.prompt
    assert batch.cached is None
    assert prompt.input_ids.tolist() == [[5, 6, 7, 8], [9, 10, 0, 0]]
    assert prompt.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert prompt.item_last.tolist() == [[1, 3], [1, 0]]
    assert prompt.item_first.tolist() == [[0, 2], [1, 0]]
    assert batch.item_mask.tolist() == [[True, True], [True, False]]
    assert batch.sizes.tolist() == [2, 1] and batch.features[:, :, 0].tolist() == [[1, 1], [2, 0]]
    assert prompt.history_first.tolist() == [[0], [0]]
    assert prompt.history_last.tolist() == [[0], [0]]
    assert batch.history_mask.tolist() == [[True], [False]]
    for t in (prompt.input_ids, prompt.attention_mask, prompt.item_last, prompt.item_first,
              batch.sizes, prompt.history_first, prompt.history_last):
        assert t.dtype == torch.long
    assert batch.item_mask.dtype == batch.history_mask.dtype == torch.bool


def test_too_many_candidates_is_a_clear_error(tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone, positions=4))
    with pytest.raises(ValueError, match="has 6 candidates; this model ranks at most 4"):
        model.rank(make_slate(random.Random(0), 6))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an spdrank checkpoint"):
        SPDRanker.from_pretrained(tmp_path)


def test_a_config_without_a_decoder_field_loads_with_the_hungarian_decoder():
    saved = SPDConfig(decoder="expected_rank").to_dict()
    assert SPDConfig.from_dict(saved).decoder == "expected_rank"
    del saved["decoder"]
    assert SPDConfig.from_dict(saved).decoder == "hungarian"


# -- upstream features -----------------------------------------------------------------------


def with_features(slates, seed=0):
    """The slates with a random 'signal' feature and a random score on every candidate."""
    rng = random.Random(seed)
    for slate in slates:
        for c in slate.candidates:
            c.features = {"signal": rng.gauss(0, 1)}
            c.score = rng.uniform(0, 10)
    return slates


def feature_config(path, kind, features_only=False):
    config = tiny_config(path, kind, frozen=features_only)
    if kind == "first":
        config.prompt = first_prompt(config.prompt)
    config.features = FeatureNormalizer(("signal", "score"), (0.0, 5.0), (1.0, 3.0))
    config.features_only = features_only
    return config


@pytest.mark.parametrize("kind", ["attn", "linear", "scalar", "first"])
def test_features_are_saved_with_their_normalisation_and_reproduce_scores(
    tmp_path, tiny_backbone, slates, kind
):
    torch.manual_seed(0)
    slates = with_features(slates)
    model = SPDRanker.build(feature_config(tiny_backbone, kind))
    before = model.score_matrix(slates[0])
    model.save_pretrained(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert saved["features"] == {"names": ["signal", "score"], "mean": [0.0, 5.0], "std": [1.0, 3.0]}
    loaded = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.score_matrix(slates[0]), before, rtol=1e-5, atol=1e-5)
    # The features reach the scores: moving one candidate's feature moves them.
    slates[0].candidates[0].features["signal"] += 3.0
    assert not np.allclose(loaded.score_matrix(slates[0]), before, atol=1e-4)
    batch = loaded.collate([loaded.encode(s) for s in slates])
    assert batch.features.shape == (len(slates), max(len(s) for s in slates), 2)


def test_a_slate_without_a_feature_the_model_reads_is_a_clear_error(tiny_backbone, slates):
    model = SPDRanker.build(feature_config(tiny_backbone, "attn"))
    slate = with_features(slates)[2]
    slate.candidates[1].features = {"other": 1.0}
    with pytest.raises(SlateError, match=r"slate 'u2': candidates\[1\] \(docid 'd1'\) has no "
                       "feature 'signal', which this model reads"):
        model.rank(slate)


def test_features_only_builds_saves_loads_and_ranks_without_the_backbone(
    tmp_path, slates, monkeypatch
):
    def no_llm(*args, **kwargs):
        raise AssertionError("a features-only model must not load the LLM")

    monkeypatch.setattr("spdrank.model.parts.load_backbone", no_llm)
    monkeypatch.setattr("spdrank.model.parts.load_tokenizer", no_llm)
    torch.manual_seed(0)
    slates = with_features(slates)
    model = SPDRanker.build(feature_config("no/such/backbone", "attn", features_only=True))
    assert not list(model.backbone.parameters())
    encoded = model.encode(slates[0])
    assert encoded.input_ids == [] and encoded.features.shape == (len(slates[0]), 2)
    before = model.score_matrix(slates[0])
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "head.safetensors"]
    loaded = SPDRanker.from_pretrained(tmp_path / "ckpt")
    np.testing.assert_allclose(loaded.score_matrix(slates[0]), before, rtol=1e-6)
    for slate, ranking in zip(slates, loaded.rank_batch(slates)):
        assert is_valid_permutation(ranking.docids, slate.docids)


def test_first_cannot_run_on_features_alone(slates):
    with pytest.raises(ValueError, match="FIRST scores candidates by the backbone's letter logits"):
        SPDRanker(feature_config("unused", "first", features_only=True), NoBackbone(), NoTokenizer())


def test_mean_readout_pools_every_token_of_a_span():
    from spdrank.backbone.readout import pool_spans

    hidden = torch.randn(2, 7, 3)
    first = torch.tensor([[1, 4], [0, 6]])
    last = torch.tensor([[3, 4], [5, 6]])
    mean = pool_spans(hidden, first, last, "mean")
    torch.testing.assert_close(mean[0, 0], hidden[0, 1:4].mean(0))
    torch.testing.assert_close(mean[0, 1], hidden[0, 4])
    torch.testing.assert_close(mean[1, 0], hidden[1, 0:6].mean(0))
    torch.testing.assert_close(pool_spans(hidden, first, last, "last")[1, 0], hidden[1, 5])
    # a bfloat16 prefill is averaged in float32 and returned in its own dtype
    low = hidden.bfloat16()
    mean = pool_spans(low, first, last, "mean")
    assert mean.dtype == torch.bfloat16
    torch.testing.assert_close(mean[1, 0], low[1, 0:6].float().mean(0).bfloat16())


def test_history_head_model_round_trips_and_ranks(tmp_path, tiny_backbone, slates):
    torch.manual_seed(0)
    config = SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="history", positions=16, width=32),
        prompt=PromptSettings(readout="mean", history_items=True),
    )
    model = SPDRanker.build(config)
    model.save_pretrained(tmp_path / "m")
    loaded = SPDRanker.from_pretrained(tmp_path / "m")
    for slate in slates[:3]:
        assert sorted(loaded.rank(slate).docids) == sorted(slate.docids)
        np.testing.assert_allclose(loaded.score_matrix(slate), model.eval().score_matrix(slate), atol=1e-5)
    without = dataclasses.replace(config, prompt=PromptSettings(readout="mean"))
    with pytest.raises(ValueError, match="history_items=True"):
        SPDRanker.build(without)


@pytest.mark.parametrize(("readout", "match"), [("tokens", "maxsim"), ("words", "tfidf")])
def test_unit_readouts_need_the_history_head_built_for_them(tiny_backbone, slates, readout, match):
    torch.manual_seed(0)
    config = SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="history", positions=16, width=32,
                        history=HistorySettings(match=match)),
        prompt=PromptSettings(max_item_tokens=6, readout=readout, history_items=True),
    )
    model = SPDRanker.build(config).eval()
    one = model.rank_batch(slates[:1])[0]
    assert sorted(one.docids) == sorted(slates[0].docids)
    # A slate's scores do not depend on the slates padded next to it.
    both = model.score_batch(slates[:2])[0]
    np.testing.assert_allclose(both[0, : len(slates[0])], model.score_matrix(slates[0]), atol=1e-4)
    with pytest.raises(ValueError, match=f"{readout} readout"):
        SPDRanker.build(dataclasses.replace(config, head=HeadConfig(kind="attn", positions=16)))


@pytest.mark.parametrize("match", ["maxsim", "tfidf"])
def test_an_anchored_history_head_ranks_as_it_was_given(tiny_backbone, slates, match):
    """Whichever match it uses, the history head names only output layers it has, so it can
    start at its anchor's order."""
    torch.manual_seed(0)
    config = SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="history", positions=16, width=32, anchor="order",
                        history=HistorySettings(match=match)),
        prompt=PromptSettings(max_item_tokens=6, readout="mean" if match == "maxsim" else "words",
                              history_items=True),
    )
    model = SPDRanker.build(config).eval()
    assert [r.docids for r in model.rank_batch(slates[:2])] == [s.docids for s in slates[:2]]
