"""Scoring heads: per-candidate hidden states [B, N, D] -> item-position scores M [B, N, K].

A head may also read F upstream features per candidate ([B, N, F], already normalised; see
:mod:`spdrank.core.features`). Each head maps the features into the space where it first meets
the hidden state (the attention width; K scores for the probe) and adds them there, so the
hidden state's path, and a checkpoint trained without features, are unchanged. A head built
with ``hidden=0`` reads the features alone: the backbone-free ablation.

All heads take a padding mask [B, N] (True = real item) so slates of different N share a
batch. Padded items are excluded from every attention, so a real item's scores do not depend
on how much padding sits next to it. Padded rows of M are set to 0; the Sinkhorn and decoders
mask them anyway.

No head adds a positional encoding over the items: candidate order is arbitrary (shuffled),
so the heads are permutation-equivariant in the items, and every position column has its own
weights so scores depend on the position (a position-free score would make every
permutation equally good to the decoder).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from spdrank.backbone.load import ConfigError
from spdrank.core.defaults import UNNAMED_HEAD
from spdrank.methods.head_inference import (
    NormedProduct,
    StackWeights,
    add_inference_path,
    apply_layer,
    key_mask,
    stack_weights,
)

#: How the history head compares a candidate's units with a history item's (``HeadConfig.match``).
MATCHES = ("maxsim", "tfidf")

#: The bounds of a head's sizes. A checkpoint's config.json is read from a file, so each size
#: is checked before a layer is built from it: positions far past any slate, widths and depths
#: far past any head trained here, and at most ``MAX_HEAD_PARAMETERS`` weights in all (1 GiB
#: in float32), so no setting asks for an allocation without bound.
MAX_POSITIONS = 8192
MAX_WIDTH = 8192
MAX_LAYERS = 64
MAX_HEADS = 256
MAX_HEAD_PARAMETERS = 1 << 28


@dataclass
class HeadConfig:
    #: "linear" | "attn" | "slot" | "history" (SPD); "scalar" | "first" (peers)
    kind: str = UNNAMED_HEAD
    #: Number of rank positions; must be >= the largest slate.
    positions: int = 64
    #: Width of the head's own layers (attn/slot), projected down from the backbone's D.
    width: int = 256
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1
    #: The history head reads several states per item (its tokens or its words: the "tokens"
    #: and "words" readouts) and matches candidates with history items unit by unit.
    tokens: bool = False
    #: How units are matched (with ``tokens``): "maxsim" (late interaction: each candidate
    #: unit's best cosine with the item's units, averaged with learned weights) or "tfidf"
    #: (every pair of units through a sharp kernel, weighted on both sides: the shape of a
    #: TF-IDF cosine, whose matches also go straight to the position scores).
    match: str = "maxsim"
    #: Width of the space where the "tfidf" match compares units: every pair of units meets
    #: there, so it is kept narrower than the head's own layers.
    match_width: int = 64

    def __post_init__(self) -> None:
        if self.match not in MATCHES:
            raise ValueError(f"unknown match {self.match!r}: use one of {list(MATCHES)}")
        self.check_sizes()

    def check_sizes(self) -> None:
        """Refuse a size that is no integer in its bound, or heads that would hold more than
        :data:`MAX_HEAD_PARAMETERS` weights, naming the field (``head.positions``)."""
        for name, low, high in (
            ("positions", 1, MAX_POSITIONS), ("width", 1, MAX_WIDTH), ("layers", 0, MAX_LAYERS),
            ("heads", 1, MAX_HEADS), ("match_width", 1, MAX_WIDTH),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"head.{name} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise ValueError(f"head.{name} must be between {low} and {high}, got {value}")
        if self.width % self.heads:
            raise ValueError(f"head.width ({self.width}) must be a multiple of head.heads "
                             f"({self.heads}): each attention head takes an equal share")
        if not isinstance(self.kind, str) or not isinstance(self.tokens, bool):
            raise ConfigError("head.kind must be a name and head.tokens true or false")
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0 <= dropout < 1:
            raise ValueError(f"head.dropout must be a number in [0, 1), got {dropout!r}")
        # A pre-norm layer holds about 12 width^2 weights; the position and match maps a few
        # width-sized rows each.
        weights = self.layers * 12 * self.width**2 + (3 * self.positions + 2 * self.match_width
                                                        + 4) * self.width
        if weights > MAX_HEAD_PARAMETERS:
            raise ValueError(
                f"head sizes (width {self.width}, layers {self.layers}, positions "
                f"{self.positions}) ask for about {weights:,} weights, more than the "
                f"{MAX_HEAD_PARAMETERS:,} a head may hold"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadConfig:
        return cls(**data)


def _state_projection(hidden: int, width: int) -> nn.Module | None:
    """LayerNorm + linear from the backbone's D to the head's width; None without states."""
    return nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, width)) if hidden else None


def _feature_projection(features: int, width: int) -> nn.Module | None:
    """A linear map of the (already normalised) features to the width; None without features."""
    return nn.Linear(features, width) if features else None


def _check_inputs(hidden: int, features: int) -> None:
    if hidden < 0 or features < 0 or not (hidden or features):
        raise ValueError(
            f"a head needs hidden states or features (hidden={hidden}, features={features})"
        )


def _renamed_from(renames: dict[str, str]) -> Callable[..., None]:
    """A load hook that moves ``renames``' keys (these layers' earlier names) to their current
    names, so checkpoints saved under the earlier names still load."""

    def hook(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key in [k for k in state_dict if k.startswith(prefix)]:
            rest = key[len(prefix) :]
            for old, new in renames.items():
                if rest.startswith(old):
                    state_dict[prefix + new + rest[len(old) :]] = state_dict.pop(key)
                    break

    return hook


def _item_inputs(
    states: nn.Module | None,
    h: torch.Tensor | None,
    features: nn.Module | None,
    f: torch.Tensor | None,
) -> torch.Tensor:
    """The sum of the projected hidden state and the projected features (whichever exist)."""
    parts = []
    for module, x, what in ((states, h, "hidden states"), (features, f, "features")):
        if module is not None:
            if x is None:
                raise ValueError(f"this head reads {what}, but none were given")
            parts.append(module(x))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


class LinearProbe(nn.Module):
    """Each item scored independently: all cross-item context comes from the backbone."""

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        _check_inputs(hidden, features)
        self.proj = _state_projection(hidden, cfg.positions)
        self.features = _feature_projection(features, cfg.positions)
        self.register_load_state_dict_pre_hook(
            _renamed_from({"norm.": "proj.0.", "out.": "proj.1."})
        )

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        scores = _item_inputs(self.proj, h, self.features, features)
        return scores.masked_fill(~mask.unsqueeze(-1), 0.0)


class SelfAttentionHead(nn.Module):
    """The paper's head: L self-attention layers over the items, then a linear map to K scores.

    Each item attends to every other real item, an explicit pairwise comparison before scoring.
    """

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        _check_inputs(hidden, features)
        self.proj = _state_projection(hidden, cfg.width)
        self.features = _feature_projection(features, cfg.width)
        layer = nn.TransformerEncoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        # Nested tensors would drop padded rows and change numerics with the padding.
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.positions)
        add_inference_path(self, _attention_head_weights)

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Scores [B, N, K]: :meth:`infer` where it applies (eval mode, no autograd, hidden
        states to read), else :meth:`reference`. Training always runs the reference, so the
        fast path never decides what is learned, and the two are tested to agree."""
        if self.infers(h):
            assert h is not None
            return self.infer(h, mask, features)
        return self.reference(h, mask, features)

    def infers(self, h: torch.Tensor | None) -> bool:
        """:meth:`forward` takes the inference path: in eval mode without autograd, for a
        head that reads hidden states (a features-only head has no inference path)."""
        return not self.training and not torch.is_grad_enabled() and self.proj is not None \
            and h is not None

    def reference(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head as nn modules compute it, with autograd and dropout: what training runs
        and what :meth:`infer` must reproduce."""
        x = _item_inputs(self.proj, h, self.features, features)
        x = self.encoder(x, src_key_padding_mask=~mask)
        return self.out(self.norm(x)).masked_fill(~mask.unsqueeze(-1), 0.0)

    def infer(
        self, h: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The forward without autograd or dropout, in as few tensor operations as it takes
        (:mod:`spdrank.methods.head_inference`): functional layers, no key mask when no item is
        padded, the matrix products in ``compute_dtype``."""
        w = self._cast.weights(self, self.compute_dtype)
        x = w.input(h).to(h.dtype)
        if self.features is not None:
            if features is None:
                raise ValueError("this head reads features, but none were given")
            x = x + self.features(features)
        keys = key_mask(mask)
        for weights in w.layers:
            x = apply_layer(x, weights, keys)
        scores = w.output(x).to(h.dtype)
        return scores if keys is None else scores.masked_fill(~mask.unsqueeze(-1), 0.0)


def _attention_head_weights(head: SelfAttentionHead, dtype: torch.dtype | None) -> StackWeights:
    assert head.proj is not None
    return stack_weights(head.proj, head.encoder.layers, head.norm, head.out, dtype)


class SlotQueryHead(nn.Module):
    """The dual view: K learned position queries cross-attend over the items ("what fills rank k?").

    M[i, k] is the scaled dot product of item i's projection with slot k's output.
    """

    matrix = True

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        _check_inputs(hidden, features)
        self.proj = _state_projection(hidden, cfg.width)
        self.features = _feature_projection(features, cfg.width)
        self.slots = nn.Parameter(torch.randn(cfg.positions, cfg.width) * 0.02)
        layer = nn.TransformerDecoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, cfg.layers)
        self.item_out = nn.Linear(cfg.width, cfg.width)
        self.slot_out = nn.Linear(cfg.width, cfg.width)
        self.scale = 1.0 / math.sqrt(cfg.width)

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        items = _item_inputs(self.proj, h, self.features, features)
        slots = self.slots.unsqueeze(0).expand(items.size(0), -1, -1)
        slots = self.decoder(slots, items, memory_key_padding_mask=~mask)
        scores = torch.einsum("bnd,bkd->bnk", self.item_out(items), self.slot_out(slots))
        return (scores * self.scale).masked_fill(~mask.unsqueeze(-1), 0.0)


