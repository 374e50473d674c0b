"""The contract every registered ranking method keeps, whatever its head (issue 46, item 4).

The cases come from the registry itself (:func:`spdrank.methods.base.methods`, each method's
``kinds`` and ``history_kinds``), so a method registered later is held to the same contract
without a line here changing. Each case is the model ``spdrank train`` builds for one head kind
and readout (:meth:`TrainConfig.model_config`), on the tiny Llama of the other tests, with its
trainable weights (head, anchor, LoRA) moved off their initial values so that a checkpoint that
failed to carry them would rank otherwise. For each one, through the public surface
(``rank_batch``, ``save_pretrained``/``from_pretrained``, the state cache training opens):

- (a) a saved model loads and ranks the same slates identically, orders and scores;
- (b) a slate ranked beside longer ones (so padded) ranks as it does alone, under every
  decoder of a matrix method;
- (c) a ranking is a permutation of the slate's candidates, for slates of 1 to K candidates
  (and a slate of K + 1 is refused), its scores finite and never rising down the list;
- (d) where the method and the backbone's training allow caching, the cached states are the
  live ones and rank the slates as the live prefill does; elsewhere the cache is refused
  with the method's reason, and the case is skipped saying so.

Besides every head kind under each readout it accepts (and the history head's unit matches),
each method's first kind is also built anchored, with a feature, features only, with LoRA on
every layer and with LoRA on the top layer alone (the split cache). Those extra combinations
a method refuses to build (FIRST cannot be anchored or run on features alone) are skipped with
the refusal; the plain ones must build.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from spdrank.backbone.prompt import READOUTS, UNIT_READOUTS
from spdrank.core.features import FeatureNormalizer
from spdrank.core.slates import Candidate, Query, Slate, write_slates
from spdrank.core.validation import SlateError
from spdrank.methods.base import head_kinds, method_for, methods
from spdrank.methods.spd.decode import DECODERS
from spdrank.methods.spd.history_settings import MATCHES
from spdrank.model.ranker import SPDRanker
from spdrank.model.state_cache import open_state_cache
from spdrank.training.config import TrainConfig
from tests.helpers import WORDS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: K of every case: small, so a slate of K candidates is quick to prefill.
K = 8
#: The one feature a case with features reads.
FEATURE = "signal"
#: Float tolerance for the same slate scored in a different batch (other padding, another
#: batch size in the kernels).
TOLERANCE = {"rel": 1e-4, "abs": 1e-5}


# -- the cases, from the registry ---------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One model to build: a head kind with ``spdrank train``'s settings (``settings``, on top
    of :data:`BASE`), whether it reads :data:`FEATURE`, and whether it is an extra combination
    the method may refuse to build (then skipped, with its refusal)."""

    kind: str
    settings: tuple[tuple[str, object], ...] = ()
    features: bool = False
    optional: bool = False
    label: str = field(default="", compare=False)

    @property
    def id(self) -> str:
        return self.label or self.kind

    def train_config(self, backbone: str) -> TrainConfig:
        return TrainConfig(**(BASE | {"backbone": backbone, "head": self.kind}
                              | dict(self.settings)))


#: What every case shares: a frozen tiny head of K positions, no dropout.
BASE = {
    "slates": "unused.jsonl", "out": "unused", "positions": K, "head_width": 16,
    "head_dropout": 0.0, "max_item_tokens": 8, "frozen": True,
}
LORA = {"frozen": False, "lora_r": 4, "lora_alpha": 8}


def readouts_of(method, kind: str) -> list[tuple[str | None, str | None]]:
    """(readout, match) pairs a kind is built with: none but the default for a head reading the
    LM's logits (it reads no states); every readout, with each match of the unit ones, for a
    head reading the history items' states; the one-state readouts for any other head."""
    if method.reads_logits:
        return [(None, None)]
    if kind in method.history_kinds:
        return [(r, m) for r in READOUTS for m in (MATCHES if r in UNIT_READOUTS else [None])]
    return [(r, None) for r in READOUTS if r not in UNIT_READOUTS]


def cases() -> list[Case]:
    out = []
    for method in methods():
        for kind in method.kinds:
            for readout, match in readouts_of(method, kind):
                settings = {"readout": readout} if readout else {}
                if match:
                    settings["match"] = match
                label = "-".join(filter(None, (kind, readout, match)))
                case = Case(kind, tuple(settings.items()), label=label)
                try:  # what the method refuses of its settings alone is no case
                    method.check(case.train_config("unused").model_config())
                except ValueError:
                    continue
                out.append(case)
        kind = method.kinds[0]
        for extra, settings, features in (
            ("anchored", {"anchor": "order"}, False),
            ("features", {}, True),
            ("features-only", {"features_only": True}, True),
            ("lora", LORA, False),
            ("lora-top1", LORA | {"lora_layers": 1}, False),
        ):
            out.append(Case(kind, tuple(settings.items()), features, optional=True,
                            label=f"{kind}-{extra}"))
    return out


