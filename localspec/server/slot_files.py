"""A slot's cache in a file and back (llama-server's `POST /slots/{id}?action=save`,
`restore`, `erase`, in the directory --slot-save-path names): a long prompt read once
comes back after a restart in the time a copy takes (an agent's system prompt of 2,900
tokens, read in 14.6 s on two CPU cores, in 0.2 s). The file holds every part of the
slot's cache (the target's, the draft model's, an MTP head's: llama.cpp's sequence
states) with the tokens each holds, and the model files they belong to: a cache of
other weights would load without complaint and answer nonsense, so it is refused.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

from localspec.models.calibration import file_id
from localspec.paths import write_atomic
from localspec.server.errors import ApiError
from localspec.server.prompt_cache import Holder
from localspec.server.schemas import Body
from localspec.server.worker import Slot

MAGIC = b"localspec slot cache 1\n"  # then one line of JSON, then the states' bytes


class SlotFileRequest(Body):
    filename: str


def checked_name(name: str) -> str:
    """A file name in the save directory (no path, as llama-server's
    `fs_validate_filename`), or a 400."""
    if (
        name in ("", ".", "..")
        or len(name.encode()) > 255
        or any(c in "/\\:" or ord(c) < 32 for c in name)
    ):
        raise ApiError(400, "filename: a file name without a path", "filename")
    return name


def model_ids(slot: Slot) -> list[str]:
    """The model files whose caches the slot holds, by name and size, and how their
    contexts lay the slots' caches out (llama.cpp's states are in that layout)."""
    ids = []
    for model in slot.models:
        loaded = getattr(model, "shared", model)  # a slot's view: the model it views
        path, n_seq = getattr(loaded, "path", None), getattr(loaded, "n_seq", 1)
        name = file_id(path) if isinstance(path, Path) else model.name
        caches = "in one cache" if getattr(loaded, "kv_unified", False) else "a cache each"
        ids.append(f"{name}, {n_seq} slot{'s' * (n_seq > 1)} {caches}" if n_seq > 1 else name)
    return ids


def save(slot: Slot, path: Path) -> dict[str, Any]:
    """The slot's cache written to `path` (atomically: a reader of the directory never
    sees half a file), as llama-server answers it."""
    started = time.perf_counter()
    parts: list[tuple[list[int], bytearray]] = []
    for holder in slot.holders:
        state = holder.save_state()
        if state is None:
            raise ApiError(500, "llama.cpp could not copy the slot's cache", code="server_error")
        parts.append((list(holder.cached), state))
    tokens = list(slot.cached)
    head = {"models": model_ids(slot), "tokens": tokens}
    head["parts"] = [{"tokens": t, "bytes": len(state)} for t, state in parts]
    chunks: list[bytes | bytearray] = [MAGIC, json.dumps(head).encode() + b"\n"]
    chunks += [state for _t, state in parts]
    write_atomic(path, chunks)
    took = (time.perf_counter() - started) * 1e3
    return {
        "id_slot": slot.index,
        "filename": path.name,
        "n_saved": len(tokens),
        "n_written": sum(map(len, chunks)),
        "timings": {"save_ms": took},
    }


def restore(slot: Slot, path: Path) -> dict[str, Any]:
    """The slot's cache as `save` wrote it to `path`; a 400 where the file is not one,
    holds other models' caches or more than the slot's context, or where llama.cpp
    finds no room for it (the slot then empty)."""
    started = time.perf_counter()
    try:
        with path.open("rb") as f:
            head, states = read_slot(f, path.name)
    except OSError as e:
        raise ApiError(400, f"no saved slot {path.name!r} ({e.strerror})", "filename") from e
    if head["models"] != model_ids(slot):
        raise ApiError(
            400,
            f"{path.name!r} holds the caches of {'; '.join(head['models'])}, not of "
            f"{'; '.join(model_ids(slot))} (the same files and --parallel restore it)",
            "filename",
        )
    if len(head["tokens"]) > (n_ctx := slot.engine.target.n_ctx):
        raise ApiError(
            400,
            f"{path.name!r} holds {len(head['tokens'])} tokens, more than "
            f"this slot's context of {n_ctx}",
            "filename",
        )
    if not load(slot.holders, head["parts"], states):
        raise ApiError(
            400,
            f"llama.cpp found no room for {path.name!r} in the slots' cache (the slot is "
            "empty now)",
            "filename",
        )
    took = (time.perf_counter() - started) * 1e3
    return {
        "id_slot": slot.index,
        "filename": path.name,
        "n_restored": len(head["tokens"]),
        "n_read": path.stat().st_size,
        "timings": {"restore_ms": took},
    }


def erase(slot: Slot) -> dict[str, Any]:
    n = len(slot.cached)
    for holder in slot.holders:
        holder.reset()
    return {"id_slot": slot.index, "n_erased": n}


def read_slot(f: io.BufferedReader, name: str) -> tuple[dict[str, Any], list[bytearray]]:
    """A saved slot's head and its states, each read once into its own buffer (a 14B
    target's cache of 8k tokens is 1.6 GB), or a 400."""
    try:
        if f.read(len(MAGIC)) != MAGIC:
            raise ValueError("not a saved slot")
        head = json.loads(f.readline())
        if not all(isinstance(head[k], list) for k in ("models", "tokens", "parts")):
            raise ValueError("a head of another shape")
        states = []
        for part in head["parts"]:
            part["tokens"] = [int(t) for t in part["tokens"]]
            state = bytearray(part["bytes"])
            if f.readinto(state) != len(state):
                raise ValueError("cut short")
            states.append(state)
        if f.read(1):
            raise ValueError("more than it says")
    except (ValueError, KeyError, TypeError) as e:
        raise ApiError(400, f"{name!r} is not a slot localspec saved ({e})", "filename") from e
    return head, states


def load(holders: list[Holder], parts: list[dict[str, Any]], states: list[bytearray]) -> bool:
    """Each holder's state back; where one does not fit, every holder emptied."""
    if len(parts) != len(holders):
        return False
    if all(h.load_state(p["tokens"], s) for h, p, s in zip(holders, parts, states, strict=True)):
        return True
    for holder in holders:
        holder.reset()
    return False
