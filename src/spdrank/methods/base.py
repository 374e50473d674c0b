"""The ranking-method interface and its registry, found by head kind.

SPD and its single-pass peers share the backbone, the prompt, the training loop and the
checkpoint format; they differ in what their head scores, how it learns, and how its scores
become an order. A :class:`RankingMethod` says all of that for one method: a head, a loss and a
decoder, plus which way its head reads the backbone (:attr:`RankingMethod.reads`; the model
builds the reader, :mod:`spdrank.backbone.readout`). The model, the training loop, the state cache
and the commands ask the method of a head kind (:func:`method_for`) rather than test the kind;
a method never receives the model, only settings and arrays.

Nothing here imports torch at module level: the CLI lists the head kinds, and the training
settings build their prompt, without loading it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from spdrank.backbone.prompt import PromptSettings
    from spdrank.core.unread import Unread
    from spdrank.methods.head_config import HeadConfig


class ModelSettings(Protocol):
    """What a method reads of a model's settings (:class:`spdrank.model.config.SPDConfig`)."""

    head: HeadConfig
    prompt: PromptSettings
    features: Any
    features_only: bool


#: The ways a head reads the backbone (:attr:`RankingMethod.reads`), each a reader the model
#: builds (:mod:`spdrank.backbone.readout`).
READS = ("prompt", "candidates", "logits")

#: A method's decoding (:meth:`RankingMethod.decoding`): a padded batch of scores ([B, N, K]
#: or [B, N]) and each slate's real items -> each slate's order (item indices best first) and
#: the scores its :class:`~spdrank.core.ranking.Ranking` reports, best first.
BatchDecoder = Callable[["np.ndarray", Sequence[int]], list[tuple["np.ndarray", list[float]]]]


class RankingMethod(ABC):
    """One ranking method: its heads, prompt, loss, decoding, and what it cannot do."""

    #: The method's own name, and how messages call it ("SPD", "FIRST").
    name: ClassVar[str]
    title: ClassVar[str]
    #: The head kinds (``HeadConfig.kind``, ``--head``) it serves, in the order ``--help``
    #: lists them; a kind belongs to one method.
    kinds: ClassVar[tuple[str, ...]]
    #: ``--head``'s help for these kinds.
    help: ClassVar[str]
    #: Its head scores an N x K item-position matrix, each slate decoded by a named decoder
    #: (:mod:`spdrank.methods.spd.decode`); otherwise it scores one value per item.
    matrix: ClassVar[bool]
    #: How its head reads the backbone (one of :data:`READS`): ``prompt``, one prompt holding
    #: every candidate, its states pooled at the readout positions; ``candidates``, one
    #: sequence a candidate; ``logits``, one prompt's next-token logits at its end (the
    #: backbone is loaded with its LM head).
    reads: ClassVar[str] = "prompt"
    #: Its settings record (:class:`MethodSettings`), filled from the settings of a run.
    settings: ClassVar[type[MethodSettings] | None] = None
    #: Why its backbone states cannot be cached for training (``--cache-states``); None when
    #: they can.
    cache_refusal: ClassVar[str | None] = None
    #: The head kinds among :attr:`kinds` that read the history items' states as well as the
    #: candidates': their prompt spans each history item.
    history_kinds: ClassVar[tuple[str, ...]] = ()
    #: The most rank positions (K) it can score; None: no limit of its own.
    max_positions: ClassVar[int | None] = None
    #: Its scores can start from a ranker's order (:mod:`spdrank.methods.anchor`): its heads
    #: name the output layers to start at zero.
    anchorable: ClassVar[bool] = True

    @property
    def reads_logits(self) -> bool:
        """Its head reads the LM's logits rather than the items' hidden states."""
        return self.reads == "logits"

    @property
    def caches_states(self) -> bool:
        """Whether a frozen backbone's states can stand in for its prefill."""
        return self.cache_refusal is None

    def model_name(self, kind: str) -> str:
        """A model's default name in tables and the server (e.g. ``spd-attn``)."""
        return kind

    def positions(self, asked: int) -> int:
        """The rank positions a model of this method gets when ``asked`` for K."""
        return asked if self.max_positions is None else min(asked, self.max_positions)

    def prompt(self, settings: PromptSettings) -> PromptSettings:
        """The prompt settings this method needs, from those asked for."""
        return settings

    def check(self, config: ModelSettings) -> None:
        """Raise ValueError when ``config`` describes a model this method cannot be."""

    @abstractmethod
    def build_head(
        self, config: ModelSettings, backbone: nn.Module, tokenizer: Any, features: int
    ) -> nn.Module:
        """A fresh head of ``config.head.kind`` (one of :attr:`kinds`) for a model over
        ``backbone`` reading ``features`` features: each method builds the heads it serves
        (a head over the backbone's states reads :func:`state_size` of them)."""

    def head_settings(self, settings: Any) -> dict[str, Any]:
        """The :class:`~spdrank.methods.head_config.HeadConfig` fields that this method's own
        settings record (:attr:`settings`, or a run's settings holding its fields) fills,
        beyond the sizes every head has; none unless the method says."""
        return {}

    def unread(self, settings: Any) -> list[Unread]:
        """Its own settings that a run of ``settings`` (a training run's, holding this
        method's fields) would not read, each with what would make it count
        (:mod:`spdrank.core.unread`); a setting of another method's record is never read,
        and the run says so without asking here."""
        return []

    def frozen_refusal(self, config: ModelSettings) -> str | None:
        """Why a model of ``config`` has nothing to train with its backbone frozen (its head
        has no weights of its own); None when it has."""
        return None

    @abstractmethod
    def loss(
        self, scores: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, settings: Any
    ) -> torch.Tensor:
        """The [B] per-slate losses of a batch's ``scores`` against its [B, P, P] item-position
        ``target`` matrices, with ``sizes`` [B] real items a slate, under ``settings``: the
        method's own record (:attr:`settings`) or any settings holding its fields (a
        training run's)."""

    @abstractmethod
    def order(self, scores: np.ndarray, decoder: str) -> np.ndarray:
        """Item indices best first from one slate's scores ([n, K] or [n])."""

    def orders(self, scores: np.ndarray, sizes: Sequence[int], decoder: str) -> list[np.ndarray]:
        """Each slate's order from a padded batch of scores, ``sizes`` real items a slate."""
        return [self.order(scores[i, :n], decoder) for i, n in enumerate(sizes)]

    @abstractmethod
    def ranked_scores(self, scores: np.ndarray, order: np.ndarray) -> list[float]:
        """The scores a :class:`~spdrank.core.ranking.Ranking` reports, best first, for a slate
        ranked in ``order`` from its ``scores`` (padded items may follow the real ones)."""

    def decoders(self) -> list[str]:
        """The names its :meth:`decoding` accepts, in the order ``spdrank bench`` gives each its
        row: the decoders of :mod:`spdrank.methods.spd.decode`, those registered since
        included, which every built-in method takes (one that sorts takes the name, and sorts).
        """
        from spdrank.methods.spd.decode import DECODERS

        return list(DECODERS)

    def decoding(self, decoder: str) -> BatchDecoder:
        """What a ranking call runs after the head: each slate's order under the named
        ``decoder`` (:meth:`orders`) and its reported scores (:meth:`ranked_scores`), for a
        whole batch in one call. A method that names its decoders checks the name here, before
        returning this (an unknown one a ValueError naming those there are). The model asks
        once a decoder (:meth:`spdrank.model.ranker.SPDRanker.decoding`), so a ranking call
        hands its scores to the method once."""

        def decode(scores: np.ndarray, sizes: Sequence[int]) -> list[tuple[np.ndarray, list[float]]]:
            orders = self.orders(scores, sizes, decoder)
            return [(order, self.ranked_scores(scores[i], order)) for i, order in enumerate(orders)]

        return decode


