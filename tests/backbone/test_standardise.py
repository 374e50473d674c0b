"""States standardised per dimension before the head (``--standardise-states``): fitted on
real states only, saved with the head, the same from a cache as live, and what it is for: a
backbone whose states share one huge dimension no longer looks alike token to token."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from spdrank.backbone.readout import HeadInputs
from spdrank.backbone.standardise import StateStandardiser, real_states
from spdrank.core.slates import load_slates
from spdrank.model.ranker import SPDRanker
from spdrank.training.state_cache import open_state_cache
from spdrank.training.train import train
from tests.helpers import make_slate, save_features_only_model, tiny_config
from tests.helpers import train_config as config


def test_an_unfitted_standardiser_is_the_identity() -> None:
    states = torch.randn(2, 3, 8)
    assert torch.equal(StateStandardiser(8)(states), states)


def test_fitted_statistics_are_those_of_the_real_states_only() -> None:
    torch.manual_seed(0)
    items = torch.randn(2, 3, 4, 6) * torch.arange(1, 7) + 5.0  # [B, N, W, D]
    item_mask = torch.tensor([[True, True, False], [True, False, False]])
    units = torch.tensor([[4, 2, 4], [1, 4, 4]])
    # Padding (a padded item, unit slots past an item's count) holds values that would move
    # the statistics far if they were read.
    items[0, 2] = items[1, 1:] = 1e6
    items[0, 1, 2:] = items[1, 0, 1:] = -1e6
    history = torch.randn(2, 2, 6)
    history_mask = torch.tensor([[True, False], [True, True]])
    history[0, 1] = 1e6
    inputs = HeadInputs(items, history, units, None)
    rows = real_states(inputs, item_mask, history_mask)
    assert [len(r) for r in rows] == [4 + 2 + 1, 3]
    standardiser = StateStandardiser(6)
    assert standardiser.fit(iter(rows)) == 10
    real = torch.cat(rows)
    assert torch.allclose(standardiser.shift, real.mean(0), atol=1e-5)
    assert torch.allclose(standardiser.scale, real.std(0), atol=1e-5)
    out = standardiser(real)
    assert torch.allclose(out.mean(0), torch.zeros(6), atol=1e-5)
    assert torch.allclose(out.std(0), torch.ones(6), atol=1e-5)


def test_a_shared_huge_dimension_no_longer_makes_every_token_alike() -> None:
    """What the states of Gemma 3's second layer look like: one dimension, the same sign and
    hundreds of times the others' size in every token. After the head's LayerNorm two random
    tokens then have a cosine near 1; standardised, near 0."""
    torch.manual_seed(0)
    states = torch.randn(512, 64)
    states[:, 7] = 400.0 + torch.randn(512)

    def mean_cosine(x: torch.Tensor) -> float:
        n = F.normalize(F.layer_norm(x, x.shape[-1:]), dim=-1)
        cosine = n @ n.T
        return cosine[~torch.eye(len(x), dtype=torch.bool)].mean().item()

    standardiser = StateStandardiser(64)
    standardiser.fit([states])
    assert mean_cosine(states) > 0.9
    assert abs(mean_cosine(standardiser(states))) < 0.05


@pytest.mark.parametrize("kind", ["attn", "history"])
def test_training_fits_it_and_the_checkpoint_ranks_the_same_cached_live_and_reloaded(
    tmp_path, tiny_backbone, train_file, kind
) -> None:
    cfg = config(tmp_path, tiny_backbone, head=kind, frozen=True, standardise_states=True,
                 max_steps=3, cache_states=str(tmp_path / "cache"), cache_batch_size=2)
    train(cfg)
    model_dir = tmp_path / "run" / "model"
    head = json.loads((model_dir / "config.json").read_text())["head"]
    assert head["standardise"] is True
    saved = load_file(str(model_dir / "head.safetensors"))
    shift, scale = saved["standardiser.shift"], saved["standardiser.scale"]
    assert shift.abs().max() > 0 and not torch.allclose(scale, torch.ones_like(scale))

    model = SPDRanker.from_pretrained(model_dir, dtype="float32")
    assert torch.equal(model.head.standardiser.shift, shift)
    slates = load_slates(train_file)
    cache = open_state_cache(tmp_path / "check", model, train_file, len(slates),
                             storage="float32", batch_size=2, progress=False)
    with torch.inference_mode():
        cached = model(cache.batch([3, 0], [slates[3], slates[0]], model))
    for row, i in enumerate([3, 0]):
        live = torch.from_numpy(model.score_matrix(slates[i]))
        assert torch.allclose(cached[row, : len(slates[i])], live, atol=1e-5)
    # A slate padded beside a longer one ranks as it does alone.
    short = make_slate(random.Random(1), 3, qid="short")
    alone = model.rank_batch([short])[0].docids
    assert model.rank_batch([short, slates[0]])[0].docids == alone


def test_a_model_without_it_writes_no_field_and_reads_its_states_as_they_are(tiny_backbone):
    model = SPDRanker.build(tiny_config(tiny_backbone, frozen=True))
    assert "standardise" not in model.config.to_dict()["head"]
    assert not hasattr(model.head, "standardiser")


def test_a_model_that_reads_no_states_refuses_it(tmp_path) -> None:
    model_dir = save_features_only_model(tmp_path / "m", positions=8)
    config = json.loads((model_dir / "config.json").read_text())
    config["head"]["standardise"] = True
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="head.standardise"):
        SPDRanker.from_pretrained(model_dir)
