"""--holdout beside --eval-slates is refused wherever the eval file lies, --out included;
only the parts --holdout itself wrote there (a held-out run's recorded settings) pass."""

from __future__ import annotations

import pytest

from spdrank.training.config import TrainConfig


@pytest.mark.parametrize("eval_slates", ["v.jsonl", "run/val.jsonl", "run/holdout/x.jsonl"])
def test_holdout_with_eval_slates_is_refused_even_under_out(eval_slates):
    with pytest.raises(ValueError, match="--holdout sets queries of --slates aside"):
        TrainConfig(slates="s.jsonl", out="run", holdout=30.0, eval_slates=eval_slates).check()


def test_the_parts_holdout_wrote_are_its_own_pair():
    TrainConfig(slates="run/holdout/train.jsonl", out="run/", holdout=30.0,
                eval_slates="./run/holdout/validation.jsonl").check()
