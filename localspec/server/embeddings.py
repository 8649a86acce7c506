"""OpenAI's `/v1/embeddings`, answered with the served model's own weights
(localspec.backends.embedding): the agents and RAG tools that index a codebase
(llama.vscode's agent, Continue's @codebase, Open WebUI) need no second server. A
chat model's vectors are coarser than an embedding model's, but close texts land close.

The texts are read beside the slots (a chunk after each of their target passes:
batching.py), so an editor's completion does not wait for an index to be built.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
from pydantic import Field

from localspec.backends.base import Model
from localspec.server.errors import ApiError
from localspec.server.native import token_ids
from localspec.server.schemas import Body

MAX_INPUTS = 2048  # texts in one request, as OpenAI allows


class EmbeddingRequest(Body):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"  # the openai SDKs ask for base64
    dimensions: int | None = Field(None, ge=1)


def token_lists(body: EmbeddingRequest, model: Model, limit: int, size: int) -> list[list[int]]:
    """The request's texts as token lists (token ids where it sent ids), or a 400 that
    names the first one this model cannot embed."""
    if body.dimensions is not None and body.dimensions != size:
        raise ApiError(
            400,
            f"dimensions: this model's embeddings have {size} dimensions, not {body.dimensions}",
            "dimensions",
        )
    inputs = texts_of(body.input)
    if not inputs:
        raise ApiError(400, "input: no text to embed", "input")
    if len(inputs) > MAX_INPUTS:
        raise ApiError(400, f"input: at most {MAX_INPUTS} texts a request", "input")
    lists = []
    for i, text in enumerate(inputs):
        param = f"input[{i}]" if len(inputs) > 1 else "input"
        tokens = model.tokenize(text) if isinstance(text, str) else token_ids(model, text, param)
        if not tokens:
            raise ApiError(400, f"{param}: an empty text has no embedding", "input")
        if len(tokens) > limit:
            raise ApiError(
                400,
                f"{param}: {len(tokens):,} tokens, and this server embeds at most "
                f"{limit:,} a text: cut it into chunks",
                "input",
            )
        lists.append(tokens)
    return lists


def texts_of(given: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """One text, one list of token ids, or a list of either: as a list of texts."""
    if isinstance(given, str):
        return [given]
    if given and isinstance(given[0], int):
        return [cast(list[int], given)]
    return list(cast(list[str] | list[list[int]], given))


def embeddings_body(
    vectors: Sequence[np.ndarray], model_id: str, tokens: int, encoding: str
) -> dict[str, Any]:
    data = [
        {"object": "embedding", "index": i, "embedding": encoded(v, encoding)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model_id, "usage": usage}


def encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: a list of floats, or their little-endian float32
    bytes in base64."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]
