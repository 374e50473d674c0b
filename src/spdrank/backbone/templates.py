"""Prompt templates as data: every text of a prompt that differs by domain, one record each.

spdrank ranks in two domains that word their prompts differently. Recommendation shows a
user's history and asks which candidate item the user chooses next; search shows a query and
asks which passages are most relevant to it (RankGPT / rank_llm's listwise prompt). Everything
else (how the pieces are tokenized, the ``[i]`` labels, the answer format the parser reads) is
shared, so a template holds only texts: the student's instruction and headers, the listwise
teacher's system text and answer instruction, and what the likelihood teacher scores.

Two built-ins, ``recommendation`` (the texts spdrank has always used, so its prompts and token
ids are unchanged) and ``search``; a user's own template is a JSON file with the same fields
(:func:`load_template`). A template is recorded where its texts matter: in a checkpoint's
prompt settings and in the teacher's label records, so a model ranks with the template it was
trained on and a student is trained on labels made under its own template. Torch-free.

Placeholders are ``{name}`` (a literal brace is written ``{{`` or ``}}``); each field may use
only the names :data:`PLACEHOLDERS` lists for it.
"""

from __future__ import annotations

import string
import unicodedata
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from spdrank.core.defaults import MAX_TEMPLATE_BYTES
from spdrank.core.inputs import read_document
from spdrank.core.validation import SlateError, codepoint, loads

#: The likelihood teacher's kinds: ``item`` scores each candidate's text given the user
#: context, less its likelihood without it (log p(item | history) - log p(item)); ``query``
#: scores the query's text given each passage (log p(query | passage), as UPR does).
LIKELIHOOD_KINDS = ("item", "query")

#: The placeholders each text field may use. ``n``: the slate's number of candidates;
#: ``order``: the template's ``order`` phrase; ``query``: the query (user context) text, cut
#: to the query budget; ``passage``: one candidate's text (the ``query`` kind's scoring text,
#: where it is required).
PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    "name": (),
    "instruction": ("n",),
    "context_header": (),
    "candidates_header": ("n",),
    "system": (),
    "order": (),
    "answer": ("n", "order", "query"),
    "reasoning_answer": ("n", "order", "query"),
    "likelihood_system": (),
    "likelihood_ask": ("passage",),
    "likelihood_plain": ("passage",),
}
#: The likelihood teacher's scoring texts: ``{passage}`` only in the ``query`` kind, where
#: each must hold it once; the ``item`` kind's use no placeholder.
PASSAGE_FIELDS = ("likelihood_ask", "likelihood_plain")
#: The fields a template file may leave out, filled from its ``base`` built-in.
FILE_ONLY_FIELDS = ("base",)