CASES = cases()


def test_every_registered_head_kind_has_a_case_it_must_build():
    assert {c.kind for c in CASES if not c.optional} == set(head_kinds())
    assert {method_for(c.kind).name for c in CASES} == {m.name for m in methods()}
    assert len({c.id for c in CASES}) == len(CASES)


# -- slates and models --------------------------------------------------------------------------


def make_slate(rng: random.Random, n: int, qid: str) -> Slate:
    """``n`` candidates with titles and a feature, and a history of three numbered lines (what
    a history head reads item by item)."""
    history = "\n".join(f"{i}. " + " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
                        for i in range(1, 4))
    return Slate(
        query=Query(qid=qid, text=history),
        candidates=[
            Candidate(docid=f"{qid}-d{i}",
                      doc={"title": " ".join(rng.choices(WORDS, k=rng.randint(1, 5)))},
                      features={FEATURE: rng.gauss(0, 1)})
            for i in range(n)
        ],
    )


#: Slate lengths from one candidate to K, two of one length (ranked side by side, a batch
#: decoder stacks them).
LENGTHS = (1, 2, K // 2 + 1, K, K // 2 + 1)


@pytest.fixture(scope="module")
def slates() -> list[Slate]:
    rng = random.Random(46)
    return [make_slate(rng, n, f"q{i}") for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def slate_file(tmp_path_factory, slates) -> Path:
    path = tmp_path_factory.mktemp("contract") / "slates.jsonl"
    write_slates(path, slates)
    return path


def moved(model: SPDRanker) -> SPDRanker:
    """``model`` with every trainable weight (head, anchor strength, LoRA) moved by seeded
    noise: LoRA starts as a no-op and an anchored head at zero, so untouched they would rank
    alike whether or not a checkpoint carried them."""
    generator = torch.Generator().manual_seed(7)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable or model.method.frozen_refusal(model.config), "nothing trainable to move"
    with torch.no_grad():
        for param in trainable:
            param.add_(0.3 * torch.randn(param.shape, generator=generator))
    return model.eval()


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def case(request) -> Case:
    return request.param


@pytest.fixture(scope="module")
def model(case, tiny_backbone) -> SPDRanker:
    config = case.train_config(tiny_backbone)
    features = FeatureNormalizer((FEATURE,), (0.0,), (1.0,)) if case.features else None
    torch.manual_seed(0)
    try:
        built = SPDRanker.build(config.model_config(features))
    except ValueError as refusal:
        if not case.optional:
            raise
        pytest.skip(f"{case.id}: refused by the method: {refusal}")
    assert built.config.head.kind == case.kind
    return moved(built)


def decoders(model: SPDRanker) -> list[str]:
    """Every registered decoder for a method that decodes a matrix; the model's own for one
    that sorts (it reads no decoder)."""
    names = list(DECODERS) if model.method.matrix else [model.config.decoder]
    assert names
    return names


def assert_same_rankings(got, expected, exact: bool = False) -> None:
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert a.docids == b.docids and a.indices == b.indices
        assert len(a.scores) == len(b.docids) > 0
        if exact:
            assert a.scores == b.scores
        else:
            assert a.scores == pytest.approx(b.scores, **TOLERANCE)


# -- the contract -------------------------------------------------------------------------------


def test_a_saved_model_loads_and_ranks_identically(model, case, slates, tmp_path):
    model.save_pretrained(tmp_path / "model")
    loaded = SPDRanker.from_pretrained(tmp_path / "model", dtype="float32")
    assert type(loaded.method) is type(model.method) and loaded.name == model.name
    assert loaded.config.head == model.config.head
    assert loaded.config.prompt == model.config.prompt
    assert (loaded.config.backbone.lora is None) == (model.config.backbone.lora is None)
    for decoder in decoders(model):
        assert_same_rankings(loaded.rank_batch(slates, decoder),
                             model.rank_batch(slates, decoder), exact=True)


def test_a_padded_slate_ranks_as_it_does_alone(model, case, slates):
    sizes = [len(s) for s in slates]
    assert min(sizes) < max(sizes)  # all but the longest are padded in the batch
    for decoder in decoders(model):
        together = model.rank_batch(slates, decoder)
        alone = [model.rank_batch([slate], decoder)[0] for slate in slates]
        assert_same_rankings(together, alone)


def test_a_ranking_is_a_permutation_of_the_candidates(model, slates):
    assert model.config.head.positions == K
    assert sorted({len(s) for s in slates}) == sorted(set(LENGTHS)) and max(LENGTHS) == K
    for decoder in decoders(model):
        rankings = model.rank_batch(slates, decoder)
        assert len(rankings) == len(slates)
        for slate, ranking in zip(slates, rankings):
            n = len(slate)
            assert sorted(ranking.docids) == sorted(slate.docids) and len(ranking.docids) == n
            assert sorted(ranking.indices) == list(range(n))
            assert [slate.docids[i] for i in ranking.indices] == ranking.docids
            scores = np.asarray(ranking.scores, dtype=float)
            assert scores.shape == (n,) and np.isfinite(scores).all()
            assert (np.diff(scores) <= 0).all(), f"scores rise down the list: {ranking.scores}"
    too_long = make_slate(random.Random(1), K + 1, "long")
    with pytest.raises(SlateError, match=f"ranks at most {K}"):
        model.rank_batch([too_long])


def cache_refusal(model: SPDRanker) -> str | None:
    """Why ``model``'s states cannot be cached, as the registry and the model's settings say:
    its method's own reason, no backbone to read, or LoRA on every layer (states that change
    as it trains); None where they can."""
    if model.method.cache_refusal is not None:
        return model.method.cache_refusal
    if model.config.features_only:
        return "a features-only model runs no backbone"
    lora = model.config.backbone.lora
    if lora is not None and lora.top_layers is None:
        return "LoRA on every layer changes every state as it trains"
    if lora is not None and model.method.reads == "candidates":
        return "the split cache keeps one prompt a slate; this method reads one a candidate"
    return None


def test_cached_states_are_the_live_ones_where_the_method_caches(model, case, slates, slate_file,
                                                                 tmp_path):
    options = {"storage": "float32", "batch_size": 2, "shard_size": 2, "progress": False}
    refusal = cache_refusal(model)
    if refusal is not None:
        with pytest.raises(ValueError) as refused:
            open_state_cache(tmp_path / "cache", model, slate_file, len(slates), **options)
        if model.method.cache_refusal is not None and not model.config.features_only:
            assert str(refused.value) == model.method.cache_refusal
        assert not (tmp_path / "cache").exists()
        pytest.skip(f"no state cache: {refusal}")
    cache = open_state_cache(tmp_path / "cache", model, slate_file, len(slates), **options)
    assert len(cache) == len(slates)
    everything = list(range(len(slates)))
    with torch.inference_mode():
        cached = model.read(cache.batch(everything, slates, model))
        live = model.read(model.collate([model.encode(s) for s in slates]))
    assert cached.items is not None and cached.items.shape == live.items.shape
    compared = 0
    for states, counts in (("items", "item_tokens"), ("history", "history_tokens")):
        a, b = getattr(cached, states), getattr(live, states)
        assert (a is None) == (b is None), states
        if a is None:
            continue
        # Only what a head reads is compared: a slate's real items (a padded batch's rows
        # past them are the padding's), and with a unit readout each one's real units.
        units_a, units_b = getattr(cached, counts), getattr(live, counts)
        assert (units_a is None) == (units_b is None), counts
        for row, slate in enumerate(slates):
            real = len(slate) if states == "items" else a.shape[1]
            if units_a is None:
                torch.testing.assert_close(a[row, :real], b[row, :real], atol=1e-5, rtol=1e-5)
                compared += 1
                continue
            assert torch.equal(units_a[row, :real], units_b[row, :real]), counts
            for j, k in enumerate(units_b[row, :real].tolist()):
                torch.testing.assert_close(a[row, j, :k], b[row, j, :k], atol=1e-5, rtol=1e-5)
                compared += k
    assert compared >= len(slates)
    # And they rank as the live prefill does: all slates at once, and a padded pair.
    assert_same_rankings(model.rank_batch(slates, batch=cache.batch(everything, slates, model)),
                         model.rank_batch(slates))
    pair = [3, 0]
    assert_same_rankings(
        model.rank_batch([slates[i] for i in pair],
                         batch=cache.batch(pair, [slates[i] for i in pair], model)),
        [model.rank_batch([slates[i]])[0] for i in pair],
    )
