"""SPDRanker: backbone prefill -> head -> score matrix -> assignment decode.

A checkpoint is a directory holding ``config.json`` (backbone reference, head, prompt and
decoder settings, and the upstream features the head reads with their normalisation),
``head.safetensors`` and, when the backbone was LoRA-adapted, the peft adapter under
``adapter/``. Nothing in it is a pickle, so loading a checkpoint never runs code; nor can its
backbone reference make it: the Python of a model folder runs only when the caller passes
``trust_remote_code`` for that load, which no checkpoint records.

A features-only model (``features_only``) has no backbone at all: its head reads the upstream
features alone, so it loads and ranks without the LLM (the ablation that measures what the
LLM adds).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from spdrank.backbone.batching import Batch, collate, pad_features  # noqa: F401 - part of this module's API
from spdrank.backbone.load import (
    BackboneConfig,
    ConfigError,
    bounded_int,
    last_hidden,
    last_token_logits,
    load_backbone,
    load_tokenizer,
    pool_spans,
    read_json,
    read_tensors,
    resolve_dtype,
    span_tokens,
)
from spdrank.backbone.prompt import (
    UNIT_READOUTS,
    EncodedPrompt,
    PromptBuilder,
    PromptSettings,
    fitted_item_tokens,
)
from spdrank.backbone.words import WordSplitter, pool_words
from spdrank.core.atomic_dir import atomic_directory
from spdrank.core.defaults import UNNAMED_DECODER
from spdrank.core.features import FeatureNormalizer
from spdrank.core.ranking import STAGES, Ranking
from spdrank.core.slates import TEXT_FIELDS, Candidate, Query, Slate, SlateError
from spdrank.methods.base import RankingMethod, method_for
from spdrank.methods.first.method import first_prompt  # noqa: F401 - part of this module's API
from spdrank.methods.heads import HeadConfig
from spdrank.methods.spd.decode import get_decoder

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
HEAD_NAME = "head.safetensors"
ADAPTER_DIR = "adapter"
FORMAT_VERSION = 1
#: The checkpoint formats this version reads.
SUPPORTED_FORMAT_VERSIONS = (FORMAT_VERSION,)
#: The largest token budget (per item, per user context) a checkpoint may set: far past any
#: model's context.
MAX_TOKEN_BUDGET = 1 << 20


@dataclass
class SPDConfig:
    backbone: BackboneConfig = field(default_factory=BackboneConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    decoder: str = UNNAMED_DECODER
    text_fields: tuple[str, ...] = TEXT_FIELDS
    #: The upstream features the head reads, with their normalisation; None reads none.
    features: FeatureNormalizer | None = None
    #: Read the features alone: no backbone is loaded and no prompt is built.
    features_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "spdrank",
            "format_version": FORMAT_VERSION,
            "backbone": self.backbone.to_dict(),
            "head": self.head.to_dict(),
            "prompt": self.prompt.to_dict(),
            "decoder": self.decoder,
            "text_fields": list(self.text_fields),
            "features": self.features.to_dict() if self.features is not None else None,
            "features_only": self.features_only,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SPDConfig:
        if data.get("format") != "spdrank":
            raise ValueError("not an spdrank checkpoint config (missing \"format\": \"spdrank\")")
        version = data.get("format_version", FORMAT_VERSION)
        if isinstance(version, bool) or version not in SUPPORTED_FORMAT_VERSIONS:
            raise ValueError(
                f"format_version {version!r} is not one this spdrank reads (it reads "
                f"{', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})"
            )
        prompt = PromptSettings.from_dict(data["prompt"])
        # Token budgets: what the prompt is cut to, and what its texts are cut to before
        # they are tokenized.
        bounded_int(prompt.max_item_tokens, "prompt.max_item_tokens", 1, MAX_TOKEN_BUDGET)
        bounded_int(prompt.max_query_tokens, "prompt.max_query_tokens", 1, MAX_TOKEN_BUDGET)
        decoder, fields = data.get("decoder", UNNAMED_DECODER), data.get("text_fields", TEXT_FIELDS)
        if not isinstance(decoder, str):
            raise ConfigError(f"decoder must be a decoder's name, got {decoder!r}")
        if not isinstance(fields, (list, tuple)) or not fields \
                or not all(isinstance(f, str) for f in fields):
            raise ConfigError(f"text_fields must be a list of field names, got {fields!r}")
        if data.get("features"):
            _check_features(data["features"])
        return cls(
            backbone=BackboneConfig.from_dict(data["backbone"]),
            head=HeadConfig.from_dict(data["head"]),
            prompt=prompt,
            decoder=data.get("decoder", UNNAMED_DECODER),
            text_fields=tuple(data.get("text_fields", TEXT_FIELDS)),
            features=(
                FeatureNormalizer.from_dict(data["features"]) if data.get("features") else None
            ),
            features_only=bool(data.get("features_only", False)),
        )


def _check_features(data: Any) -> None:
    """Refuse a saved feature normalisation that is not names with finite means and positive,
    finite deviations, one of each per name."""
    import math

    names, mean, std = (data.get(k) if isinstance(data, dict) else None
                        for k in ("names", "mean", "std"))
    lists = all(isinstance(v, list) for v in (names, mean, std))
    if not lists or not (len(names) == len(mean) == len(std)) \
            or not all(isinstance(n, str) for n in names):
        raise ConfigError("features must hold 'names', 'mean' and 'std', one of each per name")
    for value in (*mean, *std):
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise ConfigError(f"features: mean and std must be finite numbers, got {value!r}")
    if any(s <= 0 for s in std):
        raise ConfigError("features: every std must be positive")


class HeadInputs(NamedTuple):
    """What a head reads of a batch (see :meth:`SPDRanker.read`)."""

    #: The candidates' states [B, N, D] ([B, N, W, D] with the "tokens" readout; FIRST: the
    #: LM's logits [B, V]); None without an LLM.
    items: torch.Tensor | None
    #: The history items' states, for a head that reads them; else None.
    history: torch.Tensor | None = None
    #: With the "tokens" readout, the real token slots of each candidate [B, N] and history
    #: item [B, H].
    item_tokens: torch.Tensor | None = None
    history_tokens: torch.Tensor | None = None


#: Items (over the whole batch) up to which the head runs on one CPU thread. Its matrices
#: are then [rows, width]-sized: each product takes tens of microseconds on one core, about
#: what a thread pool's fork and join cost, and a worker descheduled by another process on a
#: shared core stalls the whole product for a scheduler slice (milliseconds).
HEAD_SERIAL_ROWS = 512


@contextmanager
def _serial_if(serial: bool, device: torch.device) -> Iterator[None]:
    """Run the body on one intra-op thread when ``serial`` (on CPU), then restore the count."""
    threads = torch.get_num_threads()
    if not serial or device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class StageClock:
    """Milliseconds spent in each named stage of a ranking call, timed around the work itself.

    A stage timed twice (the head, then copying its scores to the host) adds up. On a GPU a
    stage's timer stops after its queued work has run, so each stage is charged its own.
    """

    def __init__(self, stages: Sequence[str] = ()) -> None:
        #: Each stage's milliseconds; the ``stages`` given start at 0, so a call that skips
        #: one (no prefill for cached states) still reports it.
        self.ms: dict[str, float] = dict.fromkeys(stages, 0.0)

    @contextmanager
    def stage(self, name: str, model: SPDRanker | None = None) -> Iterator[None]:
        """Time the body as stage ``name``; with ``model``, wait for its device's queued work
        before the timer stops."""
        start = time.perf_counter()
        yield
        if model is not None:
            model.synchronize()
        self.ms[name] = self.ms.get(name, 0.0) + (time.perf_counter() - start) * 1e3


def _stage(
    clock: StageClock | None, name: str, model: SPDRanker
) -> contextlib.AbstractContextManager[None]:
    """``clock``'s timer for stage ``name``, or nothing to time without a clock (training)."""
    return contextlib.nullcontext() if clock is None else clock.stage(name, model)