@dataclass(frozen=True)
class PromptTemplate:
    """The texts of one prompt domain. The student's prompt body is::

        {instruction}\\n\\n{context_header}\\n<query>\\n\\n{candidates_header}
        [1] <candidate>
        ...

    which the listwise teacher shows its model too (after ``system``), followed by ``answer``
    (``reasoning_answer`` in reasoning mode).
    """

    #: How the template is named in checkpoints, label records and error messages.
    name: str
    #: The student's (and the listwise teacher's) instruction, the prompt's first line.
    instruction: str
    #: The line above the query (the user context).
    context_header: str
    #: The line above the numbered candidates.
    candidates_header: str
    #: The listwise teacher's system message ("" sends none).
    system: str
    #: How the teacher is asked to order the candidates, for ``{order}`` in the answers.
    order: str
    #: The listwise teacher's answer instruction, direct mode (the format is ``[i] > [j]``).
    answer: str
    #: The same in reasoning mode: think first, the ranking on the last line.
    reasoning_answer: str
    #: The likelihood teacher's kind (:data:`LIKELIHOOD_KINDS`).
    likelihood: str
    #: The likelihood teacher's system message ("" sends none).
    likelihood_system: str
    #: The likelihood teacher's user turn (with a chat template). ``item``: it follows the
    #: context header and the history (the neutral prompt holds it alone), and the item's
    #: text is the answer. ``query``: it holds ``{passage}``, and the query is the answer.
    likelihood_ask: str
    #: The same as plain text, for a model without a chat template; the scored text follows
    #: it after a space.
    likelihood_plain: str

    def __post_init__(self) -> None:
        where = f"prompt template {self.name!r}"
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise ValueError(f"{where}: field {f.name!r} must be a string")  # noqa: TRY004 - a file's bad input
        if not self.name.strip():
            raise ValueError("a prompt template needs a non-empty 'name'")
        if unseen := next((c for c in self.name if unicodedata.category(c) in ("Cc", "Cf")),
                          None):
            # The name is printed in messages and recorded in checkpoints and label records:
            # a NUL, a newline or a right-to-left override there breaks them or hides it.
            raise ValueError(f"{where}: its name holds a control or format character "
                             f"({codepoint(unseen)}); name it with visible characters")
        if self.likelihood not in LIKELIHOOD_KINDS:
            raise ValueError(
                f"{where}: field 'likelihood' must be one of {list(LIKELIHOOD_KINDS)}, "
                f"got {self.likelihood!r}"
            )
        for name, allowed in PLACEHOLDERS.items():
            if name in PASSAGE_FIELDS and self.likelihood != "query":
                allowed = ()  # the item kind scores the item, and holds no passage
            used = _placeholders(getattr(self, name), where, name)
            extra = sorted(set(used) - set(allowed))
            if extra:
                may = ", ".join(f"{{{a}}}" for a in allowed) or "none"
                raise ValueError(
                    f"{where}: field {name!r} uses {{{extra[0]}}}; the placeholders it may use: "
                    f"{may} (write {{{{ and }}}} for literal braces)"
                )
            needs_passage = self.likelihood == "query" and name in PASSAGE_FIELDS
            if needs_passage and used.count("passage") != 1:
                raise ValueError(
                    f"{where}: field {name!r} must hold {{passage}} exactly once "
                    "(the query kind scores the query given each passage)"
                )

    def render(self, field: str, **values: Any) -> str:
        """Field ``field`` with its placeholders filled (``order`` from the template)."""
        text: str = getattr(self, field)
        return text.format(**{"order": self.order, **values})

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "prompt template") -> PromptTemplate:
        """A template from its fields, as :meth:`to_dict` writes them (a checkpoint's, a label
        record's): every field present, none unknown."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: a prompt template must be a JSON object")  # noqa: TRY004
        names = [f.name for f in fields(cls)]
        unknown = [k for k in data if k not in names]
        if unknown:
            raise ValueError(f"{where}: unknown prompt template field {unknown[0]!r}; the "
                             f"fields are {', '.join(names)}")
        missing = [k for k in names if k not in data]
        if missing:
            raise ValueError(f"{where}: the prompt template lacks field {missing[0]!r}")
        try:
            return cls(**data)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def _placeholders(text: str, where: str, name: str) -> list[str]:
    """The placeholder names ``text`` uses, in order; a ValueError for a malformed one."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise ValueError(
            f"{where}: field {name!r} has a malformed placeholder ({exc}); write {{{{ and }}}} "
            "for literal braces"
        ) from None
    used = []
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if not field_name.isidentifier() or spec or conversion:
            raise ValueError(
                f"{where}: field {name!r} has placeholder {{{field_name}"
                f"{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: "
                "a placeholder is a bare name such as {n}"
            )
        used.append(field_name)
    return used


RECOMMENDATION = PromptTemplate(
    name="recommendation",
    instruction=(
        "Rank the candidate items by how likely the user is to choose each one next, "
        "given the user's history."
    ),
    context_header="User history:",
    candidates_header="Candidates ({n}):",
    system=(
        "You are an expert recommender system. Given a user's history, you rank candidate "
        "items by how likely the user is to choose each one next."
    ),
    order="most likely first",
    answer=(
        "Rank all {n} candidates, {order}. Answer only with the ranking, in the format "
        "[i] > [j] > ... using the candidate numbers, every number from 1 to {n} exactly once, "
        "and nothing else: no explanation."
    ),
    reasoning_answer=(
        "First think step by step about the user's preferences and each candidate. Then, on "
        "the last line, write the ranking of all {n} candidates, {order}, in the format "
        "[i] > [j] > ... using the candidate numbers, every number from 1 to {n} exactly once."
    ),
    likelihood="item",
    likelihood_system=(
        "You are an expert recommender system. Given a user's history, you name the item the "
        "user is most likely to choose next."
    ),
    likelihood_ask="Name the item the user will choose next.",
    likelihood_plain="The user will choose next:",
)

