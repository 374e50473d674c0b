"""The attention heads' inference paths: their layers as a few functional tensor operations.

At a slate's size the heads' matrices are small (N rows), so each operation's fixed cost (the
dispatcher, an allocation, nn.Module's hooks, re-laying out a weight) weighs as much as its
arithmetic. These functions compute what the heads' nn modules compute in eval mode (pre-norm
layers, ReLU, no dropout) with functional calls and with the weights of the matrix products
cast (and, for bfloat16 on a CPU, laid out for oneDNN's kernels) once and kept. The layer
norms, the residual stream and the scores stay in the parameters' dtype.

Training never runs these paths, so they never decide what is learned; the heads' tests hold
them to the modules' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NamedTuple, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

#: ``F.layer_norm``'s arguments after the input: shape, weight, bias, eps.
Norm = tuple[tuple[int, ...], torch.Tensor | None, torch.Tensor | None, float]

W = TypeVar("W")


class Product:
    """``x W^T + b`` with the weights in the compute dtype, optionally followed by ReLU.

    For bfloat16 on a CPU the weight is laid out once in oneDNN's blocked format: a plain
    weight is re-laid out by every product, which for a slate's few rows costs about as much
    as the product itself. Where torch lacks that path, or packing fails, the product is
    ``F.linear`` on the cast weight.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None
    ) -> None:
        self.weight = weight.detach() if dtype is None else weight.detach().to(dtype)
        self.bias = None if bias is None else bias.detach().to(self.weight.dtype)
        self.dtype = self.weight.dtype
        self.packed = packed_weight(self.weight)

    @classmethod
    def of(cls, linear: nn.Linear, dtype: torch.dtype | None) -> Product:
        return cls(linear.weight, linear.bias, dtype)

    def __call__(self, x: torch.Tensor, relu: bool = False) -> torch.Tensor:
        x = x.to(self.dtype)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed, self.bias, "relu" if relu else "none", [], ""
            )
        y = F.linear(x, self.weight, self.bias)
        return torch.relu_(y) if relu else y