def _as_slate(query: str | Query | Slate, candidates: Sequence[Any] | None) -> Slate:
    """Accept a Slate, or a query plus candidates given as strings, dicts or Candidates."""
    if isinstance(query, Slate):
        if candidates is not None:
            raise ValueError("pass either a Slate or a query with candidates, not both")
        return query
    if candidates is None:
        raise ValueError("rank() needs candidates")
    q = query if isinstance(query, Query) else Query(qid="", text=str(query))
    cands: list[Candidate] = []
    for i, c in enumerate(candidates):
        if isinstance(c, Candidate):
            cands.append(c)
        elif isinstance(c, str):
            cands.append(Candidate(docid=str(i), doc={"text": c}))
        elif isinstance(c, dict):
            cands.append(Slate.from_dict({"query": "", "candidates": [c]}).candidates[0])
        else:
            raise TypeError(f"candidate {i} must be a string, a dict or a Candidate")
    return Slate(query=q, candidates=cands)


class NoBackbone(nn.Module):
    """The backbone of a features-only model: no weights, no prefill.

    It stands where the LLM would, so code that walks a model's parts (the optimizer's
    parameter groups, checkpoints) needs no special case.
    """


class NoTokenizer:
    """The tokenizer of a features-only model: it reads no text, so its prompts are empty.

    ``pad_token_id`` is there for code that collates prompts generically; there is never a
    token to pad.
    """

    pad_token_id = 0


