"""llama-server's own small endpoints, for the clients written against it (token counting,
the context size, what each slot does): `/tokenize`, `/detokenize`, `/props`, `/slots`.
Its `/completion` and `/infill` answer through the engine (app.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localspec.backends.base import Model
from localspec.decoding.drafters import NoDrafter
from localspec.decoding.events import Stats
from localspec.server.errors import ApiError
from localspec.server.jobs import Job
from localspec.server.schemas import Body, LlamaCompletionRequest
from localspec.server.worker import Slot, Worker

NO_SEED = 4294967295  # llama-server's LLAMA_DEFAULT_SEED: a seed of its own each request


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


def slots(worker: Worker) -> tuple[list[dict[str, Any]], int]:
    """llama-server's GET /slots as it answers by default (figures only, no prompt or
    answer text), and how many slots are idle (for `?fail_on_no_slot=1`)."""
    jobs = worker.jobs()
    return [slot_json(*each) for each in jobs], sum(slot.idle for slot, _job, _running in jobs)


def slot_json(slot: Slot, job: Job | None, running: bool) -> dict[str, Any]:
    """One slot: its context, whether it drafts, and of the request it runs (else the
    last it ran) the sampling, the tokens read and decoded, and its drafts so far."""
    engine = slot.engine
    out: dict[str, Any] = {
        "id": slot.index,
        "n_ctx": engine.target.n_ctx,
        "speculative": not isinstance(engine.drafter, NoDrafter),
        "is_processing": running,
        "n_cached": len(slot.cached),  # localspec's: the tokens its cache holds now
    }
    if job is None:
        return out
    s, sampling, n = job.stats or Stats(), job.config.sampling, job.config.max_tokens
    params: dict[str, Any] = {"seed": NO_SEED if sampling.seed is None else sampling.seed}
    params |= {"temperature": sampling.temperature, "top_k": sampling.top_k}
    params |= {"top_p": sampling.top_p, "min_p": sampling.min_p}
    params |= {"repeat_last_n": sampling.repeat_last_n, "repeat_penalty": sampling.repeat_penalty}
    params |= {"presence_penalty": sampling.presence_penalty}
    params |= {"frequency_penalty": sampling.frequency_penalty, "max_tokens": n, "n_predict": n}
    params |= {"speculative.n_max": engine.gamma, "speculative.n_min": 0}
    return out | {
        "id_task": job.task,
        "n_prompt_tokens": len(job.prompt),
        "n_prompt_tokens_processed": len(job.prompt) - job.cached_tokens,
        "n_prompt_tokens_cache": job.cached_tokens,
        "params": params,
        "next_token": [
            {"has_next_token": running, "n_remain": n - s.tokens, "n_decoded": s.tokens}
        ],
        # localspec's own: what speculation did for it so far
        "drafting": {
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": s.acceptance_rate,
            "gamma": s.gamma,
            "drafters": list(s.drafters),
            "tokens_per_s": s.tokens_per_s,
        },
    }
