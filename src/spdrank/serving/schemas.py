"""Request and response shapes of the HTTP API, as pydantic models.

The rerank models follow the common subset of the Cohere, vLLM and Jina rerank APIs, so their
clients work unchanged. Types are strict (``"5"`` is not a ``top_n``, ``1`` is not a string):
a server that guesses hides client bugs. Document checks raise errors whose message names
the offending index, because "documents: invalid" does not tell a caller which one to fix.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from spdrank.core.validation import is_blank

_CHECK = "spdrank_check"  # error type of the hand-written checks: their message is complete


class RerankDocument(BaseModel):
    """A document given as an object; only ``text`` is read (other fields are ignored)."""

    text: StrictStr


class RerankRequest(BaseModel):
    """``POST /v1/rerank`` (also ``/rerank``, ``/v2/rerank``)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = Field(
        None,
        description="Optional, as clients send it: any name is answered by the served model "
        "(a name other than its own is logged once); the response names the served model.",
    )
    query: StrictStr = Field(description="The query; for SPD, the user's context or history.")
    documents: list[StrictStr | RerankDocument] = Field(
        description='Candidates to rank: strings or {"text": ...} objects; at most the '
        "model's K (more through sliding windows when the server runs with --window); none "
        "may be empty. Over-long texts are truncated (and reported)."
    )
    top_n: StrictInt | None = Field(
        None, ge=1, description="Return only the best top_n results (all when absent)."
    )
    return_documents: StrictBool = Field(
        False, description="Include each result's document text (off by default, as Cohere's)."
    )
    rank_fields: list[StrictStr] | None = Field(
        None, description="Cohere's: the fields of object documents to rank on. Only ['text'] "
        "is served: a document is ranked by its text, so any other field is refused rather "
        "than ignored."
    )

    @field_validator("rank_fields")
    @classmethod
    def _rank_fields(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise PydanticCustomError(
                _CHECK, f"rank_fields {value!r}: this server ranks a document by its 'text' "
                "alone; send each document's text to rank on as 'text' (or drop rank_fields)")
        return value

    @field_validator("documents", mode="before")
    @classmethod
    def _documents(cls, value: Any) -> list[str]:
        if not isinstance(value, list):
            raise PydanticCustomError(
                _CHECK,
                "documents must be a list of strings or objects with a 'text' string, got "
                + _json_type(value),
            )
        if not value:
            raise PydanticCustomError(_CHECK, "documents is empty: give at least one document")
        texts: list[str] = []
        for i, doc in enumerate(value):
            if isinstance(doc, dict):
                if "text" not in doc:
                    raise PydanticCustomError(_CHECK, f"documents[{i}] has no 'text' field")
                doc = doc["text"]
                where = f"documents[{i}].text"
            else:
                where = f"documents[{i}]"
            if not isinstance(doc, str):
                raise PydanticCustomError(
                    _CHECK,
                    f"{where} must be a string (or an object with a 'text' string), "
                    f"got {_json_type(doc)}",
                )
            if is_blank(doc):
                raise PydanticCustomError(_CHECK, f"{where} is empty: every document needs text "
                                          "(a visible character)")
            texts.append(doc)
        return texts

    def texts(self) -> list[str]:
        """The documents' texts, in request order (the validator normalised them to strings)."""
        return [d if isinstance(d, str) else d.text for d in self.documents]


class RerankResultDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float = Field(
        description="The model's relevance of the document, in (0, 1], never rising down the "
        "results: for SPD one minus its expected position over n under the Sinkhorn-normalised "
        "score matrix; for the scalar peers their score; rank-derived (1 - rank/n) for "
        "documents ranked through sliding windows, whose windows' scores do not compare."
    )
    document: RerankResultDocument | None = Field(
        None, description="Present when return_documents is true."
    )


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class ServeMeta(BaseModel):
    """How the request was served: spdrank's own addition to the common response."""

    batch_size: int = Field(description="Slates in the prefill this request shared.")
    queue_ms: float = Field(description="Admission to start of its batch.")
    inference_ms: float = Field(description="The batch's inference time.")
    total_ms: float = Field(description="Request received to response built.")
    timings_ms: dict[str, float] = Field(description="The batch's stages: tokenize, prefill, ...")
    truncated_documents: list[int] = Field(
        description="Indices (request order) of documents cut to the model's token budget."
    )
    query_truncated: bool = Field(description="The query was cut to its token budget.")


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult] = Field(description="Best first.")
    usage: Usage
    meta: ServeMeta


class ErrorBody(BaseModel):
    message: str = Field(description="What is wrong, naming the field or document index.")
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody


def format_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """One readable message (and the first offending field) from a pydantic error."""
    messages: list[str] = []
    param: str | None = None
    for err in exc.errors(include_url=False):
        loc = _loc(err.get("loc", ()))
        if param is None:
            param = loc or None
        if err.get("type") == _CHECK:
            messages.append(str(err["msg"]))
        elif err.get("type") == "model_type" and not loc:
            messages.append(f"the body must be a JSON object, got {_json_type(err.get('input'))}")
        else:
            messages.append(f"{loc or 'body'}: {err['msg']}")
    return "; ".join(messages), param


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
