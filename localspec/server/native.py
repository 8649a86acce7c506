"""llama-server's own small endpoints, for the clients written against it (token counting,
the context size): `/tokenize`, `/detokenize`, `/props`. Its `/completion` and `/infill`
answer through the engine (app.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localspec.backends.base import Model
from localspec.server.errors import ApiError
from localspec.server.schemas import Body, LlamaCompletionRequest


class TokenizeRequest(Body):
    content: str
    add_special: bool = False  # BOS where the model has one
    with_pieces: bool = False


class DetokenizeRequest(Body):
    tokens: list[int]


def tokenize(model: Model, body: TokenizeRequest) -> dict[str, Any]:
    """The content's token ids (control tokens parsed, as llama-server does), or with
    `with_pieces` each id with its text (its bytes where they are not UTF-8 alone)."""
    tokens = model.tokenize(body.content, special=True)
    added = model.tokenize("", special=True)  # what tokenize puts first: BOS, or nothing
    if added and not body.add_special and tokens[: len(added)] == added:
        tokens = tokens[len(added) :]
    if not body.with_pieces:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": piece(model.token_bytes(t, True))} for t in tokens]}


def piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def token_ids(model: Model, ids: list[int], param: str) -> list[int]:
    """`ids` as the request gave them, or a 400 naming `param` where one is not the model's."""
    if any(not 0 <= t < model.n_vocab for t in ids):
        raise ApiError(400, f"{param}: token ids must be in [0, {model.n_vocab})", param)
    return list(ids)


def detokenize(model: Model, body: DetokenizeRequest) -> dict[str, Any]:
    text = b"".join(model.token_bytes(t, True) for t in token_ids(model, body.tokens, "tokens"))
    return {"content": text.decode("utf-8", "replace")}


def props(
    model: Model,
    model_id: str,
    slots: int,
    build: str,
    fill: Callable[[LlamaCompletionRequest], LlamaCompletionRequest],
) -> dict[str, Any]:
    """What llama-server's clients read of its /props: each slot's context, the slots,
    the model and its chat template (the generation defaults are /completion's, as
    `fill`, `serve`'s sampling flags or the GGUF's, makes them)."""
    d = fill(LlamaCompletionRequest.model_validate({"prompt": ""})).sampling()
    defaults = {"n_predict": -1, "temperature": d.temperature, "top_k": d.top_k}
    defaults |= {"top_p": d.top_p, "min_p": d.min_p, "repeat_last_n": d.repeat_last_n}
    defaults |= {"repeat_penalty": d.repeat_penalty, "presence_penalty": d.presence_penalty}
    defaults |= {"frequency_penalty": d.frequency_penalty}
    return {
        "default_generation_settings": {"n_ctx": model.n_ctx, "params": defaults},
        "total_slots": slots,
        "model_path": model_id,
        "chat_template": model.chat_template() or "",
        "modalities": {"vision": False, "audio": False},
        "build_info": build,
    }