class MethodSettings:
    """A method's own settings record (as peft gives each tuner its config class): a dataclass
    whose fields, each declared with :func:`spdrank.core.flags.setting`, are ``spdrank train``
    flags. Registering the method adds them to the run's flat settings
    (:class:`spdrank.training.config.TrainConfig`), which fill the record (:meth:`of`)."""

    @classmethod
    def of(cls, settings: Any) -> Any:
        """This record from ``settings``: itself, or any object holding its fields by name (a
        run's :class:`~spdrank.training.config.TrainConfig`, which holds every record's)."""
        if type(settings) is cls:
            return settings
        import dataclasses

        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        return cls(**{name: getattr(settings, name) for name in names})


def state_size(config: ModelSettings, backbone: nn.Module) -> int:
    """The width D of the states a head of ``config`` reads of ``backbone``: its hidden size,
    or 0 for a features-only model, whose head reads the features alone."""
    from spdrank.backbone.load import hidden_size

    return 0 if config.features_only else hidden_size(backbone)


_METHODS: dict[str, RankingMethod] = {}


def register(method: RankingMethod) -> RankingMethod:
    """Serve ``method``'s head kinds from now on; a kind another method serves is refused."""
    taken = [k for k in method.kinds if k in _METHODS and _METHODS[k] is not method]
    if taken:
        raise ValueError(f"head kind(s) {taken} already belong to another ranking method")
    for kind in method.kinds:
        _METHODS[kind] = method
    return method


def unregister(method: RankingMethod) -> None:
    """Stop serving ``method``'s head kinds (a method registered for a while, e.g. a test's)."""
    for kind in method.kinds:
        if _METHODS.get(kind) is method:
            del _METHODS[kind]


def method_for(kind: str) -> RankingMethod:
    """The method serving head ``kind``; a ValueError listing the kinds for any other."""
    try:
        return _METHODS[kind]
    except KeyError:
        raise ValueError(f"unknown head {kind!r}: choose one of {sorted(_METHODS)}") from None


def head_kinds() -> list[str]:
    """Every head kind served, grouped by method in the order they were registered."""
    return list(_METHODS)


def methods() -> list[RankingMethod]:
    """The registered methods, in the order they were registered."""
    return list(dict.fromkeys(_METHODS.values()))
