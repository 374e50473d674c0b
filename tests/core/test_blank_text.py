"""A text of invisible characters only (zero widths, joiners, bidi marks, U+FEFF) is blank:
refused where an empty text is, not ranked as an item with nothing to read."""

from __future__ import annotations

import pytest

from spdrank.core.slates import Slate, SlateError
from spdrank.core.validation import is_blank

INVISIBLE = ["\u200b", "\u200b\u200c\u200d", "\ufeff", "\u202e", "\u2060\u2061", " \u200b\t\n",
             "\u00a0\u3000", "\u00ad", "\x00\x01"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_text_is_blank(text):
    assert is_blank(text)


@pytest.mark.parametrize("text", ["a", "\u200ba", "日本", "😀", "e\u0301", "\u202eabc", "0"])
def test_any_visible_character_is_text(text):
    assert not is_blank(text)


@pytest.mark.parametrize("text", INVISIBLE)
def test_a_candidate_of_invisible_text_is_refused(text):
    data = {"query": {"qid": "q", "text": "1. shampoo"},
            "candidates": [{"docid": "a", "doc": {"title": text}}]}
    with pytest.raises(SlateError, match=r"candidates\[0\]\.doc\.title .*is empty"):
        Slate.from_dict(data)


def test_an_invisible_title_gives_way_to_the_body():
    from spdrank.core.slates import TEXT_FIELDS, with_body

    doc = {"title": "\u200b\u200d", "text": "argan oil"}
    assert with_body(doc, "title", TEXT_FIELDS) == "argan oil"
    doc = {"title": "argan oil", "text": "\ufeff"}
    assert with_body(doc, "title", TEXT_FIELDS) == "argan oil"


def test_a_rerank_document_of_invisible_text_is_refused():
    from pydantic import ValidationError

    from spdrank.serving.schemas import RerankRequest

    with pytest.raises(ValidationError, match=r"documents\[1\] is empty"):
        RerankRequest.model_validate({"query": "q", "documents": ["ok", "\u200b\u200b"]})