# RankGPT's listwise prompt as rank_llm words it (rank_zephyr_template.yaml): the passages
# announced with their count, the query repeated after them, identifiers in descending order.
SEARCH = PromptTemplate(
    name="search",
    instruction=(
        "I will provide you with {n} passages, each indicated by a numerical identifier []. "
        "Rank the passages based on their relevance to the search query."
    ),
    context_header="Query:",
    candidates_header="Passages ({n}):",
    system=(
        "You are RankLLM, an intelligent assistant that can rank passages based on their "
        "relevancy to the query."
    ),
    order="most relevant to the query first",
    answer=(
        "Search Query: {query}.\nRank the {n} passages above based on their relevance to the "
        "search query, {order}. All the passages should be included and listed using "
        "identifiers, in the format [i] > [j] > ..., every number from 1 to {n} exactly once. "
        "Only respond with the ranking results, do not say any word or explain."
    ),
    reasoning_answer=(
        "Search Query: {query}.\nFirst think step by step about what the search query asks for "
        "and what each passage says. Then, on the last line, write the ranking of all {n} "
        "passages, {order}, in the format [i] > [j] > ... using the passage numbers, every "
        "number from 1 to {n} exactly once."
    ),
    # UPR (Sachan et al. 2022): a passage is as relevant as it makes the query likely.
    likelihood="query",
    likelihood_system="",
    likelihood_ask="Passage: {passage}\nPlease write a question based on this passage.",
    likelihood_plain="Passage: {passage}\nPlease write a question based on this passage.\nQuestion:",
)

#: The built-in templates by name: what ``--prompt NAME`` picks.
BUILTINS: dict[str, PromptTemplate] = {t.name: t for t in (RECOMMENDATION, SEARCH)}
#: The template of every command and file that names none (and of everything written before
#: templates were recorded).
DEFAULT_TEMPLATE = RECOMMENDATION


def load_template(spec: str | PromptTemplate | None) -> PromptTemplate:
    """The template ``--prompt`` names: a built-in's name, or a JSON template file.

    A file holds the template's fields (:data:`PLACEHOLDERS` lists them with the placeholders
    each may use) and ``likelihood``; ``base`` (default ``recommendation``) names the built-in
    whose texts fill the fields the file leaves out, and ``name`` defaults to the file's stem.
    An unknown field, a placeholder a field may not use or a malformed one is an error naming
    the file and the field.
    """
    if spec is None:
        return DEFAULT_TEMPLATE
    if isinstance(spec, PromptTemplate):
        return spec
    if spec in BUILTINS:
        return BUILTINS[spec]
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(
            f"--prompt {spec!r}: neither a built-in template ({', '.join(BUILTINS)}) nor a "
            "template file"
        )
    return template_from_file_data(read_template_file(path), str(path), default_name=path.stem)


def read_template_file(path: Path) -> Any:
    """A template file's JSON, read bounded: at most :data:`~spdrank.core.defaults.MAX_TEMPLATE_BYTES`
    (a template is recorded in every checkpoint and label record made with it, and a
    checkpoint's config.json is refused past its own bound), from a regular file or a pipe."""
    data = read_document(path, "prompt template", MAX_TEMPLATE_BYTES)
    try:
        return loads(data)
    except SlateError as exc:
        raise ValueError(f"{path}: not a JSON prompt template ({exc})") from None