class SPDRanker(nn.Module):
    """The SPD student, or one of its single-pass peers on the same backbone and prompt.

    ``head.kind`` picks the ranking method (:mod:`spdrank.methods.base`), which builds the head and
    turns its scores into orders: ``attn``/``linear``/``slot``/``history`` give SPD (an N x K
    matrix, decoded by assignment); ``scalar`` (one score per item) and ``first`` (FIRST's
    first-token logits over candidate letters) are decoded by sorting. All give a valid
    permutation from one prefill.
    """

    decode_passes = 1

    def __init__(self, config: SPDConfig, backbone: nn.Module, tokenizer: Any) -> None:
        super().__init__()
        self.config = config
        self.backbone = backbone
        self.tokenizer = tokenizer
        #: The ranking method of the head's kind.
        self.method: RankingMethod = method_for(config.head.kind)
        self.features = config.features
        n_features = len(config.features) if config.features is not None else 0
        if config.features_only:
            if not n_features:
                raise ValueError("a features-only model needs features to read (--features)")
            if config.backbone.lora is not None:
                raise ValueError("a features-only model has no backbone to adapt: set no LoRA")
        self.method.check(config)
        self.head = self.method.build_head(config, backbone, tokenizer, n_features)
        #: The head compares candidates with the user's history items (their own states).
        self.reads_history = bool(getattr(self.head, "reads_history", False))
        if self.reads_history and not config.prompt.history_items:
            raise ValueError(
                f"head {config.head.kind!r} reads the history items' states: build the prompt "
                "with history_items=True (spdrank train sets it for this head)"
            )
        units = config.prompt.readout in UNIT_READOUTS
        if units and not (self.reads_history and config.head.tokens):
            raise ValueError(
                f"the {config.prompt.readout} readout keeps several states per item: only the "
                "history head built for it (--head history, which spdrank train sets up) can "
                "read them"
            )
        self.prompts = None if config.features_only else PromptBuilder(tokenizer, config.prompt)
        #: The backbone's positions: no prompt may be longer (None: unknown, or no backbone).
        self.context_length = context_length(backbone)
        #: Candidates (and query texts) encoded, and how many were cut to their token budget:
        #: what ``rank``, ``eval`` and ``train`` report, since a cut text is a different text.
        self.cuts = Cuts()
        self.words = (
            WordSplitter(tokenizer) if config.prompt.readout == "words" and self.prompts else None
        )
        get_decoder(config.decoder)  # fail early on an unknown decoder
        self.name = self.method.model_name(config.head.kind)

    @property
    def matrix(self) -> bool:
        """Its scores are N x K matrices decoded by assignment (else one score per item)."""
        return self.method.matrix

    # -- construction and checkpoints --------------------------------------------------------

    @classmethod
    def build(
        cls, config: SPDConfig, device: torch.device | str = "cpu", trust_remote_code: bool = False
    ) -> SPDRanker:
        """A fresh model: pretrained backbone (fresh LoRA or frozen) and an untrained head.

        ``trust_remote_code`` lets a backbone whose folder holds its own Python run it. Built
        to be trained, it takes ``dtype: auto`` as float32 on every CPU; the checkpoint saves
        ``auto``, which :meth:`from_pretrained` resolves for the machine that ranks.
        """
        backbone, tokenizer = _backbone_and_tokenizer(config, device, None, trust_remote_code)
        if config.prompt.max_item_tokens is None:
            context = context_length(backbone)
            if context is None:
                raise ValueError(
                    f"{config.backbone.name_or_path} names no max_position_embeddings to fit "
                    "the per-candidate token budget to: pass --max-item-tokens"
                )
            config.prompt.max_item_tokens = fitted_item_tokens(
                context, config.head.positions, config.prompt.max_query_tokens
            )
            log.info(
                "per-candidate token budget: %d tokens, so that %d candidates and the query fit "
                "the backbone's %d positions (--max-item-tokens to choose)",
                config.prompt.max_item_tokens, config.head.positions, context,
            )
        model = cls(config, backbone, tokenizer)
        return model.to(device)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        device: torch.device | str = "cpu",
        dtype: str | None = None,
        trust_remote_code: bool = False,
    ) -> SPDRanker:
        """Load a checkpoint; ``dtype`` (e.g. "bfloat16") overrides the backbone's saved one.

        ``auto`` (the default a checkpoint saves) is bfloat16 on CUDA and on a CPU with native
        bfloat16 matrix units (AMX, AVX512-BF16: :func:`spdrank.backbone.cpu.native_bf16`), float32 on
        other CPUs; a saved or passed float32 stays float32.

        ``trust_remote_code`` lets the backbone the checkpoint names run the Python of its
        folder; without it such a backbone is refused. It is the caller's choice for this
        load: a checkpoint cannot grant it to itself.
        """
        path = checkpoint_dir(path)
        config = read_config(path / CONFIG_NAME)
        if dtype is not None:
            resolve_dtype(dtype, device)  # an unknown name fails before any weight is read
            config.backbone.dtype = dtype
        adapter = path / ADAPTER_DIR if config.backbone.lora is not None else None
        model = cls(
            config, *_backbone_and_tokenizer(config, device, adapter, trust_remote_code, True)
        )
        load_head(model.head, path / HEAD_NAME)
        model.to(device)
        model.eval()
        model.match_head_precision()
        return model

    def match_head_precision(self) -> None:
        """Run the head's matrix products in bfloat16 when the backbone runs in it on a CPU.

        There the head's cost is its products, and a CPU with bfloat16 units (AMX,
        AVX512-BF16) does them at a fraction of float32's time; whoever chose bfloat16 for the
        backbone has chosen its precision. On an accelerator the head is not bound by its
        arithmetic, so it keeps its float32 products. Heads without an inference path in
        another dtype are left alone.
        """
        if not hasattr(self.head, "compute_dtype") or self.config.features_only:
            return
        weight = next(self.backbone.parameters(), None)
        cpu_bf16 = self.device.type == "cpu" and weight is not None and weight.dtype == torch.bfloat16
        self.head.compute_dtype = torch.bfloat16 if cpu_bf16 else None

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpoint to a temporary sibling, then swap it in: never half-written."""
        with atomic_directory(path) as tmp:
            (tmp / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n")
            head = {k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}
            save_file(head, str(tmp / HEAD_NAME))
            if self.config.backbone.lora is not None:
                self.backbone.save_pretrained(str(tmp / ADAPTER_DIR), safe_serialization=True)

    # -- the forward pass --------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(itertools.chain(self.parameters(), self.buffers())).device

    def encode(self, slate: Slate) -> EncodedPrompt:
        """The slate's prompt, and its candidates' normalised features when the model reads them.

        A candidate missing a feature the model reads is a :class:`SlateError` naming it.
        """
        if len(slate) > self.config.head.positions:
            raise ValueError(
                f"slate {slate.query.qid!r} has {len(slate)} candidates; this model ranks at most "
                f"{self.config.head.positions} (its K)"
            )
        features = self.slate_features(slate)
        if self.prompts is None:  # features only: no text is read
            n = len(slate)
            return EncodedPrompt([], readout=[0] * n, truncated=[False] * n, features=features)
        texts = slate.candidate_texts(self.config.text_fields)
        encoded = self.prompts.encode(slate.query.text, texts)
        self.check_context(slate, encoded)
        self.cuts.add(encoded)
        encoded.features = features
        return encoded

    def check_context(self, slate: Slate, encoded: EncodedPrompt) -> None:
        """Refuse a prompt longer than the backbone's positions, with its numbers: the backbone
        would read it wrongly or fail, and nothing may be cut silently to make it fit."""
        if self.context_length is None or len(encoded.input_ids) <= self.context_length:
            return
        prompt = self.config.prompt
        raise SlateError(
            f"slate {slate.query.qid!r}: its prompt is {len(encoded.input_ids)} tokens, more "
            f"than the backbone's {self.context_length} positions ({len(slate)} candidates at "
            f"up to {prompt.max_item_tokens} tokens each, a query of up to "
            f"{prompt.max_query_tokens}): rank it by sliding windows (--window), or train "
            "with a smaller --max-item-tokens"
        )

    def slate_features(self, slate: Slate) -> np.ndarray | None:
        """The slate's normalised features [n, F] when the model reads features, else None."""
        return self.features(slate) if self.features is not None else None

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        batch = collate(encoded, self.tokenizer.pad_token_id)
        device = self.device
        return batch if device.type == "cpu" else batch.to(device)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score matrices [B, N, K] for a padded batch (padded rows are 0).

        Training calls this; :meth:`score_batch` and :meth:`score_matrix` reach the same
        :meth:`head_scores` with a clock, so every caller's scores come from the same prefill
        and head calls.
        """
        return self.head_scores(batch)

    def head_scores(self, batch: Batch, clock: StageClock | None = None) -> torch.Tensor:
        """The head's scores for a padded batch: one prefill (or the batch's cached states)
        read as :meth:`read` says, then the head (:meth:`score`).

        A frozen backbone runs without autograd even when gradients are on: only the head
        learns, so keeping the prefill's activations for backward would only cost memory.
        Without gradients (inference), a batch of few items runs its head on one CPU thread
        (see ``HEAD_SERIAL_ROWS``). ``clock``, when given, times the ``prefill``, ``readout``
        and ``head`` stages, each waiting for its queued GPU work before its timer stops.
        """
        frozen = self.config.backbone.lora is None
        with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
            inputs = self.read(batch, clock)
        serial = not torch.is_grad_enabled() and batch.item_mask.numel() <= HEAD_SERIAL_ROWS
        with _stage(clock, "head", self), _serial_if(serial, self.device):
            return self.score(inputs, batch)

    def score(self, inputs: HeadInputs, batch: Batch) -> torch.Tensor:
        """The head's scores from what :meth:`read` returned for ``batch``."""
        if self.reads_history:
            return self.head(
                inputs.items, batch.item_mask, batch.features, inputs.history,
                batch.history_mask, inputs.item_tokens, inputs.history_tokens,
            )
        return self.head(inputs.items, batch.item_mask, batch.features)

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """What the head reads, as float32, from one prefill (or the batch's cached states).

        The candidates' states (FIRST: the LM's logits; nothing without an LLM) and, for a
        head that reads the user's history, the history items' states. Each item's token
        states are pooled as the prompt settings' ``readout`` says, all kept ("tokens"), or
        pooled per word ("words"). ``clock``, when given, times the backbone's forward as the
        ``prefill`` stage and the pooling as ``readout``.
        """
        if self.config.features_only:
            return HeadInputs(None)
        if batch.states is not None:
            with _stage(clock, "readout", self):
                history = batch.history_states.float() \
                    if batch.history_states is not None else None
                return HeadInputs(batch.states.float(), history, batch.token_lengths,
                                  batch.history_token_lengths)
        if self.method.reads_logits:
            with _stage(clock, "prefill", self):
                logits = last_token_logits(self.backbone, batch.input_ids, batch.attention_mask)
            return HeadInputs(logits.float())
        with _stage(clock, "prefill", self):
            hidden = last_hidden(self.backbone, batch.input_ids, batch.attention_mask)
        with _stage(clock, "readout", self):
            return self.readout(batch, hidden)

    def readout(self, batch: Batch, hidden: torch.Tensor) -> HeadInputs:
        """The items' (and history items') states from one prefill's ``hidden`` [B, T, D], as
        the prompt settings' readout pools them."""
        first = batch.first if batch.first is not None else batch.readout
        spans = [(first, batch.readout)]
        if batch.history_first is not None and self.reads_history:
            spans.append((batch.history_first, batch.history_last))
        how = self.config.prompt.readout
        if how in UNIT_READOUTS:
            width = self.config.prompt.max_item_tokens
            if self.words is not None:
                read = pool_words(hidden, batch.input_ids, spans, width, self.words)
            else:
                read = [span_tokens(hidden, a, z, width) for a, z in spans]
            states = [x.float() for x, _ in read]
            lengths = [n for _, n in read]
            if len(read) == 1:
                return HeadInputs(states[0], None, lengths[0])
            return HeadInputs(states[0], states[1], lengths[0], lengths[1])
        pooled = [pool_spans(hidden, a, z, how).float() for a, z in spans]
        return HeadInputs(*pooled)

    def order(self, scores: np.ndarray, decoder: str | None = None) -> np.ndarray:
        """Item indices best first, as the method decodes: assignment on a matrix, sorting on
        one score per item."""
        return self.method.order(scores, decoder or self.config.decoder)

    # -- inference ---------------------------------------------------------------------------

    def rank(
        self,
        query: str | Query | Slate,
        candidates: Sequence[Any] | None = None,
        top_n: int | None = None,
    ) -> Ranking:
        """Rank one slate, or a query and its candidates (texts, dicts or Candidates).

        The :class:`Ranking` holds ``indices``, the candidates' positions in the list given
        (ints, best first, as ``CrossEncoder.rank`` and ``/v1/rerank`` answer), ``docids``
        (for plain texts, those positions as strings), rank-derived ``scores`` and stage
        ``timings``; ``top_n`` keeps the best n (the whole slate is ranked either way).
        """
        ranking = self.rank_batch([_as_slate(query, candidates)])[0]
        return ranking if top_n is None else ranking.top(top_n)

    def score_batch(
        self,
        slates: Sequence[Slate],
        encoded: Sequence[EncodedPrompt] | None = None,
        batch: Batch | None = None,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Scores of slates from one padded prefill, and the milliseconds of each stage.

        Scores are [B, N, K] for SPD and [B, N] for the sorting peers (padded items are 0);
        stages are ``tokenize`` (encode and collate), ``prefill`` (the backbone's forward),
        ``readout`` (pooling its states for the head) and ``head`` (the head and copying its
        scores to the host). Kept apart from decoding so one forward pass can be
        decoded several ways (``spdrank bench``). ``batch``: the slates already collated, e.g.
        with cached states (then nothing is tokenized).
        """
        clock = StageClock([s for s in STAGES if s != "assign"])  # decoding comes later
        with self._evaluating():
            with clock.stage("tokenize"):
                batch = self._batch_of(slates, encoded, batch)
            with torch.inference_mode():
                scores = self.head_scores(batch, clock)
                with clock.stage("head"):
                    out = scores.cpu().numpy()
        return out, clock.ms

    def _batch_of(
        self,
        slates: Sequence[Slate],
        encoded: Sequence[EncodedPrompt] | None,
        batch: Batch | None,
    ) -> Batch:
        """The batch of ``slates`` on the model's device: ``batch`` as given, else collated
        from ``encoded``, else from the slates' prompts."""
        if batch is not None:
            return batch.to(self.device)
        if encoded is None:
            encoded = [self.encode(s) for s in slates]
        elif len(encoded) != len(slates):
            raise ValueError("encoded prompts must match the slates one to one")
        return self.collate(encoded)

    def rank_batch(
        self,
        slates: Sequence[Slate],
        decoder: str | None = None,
        encoded: Sequence[EncodedPrompt] | None = None,
        batch: Batch | None = None,
    ) -> list[Ranking]:
        """Rank slates in one padded prefill. Timings are the batch's, shared by its slates.

        For SPD, ``scores`` are rank-derived relevances in (0, 1], 1 for rank 1, strictly
        decreasing: the assignment fixes the order, and M's entries are not comparable across
        positions. The sorting peers report their own per-item scores. ``encoded`` passes
        prompts the caller already encoded (e.g. to read their truncation flags) so they are
        not tokenized twice; ``batch``, the slates already collated (see :meth:`score_batch`).
        """
        decoder = decoder or self.config.decoder
        scores, timings = self.score_batch(slates, encoded, batch)
        t0 = time.perf_counter()
        orders = self.method.orders(scores, [len(s) for s in slates], decoder)
        timings["assign"] = (time.perf_counter() - t0) * 1e3
        return [
            self.ranking(slate, order, scores[i], timings)
            for i, (slate, order) in enumerate(zip(slates, orders))
        ]

    def ranking(
        self,
        slate: Slate,
        order: np.ndarray,
        scores: np.ndarray,
        timings: dict[str, float] | None = None,
    ) -> Ranking:
        """The :class:`Ranking` of ``slate`` for an item ``order`` decoded from its ``scores``."""
        items = order.tolist()  # Python ints index a list faster than numpy's
        candidates = slate.candidates
        docids = [candidates[j].docid for j in items]
        ranked_scores = self.method.ranked_scores(scores, order)
        return Ranking(docids, ranked_scores, dict(timings or {}), 1, indices=items)

    def score_matrix(self, slate: Slate) -> np.ndarray:
        """The raw scores of one slate: n x K for SPD (for analysis and other decoders), n for
        peers; :meth:`score_batch`'s for a batch of that one slate."""
        scores, _ = self.score_batch([slate])
        return scores[0, : len(slate)]

    @contextmanager
    def _evaluating(self) -> Iterator[None]:
        """Run the body in eval mode (no dropout), then restore training mode if it was on.

        Switching modes walks every submodule, which costs more than the rest of the work
        around a small slate's prefill, so a model already in eval mode (it and its direct
        parts) is left as it is.
        """
        if not (self.training or any(m.training for m in self.children())):
            yield
            return
        was_training = self.training
        self.eval()
        try:
            yield
        finally:
            self.train(was_training)

    def synchronize(self) -> None:
        """Wait for queued GPU work, so a timer read next measures it (a no-op on CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- the Ranker protocol -----------------------------------------------------------------

    def fit(self, train: Any) -> None:
        """Trained by ``spdrank train``; nothing to fit at evaluation time."""


def checkpoint_dir(path: str | os.PathLike[str]) -> Path:
    """The checkpoint directory ``path`` names: a model directory, or a training run's (whose
    model is in ``OUT/model``); a FileNotFoundError when it is neither."""
    path = Path(path)
    if not (path / CONFIG_NAME).exists() and (path / "model" / CONFIG_NAME).exists():
        path = path / "model"
    if not (path / CONFIG_NAME).exists():
        raise FileNotFoundError(f"{path} is not an spdrank checkpoint: no {CONFIG_NAME}")
    return path


def read_config(path: Path) -> SPDConfig:
    """A checkpoint's ``config.json``; a ValueError naming ``path`` when it cannot be one.

    It is read only as a regular file of bounded size (:func:`spdrank.backbone.load.read_json`),
    and every size in it is checked before anything is built from it.
    """
    try:
        data = read_json(path)
    except ValueError as exc:
        raise ValueError(f"{path}: not a JSON checkpoint config "
                         f"({str(exc).removeprefix(f'{path}: ')})") from None
    try:
        return SPDConfig.from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except (AttributeError, KeyError, TypeError) as exc:  # AttributeError: not an object
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"{path}: not a usable spdrank checkpoint config ({what})") from None


def load_head(head: nn.Module, path: Path) -> None:
    """Load the head's weights from safetensors; a ValueError naming ``path`` when the file is
    unreadable (a truncated header) or does not fit the head the config describes."""
    tensors = read_tensors(path, "head")
    try:
        head.load_state_dict(tensors)
    except RuntimeError as exc:  # missing or unexpected keys, shapes that differ
        first = str(exc).strip().splitlines()
        reason = " ".join(line.strip() for line in first[:3])
        raise ValueError(f"{path}: the weights do not fit the head in config.json ({reason})") \
            from None


class Cuts:
    """Running counts of encoded candidates and queries, and of those cut to their budget."""

    def __init__(self) -> None:
        self.candidates = self.candidates_cut = self.queries = self.queries_cut = 0

    def add(self, encoded: EncodedPrompt) -> None:
        self.candidates += len(encoded.truncated)
        self.candidates_cut += sum(encoded.truncated)
        self.queries += 1
        self.queries_cut += bool(encoded.query_truncated)

    def summary(self, budget: int) -> str:
        """One line for a user: how much was cut, and by which budget."""
        return (
            f"cut to the token budget: {self.candidates_cut} of {self.candidates} candidates "
            f"(at {budget} tokens), {self.queries_cut} of {self.queries} queries"
        )


def context_length(backbone: nn.Module) -> int | None:
    """The backbone's positions (``max_position_embeddings``), or None when it names none."""
    value = getattr(getattr(backbone, "config", None), "max_position_embeddings", None)
    return value if isinstance(value, int) and value > 0 else None


def _backbone_and_tokenizer(
    config: SPDConfig,
    device: torch.device | str,
    adapter: Path | None = None,
    trust_remote_code: bool = False,
    cpu_bf16: bool = False,
) -> tuple[nn.Module, Any]:
    """The backbone (with its trained ``adapter``, if any) and tokenizer ``config`` names.

    A features-only model gets stand-ins for both, and nothing of the LLM is read from disk.
    ``cpu_bf16`` lets ``dtype: auto`` load it in bfloat16 on a CPU with native bfloat16 units
    (a checkpoint loaded to rank; a model built to train keeps float32 on a CPU).
    """
    if config.features_only:
        return NoBackbone(), NoTokenizer()
    backbone = load_backbone(
        config.backbone,
        device=device,
        adapter_path=adapter,
        with_lm_head=method_for(config.head.kind).reads_logits,
        trust_remote_code=trust_remote_code,
        cpu_bf16=cpu_bf16,
    )
    tokenizer = load_tokenizer(config.backbone.name_or_path, trust_remote_code)
    vocab = getattr(backbone.config, "vocab_size", None)
    if config.backbone.random_weights and vocab is not None and len(tokenizer) > vocab:
        # A config's shape meets a tokenizer chosen apart from it: ids past the embedding
        # table would fail deep inside the prefill.
        raise ValueError(
            f"{config.backbone.name_or_path}: vocab_size {vocab} is smaller than its "
            f"tokenizer's {len(tokenizer)} tokens"
        )
    return backbone, tokenizer
