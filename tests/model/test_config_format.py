"""config.json as checkpoints hold it: a config written in the format read back and written
again is the same bytes, whatever record in the code holds each of its fields (the history
head's ``match`` and ``match_width`` sit flat in ``head``, for every head kind, as spdrank has
always written them)."""

from __future__ import annotations

import json

import pytest

from spdrank.model.checkpoint import CONFIG_NAME, read_config
from spdrank.model.ranker import SPDRanker
from tests.helpers import save_features_only_model

#: A history head's config.json as ``spdrank train --head history --readout words --positions
#: 20`` wrote it before the history head had a settings record of its own (``match_width``
#: edited to a value no default gives).
HISTORY = """\
{
  "format": "spdrank",
  "format_version": 1,
  "backbone": {
    "name_or_path": "bundled",
    "layers": null,
    "dtype": "auto",
    "lora": {
      "r": 64,
      "alpha": 64,
      "dropout": 0.0,
      "target_modules": "all-linear",
      "top_layers": null
    },
    "config_sha256": null
  },
  "head": {
    "kind": "history",
    "positions": 20,
    "width": 256,
    "layers": 2,
    "heads": 4,
    "dropout": 0.1,
    "tokens": true,
    "match": "tfidf",
    "match_width": 16,
    "anchor": "none"
  },
  "prompt": {
    "instruction": "Rank the candidate items by how likely the user is to choose each one next, given the user's history.",
    "max_item_tokens": 32,
    "max_query_tokens": 512,
    "use_chat_template": true,
    "labels": "numbers",
    "answer_prefix": "",
    "readout": "words",
    "history_items": true
  },
  "decoder": "expected_rank",
  "text_fields": [
    "title",
    "text",
    "contents"
  ],
  "features": null,
  "features_only": false
}
"""

#: The head record of other kinds as ``spdrank train`` wrote them: the history head's fields
#: too, at the run's ``--match`` (tfidf) though nothing reads them.
OTHER_HEADS = {
    "attn": {"kind": "attn", "positions": 20, "width": 256, "layers": 2, "heads": 4,
             "dropout": 0.1, "tokens": False, "match": "tfidf", "match_width": 64,
             "anchor": "order"},
    "first": {"kind": "first", "positions": 20, "width": 256, "layers": 2, "heads": 4,
              "dropout": 0.1, "tokens": False, "match": "maxsim", "match_width": 64,
              "anchor": "none"},
}


def _written(text: str, tmp_path) -> str:
    """``text`` read as a checkpoint's config.json and written again as a checkpoint writes it."""
    path = tmp_path / CONFIG_NAME
    path.write_text(text)
    return json.dumps(read_config(path).to_dict(), indent=2) + "\n"


def test_a_history_config_reads_and_writes_back_byte_identical(tmp_path):
    assert _written(HISTORY, tmp_path) == HISTORY
    config = read_config(tmp_path / CONFIG_NAME)
    assert config.head.kind == "history" and config.head.positions == 20


@pytest.mark.parametrize("kind", sorted(OTHER_HEADS))
def test_every_kind_keeps_the_history_fields_it_was_written_with(tmp_path, kind):
    record = json.loads(HISTORY)
    record["head"] = OTHER_HEADS[kind]
    record["prompt"] |= {"readout": "mean", "history_items": False}
    text = json.dumps(record, indent=2) + "\n"
    assert _written(text, tmp_path) == text


def test_a_config_from_before_the_unit_fields_loads_with_their_defaults(tmp_path):
    record = json.loads(HISTORY)
    for name in ("tokens", "match", "match_width", "anchor"):
        del record["head"][name]
    (tmp_path / CONFIG_NAME).write_text(json.dumps(record))
    head = json.loads(_written(json.dumps(record), tmp_path))["head"]
    assert (head["match"], head["match_width"], head["anchor"]) == ("maxsim", 64, "none")
    assert list(head) == list(json.loads(HISTORY)["head"])


