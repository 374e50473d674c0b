"""What was not used is said, one line each: judgements and slates that did not meet, a run
that ranks none of a slate's candidates, flags given without the flag that makes them count
(refused when nothing would read them)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from spdrank.commands.cli import main
from spdrank.eval.judged import unused_judgements
from spdrank.training.config import TrainConfig

QIDS = ("q1", "q2", "q3")


def search_slates(path: Path) -> Path:
    """Three search slates, q1..q3, each of three passages ``<qid>d0..d2``."""
    lines = [
        {"query": {"qid": q, "text": "fleas"},
         "candidates": [{"docid": f"{q}d{i}", "doc": {"text": f"passage {i}"}, "score": 3 - i}
                        for i in range(3)]}
        for q in QIDS
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def run_eval(tmp_path: Path, caplog, *args: str) -> list[str]:
    slates = search_slates(tmp_path / "s.jsonl")
    with caplog.at_level(logging.WARNING):
        assert main(["eval", "--slates", str(slates), "--ranker", "random", "--no-progress",
                     *args]) == 0
    return notes(caplog)


def test_qrels_queries_without_a_slate_and_slates_without_a_judgement_are_said(
    tmp_path, caplog
):
    qrels = tmp_path / "q.qrels"
    qrels.write_text("q1 0 q1d1 2\nq2 0 q2d0 1\nq9 0 x 1\nq8 0 y 1\n")
    lines = run_eval(tmp_path, caplog, "--qrels", str(qrels))
    assert f"--qrels {qrels} judges no document of 1 of the 3 slates ('q3'): they count in " \
        "no judged metric" in lines
    assert f"--qrels {qrels}: 2 of its 4 judged queries match no slate ('q9', 'q8'): their " \
        "judgements are not used" in lines


def test_a_qrels_file_that_judges_none_of_the_slates_is_said(tmp_path, caplog):
    qrels = tmp_path / "other.qrels"
    qrels.write_text("101 0 D1 1\n102 0 D2 1\n")
    (line,) = run_eval(tmp_path, caplog, "--qrels", str(qrels))
    assert line == (f"--qrels {qrels} judges none of the 3 slates: its queries ('101', '102') "
                    "are not theirs ('q1', 'q2', 'q3'), so no slate is judged")


def test_a_run_of_another_docid_space_is_said_not_passed_off_as_the_first_stage(
    tmp_path, caplog
):
    run = tmp_path / "bm25.trec"
    run.write_text("q1 Q0 D5 1 9.0 t\nq2 Q0 q2d2 1 9.0 t\nq3 Q0 D7 1 3.0 t\n")
    lines = run_eval(tmp_path, caplog, "--run", f"bm25={run}")
    assert f"bm25: {run} ranks none of the candidates of 2 slates ('q1', 'q3'), which keep " \
        "their given order: are its docids the slates'? It ranks less than 50% of the " \
        "candidates of 1 more." in lines


def test_a_run_cut_short_says_how_many_candidates_it_left(tmp_path, caplog):
    run = tmp_path / "bm25.trec"
    run.write_text("".join(f"{q} Q0 {q}d{i} {i + 1} {9 - i}.0 t\n" for q in QIDS
                           for i in range(2)))
    lines = run_eval(tmp_path, caplog, "--run", f"bm25={run}")
    assert f"bm25: {run} leaves 3 of 9 candidates unranked; they follow the ranked ones in " \
        "slate order" in lines


def test_a_run_that_ranks_every_candidate_says_nothing(tmp_path, caplog):
    run = tmp_path / "bm25.trec"
    run.write_text("".join(f"{q} Q0 {q}d{i} {i + 1} {9 - i}.0 t\n" for q in QIDS
                           for i in range(3)))
    assert run_eval(tmp_path, caplog, "--run", f"bm25={run}") == []


def test_train_and_rel_level_nothing_reads_are_said(tmp_path, caplog):
    lines = run_eval(tmp_path, caplog, "--train", str(tmp_path / "s.jsonl"), "--rel-level", "2")
    assert f"--train {tmp_path / 's.jsonl'}: not read, as no ranker here fits on training " \
        "slates" in lines
    assert "--rel-level 2: not read, as no slate evaluated has judgements (--qrels, or the " \
        "slates' 'relevance')" in lines


def test_unused_judgements_says_nothing_when_all_meet():
    assert unused_judgements({"a": {"d": 1}}, ["a"], "--qrels q") == []
    assert unused_judgements({"a": {"d": 1}}, [], "--qrels q") == [
        ("--qrels q: 1 of its 1 judged queries match no slate ('a'): their judgements are not "
        "used")]


# -- flags without the flag that makes them count --------------------------------------------


@pytest.mark.parametrize("flags,message", [
    (["--decoder", "greedy"], ("--decoder: for --model checkpoints only, and no --model is "
                              "given; add --model DIR or drop it")),
    (["--dtype", "float32", "--window", "4"], "--dtype, --window: for --model checkpoints only"),
    (["--trust-remote-code"], "--trust-remote-code: for --model checkpoints only"),
    (["--prompt", "search"], "--prompt: for --model checkpoints only"),
    (["--window-stride", "2"], ("--window-stride moves the windows of --window, and no --window "
                               "is given")),
])
def test_eval_refuses_model_flags_without_a_model(tmp_path, capsys, flags, message):
    slates = search_slates(tmp_path / "s.jsonl")
    assert main(["eval", "--slates", str(slates), "--ranker", "random", "--no-progress",
                 *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--tag", "mine"], "--tag names the run --trec writes, and no --trec is given"),
    (["--batch-size", "4", "--window", "4"], "--batch-size 4 has no effect with --window"),
    (["--window-stride", "2"], "--window-stride moves the windows of --window"),
])
def test_rank_refuses_flags_nothing_reads_before_loading_a_model(tmp_path, capsys, flags, message):
    slates = search_slates(tmp_path / "s.jsonl")
    out = tmp_path / "o.jsonl"
    code = main(["rank", "--model", str(tmp_path / "no-model"), "--input", str(slates),
                 "--output", str(out), *flags])
    assert code == 2 and message in capsys.readouterr().err and not out.exists()


def test_bench_refuses_latency_flags_without_latency(tmp_path, capsys):
    slates = search_slates(tmp_path / "s.jsonl")
    assert main(["bench", "--slates", str(slates), "--ranker", "random", "--out",
                 str(tmp_path / "b"), "--latency-slates", "5", "--no-progress"]) == 2
    assert "--latency-slates: for the latency decomposition, and no --latency is given" in \
        capsys.readouterr().err


@pytest.mark.parametrize("settings,message", [
    ({"require_clicks": True}, ("--require-clicks has no effect here: --target teacher reads no "
                                "clicks or judgements; drop it")),
    ({"select": "best"}, ("--select best has no effect here: it chooses among evaluations on "
                          "--eval-slates or --holdout, and neither is given")),
    ({"eval_limit": 10}, "--eval-limit 10 has no effect here"),
    ({"head": "attn", "match": "maxsim"},
     ("--match maxsim has no effect here: it applies to --head history with --readout tokens "
      "or words")),
    ({"max_steps": 5, "epochs": 3.0},
     "--epochs 3.0 has no effect here: --max-steps sets the run's length"),
    # Another method's own settings: the scalar head's ListNet loss reads no Sinkhorn.
    ({"head": "scalar", "tau": 0.5},
     "--tau 0.5 has no effect here: it applies to the SPD heads (--head attn, linear, history)"),
    ({"head": "first", "position_weights": "dcg"}, "--position-weights dcg has no effect here"),
])
def test_train_refuses_settings_the_run_would_not_read(settings, message):
    with pytest.raises(ValueError) as info:
        TrainConfig(slates="s.jsonl", out="run", **settings).check()
    assert message in str(info.value)


@pytest.mark.parametrize("settings,message", [
    ({"frozen": True, "lora_r": 8},
     "--lora-r 8 has no effect here: --frozen and --features-only train no LoRA"),
    ({"features_only": True, "features": "pop", "lora_modules": "q_proj"},
     "--lora-modules q_proj has no effect here"),
    ({"cache_dtype": "float32"},
     "--cache-dtype float32 has no effect here: it applies to --cache-states"),
    ({"cache_batch_size": 2}, "--cache-batch-size 2 has no effect here"),
])
def test_train_notes_a_recipes_settings_its_switch_turns_off(caplog, settings, message):
    # One recipe run with --frozen or without, --cache-states or without: said, not refused.
    with caplog.at_level(logging.WARNING):
        TrainConfig(slates="s.jsonl", out="run", **settings).check()
    (line,) = notes(caplog)
    assert line.startswith(message), line


def test_train_says_when_it_evaluates_on_its_training_file(tmp_path, caplog):
    slates = search_slates(tmp_path / "s.jsonl")
    (tmp_path / "link.jsonl").symlink_to(slates)
    with caplog.at_level(logging.WARNING):
        TrainConfig(slates=str(slates), out="run", eval_slates=str(tmp_path / "link.jsonl"),
                    select="best").check()
    (line,) = notes(caplog)
    assert line.startswith(f"--eval-slates {tmp_path / 'link.jsonl'} is the training file "
                           "(--slates): its figures measure the fit, not held-out quality")


def test_train_settings_that_count_pass():
    for settings in ({"target": "clicks", "require_clicks": True},
                     {"eval_slates": "v.jsonl", "select": "best", "eval_limit": 10},
                     {"frozen": True, "cache_states": "c", "cache_dtype": "float32"},
                     {"head": "history", "readout": "tokens", "match": "maxsim"},
                     {"max_steps": 5}, {"frozen": True, "lora_r": 64}):
        TrainConfig(slates="s.jsonl", out="run", **settings).check()


def test_data_search_says_and_refuses_what_it_would_not_read(tmp_path, capsys, caplog):
    retrieved = tmp_path / "r.json"
    retrieved.write_text(json.dumps([{"query": {"qid": "q1", "text": "fleas"}, "hits": [
        {"docid": "a", "content": "Fleas live on cats.", "rank": 1, "score": 1.0}]}]))
    out = tmp_path / "s.jsonl"
    base = ["data", "search", "--retrieved", str(retrieved), "--out", str(out)]
    assert main([*base, "--rel-level", "2"]) == 2
    assert "--rel-level 2 counts the queries --qrels judges" in capsys.readouterr().err
    assert main([*base, "--topics", str(retrieved)]) == 2
    assert "--topics: texts for --run's ids" in capsys.readouterr().err
    qrels = tmp_path / "q.qrels"
    qrels.write_text("q1 0 a 1\nq7 0 b 1\n")
    with caplog.at_level(logging.WARNING):
        assert main([*base, "--qrels", str(qrels)]) == 0
    assert notes(caplog) == [(f"--qrels {qrels}: 1 of its 2 judged queries match no slate "
                             "('q7'): their judgements are not used")]


# -- teacher flags another backend reads, eval's --seed --------------------------------------


@pytest.mark.parametrize(("backend", "flags", "said"), [
    ("ranker:random", ["--timeout", "3"], ("--timeout 3.0 has no effect here: it applies to "
                                          "--backend openai")),
    ("ranker:popularity", ["--seed", "3"], ("--seed 3 has no effect here: it seeds --backend "
                                           "ranker:random alone")),
    ("file:{rankings}", ["--model", "m"], ("--model m has no effect here: it applies to the "
                                          "local models of --backend hf and likelihood")),
    ("openai", ["--layers", "2"], "--layers 2 has no effect here"),
    ("hf", ["--base-url", "http://localhost:9/v1"], ("--base-url http://localhost:9/v1 has no "
                                                    "effect here: it applies to --backend openai")),
    ("likelihood", ["--mode", "reasoning"], ("--mode reasoning has no effect here: it applies to "
                                            "the teachers that generate")),
    ("hf", ["--train", "t.jsonl"], "--train t.jsonl has no effect here: it fits the baseline"),
    ("file:{rankings}", ["--max-new-tokens", "9"], "--max-new-tokens 9 has no effect here"),
    ("ranker:random", ["--api-key", "sekrit"], "--api-key has no effect here"),
])
def test_teacher_refuses_a_flag_only_another_backend_reads(
    tmp_path, capsys, backend, flags, said
):
    # Each was accepted and ignored: a --timeout on a ranker, a --seed on popularity.
    slates = search_slates(tmp_path / "s.jsonl")
    rankings = tmp_path / "r.jsonl"
    rankings.write_text("".join(json.dumps({"qid": q, "ranking": [f"{q}d0"]}) + "\n"
                                for q in QIDS))
    out = tmp_path / "labels.jsonl"
    code = main(["teacher", "--slates", str(slates), "--out", str(out), "--backend",
                 backend.format(rankings=rankings), "--no-progress", *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"spdrank teacher: error: {said}"), err
    assert "sekrit" not in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_teacher_flags_of_the_backend_in_use_pass(tmp_path, caplog):
    slates = search_slates(tmp_path / "s.jsonl")
    with caplog.at_level(logging.WARNING):
        assert main(["teacher", "--slates", str(slates), "--out", str(tmp_path / "l.jsonl"),
                     "--backend", "ranker:random", "--seed", "3", "--train", str(slates),
                     "--no-progress"]) == 0
    assert notes(caplog) == []


def test_the_likelihood_teacher_says_it_reads_no_batch_size(caplog):
    """The local teachers share one group of flags, so a recipe may give both the same ones:
    said in one line, not refused."""
    from spdrank.commands.cli import build_parser
    from spdrank.commands.teacher import check_backend_flags

    args = build_parser().parse_args(["teacher", "--backend", "likelihood", "--batch-size", "2"])
    with caplog.at_level(logging.WARNING):
        check_backend_flags(args)
    assert notes(caplog) == ["--batch-size 2 has no effect here: it applies to --backend hf"]


def test_eval_refuses_a_seed_nothing_random_reads(tmp_path, capsys, caplog):
    slates = search_slates(tmp_path / "s.jsonl")
    base = ["eval", "--slates", str(slates), "--no-progress", "--seed", "3"]
    assert main([*base, "--ranker", "retriever"]) == 2
    assert capsys.readouterr().err.strip() == (
        "spdrank eval: error: --seed 3 has no effect here: it seeds the random ranker and "
        "--reference's bootstrap, and neither runs; drop it")
    assert main([*base, "--ranker", "random"]) == 0
    assert main([*base, "--ranker", "retriever", "--ranker", "slate_bm25", "--reference",
                 "retriever"]) == 0
    assert main([*base[:-2], "--ranker", "retriever", "--seed", "0"]) == 0  # the default
