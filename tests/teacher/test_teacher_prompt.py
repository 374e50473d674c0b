"""The teacher's prompt: the student's item rendering, budgets, direct vs reasoning."""

import random

import pytest

from spdrank.backbone.prompt import PromptBuilder, PromptSettings, render_text
from spdrank.core.slates import Candidate, Query, Slate
from spdrank.teacher.prompt import (
    CHARS_PER_TOKEN,
    TeacherPromptSettings,
    build_messages,
    cut_head,
    cut_tail,
)
from tests.helpers import WORDS


def slate_of(titles, query="1. red lipstick\n2. soft brush"):
    return Slate(
        query=Query(qid="q", text=query),
        candidates=[Candidate(docid=f"d{i}", doc={"title": t}) for i, t in enumerate(titles)],
    )


@pytest.mark.parametrize("seed", range(5))
def test_render_text_is_what_the_student_tokenizes(tokenizer, seed):
    rng = random.Random(seed)
    budget = rng.choice([2, 4, 32])
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(rng.randint(1, 20))]
    query = "1. " + " ".join(rng.choices(WORDS, k=6))
    builder = PromptBuilder(
        tokenizer, PromptSettings(max_item_tokens=budget, use_chat_template=False)
    )
    enc = builder.encode(query, texts)
    body = enc.input_ids[len(builder._prefix) : len(enc.input_ids) - len(builder._suffix)]
    cut = [cut_head(t, budget, tokenizer) for t in texts]
    assert tokenizer.decode(body) == render_text(query, cut)


def test_messages_direct_and_reasoning_share_the_body(tokenizer):
    slate = slate_of(["green gel", "blue shampoo", "soft brush"])
    direct = build_messages(slate, TeacherPromptSettings(mode="direct"), tokenizer)
    reasoning = build_messages(slate, TeacherPromptSettings(mode="reasoning"), tokenizer)
    assert [m["role"] for m in direct] == ["system", "user"] == [m["role"] for m in reasoning]
    body = render_text(slate.query.text, ["green gel", "blue shampoo", "soft brush"])
    assert direct[1]["content"].startswith(body) and reasoning[1]["content"].startswith(body)
    assert "\n[1] green gel\n[2] blue shampoo\n[3] soft brush\n" in body
    assert "Candidates (3):" in body and "User history:\n1. red lipstick" in body
    d, r = direct[1]["content"][len(body) :], reasoning[1]["content"][len(body) :]
    assert "[i] > [j] > ..." in d and "[i] > [j] > ..." in r
    assert "Answer only with the ranking" in d and "think" not in d
    assert "think step by step" in r and "last line" in r
    assert "from 1 to 3" in d and "from 1 to 3" in r


def test_titles_cut_to_token_budget_with_tokenizer(tokenizer):
    long = " ".join(WORDS * 20)
    settings = TeacherPromptSettings(max_item_tokens=4)
    content = build_messages(slate_of([long, "gel"]), settings, tokenizer)[1]["content"]
    line = next(x for x in content.splitlines() if x.startswith("[1] "))
    shown = line[len("[1] ") :]
    assert long.startswith(shown) and len(tokenizer(shown, add_special_tokens=False)["input_ids"]) == 4
    student = PromptBuilder(tokenizer, PromptSettings(max_item_tokens=4)).item_tokens(long)
    assert tokenizer.decode(student) == shown
    assert "[2] gel" in content


def test_titles_cut_to_character_budget_without_tokenizer():
    long = "x" * 10_000
    settings = TeacherPromptSettings(max_item_tokens=8, max_query_tokens=4)
    content = build_messages(slate_of([long], query="old " * 50 + "newest"), settings)[1]["content"]
    assert f"[1] {'x' * 8 * CHARS_PER_TOKEN}\n" in content and "x" * (8 * CHARS_PER_TOKEN + 1) not in content
    # The user context keeps its END: the most recent history.
    assert "newest" in content and content.count("old") < 50


def test_query_keeps_its_end_with_tokenizer(tokenizer):
    query = " ".join(f"item{i}" for i in range(200))
    kept = cut_tail(query, 10, tokenizer)
    assert query.endswith(kept) and "item199" in kept and "item0 " not in kept


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode"):
        TeacherPromptSettings(mode="chatty")