def packed_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` in oneDNN's layout for bfloat16 products on a CPU; None where unavailable."""
    if weight.dtype != torch.bfloat16 or weight.device.type != "cpu":
        return None
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight, 1)
    except (AttributeError, RuntimeError, NotImplementedError):
        return None


def norm_args(norm: nn.LayerNorm) -> Norm:
    weight = None if norm.weight is None else norm.weight.detach()
    bias = None if norm.bias is None else norm.bias.detach()
    return (tuple(norm.normalized_shape), weight, bias, norm.eps)


class NormedProduct(NamedTuple):
    """A layer norm, then a product: how a head maps the backbone's states into its width."""

    norm: Norm
    product: Product

    @classmethod
    def of(cls, norm: nn.LayerNorm, linear: nn.Linear, dtype: torch.dtype | None) -> NormedProduct:
        return cls(norm_args(norm), Product.of(linear, dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(F.layer_norm(x, *self.norm))


class SelfAttention(NamedTuple):
    """One pre-norm block of self-attention: its norm, the fused q/k/v product, the output."""

    norm: Norm
    qkv: Product
    out: Product
    heads: int


class CrossAttention(NamedTuple):
    """One pre-norm block of attention over a memory: q from the items, k/v from the memory."""

    norm: Norm
    q: Product
    kv: Product
    out: Product
    heads: int


class FeedForward(NamedTuple):
    """One pre-norm feed-forward block: norm, then ReLU between two products."""

    norm: Norm
    ff1: Product
    ff2: Product


class LayerWeights(NamedTuple):
    """One pre-norm layer: self-attention, attention over a memory (decoder layers only),
    feed-forward."""

    self_attention: SelfAttention
    cross_attention: CrossAttention | None
    feed_forward: FeedForward


def _check_layer(layer: nn.Module) -> None:
    relu = getattr(layer, "activation_relu_or_gelu", None) == 1 or layer.activation is F.relu
    if not layer.norm_first or not relu:
        raise ValueError("the inference path computes pre-norm ReLU layers only")


class StackWeights(NamedTuple):
    """A head's layers between its input map (the states into its width) and its output map
    (a final norm, then the K position scores)."""

    input: NormedProduct
    layers: tuple[LayerWeights, ...]
    output: NormedProduct


def stack_weights(
    input_map: nn.Sequential,
    layers: nn.ModuleList,
    norm: nn.LayerNorm,
    out: nn.Linear,
    dtype: torch.dtype | None,
) -> StackWeights:
    """The weights of ``input_map`` (LayerNorm, Linear), ``layers`` and the output ``norm`` and
    ``out``, in ``dtype``."""
    return StackWeights(
        NormedProduct.of(input_map[0], input_map[1], dtype),
        tuple(layer_weights(layer, dtype) for layer in layers),
        NormedProduct.of(norm, out, dtype),
    )


def layer_weights(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer, dtype: torch.dtype | None
) -> LayerWeights:
    """The weights of one pre-norm ReLU encoder or decoder layer, in ``dtype``."""
    _check_layer(layer)
    attn = layer.self_attn
    heads = attn.num_heads
    self_attention = SelfAttention(
        norm_args(layer.norm1),
        Product(attn.in_proj_weight, attn.in_proj_bias, dtype),
        Product.of(attn.out_proj, dtype),
        heads,
    )
    if isinstance(layer, nn.TransformerDecoderLayer):
        cross = layer.multihead_attn
        width = cross.embed_dim
        weight, bias = cross.in_proj_weight, cross.in_proj_bias
        cross_attention = CrossAttention(
            norm_args(layer.norm2),
            Product(weight[:width], None if bias is None else bias[:width], dtype),
            Product(weight[width:], None if bias is None else bias[width:], dtype),
            Product.of(cross.out_proj, dtype),
            cross.num_heads,
        )
        ff_norm = layer.norm3
    else:
        cross_attention = None
        ff_norm = layer.norm2
    feed_forward = FeedForward(
        norm_args(ff_norm), Product.of(layer.linear1, dtype), Product.of(layer.linear2, dtype)
    )
    return LayerWeights(self_attention, cross_attention, feed_forward)


def apply_layer(
    x: torch.Tensor,
    w: LayerWeights,
    key_mask: torch.Tensor | None,
    memory: torch.Tensor | None = None,
    memory_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One pre-norm layer without dropout on ``x`` [B, N, width]: x + self-attention(norm(x)),
    then (decoder layers) + attention over ``memory`` [B, M, width], then + feed-forward.
    Masks are [B, 1, 1, keys] (True: attend) or None (every key is real)."""
    b, n, width = x.shape
    sa = w.self_attention
    qkv = sa.qkv(F.layer_norm(x, *sa.norm))
    qkv = qkv.view(b, n, 3, sa.heads, -1).permute(2, 0, 3, 1, 4)
    a = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=key_mask)
    x = x + sa.out(a.transpose(1, 2).reshape(b, n, width))
    ca = w.cross_attention
    if ca is not None:
        if memory is None:
            raise ValueError("a decoder layer attends over a memory, but none was given")
        m = memory.size(1)
        q = ca.q(F.layer_norm(x, *ca.norm)).view(b, n, ca.heads, -1).transpose(1, 2)
        kv = ca.kv(memory).view(b, m, 2, ca.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=memory_mask)
        x = x + ca.out(a.transpose(1, 2).reshape(b, n, width))
    ff = w.feed_forward
    return x + ff.ff2(ff.ff1(F.layer_norm(x, *ff.norm), relu=True))


def key_mask(mask: torch.Tensor) -> torch.Tensor | None:
    """``mask`` [B, N] (True: real) as an attention mask [B, 1, 1, N]; None when all are real,
    which lets attention skip the mask."""
    return None if bool(mask.all()) else mask[:, None, None, :]


class WeightCache(Generic[W]):
    """A head's weights as its inference path reads them, built once by ``build(head, dtype)``
    and kept until a parameter changes: in place (an optimizer step, a checkpoint loaded: its
    version counter moves) or its storage (moved to another device or dtype: its address
    moves). Casting them on every call would cost more than the products they take part in,
    and so would walking the modules for their parameters: those are listed once, and listed
    again after :meth:`reset` (a checkpoint loaded with ``assign=True`` replaces them)."""

    def __init__(self, build: Callable[[Any, torch.dtype | None], W]) -> None:
        self.build = build
        self.reset()

    def reset(self) -> None:
        self._params: list[torch.Tensor] | None = None
        self._key: tuple[Any, ...] | None = None
        self._weights: W | None = None

    def weights(self, head: nn.Module, dtype: torch.dtype | None) -> W:
        if self._params is None:
            self._params = list(head.parameters())
        key = (dtype, *[(p.data_ptr(), p._version) for p in self._params])
        if key != self._key or self._weights is None:
            self._weights = self.build(head, dtype)
            self._key = key
        return self._weights


def add_inference_path(head: nn.Module, build: Callable[[Any, torch.dtype | None], Any]) -> None:
    """Give ``head`` what its inference path reads: ``compute_dtype``, the dtype of the
    matrix products at inference (None: the parameters' own; the layer norms, the residual
    stream and the scores stay in the parameters' dtype), and the weights ``build`` makes,
    kept until a parameter changes or a checkpoint is loaded."""
    head.compute_dtype = None
    head._cast = WeightCache(build)
    head.register_load_state_dict_post_hook(_forget_cached_weights)


def _forget_cached_weights(head: nn.Module, _keys: Any) -> None:
    """A load hook: the loaded weights may be new tensors, so list the parameters afresh."""
    head._cast.reset()
