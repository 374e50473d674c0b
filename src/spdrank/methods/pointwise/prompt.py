"""One sequence a candidate: the user context, then that candidate alone.

A pointwise reranker (monoT5, RankLLaMA, a cross-encoder) reads each candidate in its own
sequence with the query, so a candidate's state depends on the context and on itself, never on
the other candidates. Each sequence here is the single-candidate prompt of the model's own
:class:`~spdrank.backbone.prompt.PromptBuilder` (the same template, instruction, history and
``[1]`` marker, the same token budgets and the same guarantees about special tokens), cut
right after the candidate's last token: under causal attention nothing after that token can
move its state, so the chat template's closing tokens would be computed for nothing.

A slate's sequences travel as one :class:`CandidatePrompts`, an
:class:`~spdrank.backbone.prompt.EncodedPrompt` whose ``input_ids`` are the sequences one
after another: its length is the tokens the backbone processes for the slate, which is what
the code that counts a prompt's tokens reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from spdrank.backbone.prompt import EncodedPrompt, PromptBuilder


@dataclass
class CandidatePrompts(EncodedPrompt):
    """A slate as one sequence a candidate.

    ``input_ids`` holds the sequences back to back, ``lengths`` their lengths; ``item_first``
    and ``item_last`` index into each candidate's *own* sequence (its text's first and last
    tokens; the last is its sequence's last token); ``context_end`` is where the user context
    ends in every sequence (they all start with the same tokens up to there).
    """

    lengths: list[int] = field(default_factory=list)

    def sequences(self) -> list[list[int]]:
        """Each candidate's token ids, in the slate's order."""
        out, start = [], 0
        for length in self.lengths:
            out.append(self.input_ids[start : start + length])
            start += length
        return out

    @property
    def longest(self) -> int:
        """The longest sequence the backbone reads: what must fit its positions."""
        return max(self.lengths, default=0)


def encode_candidates(
    builder: PromptBuilder, query_text: str, candidate_texts: Sequence[str]
) -> CandidatePrompts:
    """The slate's candidates, each in its own single-candidate prompt with ``query_text``.

    The builder caches the query's and the items' token ids, so the context is tokenized once
    a slate however many candidates share it.
    """
    ids: list[int] = []
    lengths: list[int] = []
    item_first: list[int] = []
    item_last: list[int] = []
    truncated: list[bool] = []
    query_truncated = False
    context_end = 0
    for text in candidate_texts:
        one = builder.encode(query_text, [text])
        end = one.item_last[0] + 1
        ids += one.input_ids[:end]
        lengths.append(end)
        item_first.append(one.item_first[0])
        item_last.append(end - 1)
        truncated.append(one.truncated[0])
        query_truncated = one.query_truncated
        context_end = one.context_end
    return CandidatePrompts(
        ids, item_first=item_first, item_last=item_last, truncated=truncated,
        query_truncated=query_truncated, context_end=context_end, lengths=lengths,
    )
