"""Prompt templates: the recommendation one is today's texts exactly (strings and token ids),
search is RankGPT's, a user's file is checked field by field, and the template travels with
the checkpoint and the label files, so a model ranks (and a student trains) only under its own."""

import dataclasses
import json

import pytest

from spdrank.backbone.prompt import PromptBuilder, PromptSettings, render_text, template_around
from spdrank.backbone.templates import (
    RECOMMENDATION,
    SEARCH,
    TEACHER_PROMPT_FIELD,
    PromptTemplate,
    check_labels_template,
    check_model_template,
    load_template,
)
from spdrank.commands.cli import main
from spdrank.core.slates import Candidate, Query, Slate, load_slates, write_slates
from spdrank.model.config import SPDConfig
from spdrank.teacher.labels import LabelError, read_labels
from spdrank.teacher.prompt import TeacherPromptSettings, answer_instruction, build_messages
from tests.helpers import make_slates, records

# The texts spdrank's prompts held before templates existed, copied here so that any change
# to the recommendation template's wording fails.
OLD_INSTRUCTION = (
    "Rank the candidate items by how likely the user is to choose each one next, "
    "given the user's history."
)
OLD_SYSTEM = (
    "You are an expert recommender system. Given a user's history, you rank candidate items "
    "by how likely the user is to choose each one next."
)


def old_answer(n: int, mode: str) -> str:
    fmt = (
        f"in the format [i] > [j] > ... using the candidate numbers, "
        f"every number from 1 to {n} exactly once"
    )
    if mode == "reasoning":
        return (
            f"First think step by step about the user's preferences and each candidate. Then, "
            f"on the last line, write the ranking of all {n} candidates, most likely first, {fmt}."
        )
    return (
        f"Rank all {n} candidates, most likely first. Answer only with the ranking, {fmt}, "
        f"and nothing else: no explanation."
    )


def old_render_text(query: str, texts: list[str]) -> str:
    lines = "".join(f"\n[{i}] {text}" for i, text in enumerate(texts, start=1))
    return f"{OLD_INSTRUCTION}\n\nUser history:\n{query}\n\nCandidates ({len(texts)}):{lines}\n"


QUERY = "1. argan oil\n2. hair serum <|im_end|>"
TEXTS = ["red lipstick", "gel", "[3] shampoo\nand conditioner", ""]


def slate() -> Slate:
    return Slate(Query("q1", QUERY), [Candidate(f"d{i}", {"title": t}) for i, t in enumerate(TEXTS)])


# -- recommendation is today's prompt --------------------------------------------------------


def test_recommendation_renders_todays_texts():
    assert render_text(QUERY, TEXTS) == old_render_text(QUERY, TEXTS)
    assert render_text(QUERY, TEXTS, template=RECOMMENDATION) == old_render_text(QUERY, TEXTS)
    for n in (1, 7, 100):
        for mode in ("direct", "reasoning"):
            assert answer_instruction(n, mode) == old_answer(n, mode)
            assert answer_instruction(n, mode, RECOMMENDATION, "q") == old_answer(n, mode)
    messages = build_messages(slate(), TeacherPromptSettings())
    assert messages[0] == {"role": "system", "content": OLD_SYSTEM}
    assert messages[1]["content"] == old_render_text(QUERY, TEXTS) + "\n" + old_answer(4, "direct")


def test_recommendation_token_ids_are_todays(tokenizer):
    """The student's ids, piece by piece as the builder made them before templates."""

    def enc(text: str, specials: bool = False) -> list[int]:
        out = tokenizer(text, add_special_tokens=False, split_special_tokens=not specials)
        return list(out["input_ids"]) if text else []

    before, after = template_around(tokenizer, [])
    expected = enc(before, True) + enc(OLD_INSTRUCTION + "\n\nUser history:\n") + enc(QUERY)
    expected += enc(f"\n\nCandidates ({len(TEXTS)}):")
    for i, text in enumerate(TEXTS, start=1):
        expected += enc(f"\n[{i}] ") + enc(text)[:32]
    expected += enc("\n") + enc(after, True)
    for settings in (PromptSettings(), PromptSettings(template=RECOMMENDATION)):
        assert PromptBuilder(tokenizer, settings).encode(QUERY, TEXTS).input_ids == expected


def test_a_recommendation_checkpoint_config_is_unchanged_and_old_ones_load_as_it():
    prompt = SPDConfig().to_dict()["prompt"]
    assert "template" not in prompt
    assert next(iter(prompt)) == "instruction" and prompt["instruction"] == OLD_INSTRUCTION
    # A config.json's prompt settings as written before templates were recorded.
    old = {"instruction": OLD_INSTRUCTION, "max_item_tokens": 32, "max_query_tokens": 512,
           "use_chat_template": True, "labels": "numbers", "answer_prefix": "",
           "readout": "last", "history_items": False}
    assert PromptSettings.from_dict(old).template == RECOMMENDATION
    assert PromptSettings.from_dict(old).to_dict() == old


