"""Parse, judge and repair teacher answers: every status, the precedence, reasoning's last line."""

import random

import pytest

from spdrank.teacher.parse import (
    MISSING,
    OK,
    OUT_OF_RANGE,
    PRECEDENCE,
    REPETITION,
    STATUSES,
    WRONG_FORMAT,
    judge_ids,
    parse_response,
    repair,
)


@pytest.mark.parametrize(
    "text, n, status, issues, ids, perm",
    [
        ("[2] > [1] > [3]", 3, OK, [], [2, 1, 3], [1, 0, 2]),
        ("  Ranking: [2] > [1] > [3].\n", 3, OK, [], [2, 1, 3], [1, 0, 2]),
        ("**[2]>[1] >[3]**", 3, OK, [], [2, 1, 3], [1, 0, 2]),
        ("[1]", 1, OK, [], [1], [0]),
        # Not the format, but readable: bare numbers (rank_llm's fallback) and commas.
        ("2 > 1 > 3", 3, WRONG_FORMAT, [WRONG_FORMAT], [2, 1, 3], [1, 0, 2]),
        ("[2], [1], [3]", 3, WRONG_FORMAT, [WRONG_FORMAT], [2, 1, 3], [1, 0, 2]),
        ("[2] > [1] > [3]\nI ranked gel first.", 3, WRONG_FORMAT, [WRONG_FORMAT], [2, 1, 3], [1, 0, 2]),
        ("I cannot rank these.", 3, WRONG_FORMAT, [WRONG_FORMAT, MISSING], [], [0, 1, 2]),
        ("", 2, WRONG_FORMAT, [WRONG_FORMAT, MISSING], [], [0, 1]),
        ("[2] > [7] > [1] > [3] > [0]", 3, OUT_OF_RANGE, [OUT_OF_RANGE], [2, 7, 1, 3, 0], [1, 0, 2]),
        ("[2] > [2] > [1] > [3]", 3, REPETITION, [REPETITION], [2, 2, 1, 3], [1, 0, 2]),
        ("[3] > [1]", 4, MISSING, [MISSING], [3, 1], [2, 0, 1, 3]),
        # Several problems: the status is the first in PRECEDENCE, all are listed.
        ("[5] > [1] > [1]", 3, OUT_OF_RANGE, [OUT_OF_RANGE, REPETITION, MISSING], [5, 1, 1], [0, 1, 2]),
        ("[3] > [3]", 3, REPETITION, [REPETITION, MISSING], [3, 3], [2, 0, 1]),
        ("1, 1, 5", 3, WRONG_FORMAT, [WRONG_FORMAT, OUT_OF_RANGE, REPETITION, MISSING], [1, 1, 5], [0, 1, 2]),
        # A reasoning model's thoughts are not its answer, even in direct mode.
        ("<think>[1] > [2] > [3]</think>\n[3] > [2] > [1]", 3, OK, [], [3, 2, 1], [2, 1, 0]),
    ],
)
def test_direct_statuses_and_repair(text, n, status, issues, ids, perm):
    parsed = parse_response(text, n, "direct")
    assert (parsed.status, parsed.issues, parsed.ids, parsed.permutation) == (status, issues, ids, perm)


def test_precedence_is_documented_order():
    assert PRECEDENCE == (WRONG_FORMAT, OUT_OF_RANGE, REPETITION, MISSING)
    assert STATUSES[0] == OK and set(STATUSES) == {OK, *PRECEDENCE}


@pytest.mark.parametrize(
    "text, status, ids",
    [
        # The ranking is on the last line after free-form thinking that mentions ids.
        ("The user likes gel, so [3] fits.\n[1] is a brush.\n[3] > [1] > [2]", OK, [3, 1, 2]),
        # The LAST ranking line wins over an earlier draft...
        ("Draft: [1] > [2] > [3]\nOn reflection:\n[2] > [3] > [1]\n", OK, [2, 3, 1]),
        # ... and a chain beats a later line that only mentions an id.
        ("[2] > [3] > [1]\nSo [2] comes first.", OK, [2, 3, 1]),
        ("<think>[1] > [2] > [3]</think>\nFinal ranking: [3] > [2] > [1]", OK, [3, 2, 1]),
        ("thinking...\nFinal: [2] > [2] > [1]", REPETITION, [2, 2, 1]),
        ("thinking about 7 items\nmy answer is 3 1 2", WRONG_FORMAT, [3, 1, 2]),
        ("Let me think step by step about [2]", WRONG_FORMAT, [2]),
    ],
)
def test_reasoning_reads_last_ranking_line(text, status, ids):
    parsed = parse_response(text, 3, "reasoning")
    assert parsed.status == status and parsed.ids == ids
    assert sorted(parsed.permutation) == [0, 1, 2]


def test_direct_reads_whole_answer_not_last_line():
    parsed = parse_response("[2] > [3] >\n[1]", 3, "direct")
    assert parsed.status == OK and parsed.ids == [2, 3, 1]
    # Reasoning mode reads one line only: the last with a chain.
    reasoning = parse_response("[2] > [3] >\n[1]", 3, "reasoning")
    assert reasoning.ids == [2, 3] and reasoning.issues == [WRONG_FORMAT, MISSING]


def test_repair_always_gives_a_permutation():
    rng = random.Random(0)
    for _ in range(500):
        n = rng.randint(1, 12)
        ids = [rng.randint(-1, n + 2) for _ in range(rng.randint(0, 2 * n))]
        perm = repair(ids, n)
        assert sorted(perm) == list(range(n))
        valid = list(dict.fromkeys(i - 1 for i in ids if 1 <= i <= n))
        assert perm[: len(valid)] == valid  # given order first, then the rest in order
        assert perm[len(valid) :] == sorted(perm[len(valid) :])
        assert judge_ids(ids, n).permutation == perm


def test_judge_ids_without_text():
    assert judge_ids([2, 1], 2).status == OK
    assert judge_ids([0, 1, 2], 2).status == OUT_OF_RANGE  # 0 = a docid not in the slate
    assert judge_ids([1, 2], 2, well_formed=False).status == WRONG_FORMAT
