"""The settings of one training run, importable without torch (the CLI builds its flags from it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spdrank.core.defaults import (
    DEFAULT_ITEM_TOKENS,
    FEATURES_ONLY_HEAD,
    HISTORY_READOUT,
    OTHER_READOUT,
    TRAIN_DECODER,
    TRAIN_HEAD,
    UNIT_MATCH,
)
from spdrank.training.targets import TARGETS

if TYPE_CHECKING:
    from spdrank.backbone.load import LoraSettings
    from spdrank.backbone.templates import PromptTemplate
    from spdrank.core.features import FeatureNormalizer
    from spdrank.model.ranker import SPDConfig


#: How --cache-states may store states.
CACHE_DTYPES = ("float16", "float32")


@dataclass
class TrainConfig:
    """The settings of one training run: one flat record, one field per ``spdrank train`` flag.

    It is flat, as Hugging Face's ``TrainingArguments`` is, because three readers need one
    field per setting: ``spdrank train`` generates a flag from each field
    (:mod:`spdrank.commands.train`), a run saves them as one flat record (``config`` in
    ``train.json`` and in the resumable state, which a rerun compares to resume), and
    ``benchmarks/retrain_command.py`` rebuilds a run from that record. The nested settings of
    the model it trains (backbone, head, prompt, features) are built from these by
    :meth:`model_config`.

    It holds settings and reads nothing but the ``--prompt`` template's file, when it names
    one: the feature normalisation fitted on the training slates is given to
    :meth:`model_config` by the trainer, and :meth:`check` refuses settings that cannot train,
    once, when a run starts.
    """

    # -- data ------------------------------------------------------------------------------
    slates: str
    out: str
    eval_slates: str | None = None
    #: The teacher's permutations: SPD distils a teacher (``spdrank teacher`` labels slates).
    target: str = "teacher"
    #: With a clicks target, refuse a file holding a slate without a clicked item (by
    #: default such slates, impressions nobody clicked, are left out and counted).
    require_clicks: bool = False

    # -- ranking method, backbone & LoRA ---------------------------------------------------
    #: None: :data:`~spdrank.core.defaults.TRAIN_HEAD`, or with --features-only
    #: :data:`~spdrank.core.defaults.FEATURES_ONLY_HEAD`.
    head: str | None = None
    frozen: bool = False
    backbone: str = "bundled"
    layers: int | None = None
    lora_r: int = 64
    lora_alpha: int = 64
    #: The modules LoRA adapts: "all-linear" (the paper) or comma-separated module names
    #: (``q_proj,v_proj``: the original LoRA's attention-only choice).
    lora_modules: str = "all-linear"

    # -- head ------------------------------------------------------------------------------
    positions: int = 64
    head_width: int = 256
    head_layers: int = 2
    head_dropout: float = 0.1

    # -- prompt & readout ------------------------------------------------------------------
    #: The prompt template: a built-in's name (recommendation, search) or a JSON template
    #: file (:func:`spdrank.backbone.templates.load_template`); the checkpoint holds its texts.
    prompt: str = "recommendation"
    #: None: the template's budget (recommendation: 32 tokens, titles), or for a template
    #: without one (search) what lets K candidates fit the backbone's context, computed when
    #: the model is built (:func:`spdrank.backbone.prompt.fitted_item_tokens`) and saved as a number.
    max_item_tokens: int | None = None
    max_query_tokens: int = 512
    #: How an item's token states reach the head: "words" (one mean per word of its text),
    #: "mean" (over the item's tokens), "last" (the paper's last token) or "tokens" (every
    #: one). None: "words" for the history head, which matches them with the history items'
    #: words (the recipe that learned its teachers best), "mean" for the others.
    readout: str | None = None
    #: How the history head compares a candidate's words or tokens with a history item's:
    #: "tfidf" or "maxsim" (see :class:`spdrank.methods.heads.HeadConfig`).
    match: str = UNIT_MATCH

    # -- features & warm start -------------------------------------------------------------
    #: Upstream features the head reads, comma-separated (``score,popularity``); None: none.
    features: str | None = None
    #: Read the features alone, without the backbone (no prefill): what the LLM adds is the
    #: difference to a run with the same features and the backbone.
    features_only: bool = False
    #: A trained checkpoint to start from (:mod:`spdrank.training.warm_start`): e.g. a student
    #: distilled from a teacher, fine-tuned on clicks with features added.
    init_from: str | None = None

    # -- state cache -----------------------------------------------------------------------
    #: With --frozen: a directory where the backbone's readout states of the training (and
    #: eval) slates are computed once and read back at every step (:mod:`spdrank.training.state_cache`).
    cache_states: str | None = None
    #: How cached states are stored: float16 (half the disk) or float32.
    cache_dtype: str = "float16"
    #: Slates per prefill while the cache is built.
    cache_batch_size: int = 8

    # -- steps & optimisation --------------------------------------------------------------
    limit: int | None = None
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 1
    lr: float = 2e-4
    head_lr: float = 1e-3
    weight_decay: float = 0.0
    #: Learning-rate warm-up steps; None: 20, or a tenth of a run too short for 20.
    warmup_steps: int | None = None
    max_grad_norm: float = 1.0

    # -- loss & decoder --------------------------------------------------------------------
    tau: float = 1.0
    sinkhorn_iters: int = 20
    #: How the permutation cross-entropy weighs target positions (``uniform``: the paper).
    position_weights: str = "uniform"
    #: The checkpoint's decoder: what evaluation during training, rank, eval and serve use.
    decoder: str = TRAIN_DECODER

    # -- evaluation, checkpoints & seed ----------------------------------------------------
    eval_every: int = 200
    eval_limit: int = 100
    save_every: int = 100
    seed: int = 0

    # -- runtime ---------------------------------------------------------------------------
    device: str = "auto"
    dtype: str = "auto"
    #: Stop this run after this many steps (the state is kept; rerun to continue).
    stop_after: int | None = None
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.head is None:
            self.head = FEATURES_ONLY_HEAD if self.features_only else TRAIN_HEAD
        if self.readout is None:
            self.readout = HISTORY_READOUT if self.head == "history" else OTHER_READOUT

    def check(self, processes: int = 1) -> None:
        """Refuse settings that cannot train, before anything is loaded or written; a run on
        ``processes`` processes calls it once, as it starts (and ``spdrank train
        --num-processes`` before launching them).

        The checks live here rather than in ``__post_init__`` because a TrainConfig is also
        rebuilt from a run's saved ``train.json`` (``benchmarks/retrain_command.py``, the
        tests): a record must load even when a later version refuses one of its settings, so
        that the refusal is reported by the run that uses it. The checks that need the data
        or the model (a slate larger than ``positions``, a frozen head with nothing to train)
        are the trainer's.
        """
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.batch_size % processes:
            raise ValueError(
                f"--batch-size {self.batch_size} does not split evenly over {processes} "
                f"processes: use a multiple of {processes} (each process takes batch-size / "
                "processes slates)"
            )
        if self.cache_states and processes > 1:
            raise ValueError("--cache-states trains in one process: a step from cached states "
                             "runs no prefill, so there is little to spread over processes; "
                             "drop --num-processes")
        if self.target not in TARGETS:
            raise ValueError(f"unknown --target {self.target!r}: choose one of {list(TARGETS)}")
        self._check_cache_settings()
        self.template()  # an unknown name or a bad template file, before anything loads
        if self.trains_lora:
            self.lora_settings()  # raises when --lora-modules names no module

    def template(self) -> PromptTemplate:
        """The ``--prompt`` template (its file read now)."""
        from spdrank.backbone.templates import load_template

        return load_template(self.prompt)

    @property
    def trains_lora(self) -> bool:
        """Whether LoRA adapters train: nothing of a backbone that is frozen, or never loaded
        (--features-only), is trained."""
        return not (self.frozen or self.features_only)

    def item_tokens(self) -> int | None:
        """The per-candidate budget: the flag's, else the template's (None: fit the context)."""
        if self.max_item_tokens is not None:
            return self.max_item_tokens
        return DEFAULT_ITEM_TOKENS if self.template().name == "recommendation" else None

    def model_config(self, features: FeatureNormalizer | None = None) -> SPDConfig:
        """The model these settings train; ``features``: the ``--features`` normalisation,
        fitted on the training slates (:func:`spdrank.training.train.fit_feature_normalizer`)."""
        from spdrank.backbone.load import BackboneConfig
        from spdrank.backbone.prompt import UNIT_READOUTS, PromptSettings
        from spdrank.methods.base import method_for
        from spdrank.methods.heads import HeadConfig
        from spdrank.model.ranker import SPDConfig

        method = method_for(self.head)
        prompt = method.prompt(PromptSettings(
            template=self.template(),
            max_item_tokens=self.item_tokens(),
            max_query_tokens=self.max_query_tokens,
            readout=self.readout,
            # The history head reads each history item's states: the prompt must span them.
            history_items=self.head == "history",
        ))
        positions = method.positions(self.positions)
        return SPDConfig(
            backbone=BackboneConfig(
                name_or_path=self.backbone,
                layers=self.layers,
                dtype=self.dtype,
                lora=self.lora_settings() if self.trains_lora else None,
            ),
            head=HeadConfig(
                kind=self.head,
                positions=positions,
                width=self.head_width,
                layers=self.head_layers,
                dropout=self.head_dropout,
                tokens=self.readout in UNIT_READOUTS,
                match=self.match,
            ),
            prompt=prompt,
            features=features,
            features_only=self.features_only,
            decoder=self.decoder,
        )

    def lora_settings(self) -> LoraSettings:
        """--lora-r, --lora-alpha and --lora-modules as the backbone's LoRA settings."""
        from spdrank.backbone.load import LoraSettings

        modules = [m.strip() for m in self.lora_modules.split(",") if m.strip()]
        if not modules:
            raise ValueError("--lora-modules is empty: use all-linear or module names, "
                             "e.g. q_proj,v_proj")
        return LoraSettings(
            r=self.lora_r,
            alpha=self.lora_alpha,
            target_modules="all-linear" if modules == ["all-linear"] else modules,
        )

    def _check_cache_settings(self) -> None:
        """Cached states stand for a prefill only when the prefill never changes."""
        from spdrank.methods.base import method_for

        if self.cache_states is None:
            return
        if self.features_only:
            raise ValueError("--features-only runs no backbone, so it has no states to cache: "
                             "drop --cache-states")
        refusal = method_for(self.head).cache_refusal
        if refusal is not None:
            raise ValueError(refusal)
        if not self.frozen:
            raise ValueError("--cache-states needs --frozen: LoRA changes the backbone's states "
                             "at every step, so cached ones would be stale")
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(
                f"unknown --cache-dtype {self.cache_dtype!r}: use one of {list(CACHE_DTYPES)}"
            )
        if self.cache_batch_size < 1:
            raise ValueError(f"--cache-batch-size must be at least 1, got {self.cache_batch_size}")
