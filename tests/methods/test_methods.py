"""The ranking methods (spdrank.methods.base): the registry, each method's contract, and a method
added from outside the package being used by the model, training and the CLI untouched."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from spdrank.backbone.prompt import LETTERS, PromptSettings
from spdrank.backbone.settings import BackboneConfig
from spdrank.core.slates import load_slates
from spdrank.methods.base import (
    RankingMethod,
    head_kinds,
    method_for,
    methods,
    register,
    unregister,
)
from spdrank.methods.first.method import FirstMethod, first_prompt
from spdrank.methods.head_config import HeadConfig
from spdrank.methods.pointwise.method import PointwiseMethod
from spdrank.methods.scalar.loss import listnet_loss
from spdrank.methods.scalar.method import ScalarMethod
from spdrank.methods.spd.decode import expected_positions
from spdrank.methods.spd.loss import log_sinkhorn, permutation_cross_entropy
from spdrank.methods.spd.method import SPDMethod
from spdrank.model.config import SPDConfig
from spdrank.model.ranker import SPDRanker
from spdrank.training.train import TrainConfig, train
from tests.helpers import train_config as config


def test_each_head_kind_is_served_by_its_method():
    assert {k: type(method_for(k)) for k in head_kinds()} == {
        "attn": SPDMethod, "linear": SPDMethod, "history": SPDMethod,
        "scalar": ScalarMethod, "first": FirstMethod, "pointwise": PointwiseMethod,
    }
    assert head_kinds() == ["attn", "linear", "history", "scalar", "first", "pointwise"]
    assert [m.name for m in methods()] == ["spd", "scalar", "first", "pointwise"]
    with pytest.raises(ValueError, match=r"unknown head 'mlp': choose one of \['attn', "):
        method_for("mlp")


class _Backbone(nn.Module):
    """What a method reads of a backbone to build a head: its hidden size."""

    config = SimpleNamespace(hidden_size=8)


def _one_token_each(text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
    return {"input_ids": [ord(text)]}


def test_every_kind_is_built_by_its_method_and_scores_as_its_method_decodes():
    built = {}
    for method in methods():
        for kind in method.kinds:
            config = SPDConfig(head=HeadConfig(kind=kind, positions=4, width=16, heads=2),
                               prompt=method.prompt(PromptSettings()))
            head = method.build_head(config, _Backbone(), _one_token_each, 0)
            assert head.matrix == method.matrix, kind
            built[kind] = type(head).__name__
    expected = {
        "attn": "SelfAttentionHead", "linear": "LinearProbe", "history": "HistoryAttentionHead",
        "scalar": "ScalarHead", "first": "FirstHead",
    }
    assert {kind: built[kind] for kind in expected} == expected
    with pytest.raises(ValueError, match="'scalar' is no SPD head"):
        SPDMethod().head(HeadConfig(kind="scalar"), 8)


def test_a_kind_belongs_to_one_method():
    class Thief(ScalarMethod):
        name = "thief"
        kinds = ("attn",)

    with pytest.raises(ValueError, match=r"head kind\(s\) \['attn'\] already belong"):
        register(Thief())
    assert isinstance(method_for("attn"), SPDMethod)


def batch_of_targets(n: int = 4):
    """Two slates (n and n-1 items): random scores, and targets ranking the items in order."""
    torch.manual_seed(0)
    sizes = torch.tensor([n, n - 1])
    target = torch.zeros(2, n, n)
    for b, size in enumerate(sizes.tolist()):
        target[b, :size, :size] = torch.eye(size)
    return sizes, target


def test_spd_learns_by_sinkhorn_cross_entropy_with_the_runs_settings():
    sizes, target = batch_of_targets()
    scores = torch.randn(2, 4, 6)
    for tau, iters, weights in ((1.0, 20, "uniform"), (0.5, 3, "dcg")):
        cfg = TrainConfig(slates="x", out="y", tau=tau, sinkhorn_iters=iters,
                          position_weights=weights)
        expected = permutation_cross_entropy(
            log_sinkhorn(scores, sizes, tau=tau, iters=iters), target, sizes,
            reduction="none", position_weights=weights,
        )
        got = SPDMethod().loss(scores, target, sizes, cfg)
        assert got.shape == (2,)
        torch.testing.assert_close(got, expected)
    uniform = SPDMethod().loss(scores, target, sizes, TrainConfig(slates="x", out="y"))
    dcg = SPDMethod().loss(scores, target, sizes,
                           TrainConfig(slates="x", out="y", position_weights="dcg"))
    assert not torch.allclose(uniform, dcg)


@pytest.mark.parametrize("method", [ScalarMethod(), FirstMethod()])
def test_the_sorting_peers_learn_by_listnet_whatever_the_sinkhorn_settings(method):
    sizes, target = batch_of_targets()
    scores = torch.randn(2, 4)
    expected = listnet_loss(scores, target, sizes, reduction="none")
    for cfg in (TrainConfig(slates="x", out="y"),
                TrainConfig(slates="x", out="y", tau=0.1, position_weights="dcg")):
        torch.testing.assert_close(method.loss(scores, target, sizes, cfg), expected)


def test_spd_orders_by_its_decoder_and_reports_its_relevance():
    # Item 0 is best at rank 1 alone; the assignment puts item 1 there and item 0 second.
    m = np.array([[10.0, 9.0, 0.0], [9.5, 0.0, 0.0], [0.0, 0.0, 1.0]])
    spd = SPDMethod()
    assert spd.order(m, "argsort").tolist() == [0, 1, 2]
    assert spd.order(m, "hungarian").tolist() == [1, 0, 2]
    padded = np.zeros((2, 3, 3))
    padded[0], padded[1, :2, :2] = m, m[:2, :2]
    assert [o.tolist() for o in spd.orders(padded, [3, 2], "hungarian")] == [[1, 0, 2], [1, 0]]
    relevance = 1.0 - expected_positions(m[None])[0] / 3
    # Under expected rank the scores are the relevances themselves, in decreasing order.
    by_expected = spd.order(m, "expected_rank")
    assert spd.ranked_scores(m, by_expected) == pytest.approx(relevance[by_expected].tolist())
    assert relevance[by_expected].tolist() == sorted(relevance, reverse=True)
    # Under the assignment's order (item 1 above item 0, whose relevance is higher) they never
    # rise down the list.
    hungarian = spd.ranked_scores(m, np.array([1, 0, 2]))
    assert hungarian == sorted(hungarian, reverse=True)
    assert hungarian[0] == pytest.approx(relevance[1]) and all(0 < s <= 1 for s in hungarian)
    assert spd.model_name("attn") == "spd-attn"


@pytest.mark.parametrize("method", [ScalarMethod(), FirstMethod()])
def test_the_sorting_peers_sort_whatever_the_decoder_and_report_their_scores(method):
    scores = np.array([0.1, 3.0, -1.0, 2.0], dtype=np.float32)
    for decoder in ("hungarian", "argsort"):
        assert method.order(scores, decoder).tolist() == [1, 3, 0, 2]
    padded = np.array([[0.1, 3.0, -1.0, 2.0], [5.0, 4.0, 6.0, 0.0]], dtype=np.float32)
    assert [o.tolist() for o in method.orders(padded, [4, 3], "hungarian")] == [
        [1, 3, 0, 2], [2, 0, 1]]
    assert method.ranked_scores(padded[1], np.array([2, 0, 1])) == [6.0, 5.0, 4.0]
    assert method.model_name(method.kinds[0]) == method.kinds[0]


def test_what_each_method_can_cache_load_and_train_frozen():
    spd, scalar, first = SPDMethod(), ScalarMethod(), FirstMethod()
    assert spd.caches_states and scalar.caches_states and not first.caches_states
    assert "--head first reads the LM's logits" in first.cache_refusal
    assert not spd.reads_logits and not scalar.reads_logits and first.reads_logits
    plain = SPDConfig(head=HeadConfig(kind="first"))
    assert first.frozen_refusal(plain) == "FIRST's only weights are the backbone's"
    from spdrank.core.features import FeatureNormalizer

    plain.features = FeatureNormalizer(("pop",), (0.0,), (1.0,))
    assert first.frozen_refusal(plain) is None
    assert spd.frozen_refusal(SPDConfig()) is None


def test_first_asks_for_letters_and_caps_its_positions():
    asked = PromptSettings(max_item_tokens=7)
    first = FirstMethod()
    assert first.prompt(asked) == first_prompt(asked) != asked
    assert first.prompt(asked).labels == "letters" and first.prompt(asked).max_item_tokens == 7
    assert first.positions(100) == len(LETTERS) == 52 and first.positions(10) == 10
    for other in (SPDMethod(), ScalarMethod()):
        assert other.prompt(asked) == asked and other.positions(100) == 100
    model = TrainConfig(slates="x", out="y", head="first", positions=64, backbone="b")
    assert model.model_config().head.positions == 52
    assert model.model_config().prompt.answer_prefix == "["
    with pytest.raises(ValueError, match="needs letter labels"):
        first.check(SPDConfig(head=HeadConfig(kind="first"), prompt=PromptSettings()))
    first.check(SPDConfig(head=HeadConfig(kind="first")))  # given no prompt: train's, letters


# -- a method from outside the package ---------------------------------------------------------


class ReverseHead(nn.Module):
    """One score per item from its state."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, 1)

    def forward(self, h: torch.Tensor, mask: torch.Tensor, features: Any = None) -> torch.Tensor:
        return self.out(h).squeeze(-1).masked_fill(~mask, 0.0)


