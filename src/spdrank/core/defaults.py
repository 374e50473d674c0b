"""The decoder and head kind each setting takes when none is named, each defined here once.

Several modules read these (the model config, the decoders, the training settings, the CLI's
help), and a default written twice drifts apart. Nothing here imports numpy, scipy or torch:
the CLI builds its flags from these without loading them.
"""

from __future__ import annotations

#: The decoder ``spdrank train`` saves with a checkpoint unless told another: expected rank
#: reads the whole Sinkhorn matrix rather than one assignment (the decoders compared:
#: benchmarks/results/quality-beauty-cpu; docs/architecture.md).
TRAIN_DECODER = "expected_rank"

#: The decoder where none is named: a model config without the ``decoder`` field (built in
#: code, or read from a checkpoint's config.json that lacks it: such a checkpoint ranks with
#: this one), and :func:`spdrank.methods.spd.decode.decode` called without a name. The exact assignment,
#: the paper's decoder.
UNNAMED_DECODER = "hungarian"

#: The head ``spdrank train`` fits unless told another: it reads the history items' states
#: too, the head that learned its teachers best.
TRAIN_HEAD = "history"

#: The head ``spdrank train --features-only`` fits unless told another: without a backbone
#: there are no history states for the history head to read.
FEATURES_ONLY_HEAD = "attn"

#: The head of a head config that names no kind.
UNNAMED_HEAD = "attn"

#: How the history head reads items unless told another: one state per word of each title,
#: matched with the history items' words as a soft TF-IDF cosine (the recipe that learned
#: its teachers best). The other heads read one state per item, its tokens' mean.
HISTORY_READOUT = "words"
#: The readout of prompt settings that name none (built in code, or a checkpoint's config
#: without the field): the last token of each item's text, the paper's readout.
UNNAMED_READOUT = "last"
OTHER_READOUT = "mean"
UNIT_MATCH = "tfidf"

#: The match of a head config that names none (built in code, or read from a checkpoint's
#: config.json saved before the field existed: such a checkpoint matches with this one).
UNNAMED_MATCH = "maxsim"

#: What a head may be anchored to (:mod:`spdrank.methods.anchor`): nothing, or the order its
#: candidates are given in (the first stage's, for search slates and rerank requests).
ANCHORS = ("none", "order")
#: The anchor of a head config that names none (built in code, or a checkpoint saved before
#: the field existed): such a model is not anchored.
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