def test_a_checkpoint_loaded_and_saved_again_writes_the_same_config(tmp_path):
    """Through the model: a checkpoint's config.json (an attn head's, with the history fields
    a run wrote) survives ``from_pretrained`` and ``save_pretrained`` byte for byte."""
    saved = save_features_only_model(tmp_path / "m", positions=6)
    record = json.loads((saved / CONFIG_NAME).read_text())
    record["head"] |= {"match": "tfidf", "match_width": 16}
    text = json.dumps(record, indent=2) + "\n"
    (saved / CONFIG_NAME).write_text(text)
    SPDRanker.from_pretrained(saved, device="cpu").save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / CONFIG_NAME).read_text() == text


# -- the default model, the paper's, and configs of earlier versions -------------------------


def test_the_default_config_is_what_train_fits_with_no_flags():
    from spdrank.methods.base import head_kinds
    from spdrank.methods.head_config import HeadConfig
    from spdrank.model.config import SPDConfig
    from spdrank.training.config import TrainConfig

    trained = TrainConfig(slates="s.jsonl", out="o").model_config()
    assert SPDConfig().to_dict() == trained.to_dict()
    assert (trained.head.kind, trained.prompt.readout, trained.decoder) == (
        "history", "words", "expected_rank")
    for kind in head_kinds():  # and the prompt of each head is the one train builds for it
        built = SPDConfig(head=HeadConfig(kind=kind)).prompt
        assert built == TrainConfig(slates="s.jsonl", out="o", head=kind).model_config().prompt


def test_the_paper_preset_is_the_attention_head_read_at_the_last_token_decoded_exactly():
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.model.config import SPDConfig
    from spdrank.training.config import TrainConfig

    paper = SPDConfig.paper()
    assert (paper.head.kind, paper.prompt.readout, paper.prompt.history_items,
            paper.decoder) == ("attn", "last", False, "hungarian")
    trained = TrainConfig(slates="s.jsonl", out="o", head="attn", readout="last",
                          decoder="hungarian").model_config()
    assert paper.to_dict() == trained.to_dict()
    assert SPDConfig.paper(backbone=BackboneConfig(lora=None)).backbone.lora is None


def test_a_config_without_a_field_reads_it_as_the_format_wrote_it_not_as_todays_default(
    tmp_path,
):
    """A format-1 config.json that lacks the head's kind, the readout or the decoder was
    written when they were attn, last and hungarian; today's defaults differ."""
    record = json.loads(HISTORY)
    del record["head"]["kind"], record["head"]["tokens"], record["head"]["match"]
    del record["prompt"]["readout"], record["prompt"]["history_items"], record["decoder"]
    (tmp_path / CONFIG_NAME).write_text(json.dumps(record))
    config = read_config(tmp_path / CONFIG_NAME)
    assert (config.head.kind, config.head.history.match, config.prompt.readout,
            config.prompt.history_items, config.decoder) == (
        "attn", "maxsim", "last", False, "hungarian")


@pytest.mark.parametrize("field,value,says", [
    ("kind", "slot", (r"head\.kind 'slot': the slot-query head is no longer part of spdrank.*"
                     r"train the model again with another --head")),
    ("standardise", True, (r"head\.standardise: standardising the backbone's states.*"
                          r"train the model again without --standardise-states")),
])
def test_a_checkpoint_using_a_removed_option_is_refused_naming_file_option_and_what_to_do(
    tmp_path, field, value, says
):
    record = json.loads(HISTORY)
    record["head"][field] = value
    path = tmp_path / CONFIG_NAME
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"^{path}: {says}"):
        read_config(path)
    with pytest.raises(ValueError, match=says):  # and so is the model
        SPDRanker.from_pretrained(tmp_path)


def test_a_removed_setting_at_its_off_value_reads_as_a_model_without_it(tmp_path):
    record = json.loads(HISTORY)
    record["head"]["standardise"] = False
    assert _written(json.dumps(record), tmp_path) == HISTORY


def test_the_documented_ways_to_give_a_model_another_prompt_build(tiny_backbone):
    """docs/usage.md: the default head with train's prompt on another template, and the
    paper's configuration with that template."""
    from spdrank.backbone.prompt import PromptSettings
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.backbone.templates import SEARCH
    from spdrank.model.config import SPDConfig, default_prompt

    backbone = BackboneConfig(name_or_path=tiny_backbone, lora=None)
    for config in (SPDConfig(backbone=backbone, prompt=default_prompt(template=SEARCH)),
                   SPDConfig.paper(backbone=backbone, prompt=PromptSettings(template=SEARCH))):
        model = SPDRanker.build(config)
        assert model.config.prompt.template == SEARCH
    with pytest.raises(ValueError, match="history_items=True"):  # a history head's prompt
        SPDRanker.build(SPDConfig(backbone=backbone, prompt=PromptSettings(template=SEARCH)))


