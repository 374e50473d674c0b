"""The pointwise peer (spdrank.methods.pointwise): one sequence a candidate with the user
context, batched, one linear score from its last state; trained, cached, saved and loaded as
every method is."""

from __future__ import annotations

import json
import random

import pytest
import torch

from spdrank.backbone.batching import collate_candidates
from spdrank.backbone.prompt import (
    CandidatePrompts,
    PromptBuilder,
    PromptSettings,
    encode_candidates,
)
from spdrank.backbone.readout import read_candidates
from spdrank.backbone.settings import LoraSettings
from spdrank.core.slates import Slate, load_slates
from spdrank.methods.base import method_for
from spdrank.methods.pointwise.method import PointwiseMethod
from spdrank.methods.scalar.loss import listnet_loss
from spdrank.methods.scalar.method import ScalarMethod
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache
from spdrank.training.train import TrainConfig, train
from tests.helpers import make_slate, tiny_config
from tests.helpers import train_config as config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def model(backbone: str, frozen: bool = True, **prompt) -> SPDRanker:
    torch.manual_seed(0)
    cfg = tiny_config(backbone, "pointwise", frozen=frozen, lora=LoraSettings(r=4))
    for name, value in prompt.items():
        setattr(cfg.prompt, name, value)
    return SPDRanker.build(cfg).eval()


@pytest.fixture(scope="module")
def frozen(tiny_backbone) -> SPDRanker:
    return model(tiny_backbone)


def test_the_method_is_registered_and_sorts_a_listnet_score_as_the_scalar_peer():
    method = method_for("pointwise")
    assert isinstance(method, PointwiseMethod) and isinstance(method, ScalarMethod)
    assert not method.matrix and not method.reads_logits and method.caches_states
    assert method.model_name("pointwise") == "pointwise"
    torch.manual_seed(0)
    scores, sizes = torch.randn(2, 4), torch.tensor([4, 3])
    target = torch.zeros(2, 4, 4)
    target[0], target[1, :3, :3] = torch.eye(4), torch.eye(3)
    cfg = TrainConfig(slates="x", out="y")
    torch.testing.assert_close(method.loss(scores, target, sizes, cfg),
                               listnet_loss(scores, target, sizes, reduction="none"))


def test_each_sequence_is_the_single_candidate_prompt_cut_after_the_candidate(tokenizer):
    builder = PromptBuilder(tokenizer, PromptSettings(max_item_tokens=6))
    history = "1. Rose shampoo\n2. Argan oil"
    texts = ["Top coat", "A very long title about nail polish that the budget cuts", ""]
    encoded = encode_candidates(builder, history, texts)
    assert isinstance(encoded, CandidatePrompts)
    sequences = encoded.sequences()
    assert len(sequences) == 3 and encoded.lengths == [len(s) for s in sequences]
    assert encoded.input_ids == [t for s in sequences for t in s]
    assert encoded.longest == max(encoded.lengths) < len(encoded.input_ids)
    assert encoded.truncated == [False, True, False]
    for text, seq, first, last in zip(texts, sequences, encoded.item_first, encoded.item_last):
        alone = builder.encode(history, [text])
        # The one-candidate prompt up to the candidate's last token, read there.
        assert seq == alone.input_ids[: alone.item_last[0] + 1] and last == len(seq) - 1
        assert seq[first : last + 1] == (builder.item_tokens(text) or seq[last:])
    assert tokenizer.decode(sequences[0]).strip().endswith("[1] Top coat")


def test_a_batch_is_one_row_a_real_candidate_and_reads_as_each_row_alone(frozen):
    rng = random.Random(1)
    slates = [make_slate(rng, 5, qid="a"), make_slate(rng, 3, qid="b")]
    encoded = [frozen.encode(s) for s in slates]
    batch = frozen.collate(encoded)
    assert batch.prompt.input_ids.shape[0] == 8 and batch.prompt.item_last.shape == (2, 5)
    assert batch.item_mask.sum(1).tolist() == [5, 3] and batch.sizes.tolist() == [5, 3]
    assert int(batch.prompt.attention_mask.sum()) == sum(len(e.input_ids) for e in encoded)
    with torch.inference_mode():
        whole = frozen.read(batch).items
        # Chunks of one row each: the same states, the padded candidates zeros.
        rows = read_candidates(frozen.backbone, batch, "last", chunk_tokens=1).items
        assert whole.shape == (2, 5, 32) and not whole[1, 3:].any()
        torch.testing.assert_close(rows, whole, atol=1e-5, rtol=1e-5)
        for b, slate in enumerate(slates):
            alone = frozen.read(frozen.collate([frozen.encode(slate)])).items[0]
            torch.testing.assert_close(whole[b, : len(slate)], alone, atol=1e-5, rtol=1e-5)
    with pytest.raises(TypeError, match="collates the CandidatePrompts"):
        collate_candidates([PromptBuilder(frozen.tokenizer, frozen.config.prompt).encode("q", ["x"])], 0)


