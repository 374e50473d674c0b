"""Every teacher run says how many candidates it read cut to the token budget."""

from __future__ import annotations

import pytest

from spdrank.commands.cli import main
from spdrank.core.slates import Slate, write_slates
from spdrank.teacher.prompt import CutTally, TeacherPromptSettings, build_messages

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _slate() -> Slate:
    return Slate.from_dict({
        "query": {"qid": "1", "text": "fleas"},
        "candidates": [{"docid": "short", "doc": {"text": "Fleas jump."}},
                       {"docid": "long", "doc": {"text": " ".join(["flea"] * 200)}}],
    })


def test_the_listwise_prompt_counts_what_it_cut() -> None:
    tally = CutTally()
    build_messages(_slate(), TeacherPromptSettings(max_item_tokens=8), tally=tally)
    assert (tally.candidates, tally.cut) == (2, 1)


@pytest.mark.parametrize("prompt", ["search", "recommendation"])
def test_the_likelihood_run_reports_its_cuts(tiny_backbone, tmp_path, capsys, prompt) -> None:
    write_slates(tmp_path / "s.jsonl", [_slate()])
    code = main(["teacher", "--slates", str(tmp_path / "s.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", "likelihood", "--prompt", prompt,
                 "--model", tiny_backbone, "--device", "cpu", "--max-item-tokens", "8",
                 "--no-progress"])
    assert code == 0
    assert "cut to the token budget: 1 of 2 candidates read (at 8 tokens" in capsys.readouterr().out


def test_a_ranker_teacher_reads_no_text_and_says_nothing_of_cuts(tmp_path, capsys) -> None:
    write_slates(tmp_path / "s.jsonl", [_slate()])
    assert main(["teacher", "--slates", str(tmp_path / "s.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", "ranker:random",
                 "--no-progress"]) == 0
    assert "cut to the token budget" not in capsys.readouterr().out


def test_without_a_budget_search_fits_the_context_and_recommendation_keeps_32() -> None:
    from spdrank.backbone.prompt import fitted_item_tokens

    fitted = TeacherPromptSettings(max_item_tokens=None, context=4096)
    assert fitted.item_budget(20) == fitted_item_tokens(4096, 20, 512)
    assert fitted.item_budget(100) < fitted.item_budget(20)


@pytest.mark.parametrize(("prompt", "cut"), [("search", 0), ("recommendation", 1)])
def test_the_likelihood_teachers_default_budget(tiny_backbone, tmp_path, capsys, prompt, cut):
    write_slates(tmp_path / "s.jsonl", [_slate()])  # a passage of about 200 tokens
    assert main(["teacher", "--slates", str(tmp_path / "s.jsonl"), "--out",
                 str(tmp_path / "labels.jsonl"), "--backend", "likelihood", "--prompt", prompt,
                 "--model", tiny_backbone, "--device", "cpu", "--no-progress"]) == 0
    assert f"cut to the token budget: {cut} of 2 candidates read" in capsys.readouterr().out