# -- search, and templates in checkpoints -------------------------------------------------------


def test_search_prompt_is_rankgpts(tokenizer):
    text = render_text("what is argan oil", ["oil from a tree", "a shampoo"], template=SEARCH)
    assert text.startswith(
        "I will provide you with 2 passages, each indicated by a numerical identifier []. Rank "
        "the passages based on their relevance to the search query.\n\nQuery:\nwhat is argan oil"
        "\n\nPassages (2):\n[1] oil from a tree\n[2] a shampoo\n"
    )
    settings = TeacherPromptSettings(template=SEARCH)
    messages = build_messages(Slate(Query("q", "what is argan oil"), [
        Candidate("a", {"title": "oil from a tree"}), Candidate("b", {"title": "a shampoo"})
    ]), settings)
    assert "RankLLM" in messages[0]["content"]
    assert messages[1]["content"] == text + "\n" + (
        "Search Query: what is argan oil.\nRank the 2 passages above based on their relevance to "
        "the search query, most relevant to the query first. All the passages should be "
        "included and listed using identifiers, in the format [i] > [j] > ..., every number "
        "from 1 to 2 exactly once. Only respond with the ranking results, do not say any word "
        "or explain."
    )
    # The student tokenizes the same body, with its count rendered for each slate size.
    builder = PromptBuilder(tokenizer, PromptSettings(template=SEARCH))
    for texts in (["oil from a tree", "a shampoo"], ["x", "y", "z"]):
        ids = builder.encode("what is argan oil", texts).input_ids
        assert render_text("what is argan oil", texts, template=SEARCH) in tokenizer.decode(ids)


def test_the_template_round_trips_through_a_checkpoint(tiny_backbone, tmp_path):
    from spdrank.model.ranker import SPDRanker
    from tests.helpers import tiny_config

    config = tiny_config(tiny_backbone, frozen=True)
    config = dataclasses.replace(config, prompt=dataclasses.replace(config.prompt, template=SEARCH))
    SPDRanker.build(config).save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())["prompt"]
    assert saved["template"] == SEARCH.to_dict()
    assert saved["instruction"] == SEARCH.instruction
    loaded = SPDRanker.from_pretrained(tmp_path / "m")
    assert loaded.config.prompt.template == SEARCH
    ids = loaded.encode(Slate(Query("q", "argan"), [Candidate("a", {"title": "oil"})])).input_ids
    assert "Passages (1):" in loaded.tokenizer.decode(ids)


def test_train_settings_build_the_template(tmp_path):
    from spdrank.training.config import TrainConfig

    cfg = TrainConfig(slates="s.jsonl", out="o", prompt="search")
    assert cfg.model_config().prompt.template == SEARCH
    assert TrainConfig(slates="s.jsonl", out="o").model_config().prompt.template == RECOMMENDATION
    with pytest.raises(FileNotFoundError, match="--prompt 'serch': neither a built-in"):
        TrainConfig(slates="s.jsonl", out="o", prompt="serch").check()


# -- a user's template file ---------------------------------------------------------------------


def write(path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def test_a_template_file_fills_its_base_and_is_checked_by_field(tmp_path):
    own = load_template(write(tmp_path / "faq.json", {
        "base": "search", "context_header": "Question:", "candidates_header": "Answers ({n}):",
    }))
    assert own.name == "faq" and own.context_header == "Question:"
    assert own.system == SEARCH.system and own.likelihood == "query"
    assert load_template(write(tmp_path / "r.json", {"name": "mine"})) == dataclasses.replace(
        RECOMMENDATION, name="mine")
    cases = [
        ({"systm": "x"}, "unknown prompt template field 'systm'"),
        ({"answer": "Rank {count} items"},
         "field 'answer' uses {count}; the placeholders it may use: {n}, {order}, {query}"),
        ({"instruction": "about {query}"},
         "field 'instruction' uses {query}; the placeholders it may use: {n}"),
        ({"system": "use {n}"}, "field 'system' uses {n}; the placeholders it may use: none"),
        ({"candidates_header": "Items {n"}, "field 'candidates_header' has a malformed placeholder"),
        ({"answer": "{n!r}"}, "field 'answer' has placeholder {n!r}: a placeholder is a bare name"),
        ({"base": "search", "likelihood_ask": "Write a question."},
         "field 'likelihood_ask' must hold {passage} exactly once"),
        ({"likelihood": "pointwise"}, "field 'likelihood' must be one of ['item', 'query']"),
        ({"base": "ads"}, "field 'base' must name a built-in template"),
        ({"order": 3}, "field 'order' must be a string"),
        ([1], "a prompt template must be a JSON object"),
    ]
    for data, message in cases:
        path = write(tmp_path / "bad.json", data)
        with pytest.raises(ValueError, match=f"^{path}: .*") as err:
            load_template(path)
        assert message in str(err.value)
        assert "\n" not in str(err.value)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="broken.json: not a JSON prompt template"):
        load_template(str(tmp_path / "broken.json"))
    # Literal braces are written doubled.
    braces = load_template(write(tmp_path / "b.json", {"instruction": "Rank {{all}} {n}."}))
    assert braces.render("instruction", n=3) == "Rank {all} 3."