def template_from_file_data(data: Any, where: str, default_name: str) -> PromptTemplate:
    """A template file's object as a template (see :func:`load_template`)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: a prompt template must be a JSON object")  # noqa: TRY004
    names = [f.name for f in fields(PromptTemplate)]
    unknown = [k for k in data if k not in names and k not in FILE_ONLY_FIELDS]
    if unknown:
        raise ValueError(f"{where}: unknown prompt template field {unknown[0]!r}; the fields "
                         f"are {', '.join([*names, *FILE_ONLY_FIELDS])}")
    base_name = data.get("base", DEFAULT_TEMPLATE.name)
    if base_name not in BUILTINS:
        raise ValueError(f"{where}: field 'base' must name a built-in template "
                         f"({', '.join(BUILTINS)}), got {base_name!r}")
    texts = {k: v for k, v in data.items() if k not in FILE_ONLY_FIELDS}
    texts.setdefault("name", default_name)
    try:
        return replace(BUILTINS[base_name], **texts)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


#: Templates read from records, by their fields: a label file repeats one template in every
#: record, and checking it once per line would cost as much as reading the line.
_FROM_RECORDS: dict[tuple[tuple[str, Any], ...], PromptTemplate] = {}
_MAX_FROM_RECORDS = 64


def template_from_record(data: Any, where: str) -> PromptTemplate:
    """The template a checkpoint or a record stores (None or absent: the default), checked
    (:meth:`PromptTemplate.from_dict`) the first time its fields are seen."""
    if data is None:
        return DEFAULT_TEMPLATE
    try:
        key = tuple(data.items()) if isinstance(data, dict) else None
        known = _FROM_RECORDS.get(key) if key is not None else None
    except TypeError:  # an unhashable value: not a template, which from_dict says
        key = known = None
    if known is not None:
        return known
    template = PromptTemplate.from_dict(data, where)
    if key is not None and len(_FROM_RECORDS) < _MAX_FROM_RECORDS:
        _FROM_RECORDS[key] = template
    return template


def record_of(template: PromptTemplate) -> dict[str, str] | None:
    """What a checkpoint or label record stores of ``template``: nothing for the default, so
    what was written before templates existed and what is written with the default are the
    same bytes, and an absent record reads as the default."""
    return None if template == DEFAULT_TEMPLATE else template.to_dict()


def describe_difference(expected: PromptTemplate, given: PromptTemplate) -> str:
    """``expected`` named against ``given``, for an error: the names, or the first field
    whose text differs when the names are the same."""
    if expected.name != given.name:
        return f"{expected.name!r}, not {given.name!r}"
    field = next(f.name for f in fields(PromptTemplate)
                 if getattr(expected, f.name) != getattr(given, f.name))
    return f"{expected.name!r} with another {field!r} than the one given"


def check_model_template(trained: PromptTemplate, asked: str | PromptTemplate | None,
                         model: str) -> None:
    """Refuse ``--prompt`` naming another template than the one ``model`` was trained with:
    a model always ranks with the template it was trained on (None asks for nothing)."""
    if asked is None:
        return
    given = load_template(asked)
    if given != trained:
        raise ValueError(
            f"{model} was trained with the prompt template {describe_difference(trained, given)}: "
            "a model always ranks with the template it was trained on (drop --prompt)"
        )


#: ``--prompt``'s help where it picks the template (train, teacher).
PROMPT_HELP = (
    "the prompt template: recommendation (a user's history and candidate items; default), "
    "search (a query and passages, RankGPT-style; the likelihood teacher scores log p(query "
    "| passage)), or a JSON template file (docs/usage.md); recorded in the checkpoint and in "
    "the label records"
)
#: ``--prompt``'s help where a checkpoint's own template is used (rank, eval, serve).
MODEL_PROMPT_HELP = (
    "the prompt template the model must have been trained with (a name or a JSON file): a "
    "model always ranks with its own template, so another one is refused (default: the "
    "checkpoint's own)"
)


#: The slate field where the teacher's labelled slates record the template of their labels.
TEACHER_PROMPT_FIELD = "teacher_prompt"


def check_labels_template(extra: dict[str, Any], template: PromptTemplate, where: str) -> None:
    """Refuse training with ``template`` on labels a teacher made under another one.

    ``extra``: a labelled slate's extra fields (``teacher_prompt`` absent: the default
    template, which every label made before templates were recorded used).
    """
    labels = template_from_record(extra.get(TEACHER_PROMPT_FIELD), where)
    if labels != template:
        raise ValueError(
            f"{where}: the teacher labelled these slates with the prompt template "
            f"{describe_difference(labels, template)}: train with --prompt {labels.name} (or a "
            f"file holding it), or relabel them with `spdrank teacher --prompt {template.name}`"
        )