# -- a model that reads no backbone ---------------------------------------------------------


FEATURE_SLATE = {"query": {"qid": "q", "text": "history"}, "candidates": [
    {"docid": d, "doc": {"title": d}, "features": {"pop": pop}, "score": score}
    for d, pop, score in (("a", 0.2, 0.9), ("b", 1.7, 0.1), ("c", 1.1, 0.5), ("d", 0.4, 0.3))
]}


def test_a_features_only_config_names_no_backbone_and_loads_as_the_model_it_saved(tmp_path):
    """Its config.json leaves what only a backbone reads null (no LLM, no token budget, no chat
    template named), keeps what the head is built from, and reads back as the same model."""
    from spdrank.backbone.settings import BackboneConfig
    from spdrank.model.config import BACKBONE_ONLY_PROMPT

    saved = save_features_only_model(tmp_path / "m", positions=6)
    text = (saved / CONFIG_NAME).read_text()
    record = json.loads(text)
    assert record["backbone"] is None
    assert {name: record["prompt"][name] for name in BACKBONE_ONLY_PROMPT} == dict.fromkeys(
        BACKBONE_ONLY_PROMPT)
    assert (record["prompt"]["readout"], record["prompt"]["instruction"]) == (
        "mean", json.loads(HISTORY)["prompt"]["instruction"])
    model = SPDRanker.from_pretrained(saved)
    assert model.config.backbone == BackboneConfig(lora=None)
    assert model.config.prompt.max_item_tokens == 32
    model.save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / CONFIG_NAME).read_text() == text


def test_a_features_only_config_written_with_its_backbone_loads_and_ranks_as_before(tmp_path):
    """Features-only checkpoints saved before recorded a backbone and a whole prompt: they
    are read as they are, and rank as the same model saved today does."""
    from spdrank.core.slates import Slate

    saved = save_features_only_model(tmp_path / "m", positions=6)
    record = json.loads((saved / CONFIG_NAME).read_text())
    old = tmp_path / "old"
    old.mkdir()
    (old / "head.safetensors").write_bytes((saved / "head.safetensors").read_bytes())
    record["backbone"] = json.loads(HISTORY)["backbone"] | {"name_or_path": "no/such/model",
                                                            "lora": None}
    record["prompt"] |= {"max_item_tokens": 8, "max_query_tokens": 512,
                         "use_chat_template": True, "labels": "numbers", "answer_prefix": ""}
    (old / CONFIG_NAME).write_text(json.dumps(record, indent=2) + "\n")
    model = SPDRanker.from_pretrained(old)
    assert (model.config.backbone.name_or_path, model.config.prompt.max_item_tokens) == (
        "no/such/model", 8)
    slate = Slate.from_dict(FEATURE_SLATE)
    assert model.rank(slate).docids == SPDRanker.from_pretrained(saved).rank(slate).docids


def test_a_null_backbone_is_refused_for_a_model_that_reads_one(tmp_path):
    record = json.loads(HISTORY)
    record["backbone"] = None
    path = tmp_path / CONFIG_NAME
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=rf"^{path}: backbone is null, which only a "
                       r"features-only model \(features_only: true\) records"):
        read_config(path)


def test_features_only_training_builds_the_model_its_checkpoint_loads(tmp_path):
    """Backbone flags a features-only run does not read leave its model as the one saved and
    read back, so a warm start from it finds no setting changed."""
    from spdrank.model.config import SPDConfig
    from spdrank.training.config import TrainConfig

    trained = TrainConfig(slates="s.jsonl", out="o", features="pop", features_only=True,
                          backbone="no/such/model", layers=3, max_item_tokens=8,
                          max_query_tokens=64).model_config()
    assert SPDConfig.from_dict(json.loads(json.dumps(trained.to_dict()))) == trained
