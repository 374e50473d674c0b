"""The first use of the bundled backbone says where its converted copy goes (spdrank's cache,
outside the project) and how to move it."""

from __future__ import annotations

import logging

import pytest


def test_the_conversion_says_where_the_backbone_goes_and_how_to_move_it(
    tmp_path, monkeypatch, caplog
):
    import transformers

    from spdrank.backbone.locate import bundled_backbone_path

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setenv("SPDRANK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(transformers, "AutoTokenizer", type("T", (), {"from_pretrained": stop}))
    with caplog.at_level(logging.INFO, logger="spdrank.backbone.locate"), pytest.raises(Stop):
        bundled_backbone_path()  # stopped right after it says what it will do
    (said,) = [r.getMessage() for r in caplog.records]
    assert str(tmp_path / "cache") in said and "$SPDRANK_CACHE" in said