class WorstFirst(RankingMethod):
    """A toy method: ranks items by increasing score, with a prompt and a loss of its own."""

    name = "worst-first"
    title = "worst-first"
    kinds = ("reverse",)
    help = "reverse (a test's toy)"
    matrix = False
    cache_refusal = "the toy caches nothing"
    max_positions = 9

    def __init__(self) -> None:
        self.losses = 0

    def model_name(self, kind: str) -> str:
        return f"toy-{kind}"

    def prompt(self, settings: PromptSettings) -> PromptSettings:
        return first_prompt(settings)

    def build_head(self, config, backbone, tokenizer, features):
        from spdrank.backbone.load import hidden_size

        return ReverseHead(hidden_size(backbone))

    def loss(self, scores, target, sizes, cfg):
        self.losses += 1
        return (scores**2).sum(1)

    def order(self, scores, decoder):
        return np.argsort(scores, kind="stable")

    def ranked_scores(self, scores, order):
        return [-float(s) for s in scores[order]]


@pytest.fixture
def toy():
    method = register(WorstFirst())
    yield method
    unregister(method)
    with pytest.raises(ValueError, match="unknown head 'reverse'"):
        method_for("reverse")


def test_a_registered_method_trains_saves_loads_and_ranks_through_the_model(
    tmp_path, tiny_backbone, train_file, toy
):
    cfg = config(tmp_path, tiny_backbone, head="reverse", frozen=True, max_steps=2, positions=20)
    assert cfg.model_config().head.positions == 9
    assert cfg.model_config().prompt.labels == "letters"
    summary = train(cfg)
    assert summary["finished"] and toy.losses == 2
    saved = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert saved["head"]["kind"] == "reverse"
    model = SPDRanker.from_pretrained(tmp_path / "run")
    assert isinstance(model.head, ReverseHead) and model.method is toy
    assert model.name == "toy-reverse" and not model.method.matrix
    slates = load_slates(train_file)
    batch_scores, _ = model.score_batch(slates)
    for i, (slate, ranking) in enumerate(zip(slates, model.rank_batch(slates))):
        scores = batch_scores[i, : len(slate)]
        assert ranking.indices == np.argsort(scores, kind="stable").tolist()
        assert ranking.scores == [-float(s) for s in scores[ranking.indices]]
    with pytest.raises(ValueError, match="the toy caches nothing"):
        train(config(tmp_path, tiny_backbone, out="cached", head="reverse", frozen=True,
                     max_steps=1, cache_states=str(tmp_path / "states")))


def test_a_registered_method_is_a_choice_of_spdrank_train(toy):
    from spdrank.commands.cli import build_parser

    args = build_parser().parse_args(["train", "--slates", "s", "--out", "o", "--head", "reverse"])
    assert args.head == "reverse"
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    assert "reverse (a test's toy)" in " ".join(train_parser.format_help().split())


@pytest.mark.parametrize("reads_logits", [False, True])
def test_a_method_reading_logits_gets_the_backbone_with_its_lm_head(
    tiny_backbone, toy, monkeypatch, reads_logits
):
    from spdrank.model.parts import backbone_and_tokenizer

    monkeypatch.setattr(toy, "reads", "logits" if reads_logits else "prompt")
    backbone, _ = backbone_and_tokenizer(SPDConfig(
        backbone=BackboneConfig(name_or_path=tiny_backbone, lora=None),
        head=HeadConfig(kind="reverse", positions=9),
    ), "cpu")
    assert hasattr(backbone, "lm_head") == reads_logits