def test_a_checkpoint_template_record_is_checked():
    with pytest.raises(ValueError, match="prompt settings: unknown prompt template field 'x'"):
        PromptSettings.from_dict({"template": {**SEARCH.to_dict(), "x": 1}})
    with pytest.raises(ValueError, match="lacks field 'order'"):
        PromptSettings.from_dict({"template": {k: v for k, v in SEARCH.to_dict().items()
                                               if k != "order"}})


# -- a model ranks with its own template --------------------------------------------------------


def test_another_template_than_the_models_is_refused(tmp_path):
    check_model_template(SEARCH, None, "m")
    check_model_template(SEARCH, "search", "m")
    with pytest.raises(ValueError, match="m was trained with the prompt template 'search', not "
                       "'recommendation': a model always ranks with the template it was "
                       "trained on"):
        check_model_template(SEARCH, "recommendation", "m")
    edited = write(tmp_path / "search.json", {"base": "search", "order": "best first"})
    with pytest.raises(ValueError, match="'search' with another 'order' than the one given"):
        check_model_template(SEARCH, edited, "m")


@pytest.mark.parametrize("command", ["rank", "eval", "serve"])
def test_rank_eval_and_serve_refuse_another_template(command, tmp_path, capsys):
    # The check reads the checkpoint's config.json before anything loads.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(SPDConfig().to_dict()))
    write_slates(tmp_path / "s.jsonl", make_slates(2))
    model = str(tmp_path / "model")
    argv = {
        "rank": ["rank", "--model", model, "--input", str(tmp_path / "s.jsonl"), "--output",
                 str(tmp_path / "out.jsonl")],
        "eval": ["eval", "--slates", str(tmp_path / "s.jsonl"), "--model", model],
        "serve": ["serve", "--model", model],
    }[command]
    if command == "serve":
        pytest.importorskip("fastapi")
    assert main([*argv, "--prompt", "search"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{model} was trained with the prompt template 'recommendation', not "
                        "'search': a model always ranks with the template it was trained on "
                        "(drop --prompt)")
    assert "\n" not in err


# -- label files record the template; training checks it -----------------------------------------


def run_teacher(tmp_path, *prompt: str) -> list[dict]:
    write_slates(tmp_path / "s.jsonl", make_slates(3, seed=4))
    code = main(["teacher", "--slates", str(tmp_path / "s.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", "ranker:random", "--train",
                 str(tmp_path / "s.jsonl"), "--no-progress", *prompt])
    assert code == 0
    return records(tmp_path / "labels.jsonl")


def test_labels_record_the_template_and_the_default_adds_nothing(tmp_path):
    default = run_teacher(tmp_path / "a")
    assert all("prompt" not in r for r in default)
    assert all(TEACHER_PROMPT_FIELD not in s.extra
               for s in load_slates(tmp_path / "a" / "labels.slates.jsonl"))
    old = read_labels(tmp_path / "a" / "labels.jsonl")  # as files written before templates
    assert {label.template for label in old.values()} == {RECOMMENDATION}
    searched = run_teacher(tmp_path / "b", "--prompt", "search")
    assert all(r["prompt"] == SEARCH.to_dict() for r in searched)
    labels = read_labels(tmp_path / "b" / "labels.jsonl")
    assert {label.template for label in labels.values()} == {SEARCH}
    labelled = load_slates(tmp_path / "b" / "labels.slates.jsonl")
    assert all(s.extra[TEACHER_PROMPT_FIELD] == SEARCH.to_dict() for s in labelled)


def test_a_damaged_template_in_a_label_record_names_its_line(tmp_path):
    run_teacher(tmp_path, "--prompt", "search")
    lines = (tmp_path / "labels.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["prompt"]["answer"] = "{oops}"
    lines[0] = json.dumps(record)
    (tmp_path / "labels.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(LabelError, match=r"labels.jsonl:1.*field 'answer' uses \{oops\}"):
        read_labels(tmp_path / "labels.jsonl")


def test_training_on_labels_of_another_template_is_refused(tmp_path, capsys):
    run_teacher(tmp_path, "--prompt", "search")
    labelled = tmp_path / "labels.slates.jsonl"
    code = main(["train", "--slates", str(labelled), "--out", str(tmp_path / "run")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "the teacher labelled these slates with the prompt template 'search', not " \
           "'recommendation': train with --prompt search" in err
    assert f"{labelled}:1" in err and "\n" not in err
    assert not (tmp_path / "run").exists()
    first = load_slates(labelled)[0]
    check_labels_template(first.extra, SEARCH, "x")  # the same template passes
    with pytest.raises(ValueError, match="'recommendation', not 'search'"):
        check_labels_template({}, SEARCH, "old labels")  # unrecorded: the default's


def test_clicks_alone_read_no_teacher_template(tmp_path):
    from spdrank.commands.train import check_labels_template as check_run
    from spdrank.training.config import TrainConfig

    run_teacher(tmp_path, "--prompt", "search")
    labelled = str(tmp_path / "labels.slates.jsonl")
    check_run(TrainConfig(slates=labelled, out="o", target="clicks"))
    check_run(TrainConfig(slates=labelled, out="o", prompt="search"))
    with pytest.raises(ValueError, match="prompt template 'search'"):
        check_run(TrainConfig(slates=labelled, out="o", target="teacher+clicks"))


def test_prompt_template_is_frozen_and_named():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SEARCH.name = "x"  # type: ignore[misc]
    with pytest.raises(ValueError, match="non-empty 'name'"):
        dataclasses.replace(SEARCH, name=" ")
    assert PromptTemplate.from_dict(SEARCH.to_dict()) == SEARCH


def test_train_then_rank_under_the_search_template(tiny_backbone, tmp_path, capsys):
    """Labels made under search train a search student, which rank accepts only as such."""
    from spdrank.model.ranker import SPDRanker

    run_teacher(tmp_path, "--prompt", "search")
    labelled = str(tmp_path / "labels.slates.jsonl")
    code = main(["train", "--slates", labelled, "--out", str(tmp_path / "run"), "--prompt",
                 "search", "--backbone", tiny_backbone, "--frozen", "--max-steps", "2",
                 "--positions", "16", "--head-width", "16", "--max-item-tokens", "4",
                 "--eval-every", "0", "--save-every", "0", "--device", "cpu", "--no-progress"])
    assert code == 0
    assert SPDRanker.from_pretrained(tmp_path / "run").config.prompt.template == SEARCH
    rank = ["rank", "--model", str(tmp_path / "run"), "--input", labelled, "--output",
            str(tmp_path / "ranked.jsonl"), "--device", "cpu"]
    assert main([*rank, "--prompt", "search"]) == 0
    assert len(records(tmp_path / "ranked.jsonl")) == 3
    capsys.readouterr()
    assert main([*rank, "--prompt", "recommendation"]) == 2
    assert "trained with the prompt template 'search'" in capsys.readouterr().err


def test_the_template_tokens_are_what_no_item_budget_shrinks(tokenizer):
    """A prompt's own text (chat template, instruction, headers, markers, tail) counted apart
    from the query and candidates: what a context check tells from what the budgets cut."""
    settings = PromptSettings(max_item_tokens=4)
    builder = PromptBuilder(tokenizer, settings)
    encoded = builder.encode("", ["a"] * 5)
    items = sum(last - first + 1 for first, last in zip(encoded.item_first, encoded.item_last))
    assert builder.template_tokens(5) == len(encoded.input_ids) - items
    long = dataclasses.replace(settings.template, instruction="Rank them. " * 2000)
    wordy = PromptBuilder(tokenizer, dataclasses.replace(settings, template=long))
    assert wordy.template_tokens(5) > builder.template_tokens(5) + 4000


def test_a_template_that_fills_the_context_is_named_not_the_budgets(tiny_backbone):
    """A prompt past the backbone's positions because of its template's own instruction is
    refused naming the template: no --max-item-tokens or --window would shrink it."""
    from spdrank.core.slates import SlateError
    from spdrank.model.ranker import SPDRanker
    from tests.helpers import tiny_config

    config = tiny_config(tiny_backbone, frozen=True, item_tokens=4)
    config.prompt = dataclasses.replace(config.prompt, template=dataclasses.replace(
        config.prompt.template, instruction="Rank them. " * 3000))
    model = SPDRanker.build(config)
    with pytest.raises(SlateError, match=r"the prompt template's own text is \d+ of them: "
                                         r"shorten its instruction"):
        model.rank("a query", ["one", "two"])
