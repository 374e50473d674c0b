"""The autoregressive listwise teacher, run once, offline, to label training slates.

SPD's student learns to reproduce a teacher LLM's permutations from one prefill; the teacher
itself is slow (tens to hundreds of decode passes per slate), so its rankings are computed
once and cached as JSONL. The pieces, one module each:

- :mod:`~spdrank.teacher.prompt`: the RankGPT-style chat prompt (direct or reasoning), built
  from the same item rendering as the student's prompt;
- :mod:`~spdrank.teacher.parse`: read ``[i] > [j] > ...`` from free text, give it a status and
  repair it into a full permutation (rank_llm's ``receive_permutation`` semantics);
- :mod:`~spdrank.teacher.backends` (``ranker:NAME``, ``file:PATH``), :mod:`~spdrank.teacher.hf`
  (local transformers) and :mod:`~spdrank.teacher.openai_api` (OpenAI-compatible servers, one
  or many: :mod:`~spdrank.teacher.servers` picks which one takes each request);
  :mod:`~spdrank.teacher.constrained` and :mod:`~spdrank.teacher.grammar` make their answers
  valid by construction; :mod:`~spdrank.teacher.likelihood` ranks by title likelihood instead
  of decoding;
- :mod:`~spdrank.teacher.labels`: the append-only, crash-safe label file;
- :mod:`~spdrank.teacher.query_writers`: the same models writing a query for a passage, the
  synthetic queries' writers (:mod:`spdrank.datasets.synthetic_queries`);
- :mod:`~spdrank.teacher.run`: the resumable labelling loop; :mod:`~spdrank.teacher.merge`
  joins shards.

Nothing here imports torch at module level: only the in-process backends (``hf``,
``likelihood``) need it.
"""

from spdrank.teacher.labels import LabelError, LabelStore, read_labels
from spdrank.teacher.merge import merge_labels
from spdrank.teacher.parse import PRECEDENCE, STATUSES, Parsed, judge_ids, parse_response
from spdrank.teacher.prompt import TeacherPromptSettings, build_messages
from spdrank.teacher.run import RunOptions, RunSummary, Shard, run_teacher

__all__ = [
    "PRECEDENCE",
    "STATUSES",
    "LabelError",
    "LabelStore",
    "Parsed",
    "RunOptions",
    "RunSummary",
    "Shard",
    "TeacherPromptSettings",
    "build_messages",
    "judge_ids",
    "merge_labels",
    "parse_response",
    "read_labels",
    "run_teacher",
]
