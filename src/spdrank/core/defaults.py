"""The decoder and head kind each setting takes when none is named, each defined here once.

Several modules read these (the model config, the decoders, the training settings, the CLI's
help), and a default written twice drifts apart. Nothing here imports numpy, scipy or torch:
the CLI builds its flags from these without loading them.
"""

from __future__ import annotations

# The default model: what ``spdrank train`` fits with no flags and what ``SPDConfig()``
# builds in Python (:class:`spdrank.model.config.SPDConfig`), one set of settings for both.

#: The decoder a model ranks with unless told another: expected rank reads the whole
#: Sinkhorn matrix rather than one assignment (the decoders compared:
#: benchmarks/results/quality-beauty-cpu; docs/architecture.md).
TRAIN_DECODER = "expected_rank"

#: The head a model has unless told another: it reads the history items' states too, the
#: head that learned its teachers best.
TRAIN_HEAD = "history"

#: The head ``spdrank train --features-only`` fits unless told another: without a backbone
#: there are no history states for the history head to read.
FEATURES_ONLY_HEAD = "attn"

#: How the history head reads items unless told another: one state per word of each title,
#: matched with the history items' words as a soft TF-IDF cosine (the recipe that learned
#: its teachers best). The other heads read one state per item, its tokens' mean.
HISTORY_READOUT = "words"
OTHER_READOUT = "mean"
UNIT_MATCH = "tfidf"

# The paper's configuration (``SPDConfig.paper()``; ``spdrank train --head attn --readout
# last --decoder hungarian``): self-attention over the items, each read at its last token,
# decoded by the exact assignment.

PAPER_HEAD = "attn"
#: The last token of each item's text; also the readout of prompt settings that name none
#: (:class:`spdrank.backbone.prompt.PromptSettings`, the record every prompt is built from,
#: teachers' included).
PAPER_READOUT = "last"
#: The exact assignment; also what :func:`spdrank.methods.spd.decode.decode` uses when
#: called without a decoder's name.
PAPER_DECODER = "hungarian"

#: What a head may be anchored to (:mod:`spdrank.methods.anchor`): nothing, or the order its
#: candidates are given in (the first stage's, for search slates and rerank requests).
ANCHORS = ("none", "order")
#: The anchor of a head config that names none: such a model is not anchored (``spdrank
#: train``'s too, for recommendation slates; :meth:`spdrank.training.config.TrainConfig.head_anchor`).
UNNAMED_ANCHOR = "none"

#: The recommendation template's per-candidate token budget: titles are short, and a student
#: can only match the words the prompt keeps (docs/architecture.md, "The token budget").
DEFAULT_ITEM_TOKENS = 32

#: The learning-rate warm-up when ``--warmup-steps`` is not given, in steps...
DEFAULT_WARMUP = 20
#: ...or this share of a run too short for it.
DEFAULT_WARMUP_SHARE = 0.1

#: The slate sizes N at which ``spdrank bench --latency`` decomposes a model's latency.
LATENCY_SIZES = (20, 50, 150)

#: The most random subsets ``spdrank data windows --subsets`` cuts from one slate: each is a
#: training slate of the same query, so more would let one query outweigh the rest of a
#: training file, and the subsets drawn are remembered (to draw none twice) in memory.
MAX_SUBSETS = 10_000

#: The most bytes the ``openai`` teacher reads for one request (headers and body): a ranking,
#: even reasoned at length, is a small fraction of it, and a server that keeps sending is cut
#: here rather than by ``--timeout``, with the memory that much text would hold.
MAX_ANSWER_BYTES = 8 * 2**20

#: The longest line, in bytes with its newline, that spdrank reads from any line-based input
#: (slates, labels, runs, qrels, topics, corpora, logs): a slate of a thousand long passages
#: fits many times over, and a file without newlines fails after this much, not after memory.
MAX_LINE_BYTES = 64 << 20
#: The most bytes spdrank reads from one input file, decompressed: MS MARCO v2's passages
#: fit in one file, and a pipe that never ends stops here.
MAX_INPUT_BYTES = 256 << 30
#: The most bytes of an input read whole as one JSON document (a qrels object, a
#: retrieve-results list), which memory holds at several times its size while parsed; a
#: larger one is written as JSONL, which is streamed.
MAX_DOCUMENT_BYTES = 1 << 30
#: The most bytes of a settings file read whole (a checkpoint's config.json, a backbone's
#: settings JSON), which a checkpoint is refused past.
MAX_SETTINGS_BYTES = 1 << 20
#: The most bytes of a ``--prompt`` template file. The template is recorded in the
#: checkpoint's config.json, read under :data:`MAX_SETTINGS_BYTES`, its instruction twice (the
#: prompt's and its template's) and its non-ASCII text up to three times longer as JSON escapes;
#: an eighth of that bound leaves room for both and the config's other fields, so a model
#: trained with a template can always be loaded.
MAX_TEMPLATE_BYTES = MAX_SETTINGS_BYTES // 8

#: The longest a backbone's chat template may take to render once, in CPU seconds of the
#: child that renders it: a real one takes milliseconds, and one that loops for ever (it comes
#: with the backbone's files, as data) is stopped here (:mod:`spdrank.backbone.chat`).
CHAT_TEMPLATE_SECONDS = 10.0

#: The wall-clock time the child that renders a chat template is given to start, on top of
#: :data:`CHAT_TEMPLATE_SECONDS`, before it is killed: it starts in a tenth of a second on an
#: idle machine, and many times that where the cores are shared.
CHAT_TEMPLATE_START_SECONDS = 5.0

#: The most address space a chat template's render may take beyond the interpreter that runs
#: it: a render holds at most :data:`CHAT_TEMPLATE_CHARS` characters (4 MiB as Python stores
#: them at the widest), so this leaves room for many such values and stops one built of many
#: small ones (a list of lists) long before it holds the machine's memory.
CHAT_TEMPLATE_MEMORY = 512 << 20

#: The most characters a chat template's render, and any string or list it builds on the way,
#: may hold: a real render around one message is a few hundred, and one that multiplies
#: (``'a' * 1000000000``, a string doubled in a loop) is refused before it allocates
#: (:mod:`spdrank.backbone.chat`).
CHAT_TEMPLATE_CHARS = 1 << 20