class _HistoryInputs(NamedTuple):
    """What the history head reads: the candidates' states [B, N, (W,) D] and mask, their
    features, the history items' states [B, H, (W,) D] and mask, and with a unit readout each
    item's unit count."""

    h: torch.Tensor
    mask: torch.Tensor
    features: torch.Tensor | None
    history: torch.Tensor
    history_mask: torch.Tensor
    item_tokens: torch.Tensor | None
    history_tokens: torch.Tensor | None


class HistoryAttentionHead(nn.Module):
    """The attention head, also reading the states of the user's history items.

    In the paper's head a candidate meets the history only through the backbone's causal
    attention, which a few frozen layers barely use. Here each candidate is compared with each
    history item directly, twice:

    - a match: a similarity of the candidate with each history item, summarised per candidate
      as its largest, its mean and the most recent item's (the shape of a retriever's "closest
      item in the history" score), and added to the candidate's input. On pooled states it is
      the cosine of learned projections; with every token's state (``cfg.tokens``) it is
      token by token, like a late-interaction retriever: each candidate token's best cosine
      with the history item's tokens, averaged with learned per-token weights (a learned
      IDF: which of the title's words identify it);
    - cross-attention: each layer lets the candidates attend to each other and to the history
      items (plus one learned slot, so a slate without history still attends to something).

    Padded history items and token slots are masked everywhere, so the scores do not depend
    on padding.
    """

    matrix = True
    reads_history = True

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("the history head compares hidden states: it needs a backbone")
        self.tokens = cfg.tokens
        self.proj = _state_projection(hidden, cfg.width)
        self.history_proj = _state_projection(hidden, cfg.width)
        self.features = _feature_projection(features, cfg.width)
        self.tfidf = cfg.tokens and cfg.match == "tfidf"
        self.match_query = _state_projection(hidden, cfg.match_width if self.tfidf else cfg.width)
        # The tfidf match projects both sides alike (match_query); the others learn a key.
        self.match_key = None if self.tfidf else _state_projection(hidden, cfg.width)
        self.token_weight = nn.Linear(hidden, 1) if cfg.tokens else None
        if self.tfidf:
            # Kernel sharpness, learned in log space: identical words meet at cosine 1, others
            # fade as exp(sharpness * (cosine - 1)).
            self.log_sharpness = nn.Parameter(torch.tensor(math.log(10.0)))
            # The match summaries straight to the position scores: a score s_n * g_k with g
            # decreasing in k is already the ranking by s, whatever the layers above add.
            self.match_positions = nn.Linear(3, cfg.positions, bias=False)
            nn.init.zeros_(self.match_positions.weight)
        self.match_out = nn.Linear(3, cfg.width)
        self.null = nn.Parameter(torch.zeros(1, 1, cfg.width))
        layer = nn.TransformerDecoderLayer(
            cfg.width, cfg.heads, 4 * cfg.width, cfg.dropout, batch_first=True, norm_first=True
        )
        self.decoder = nn.TransformerDecoder(layer, cfg.layers)
        self.norm = nn.LayerNorm(cfg.width)
        self.out = nn.Linear(cfg.width, cfg.positions)
        add_inference_path(self, _history_head_weights)

    def match(
        self, h: torch.Tensor, history: torch.Tensor, history_mask: torch.Tensor
    ) -> torch.Tensor:
        """Per candidate [B, N, 3]: its largest, mean and most recent cosine with the history
        (0 for a slate without history)."""
        q = F.normalize(self.match_query(h), dim=-1)
        k = F.normalize(self.match_key(history), dim=-1)
        return _summarise(torch.einsum("bnd,bhd->bnh", q, k), history_mask)

    def match_tokens(
        self,
        h: torch.Tensor,
        item_tokens: torch.Tensor,
        history: torch.Tensor,
        history_tokens: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The match token by token: ``h`` [B, N, W, D] and ``history`` [B, H, W, D] with their
        real token counts; per candidate and history item, the weighted mean over the
        candidate's tokens of each one's best cosine with the item's tokens; summarised [B, N, 3]."""
        q = F.normalize(self.match_query(h), dim=-1)
        k = F.normalize(self.match_key(history), dim=-1)
        sim = torch.einsum("bntd,bhsd->bnths", q, k)
        real_keys = _slots(history_tokens, history.size(2))  # [B, H, W]
        sim = sim.masked_fill(~real_keys[:, None, None], float("-inf")).amax(-1)
        sim = sim.masked_fill(~history_mask[:, None, None], 0.0)  # [B, N, W, H]
        weight = F.softplus(self.token_weight(h).squeeze(-1)) + 1e-6
        weight = weight * _slots(item_tokens, h.size(2))
        weight = weight / weight.sum(-1, keepdim=True).clamp(min=1e-6)
        return _summarise(torch.einsum("bnt,bnth->bnh", weight, sim), history_mask)

    def match_tfidf(
        self,
        h: torch.Tensor,
        item_tokens: torch.Tensor,
        history: torch.Tensor,
        history_tokens: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        """A soft TF-IDF cosine: ``h`` [B, N, W, D] and ``history`` [B, H, W, D] with their real
        unit counts; per candidate and history item, sum over pairs of units of w_i v_j k_ij,
        where w and v are learned weights (a learned IDF, unit length over each item's units)
        and k_ij = exp(s (cos_ij - 1)) a kernel that is 1 for the same word and fades for
        others; summarised [B, N, 3]. One projection serves both sides, so a word meets itself
        at cosine 1 from the start."""
        q = F.normalize(self.match_query(h), dim=-1)
        k = F.normalize(self.match_query(history), dim=-1)
        cosine = torch.einsum("bnid,bhjd->bnhij", q, k)
        kernel = torch.exp(self.log_sharpness.exp() * (cosine - 1.0))
        w = _unit_weights(self.token_weight(h).squeeze(-1), item_tokens)
        v = _unit_weights(self.token_weight(history).squeeze(-1), history_tokens)
        sim = torch.einsum("bni,bhj,bnhij->bnh", w, v, kernel)
        return _summarise(sim.masked_fill(~history_mask[:, None], 0.0), history_mask)

    def forward(
        self,
        h: torch.Tensor | None,
        mask: torch.Tensor,
        features: torch.Tensor | None = None,
        history: torch.Tensor | None = None,
        history_mask: torch.Tensor | None = None,
        item_tokens: torch.Tensor | None = None,
        history_tokens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores [B, N, K]: :meth:`infer` in eval mode without autograd, else
        :meth:`reference` (what training runs); the two are tested to agree."""
        if h is None or history is None or history_mask is None:
            raise ValueError("this head reads the candidates' and the history items' states")
        if self.tokens and (h.dim() != 4 or item_tokens is None or history_tokens is None):
            raise ValueError("this head matches tokens: it reads every token's state "
                             "(the tokens readout) and their counts")
        x = _HistoryInputs(h, mask, features, history, history_mask, item_tokens, history_tokens)
        if not self.training and not torch.is_grad_enabled():
            return self.infer(x)
        return self.reference(x)

    def reference(self, x: _HistoryInputs) -> torch.Tensor:
        """The head as nn modules compute it, with autograd and dropout: what training runs
        and what :meth:`infer` must reproduce."""
        h, history, history_mask = x.h, x.history, x.history_mask
        if self.tokens:
            assert x.item_tokens is not None and x.history_tokens is not None
            match = self.match_tfidf if self.tfidf else self.match_tokens
            stats = match(h, x.item_tokens, history, x.history_tokens, history_mask)
            h, history = _slot_means(h, x.item_tokens), _slot_means(history, x.history_tokens)
        else:
            stats = self.match(h, history, history_mask)
        items = _item_inputs(self.proj, h, self.features, x.features) + self.match_out(stats)
        b = items.size(0)
        memory = torch.cat([self.null.expand(b, -1, -1), self.history_proj(history)], dim=1)
        memory_mask = torch.cat([history_mask.new_ones(b, 1), history_mask], dim=1)
        items = self.decoder(
            items, memory, tgt_key_padding_mask=~x.mask, memory_key_padding_mask=~memory_mask
        )
        scores = self.out(self.norm(items))
        if self.tfidf:
            scores = scores + self.match_positions(stats)
        return scores.masked_fill(~x.mask.unsqueeze(-1), 0.0)

    def infer(self, x: _HistoryInputs) -> torch.Tensor:
        """The forward without autograd or dropout (:mod:`spdrank.methods.head_inference`): the
        layers as functional calls with the products in ``compute_dtype``, and with a unit
        readout only as many unit slots as the longest item has (the rest are padding, which
        every step masks)."""
        w = self._cast.weights(self, self.compute_dtype)
        h, history, history_mask, mask = x.h, x.history, x.history_mask, x.mask
        dtype = h.dtype
        if self.tokens:
            item_tokens, history_tokens = x.item_tokens, x.history_tokens
            assert item_tokens is not None and history_tokens is not None
            h, history = _used_slots(h, item_tokens), _used_slots(history, history_tokens)
            if self.tfidf:
                stats = self._infer_tfidf(w, h, item_tokens, history, history_tokens, history_mask)
            else:
                stats = self.match_tokens(h, item_tokens, history, history_tokens, history_mask)
            h, history = _slot_means(h, item_tokens), _slot_means(history, history_tokens)
        else:
            stats = self.match(h, history, history_mask)
        items = w.stack.input(h).to(dtype)
        if self.features is not None:
            if x.features is None:
                raise ValueError("this head reads features, but none were given")
            items = items + self.features(x.features)
        items = items + self.match_out(stats)
        b = items.size(0)
        memory = w.history(history)
        memory = torch.cat([self.null.expand(b, -1, -1).to(memory.dtype), memory], dim=1)
        memory_keys = torch.cat([history_mask.new_ones(b, 1), history_mask], dim=1)
        keys, memory_keys = key_mask(mask), key_mask(memory_keys)
        for weights in w.stack.layers:
            items = apply_layer(items, weights, keys, memory, memory_keys)
        scores = w.stack.output(items).to(dtype)
        if self.tfidf:
            scores = scores + self.match_positions(stats)
        return scores if keys is None else scores.masked_fill(~mask.unsqueeze(-1), 0.0)

    def _infer_tfidf(
        self,
        w: _HistoryHeadWeights,
        h: torch.Tensor,
        item_tokens: torch.Tensor,
        history: torch.Tensor,
        history_tokens: torch.Tensor,
        history_mask: torch.Tensor,
    ) -> torch.Tensor:
        """:meth:`match_tfidf` as two matrix products: every candidate unit against every
        history unit at once, then the kernel weighted by the history side and by the
        candidate side."""
        assert w.match is not None
        b, n, wi, _ = h.shape
        hh, wj = history.shape[1], history.shape[2]
        q = F.normalize(w.match(h).float(), dim=-1)
        k = F.normalize(w.match(history).float(), dim=-1)
        cosine = torch.bmm(q.view(b, n * wi, -1), k.view(b, hh * wj, -1).transpose(1, 2))
        kernel = cosine.sub_(1.0).mul_(self.log_sharpness.exp()).exp_()
        item_w = _unit_weights(self.token_weight(h).squeeze(-1), item_tokens)
        history_w = _unit_weights(self.token_weight(history).squeeze(-1), history_tokens)
        per_item = (kernel.view(b, n * wi, hh, wj) * history_w[:, None]).sum(-1)
        sim = torch.einsum("bni,bnih->bnh", item_w, per_item.view(b, n, wi, hh))
        return _summarise(sim.masked_fill(~history_mask[:, None], 0.0), history_mask)

class _HistoryHeadWeights(NamedTuple):
    """What :meth:`HistoryAttentionHead.infer` reads: the candidates' stack, the history
    items' map into the head's width and the tfidf match's projection (None for the other
    matches, which run as in training)."""

    stack: StackWeights
    history: NormedProduct
    match: NormedProduct | None


def _history_head_weights(
    head: HistoryAttentionHead, dtype: torch.dtype | None
) -> _HistoryHeadWeights:
    match = head.match_query if head.tfidf else None
    return _HistoryHeadWeights(
        stack_weights(head.proj, head.decoder.layers, head.norm, head.out, dtype),
        NormedProduct.of(head.history_proj[0], head.history_proj[1], dtype),
        None if match is None else NormedProduct.of(match[0], match[1], dtype),
    )


def _summarise(sim: torch.Tensor, history_mask: torch.Tensor) -> torch.Tensor:
    """Similarities [B, N, H] with each history item as [B, N, 3]: the largest, the mean and
    the most recent real item's (0 for a slate without history)."""
    real = history_mask.unsqueeze(1)
    count = history_mask.sum(1)
    largest = sim.masked_fill(~real, float("-inf")).amax(-1)
    mean = (sim * real).sum(-1) / count.clamp(min=1).unsqueeze(-1)
    latest = (count - 1).clamp(min=0).view(-1, 1, 1).expand(-1, sim.size(1), 1)
    recent = torch.gather(sim, 2, latest).squeeze(-1)
    stats = torch.stack([largest, mean, recent], dim=-1)
    return stats.masked_fill((count == 0).view(-1, 1, 1), 0.0)


def _slots(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Which of ``width`` token slots are real, for items of ``lengths`` tokens: [..., width]."""
    return torch.arange(width, device=lengths.device) < lengths.unsqueeze(-1)


def _unit_weights(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Positive weights of each item's real units [..., W], of unit length per item, as a
    TF-IDF vector's; padded slots weigh 0."""
    weight = (F.softplus(logits) + 1e-6) * _slots(lengths, logits.size(-1))
    return weight / weight.norm(dim=-1, keepdim=True).clamp(min=1e-6)


def _used_slots(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``states`` [..., W, D] cut to the slots some item uses (at least one)."""
    used = int(lengths.max()) if lengths.numel() else 0
    return states[..., : max(used, 1), :]


def _slot_means(states: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The mean over each item's real token slots, [..., W, D] -> [..., D], as one matrix
    product per item (which reads the states once)."""
    real = _slots(lengths, states.size(-2)).to(states.dtype)
    weights = real / real.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.matmul(weights.unsqueeze(-2), states).squeeze(-2)


class ScalarHead(nn.Module):
    """The classic pointwise peer: one score per item, ranked by sorting (no positions).

    Returns [B, N] (padded items 0). Trained with a listwise loss (ListNet), decoded by argsort.
    """

    matrix = False

    def __init__(self, hidden: int, cfg: HeadConfig, features: int = 0) -> None:
        super().__init__()
        _check_inputs(hidden, features)
        self.proj = _state_projection(hidden, cfg.width)
        self.features = _feature_projection(features, cfg.width)
        self.out = nn.Sequential(nn.GELU(), nn.Linear(cfg.width, 1))
        self.register_load_state_dict_pre_hook(
            _renamed_from({"mlp.0.": "proj.0.", "mlp.1.": "proj.1.", "mlp.3.": "out.1."})
        )

    def forward(
        self, h: torch.Tensor | None, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = _item_inputs(self.proj, h, self.features, features)
        return self.out(x).squeeze(-1).masked_fill(~mask, 0.0)


class FirstHead(nn.Module):
    """FIRST (Reddy et al. 2024): the LM's first-token logits over the candidates' identifiers.

    The prompt ends with "[" and each candidate is labelled by one token (a letter), so the
    logit of that token at the last position scores the candidate. The backbone's LM head does
    the work; this module only holds the identifier token ids. Returns [B, N].

    With features, a linear map of each candidate's features is added to its letter's logit:
    the letters stay the LM's own answer, and the features shift it, one weight per feature.
    """

    matrix = False

    def __init__(self, token_ids: list[int], features: int = 0) -> None:
        super().__init__()
        self.register_buffer("token_ids", torch.tensor(token_ids, dtype=torch.long))
        self.features = _feature_projection(features, 1)

    def forward(
        self, logits: torch.Tensor, mask: torch.Tensor, features: torch.Tensor | None = None
    ) -> torch.Tensor:
        scores = logits[:, self.token_ids[: mask.size(1)]]
        if self.features is not None:
            scores = scores + _item_inputs(None, None, self.features, features).squeeze(-1)
        return scores.masked_fill(~mask, 0.0)


HEADS: dict[str, type[nn.Module]] = {
    "linear": LinearProbe,
    "attn": SelfAttentionHead,
    "slot": SlotQueryHead,
    "history": HistoryAttentionHead,
    "scalar": ScalarHead,
}


def build_head(hidden: int, cfg: HeadConfig, features: int = 0) -> nn.Module:
    """The head ``cfg.kind`` over D=``hidden`` states (0: none) and ``features`` features."""
    try:
        cls = HEADS[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown head {cfg.kind!r}: choose one of {sorted(HEADS)}") from None
    return cls(hidden, cfg, features)
