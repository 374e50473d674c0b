"""Constrained decoding with the real SmolLM2 tokenizer (no model): every walk under the mask
is a full permutation; and the servers' grammar and regex accept the format and nothing else."""

import random
import re

import pytest
import torch

from spdrank.teacher.constrained import (
    PermutationLogitsProcessor,
    PermutationState,
    build_pieces,
)
from spdrank.teacher.grammar import gbnf, guided_body, permutation_regex
from spdrank.teacher.parse import OK, parse_response, render_ids

SIZES = [1, 2, 9, 10, 11, 50]


pytestmark = pytest.mark.usefixtures("one_torch_thread")
EOS = 2  # SmolLM2's <|im_end|>


def walk(tokenizer, n: int, pick) -> list[int]:
    """Tokens emitted by following the state machine, ``pick`` choosing among the allowed."""
    state = PermutationState(build_pieces(tokenizer, n), frozenset({EOS}))
    tokens: list[int] = []
    while not state.done:
        token = pick(state.allowed())
        state.advance(token)
        tokens.append(token)
        assert len(tokens) <= state.pieces.max_tokens()
    return tokens


def check_answer(tokenizer, tokens: list[int], n: int) -> list[int]:
    assert tokens[-1] == EOS and EOS not in tokens[:-1]
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    parsed = parse_response(text, n)
    assert parsed.status == OK, text
    assert sorted(parsed.ids) == list(range(1, n + 1))
    return parsed.ids


@pytest.mark.parametrize("n", SIZES)
def test_random_walks_are_permutations(tokenizer, n):
    rng = random.Random(n)
    orders = set()
    for _ in range(20):
        ids = check_answer(tokenizer, walk(tokenizer, n, rng.choice), n)
        orders.add(tuple(ids))
    assert len(orders) > 1 or n == 1  # the mask leaves every order open


@pytest.mark.parametrize("n", SIZES)
def test_greedy_walks_pick_the_lowest_and_highest_tokens(tokenizer, n):
    for pick in (min, max):
        check_answer(tokenizer, walk(tokenizer, n, pick), n)


def test_decode_passes_are_the_pieces_tokens_plus_end(tokenizer):
    pieces = build_pieces(tokenizer, 12)
    tokens = walk(tokenizer, 12, min)
    ids = parse_response(tokenizer.decode(tokens, skip_special_tokens=True), 12).ids
    expected = len(pieces.first[ids[0] - 1]) + sum(len(pieces.later[i - 1]) for i in ids[1:]) + 1
    assert len(tokens) == expected
    # "[i]" is "[", digits, "]" with this tokenizer: numbers of several tokens are handled.
    assert len(pieces.first[11]) == 4 and len(pieces.first[0]) == 3


def test_a_disallowed_token_is_an_error(tokenizer):
    state = PermutationState(build_pieces(tokenizer, 3), frozenset({EOS}))
    with pytest.raises(ValueError, match="continues no valid answer"):
        state.advance(EOS)
    for token in tokenizer("[2]", add_special_tokens=False)["input_ids"]:
        state.advance(token)
    assert state.named == [1]
    second = tokenizer(" > [2]", add_special_tokens=False)["input_ids"]
    state.advance(second[0])
    state.advance(second[1])
    with pytest.raises(ValueError):  # [2] is named already
        state.advance(second[2])


def generate(processor, prompt_width: int, batch: int, vocab: int, seed: int, steps: int):
    """A greedy loop as transformers runs it: finished rows get the pad token (= EOS here)."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.full((batch, prompt_width), 7)
    finished = torch.zeros(batch, dtype=torch.bool)
    for _ in range(steps):
        scores = torch.randn(batch, vocab, generator=gen)
        scores[:, EOS] += 5.0  # a model eager to stop early cannot
        scores[0, :100] = -torch.inf  # an earlier processor's ban cannot block a valid choice
        nxt = processor(input_ids, scores).argmax(-1)
        nxt = torch.where(finished, torch.full_like(nxt, EOS), nxt)
        finished |= nxt == EOS
        input_ids = torch.cat([input_ids, nxt[:, None]], dim=1)
        if finished.all():
            break
    return input_ids[:, prompt_width:].tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_processor_batches_rows_of_different_sizes(tokenizer, seed):
    sizes = [1, 2, 9, 10, 11, 50]
    pieces = [build_pieces(tokenizer, n) for n in sizes]
    processor = PermutationLogitsProcessor(pieces, {EOS}, prompt_width=5)
    steps = max(p.max_tokens() for p in pieces)
    rows = generate(processor, 5, len(sizes), len(tokenizer), seed, steps)
    for row, n in zip(rows, sizes):
        end = row.index(EOS) + 1
        check_answer(tokenizer, row[:end], n)


def test_regex_accepts_permutations_and_the_format_only():
    n = 12
    pattern = re.compile(permutation_regex(n))
    ids = list(range(1, n + 1))
    random.Random(0).shuffle(ids)
    assert pattern.fullmatch(render_ids(ids))
    assert pattern.fullmatch(render_ids([1] * n))  # repeats: left to the repair
    assert not pattern.fullmatch(render_ids(ids[:-1]))
    assert not pattern.fullmatch(render_ids([13, *ids[1:]]))
    assert not pattern.fullmatch(render_ids([0, *ids[1:]]))
    assert not pattern.fullmatch(render_ids(ids) + " > [3]")
    assert not pattern.fullmatch(render_ids(ids).replace(" > ", ">"))
    assert re.compile(permutation_regex(1)).fullmatch("[1]")


def test_gbnf_names_n_items_and_the_id_range():
    grammar = gbnf(3)
    assert grammar.splitlines() == [
        'root ::= item " > " item " > " item',
        'item ::= "[" id "]"',
        'id ::= "3" | "2" | "1"',
    ]
    assert guided_body("llama", 3) == {"grammar": grammar}
    assert guided_body("vllm", 2) == {"structured_outputs": {"regex": permutation_regex(2)}}
    assert guided_body("vllm-legacy", 2) == {"guided_regex": permutation_regex(2)}
    with pytest.raises(ValueError, match="unknown --guided"):
        guided_body("tgi", 2)
