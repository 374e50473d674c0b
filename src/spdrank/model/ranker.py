"""SPDRanker: one prefill of a slate's prompt -> the readout -> a head -> scores -> an order.

Read top to bottom: the model's parts and their checks (``__init__``), building and loading
(``build``, ``from_pretrained``, ``save_pretrained``; the files are :mod:`.checkpoint`'s), the
forward pass (``encode`` -> ``collate`` -> ``read`` -> ``score``; how the backbone is read is
the model's reader, :mod:`spdrank.backbone.readout`, of the kind its ranking method declares),
and ranking (``rank``, ``rank_batch``: the method's decoding turns the scores into a valid
permutation and the scores its ranking reports, in one call). A call that cut texts to the
token budget says so to the code that made it (:class:`TruncationWarning`).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from spdrank.backbone.batching import Batch
from spdrank.backbone.load import context_length, resolve_device, resolve_dtype
from spdrank.backbone.prompt import (
    UNIT_READOUTS,
    Cuts,
    EncodedPrompt,
    PromptBuilder,
    fitted_item_tokens,
)
from spdrank.backbone.readout import HeadInputs, PromptReader, reader_for
from spdrank.backbone.words import WordSplitter
from spdrank.core.clock import StageClock, timed
from spdrank.core.defaults import DEFAULT_ITEM_TOKENS
from spdrank.core.ranking import STAGES, Ranking
from spdrank.core.slates import Query, Slate, SlateError, as_slate
from spdrank.core.validation import located
from spdrank.methods.anchor_spec import parse_anchor
from spdrank.methods.base import BatchDecoder, RankingMethod, method_for
from spdrank.model.checkpoint import (
    ADAPTER_DIR,
    CONFIG_NAME,
    HEAD_NAME,
    checkpoint_dir,
    load_head,
    load_weights,
    read_config,
    save_checkpoint,
)
from spdrank.model.config import SPDConfig
from spdrank.model.parts import backbone_and_tokenizer

log = logging.getLogger(__name__)

#: Items (over the whole batch) up to which the head runs on one CPU thread. Its matrices
#: are then [rows, width]-sized: each product takes tens of microseconds on one core, about
#: what a thread pool's fork and join cost, and a worker descheduled by another process on a
#: shared core stalls the whole product for a scheduler slice (milliseconds).
HEAD_SERIAL_ROWS = 512


class TruncationWarning(UserWarning):
    """A ranking call read some texts cut to the model's token budget: a cut text is read
    without its end, so the ranking is of other texts than those given."""


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


class SPDRanker(nn.Module):
    """The SPD student, or one of its single-pass peers on the same backbone and prompt.

    ``head.kind`` picks the ranking method (:mod:`spdrank.methods.base`), which builds the head and
    turns its scores into orders: ``attn``/``linear``/``history`` give SPD (an N x K
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
        #: Scores start from a ranker's order (the given one, or a feature's) and the head
        #: learns a correction to it, its output layers starting at zero; the anchor's
        #: strength is the head's (saved with it in head.safetensors).
        spec = parse_anchor(config.head.anchor)
        self.anchored = spec.anchored
        if self.anchored:
            from spdrank.methods.anchor import Anchor, zero_correction

            zero_correction(self.head)
            self.head.anchor = Anchor(self.method.matrix, spec,
                                      config.features.names if config.features else ())
        #: The head compares candidates with the user's history items (their own states).
        self.reads_history = config.head.kind in self.method.history_kinds
        if self.reads_history and not config.prompt.history_items:
            raise ValueError(
                f"head {config.head.kind!r} reads the history items' states: build the prompt "
                "with history_items=True (spdrank train sets it for this head, and so does "
                "spdrank.model.config.default_prompt)"
            )
        units = config.prompt.readout in UNIT_READOUTS
        if units and not self.reads_history:
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
        #: How the backbone reads a slate: the reader of the kind the method declares.
        self.reader: PromptReader = reader_for(
            self.method.reads, backbone=backbone, prompts=self.prompts,
            pad_id=tokenizer.pad_token_id, settings=config.prompt,
            text_fields=config.text_fields, words=self.words, history=self.reads_history,
            sync=self.synchronize,
        )
        #: The method's decoding of each decoder named so far (:meth:`decoding`).
        self._decodings: dict[str, BatchDecoder] = {}
        self.decoding()  # an unknown decoder fails here, not at the first ranking
        self.name = self.method.model_name(config.head.kind)

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
        backbone, tokenizer = backbone_and_tokenizer(config, device, None, trust_remote_code)
        if config.prompt.max_item_tokens is None and config.features_only:
            # No text is read: the budget is only recorded, and any number will do.
            config.prompt.max_item_tokens = DEFAULT_ITEM_TOKENS
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
        if isinstance(device, str):
            device = resolve_device(device)  # one this machine lacks, refused by name
        path = checkpoint_dir(path)
        config = read_config(path / CONFIG_NAME)
        if dtype is not None:
            resolve_dtype(dtype, device)  # an unknown name fails before any weight is read
            config.backbone.dtype = dtype
        adapter = path / ADAPTER_DIR if config.backbone.lora is not None else None
        model = cls(
            config, *backbone_and_tokenizer(config, device, adapter, trust_remote_code, True)
        )
        load_head(model.head, path / HEAD_NAME)
        model.to(device)
        model.eval()
        return model

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write the checkpoint (:func:`spdrank.model.checkpoint.save_checkpoint`)."""
        save_checkpoint(path, self.config, self.head, self.backbone)

    def load_weights(self, path: str | os.PathLike[str]) -> None:
        """Read into this model, in place, the trained weights of the checkpoint in ``path``,
        saved by a model of the same config (:func:`spdrank.model.checkpoint.load_weights`):
        how a resumed run takes back its model, whose parameters its optimizer holds."""
        load_weights(Path(path), self.head, self.backbone, self.config.backbone.lora)

    # -- the forward pass --------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(itertools.chain(self.parameters(), self.buffers())).device

    def encode(
        self, slate: Slate, features: np.ndarray | None = None, counted: bool = True
    ) -> EncodedPrompt:
        """The slate's prompt, and its candidates' normalised features when the model reads them:
        ``features`` when given (what :meth:`check` returned for this slate, taken as they
        are), else normalised here. ``counted``: the prompt is one the model reads, so what it
        cut goes into :attr:`cuts`; a prompt encoded only to be checked or digested is not.

        A candidate missing a feature the model reads is a :class:`SlateError` naming it.
        """
        self._check_size(slate)
        if features is None:
            features = self.slate_features(slate)
        if self.prompts is None:  # features only: no text is read
            n = len(slate)
            return EncodedPrompt([], item_first=[0] * n, item_last=[0] * n,
                                 truncated=[False] * n, features=features)
        encoded = self.reader.encode(slate)
        self.check_context(slate, encoded)
        if counted:
            self.cuts.add(encoded)
        encoded.features = features
        return encoded

    def check(
        self, slate: Slate, where: str | None = None, most: int | None = None
    ) -> np.ndarray | None:
        """Refuse a slate this model cannot rank, as a :class:`SlateError` naming ``where``
        (``file:line``) and the field to blame: more candidates than ``most`` (its K unless
        given: a longer slate is ranked only by windows), a feature missing, or one its
        normalisation cannot hold (``1.7e308`` overflows to infinity).

        ``spdrank rank`` and ``eval`` call it before ranking a line and the server before it
        queues a request, so errors name the line or the request, never a broken batch.
        Returns the slate's normalised features (None: the model reads none), the check's own
        work, which :meth:`encode` takes so that they are not normalised twice.
        """
        self._check_size(slate, where, most)
        with located(where):
            return self.slate_features(slate)

    def _check_size(
        self, slate: Slate, where: str | None = None, most: int | None = None
    ) -> None:
        """Refuse a slate of more than ``most`` candidates (default: K) in one pass."""
        most = int(self.config.head.positions) if most is None else most
        if len(slate) > most:
            raise SlateError(
                f"slate {slate.query.qid!r} has {len(slate)} candidates; this model ranks at "
                f"most {most} (its K) in one pass; --window {most} ranks a longer list by "
                "sliding windows",
                where,
                field="candidates",
            )

    def check_context(self, slate: Slate, encoded: EncodedPrompt) -> None:
        """Refuse a prompt longer than the backbone's positions, with its numbers: the backbone
        would read it wrongly or fail, and nothing may be cut silently to make it fit."""
        if self.context_length is None or encoded.longest <= self.context_length:
            return
        prompt = self.config.prompt
        fixed = self.prompts.template_tokens(len(slate)) if self.prompts is not None else 0
        if fixed * 2 >= self.context_length:
            raise SlateError(
                f"slate {slate.query.qid!r}: its prompt is {encoded.longest} tokens, more "
                f"than the backbone's {self.context_length} positions, and the prompt "
                f"template's own text is {fixed} of them: shorten its instruction (--prompt "
                "FILE); no token budget or window shrinks it"
            )
        raise SlateError(
            f"slate {slate.query.qid!r}: its prompt is {encoded.longest} tokens, more "
            f"than the backbone's {self.context_length} positions ({len(slate)} candidates at "
            f"up to {prompt.max_item_tokens} tokens each, a query of up to "
            f"{prompt.max_query_tokens}): rank it by sliding windows (--window), or train "
            "with a smaller --max-item-tokens"
        )

    def slate_features(self, slate: Slate) -> np.ndarray | None:
        """The slate's normalised features [n, F] when the model reads features, else None."""
        return self.features(slate) if self.features is not None else None

    def collate(self, encoded: Sequence[EncodedPrompt]) -> Batch:
        """Encoded slates padded into one batch on the model's device, as the reader lays
        them out."""
        batch = self.reader.collate(encoded)
        device = self.device
        return batch if device.type == "cpu" else batch.to(device)

    def forward(self, batch: Batch) -> torch.Tensor:
        """Score matrices [B, N, K] for a padded batch (padded rows are 0).

        Training calls this; :meth:`score_batch` and :meth:`score_matrix` reach the same
        :meth:`head_scores` with a clock, so every caller's scores come from the same prefill
        and head calls.
        """
        return self.head_scores(batch)

    def losses(
        self, scores: torch.Tensor, target: torch.Tensor, sizes: torch.Tensor, settings: Any
    ) -> torch.Tensor:
        """The [B] per-slate losses of a batch's ``scores`` (:meth:`forward`'s) against its
        [B, P, P] item-position ``target`` matrices, as the model's ranking method learns
        (:meth:`~spdrank.methods.base.RankingMethod.loss`), under a run's ``settings``."""
        return self.method.loss(scores, target, sizes, settings)

    def frozen_refusal(self) -> str | None:
        """Why this model has nothing to train with its backbone frozen (its head has no
        weights of its own); None when it has."""
        return self.method.frozen_refusal(self.config)

    def trainable_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """The head's parameters and the backbone's trainable ones (its LoRA adapters; none
        when it is frozen): what training optimises, each part at its own learning rate."""
        backbone = [p for p in self.backbone.parameters() if p.requires_grad]
        return list(self.head.parameters()), backbone

    def set_anchor_strength(self, strength: float) -> None:
        """Start an anchored model's prior at ``strength``
        (:meth:`~spdrank.methods.anchor.Anchor.set_strength`): how hard its head must pull
        to move an item from the anchor's order."""
        self.head.anchor.set_strength(strength)

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
        with timed(clock, "head", self.synchronize), _serial_if(serial, self.device):
            return self.score(inputs, batch)

    def start_as(self, anchor: str) -> None:
        """Rank exactly as ``anchor`` (a spec :func:`~spdrank.methods.anchor_spec.parse_anchor`
        reads: ``order``, ``feature:NAME``) from now on: the head's correction is zeroed and
        its scores anchored to that order, as an untrained anchored model starts. What
        training keeps when its student cannot beat the best ranker it reads."""
        from spdrank.methods.anchor import Anchor, zero_correction

        spec = parse_anchor(anchor)
        zero_correction(self.head)
        names = self.config.features.names if self.config.features else ()
        self.head.anchor = Anchor(self.method.matrix, spec, names).to(self.device)
        self.config.head.anchor = spec.text()
        self.anchored = True

    def score(self, inputs: HeadInputs, batch: Batch) -> torch.Tensor:
        """The head's scores from what :meth:`read` returned for ``batch`` (anchored to its
        anchor's order, when the model is)."""
        if self.reads_history:
            scores = self.head(
                inputs.items, batch.item_mask, batch.features, inputs.history,
                batch.history_mask, inputs.item_tokens, inputs.history_tokens,
            )
        else:
            scores = self.head(inputs.items, batch.item_mask, batch.features)
        if not self.anchored:
            return scores
        return self.head.anchor(scores, batch.item_mask, batch.features)

    def read(self, batch: Batch, clock: StageClock | None = None) -> HeadInputs:
        """What the head reads, as float32: the batch's cached states, or what the reader
        reads of its prefill (:mod:`.readers`: the candidates' states pooled as the prompt's
        ``readout`` says and, for a head that reads them, the history items'; FIRST: the LM's
        logits). Nothing without an LLM. ``clock``, when given, times the ``prefill`` and
        ``readout`` stages."""
        if self.config.features_only:
            return HeadInputs(None)
        cached = batch.cached
        if cached is not None:
            with timed(clock, "readout", self.synchronize):
                history = cached.history.float() if cached.history is not None else None
                return HeadInputs(cached.items.float(), history, cached.item_tokens,
                                  cached.history_tokens)
        return self.reader.read(batch, clock)

    def order(self, scores: np.ndarray, decoder: str | None = None) -> np.ndarray:
        """Item indices best first, as the method decodes: assignment on a matrix, sorting on
        one score per item."""
        return self.method.order(scores, decoder or self.config.decoder)

    def decoding(self, decoder: str | None = None) -> BatchDecoder:
        """The method's decoding (:meth:`~spdrank.methods.base.RankingMethod.decoding`) with
        ``decoder``, the model's own (``config.decoder``) unless named: where every decoder
        name given to a model is checked, an unknown one a ValueError listing those there
        are. Asked of the method once a name, so a ranking call hands it its scores once."""
        name = decoder or self.config.decoder
        decode = self._decodings.get(name)
        if decode is None:
            decode = self._decodings[name] = self.method.decoding(name)
        return decode

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
        Texts cut to the token budget are warned about, as :meth:`rank_batch` says.
        """
        ranking = self.rank_batch([as_slate(query, candidates, self.config.text_fields)])[0]
        return ranking if top_n is None else ranking.top(top_n)

    def score_batch(
        self,
        slates: Sequence[Slate],
        encoded: Sequence[EncodedPrompt] | None = None,
        batch: Batch | None = None,
        features: Sequence[np.ndarray | None] | None = None,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Scores of slates from one padded prefill, and the milliseconds of each stage.

        Scores are [B, N, K] for SPD and [B, N] for the sorting peers (padded items are 0);
        stages are ``tokenize`` (encode and collate), ``prefill`` (the backbone's forward),
        ``readout`` (pooling its states for the head) and ``head`` (the head and copying its
        scores to the host). Kept apart from decoding so one forward pass can be
        decoded several ways (``spdrank bench``). ``batch``: the slates already collated, e.g.
        with cached states (then nothing is tokenized); ``features``: each slate's normalised
        features as :meth:`check` returned them, for the prompts encoded here.
        """
        clock = StageClock([s for s in STAGES if s != "assign"])  # decoding comes later
        with self._evaluating():
            with clock.stage("tokenize"):
                batch = self._batch_of(slates, encoded, batch, features)
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
        features: Sequence[np.ndarray | None] | None = None,
    ) -> Batch:
        """The batch of ``slates`` on the model's device: ``batch`` as given, else collated
        from ``encoded``, else from the slates' prompts (with their checked ``features``)."""
        if batch is not None:
            return batch.to(self.device)
        if encoded is None:
            checked = features if features is not None else [None] * len(slates)
            if len(checked) != len(slates):
                raise ValueError("features must match the slates one to one")
            encoded = [self.encode(s, f) for s, f in zip(slates, checked)]
        elif len(encoded) != len(slates):
            raise ValueError("encoded prompts must match the slates one to one")
        return self.collate(encoded)

    def rank_batch(
        self,
        slates: Sequence[Slate],
        decoder: str | None = None,
        encoded: Sequence[EncodedPrompt] | None = None,
        batch: Batch | None = None,
        features: Sequence[np.ndarray | None] | None = None,
    ) -> list[Ranking]:
        """Rank slates in one padded prefill. Timings are the batch's, shared by its slates.

        ``scores`` are the method's, best first and never rising down the list: for SPD each
        item's relevance under the Sinkhorn-normalised matrix (1 - its expected position over
        n; M's own entries are not comparable across positions), held to a running minimum
        where the decoder's order differs from the expected one, so ties are possible; the
        sorting peers report their own per-item scores. ``encoded`` passes prompts the caller
        already encoded (e.g. to read their truncation flags) so they are not tokenized twice;
        ``batch``, the slates already collated, and ``features``, what :meth:`check` returned
        for each slate (see :meth:`score_batch`).

        Candidates (or user contexts) this call encodes and cuts to the token budget are
        warned about once, a :class:`TruncationWarning` to the code outside this module that
        made the call: what the CLI prints after a ranking, told to a notebook. Prompts passed
        ``encoded`` are the caller's to report (their flags are in hand), and spdrank's own
        callers report cuts their own way (the summary line of ``spdrank rank`` and ``eval``,
        the server's ``truncated_documents``), so neither is warned.
        """
        decode = self.decoding(decoder)
        if not slates:
            return []
        empty = next((s for s in slates if not len(s)), None)
        if empty is not None:
            raise SlateError(f"slate {empty.query.qid!r} has no candidates: nothing to rank",
                             field="candidates")
        cuts = self.cuts
        counted = (cuts.candidates, cuts.candidates_cut, cuts.queries, cuts.queries_cut)
        # encode -> collate -> read (prefill, readout) -> head, timed stage by stage
        scores, timings = self.score_batch(slates, encoded, batch, features)
        t0 = time.perf_counter()  # decode: each slate's order and the scores it reports
        decoded = decode(scores, [len(s) for s in slates])
        timings["assign"] = (time.perf_counter() - t0) * 1e3
        # What this call's own encoding cut: the counts' growth over the call.
        self._warn_cuts(*(now - then for now, then in zip(
            (cuts.candidates, cuts.candidates_cut, cuts.queries, cuts.queries_cut), counted)))
        return [
            _ranking(slate, order, ranked, timings)
            for slate, (order, ranked) in zip(slates, decoded)
        ]

    def _warn_cuts(self, candidates: int, cut: int, queries: int, queries_cut: int) -> None:
        """Warn the caller outside this module that ``cut`` of ``candidates`` (and
        ``queries_cut`` of ``queries`` user contexts) were cut to the token budget; nothing
        when none was, or when that caller is spdrank's own code, which reports cuts itself."""
        if not (cut or queries_cut):
            return
        # The first frame outside this module is the caller; its line is what is warned.
        frame, level = inspect.currentframe(), 1
        while frame is not None and frame.f_globals.get("__name__") == __name__:
            frame, level = frame.f_back, level + 1
        caller = frame.f_globals.get("__name__", "") if frame is not None else "spdrank"
        if caller == "spdrank" or caller.startswith("spdrank."):
            return
        prompt = self.config.prompt
        said = []
        if cut:
            said.append(f"{cut} of {candidates} candidates were cut to the token budget "
                        f"(config.prompt.max_item_tokens = {prompt.max_item_tokens} tokens "
                        "each) and ranked on the start of their text")
        if queries_cut:
            said.append(f"{queries_cut} of {queries} user contexts were cut to their last "
                        f"{prompt.max_query_tokens} tokens (config.prompt.max_query_tokens)")
        warnings.warn("; ".join(said) + " (the budgets were set when the model was trained; "
                      "model.cuts counts every call's)", TruncationWarning, stacklevel=level)

    def ranking(
        self,
        slate: Slate,
        order: np.ndarray,
        scores: np.ndarray,
        timings: dict[str, float] | None = None,
    ) -> Ranking:
        """The :class:`Ranking` of ``slate`` for an item ``order`` decoded from its ``scores``
        (one slate's, as ``spdrank bench`` decodes them one decoder at a time)."""
        return _ranking(slate, order, self.method.ranked_scores(scores, order), timings)

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


def _ranking(
    slate: Slate, order: np.ndarray, scores: list[float], timings: dict[str, float] | None
) -> Ranking:
    """The :class:`Ranking` of ``slate`` in item ``order``, reporting ``scores`` (best first)."""
    items = order.tolist()  # Python ints index a list faster than numpy's
    candidates = slate.candidates
    docids = [candidates[j].docid for j in items]
    return Ranking(docids, scores, dict(timings or {}), 1, indices=items)