def test_a_candidates_score_ignores_the_other_candidates(frozen):
    rng = random.Random(2)
    slate = make_slate(rng, 6, qid="u")
    scores = frozen.score_matrix(slate)
    others = Slate(query=slate.query, candidates=[slate.candidates[4], slate.candidates[1]])
    torch.testing.assert_close(torch.from_numpy(frozen.score_matrix(others)),
                               torch.from_numpy(scores[[4, 1]]), atol=1e-5, rtol=1e-5)
    ranking = frozen.rank(slate)
    assert sorted(ranking.indices) == list(range(6))
    assert ranking.scores == sorted(ranking.scores, reverse=True)


def test_a_sequence_longer_than_the_backbone_is_refused_not_the_sum(frozen, monkeypatch):
    rng = random.Random(3)
    slate = make_slate(rng, 8, qid="long")
    encoded = frozen.encode(slate)
    assert len(encoded.input_ids) > encoded.longest
    monkeypatch.setattr(frozen, "context_length", encoded.longest)
    frozen.encode(slate)  # every sequence fits, though all of them together would not
    monkeypatch.setattr(frozen, "context_length", encoded.longest - 1)
    with pytest.raises(ValueError, match=f"its prompt is {encoded.longest} tokens"):
        frozen.encode(slate)


def test_what_the_method_refuses(tiny_backbone):
    method = PointwiseMethod()
    with pytest.raises(ValueError, match="cannot run on features alone"):
        method.check(SPDConfig(features_only=True))
    words = tiny_config(tiny_backbone, "pointwise", frozen=True)
    words.prompt.readout = "words"
    with pytest.raises(ValueError, match="use --readout last or mean"):
        method.check(words)
    method.check(tiny_config(tiny_backbone, "pointwise", frozen=True))


def test_the_mean_readout_averages_the_candidates_own_tokens(tiny_backbone):
    mean = model(tiny_backbone, readout="mean")
    slate = Slate.from_dict({"query": "1. Rose shampoo", "candidates": [
        {"docid": "a", "doc": {"text": "Top coat base coat"}}]})
    encoded = mean.encode(slate)
    with torch.inference_mode():
        states = mean.read(mean.collate([encoded])).items[0, 0]
        from spdrank.backbone.split import last_hidden

        ids = torch.tensor([encoded.input_ids])
        hidden = last_hidden(mean.backbone, ids, torch.ones_like(ids))[0]
    torch.testing.assert_close(states, hidden[encoded.item_first[0] :].mean(0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("frozen_backbone", [True, False])
def test_it_trains_saves_and_loads_frozen_and_with_lora(tmp_path, tiny_backbone, train_file,
                                                        frozen_backbone):
    cfg = config(tmp_path, tiny_backbone, head="pointwise", frozen=frozen_backbone, epochs=3,
                 batch_size=1, head_lr=1e-2)
    train(cfg)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").open()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) >= 2 and all(torch.isfinite(torch.tensor(losses)))
    loaded = SPDRanker.from_pretrained(tmp_path / "run", dtype="float32")
    assert isinstance(loaded.method, PointwiseMethod)
    assert (loaded.config.backbone.lora is None) == frozen_backbone
    slate = load_slates(train_file)[0]
    scores = loaded.score_matrix(slate)
    assert scores.shape == (len(slate),) and len(set(scores.round(6).tolist())) > 1
    again = SPDRanker.from_pretrained(tmp_path / "run", dtype="float32")
    assert (again.score_matrix(slate) == scores).all()


def test_cached_states_are_the_live_ones_and_train_the_same_head(tmp_path, tiny_backbone,
                                                                 train_file, frozen):
    cache = open_state_cache(tmp_path / "c", frozen, train_file, 8, storage="float32",
                             batch_size=3, shard_size=3, progress=False)
    slates = load_slates(train_file)
    with torch.inference_mode():
        for i, slate in enumerate(slates):
            live = frozen.read(frozen.collate([frozen.encode(slate)])).items[0]
            torch.testing.assert_close(cache.slate_states(i), live, atol=1e-5, rtol=1e-5)
    common = {"head": "pointwise", "frozen": True, "epochs": 2, "head_lr": 1e-2,
              "cache_dtype": "float32"}
    train(config(tmp_path, tiny_backbone, out="live", **common))
    train(config(tmp_path, tiny_backbone, out="cached", cache_states=str(tmp_path / "c2"),
                 **common))
    live = SPDRanker.from_pretrained(tmp_path / "live", dtype="float32")
    cached = SPDRanker.from_pretrained(tmp_path / "cached", dtype="float32")
    for name, weight in live.head.state_dict().items():
        torch.testing.assert_close(cached.head.state_dict()[name], weight, atol=1e-5, rtol=1e-4)


def test_features_add_one_weight_each(tiny_backbone):
    from spdrank.core.features import FeatureNormalizer

    cfg = tiny_config(tiny_backbone, "pointwise", frozen=True)
    cfg.features = FeatureNormalizer(("pop",), (0.0,), (1.0,))
    torch.manual_seed(0)
    ranker = SPDRanker.build(cfg).eval()
    assert ranker.head.features.weight.shape == (1, 1)
    with torch.no_grad():
        ranker.head.features.weight.fill_(100.0)
    slate = Slate.from_dict({"query": "1. Rose shampoo", "candidates": [
        {"docid": d, "doc": {"text": "Top coat"}, "features": {"pop": p}}
        for d, p in (("low", 0.0), ("high", 1.0))]})
    assert ranker.rank(slate).docids == ["high", "low"]
