"""A loaded pair, ready to answer: what `localspec run`, the chat and the bench share.

`open_session` resolves the models (a .gguf path or a catalog id), loads them, refuses
an incompatible draft before anything runs, and builds the drafter. `Session.chat`
renders a conversation with the target's own chat template; the KV caches keep every
earlier turn, so a new turn only evaluates what is new.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from localspec.backends.base import (
    CHECKPOINT_FROM,
    CHECKPOINT_TAIL,
    LoadFailed,
    Model,
    ModelError,
    check_compatible,
    common_prefix,
    shared_prefix,
)
from localspec.backends.gguf import is_assistant
from localspec.backends.llama import (
    LlamaModel,
    LoadOptions,
    check_gguf,
    supports_gpu_offload,
)
from localspec.backends.mtp import AssistantHead, MtpHead
from localspec.backends.quantize import draft_to_load
from localspec.calibrate import record_cpu_speed, record_timings, seeded
from localspec.decoding.adaptive import auto_engine
from localspec.decoding.budget import ThoughtBudget
from localspec.decoding.drafters import (
    Drafter,
    DraftModel,
    HeadSteps,
    MtpDrafter,
    NgramDrafter,
    NoDrafter,
)
from localspec.decoding.engine import Engine, GenerationConfig
from localspec.decoding.events import Event
from localspec.drafting import GAMMA_MAX, MODEL_FREE_DRAFTERS
from localspec.errors import LocalspecError
from localspec.thinking import (
    CONTROL_MARKS,
    Switch,
    Thinking,
    opens_thinking,
    without_reasoning,
)
from localspec.window import answer_room, kept_first, window_start

log = logging.getLogger(__name__)


class Message(TypedDict):
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass(frozen=True)
class SessionConfig:
    target: str  # .gguf path or catalog id
    draft: str = "none"  # .gguf path, catalog id, "ngram" or "none"
    gamma: int | str = 4  # a number, or "auto" (adaptive)
    target_load: LoadOptions = field(default_factory=LoadOptions)
    draft_load: LoadOptions = field(default_factory=LoadOptions)
    p_min: float = 0.5
    draft_quant: str = "auto"  # "auto": on a CPU, draft with a Q4_0 copy; "keep"


def resolve_model(spec: str) -> Path:
    """A path to a .gguf file, or a catalog id of an installed model."""
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" or path.exists() or "/" in spec:
        return path
    from localspec.models.resolve import resolve_installed  # only when not a path

    return resolve_installed(spec)


def resolve_file(spec: str) -> Path:
    """resolve_model's path, refused in one line where nothing is there."""
    path = resolve_model(spec)
    if not path.exists():
        raise LocalspecError(f"model file not found: {path}")
    return path


class Session:
    def __init__(
        self,
        engine: Engine,
        draft_model: LlamaModel | None = None,
        config: SessionConfig | None = None,
    ) -> None:
        self.engine = engine
        self.config = config  # how the engine was made, to make more (serve's slots)
        self.target = engine.target
        self.draft_model = draft_model
        self.head: MtpHead | None = None  # the target's MTP head, where it drafts
        self._template: Callable[..., Any] | None = None  # a Jinja2ChatFormatter
        self.notes: list[str] = list(engine.notes)  # what loading had to give up, for the user
        # the chat template's variables for every conversation (--chat-template-kwargs)
        self.template_kwargs: dict[str, Any] = {}
        # a thinking model's reasoning ends after this many tokens (--reasoning-budget)
        self.reasoning_budget: int | None = None
        self.lock = threading.Lock()  # one generation at a time per loaded pair
        self.made: list[Engine] = []  # engines made for serve's slots (`engine_for`)

    @property
    def drafter(self) -> Drafter:
        return self.engine.drafter

    def around(self, engine: Engine) -> Session:
        """This session's models and conversation settings (the template's variables,
        the reasoning budget) around another engine: the chat's drafter and γ."""
        other = Session(engine, self.draft_model)
        other.template_kwargs = self.template_kwargs
        other.reasoning_budget = self.reasoning_budget
        return other

    def engine_for(
        self,
        target: Model,
        draft_model: Model | None,
        head: MtpHead | None = None,
        seq: int = 0,
        steps: HeadSteps | None = None,
    ) -> Engine:
        """An engine like the session's over other models (views of sequence `seq` of the
        session's, for serve's slots): the same drafter kind and γ, statistics afresh;
        `head`: the session's MTP head (a target's own, or Gemma 4's assistant), which
        drafts for every slot over its sequence, its steps run by `steps` (serve's
        shared passes)."""
        if self.config is None:
            raise ModelError("this session cannot make more engines (no config)")
        engine = seeded(make_engine(target, draft_model, self.config, head, seq, steps))
        self.made.append(engine)  # what it times is kept when the session closes
        return engine

    def render(self, messages: Sequence[Message]) -> list[int]:
        """The conversation as prompt tokens, through the GGUF's chat template."""
        return self.target.tokenize(self.prompt_text(messages), special=True)

    def prompt_text(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The conversation through the GGUF's chat template, as text; `tools` (OpenAI's
        function descriptions) reach templates that describe tools to the model;
        `template_kwargs` (over the session's own) are the template's other variables."""
        if self._template is None:
            self._template = _formatter(self.target)
        kwargs = {**self.template_kwargs, **(template_kwargs or {})}
        return self._template(messages=list(messages), tools=tools, **kwargs).prompt

    def message_marks(
        self,
        messages: Sequence[Mapping[str, Any]],
        text: str,
        tokens: Sequence[int],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> tuple[int, ...]:
        """Where the first and the last message from the user (or a tool) begin in
        `tokens`, the prompt `text` that `messages` render to: a recurrent target keeps
        its state there (GenerationConfig.marks), as llama-server does at user messages;
        none for other targets, which cut their cache anywhere. Each is where the text
        the template writes before that message's content (rendered with other content)
        parts from `text`, a token early: a header's last token may join the content's.

        Also marked, where calls and results follow the last message from the user (an
        agent's task), is where that message's own prompt kept its copy, before its end:
        a thinking model's template writes the task's calls otherwise once the next task
        comes (Qwen3.5's keeps the reasoning after the last message from the user only),
        so the next task's prompt parts from this one just past that copy, which stays
        through the task as a mark of each of its prompts (Checkpoints.take)."""
        if self.target.cut_depth is None:
            return ()
        starts = [k for k, m in enumerate(messages) if m.get("role") in ("user", "tool")]
        asked = [k for k in starts if messages[k].get("role") == "user"][-1:]
        marks = []
        for k in sorted({starts[0], starts[-1]}) if starts else ():
            probe = [*messages[:k], {**messages[k], "content": "\x01"}]
            try:
                before = self.prompt_text(probe, tools, template_kwargs)
            except Exception:  # a template that refuses it: no mark there
                continue
            head = self.target.tokenize(text[: common_prefix(before, text)])
            if (mark := shared_prefix(head, tokens) - 1) >= CHECKPOINT_FROM:
                marks.append(mark)
        if asked and asked[0] < len(messages) - 1:
            # the copy the task's own prompt kept CHECKPOINT_TAIL tokens before its end:
            # past the task's words, before the answer the next task writes otherwise
            with contextlib.suppress(Exception):  # a template that refuses it: none
                task = self.prompt_text(messages[: asked[0] + 1], tools, template_kwargs)
                first = self.target.tokenize(task)
                end = len(first) - CHECKPOINT_TAIL
                if shared_prefix(first, tokens) >= end >= CHECKPOINT_FROM:
                    marks.append(end)
        return tuple(sorted(set(marks)))

    @property
    def thinking_switch(self) -> bool:
        """Whether the chat template turns thinking on and off by `enable_thinking`: a
        turn renders otherwise with it true than false (llama.cpp's test too)."""
        if not self.target.chat_template():
            return False  # (a model for plain completion)
        turn = [{"role": "user", "content": "Hi"}]
        both = {
            self.prompt_text(turn, template_kwargs={"enable_thinking": b}) for b in (True, False)
        }
        return len(both) == 2

    def switch_note(self, switch: Switch) -> str | None:
        """A line where turning thinking `switch` does nothing here (None: it does)."""
        if switch == "auto" or self.thinking_switch:
            return None
        name = self.target.name
        if opens_thinking(self.target.chat_template(), "") is None:
            return (
                f"{name} does not think (its chat template has no reasoning): thinking "
                f"{switch} changes nothing"
            )
        if switch == "on":
            return None  # it thinks without being asked
        return (
            f"{name}'s chat template has no switch for thinking: it thinks anyway (a "
            "reasoning budget of 0 ends its reasoning at once)"
        )

    @property
    def supports_tools(self) -> bool:
        """Whether the target's chat template has a place for tools."""
        return "tools" in (self.target.chat_template() or "")

    def tokenize_raw(self, text: str) -> list[int]:
        return self.target.tokenize(text, special=True)

    def stop_reads_on(self, cancel: threading.Event | None) -> None:
        """The models' long reads (a prompt, a draft model catching up) stop between
        chunks once `cancel` is set, keeping what they read (None: they never stop)."""
        for model in (self.target, self.draft_model):
            if model is not None:
                model.cancel = cancel

    def chat(
        self,
        messages: Sequence[Message],
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        """The answer to a conversation; a thinking model's reasoning marks show in its
        text, where `thinking` splits them off, and its reasoning ends within the
        session's budget."""
        template = self.target.chat_template()
        marks = [m for m in CONTROL_MARKS if m in (template or "")]
        if marks:
            config = replace(config, shown=config.shown | shown_tokens(self.target, marks))
        history = self.history(messages)
        text = self.prompt_text(history)  # rendered once, read twice
        budget = self.reasoning_budget
        if budget is not None and (thinking := opens_thinking(template, text)) is not None:
            grammar = ThoughtBudget.of(
                self.target, thinking.block, budget, opened=thinking.opened, inner=config.grammar
            )
            config = replace(config, grammar=grammar)
        tokens = self.target.tokenize(text, special=True)
        config = replace(config, marks=self.message_marks(history, text, tokens))
        return self.engine.generate(tokens, config, cancel)

    def thinking(self, messages: Sequence[Message]) -> Thinking | None:
        """How the answer to `messages` holds its reasoning (None: the model does not
        think), by the chat template and whether the prompt opened the block."""
        template = self.target.chat_template()
        if opens_thinking(template, "") is None:
            return None
        return opens_thinking(template, self.prompt_text(self.history(messages)))

    def window(self, messages: Sequence[Message], kept: int, max_tokens: int) -> int:
        """The first message of `messages` (after a system prompt, which stays) that the
        next prompt of a chat holds: `kept`, where the last turn's began, until the
        conversation outgrows the context (localspec.window)."""
        head = kept_first(messages)
        starts = [i for i, m in enumerate(messages) if i >= head and m["role"] == "user"]

        def length(i: int) -> int:
            return len(self.render(self.history([*messages[:head], *messages[i:]])))

        n_ctx = self.engine.room(0)  # the smaller of the two models' contexts
        return window_start(starts, length, max(kept, head), n_ctx, answer_room(max_tokens, n_ctx))

    def history(self, messages: Sequence[Message]) -> list[Message]:
        """A conversation as saved (each answer as it streamed) as the next turn's prompt
        shows it: the answers without their reasoning (see `without_reasoning`)."""
        template = self.target.chat_template()
        return [
            {**m, "content": without_reasoning(template, m["content"])}
            if m["role"] == "assistant"
            else m
            for m in messages
        ]

    def complete(
        self,
        text: str,
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        return self.engine.generate(self.tokenize_raw(text), config, cancel)

    def close(self) -> None:
        if self.head is not None:
            self.head.close()
        record_cpu_speed(self.target)
        record_timings(self.engine, *self.made)
        self.target.close()
        if self.draft_model is not None:
            self.draft_model.close()


# what the chat formatter passes the template itself
TEMPLATE_OWN = frozenset(
    {"messages", "tools", "functions", "function_call", "tool_choice", "bos_token", "eos_token"}
    | {"add_generation_prompt", "raise_exception", "strftime_now"}
)


class TemplateKwargsError(LocalspecError):
    """Chat-template variables that cannot be used; one line that says which."""


def template_kwargs(value: Any) -> dict[str, Any]:
    """Variables for the chat template, as llama-server's `chat_template_kwargs` gives
    them (Qwen3's `enable_thinking`, gpt-oss's `reasoning_effort`): an object whose
    names are not the ones the formatter passes itself."""
    if not isinstance(value, dict):
        raise TemplateKwargsError("chat template kwargs must be a JSON object")
    if own := sorted(TEMPLATE_OWN & set(value)):
        raise TemplateKwargsError(
            f"chat template kwargs cannot set {', '.join(own)}: localspec passes them itself"
        )
    return dict(value)


def shown_tokens(model: Model, markers: list[str]) -> frozenset[int]:
    """The control tokens among a format's markers (Gemma 4's call and thought marks,
    Harmony's message end), which the answer shows so that its parser reads them."""
    bos, _ = model.special_ids
    shown = set()
    for marker in markers:
        tokens = [t for t in model.tokenize(marker, special=True) if t != bos]
        if len(tokens) == 1 and not model.token_bytes(tokens[0]):
            shown.add(tokens[0])
    return frozenset(shown)


def _formatter(model: Model) -> Callable[..., Any]:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = model.chat_template()
    if not template:
        raise ModelError(f"{model.name} has no chat template; use --raw for plain completion")
    bos, eos = model.special_ids
    return Jinja2ChatFormatter(
        template=template,
        bos_token=model.token_text(bos) if bos >= 0 else "",
        eos_token=model.token_text(eos) if eos >= 0 else "",
        add_generation_prompt=True,
    )


def open_session(config: SessionConfig, say: Callable[[str], None] = lambda _line: None) -> Session:
    """Load the target and the drafter named in `config`. When llama.cpp cannot load
    them (memory, mostly), back off: a smaller context, then fewer target layers on the
    GPU, then no draft model; each step is told through `say`."""
    config = with_cpu_draft(config, say)
    failure: LoadFailed | None = None
    failed = config
    for attempt, change in backoff(config):
        if failure is not None:
            if fails_again(attempt, failed, failure):
                continue
            say(f"{failure}; retrying with {change}")
        try:
            session = _load(attempt)
        except LoadFailed as e:
            failure, failed = e, attempt
            continue
        for note in session.notes:  # what loading this attempt noticed
            say(note)
        if failure is not None:
            session.notes.append(f"loaded with {change} ({failure})")
        return session
    assert failure is not None
    raise failure


def backoff(config: SessionConfig) -> Iterator[tuple[SessionConfig, str]]:
    """The config, then ever smaller ones: context, target GPU layers, draft."""
    yield config, "the planned settings"
    load = config.target_load
    n_ctx = load.n_ctx
    while n_ctx > 1024:
        n_ctx //= 2
        load = replace(load, n_ctx=n_ctx)
        draft_load = replace(config.draft_load, n_ctx=n_ctx)
        config = replace(config, target_load=load, draft_load=draft_load)
        yield config, f"a context of {n_ctx} tokens"
    layers = load.n_gpu_layers if load.n_gpu_layers >= 0 else 64
    while layers > 0 and supports_gpu_offload():
        layers //= 2
        config = replace(config, target_load=replace(config.target_load, n_gpu_layers=layers))
        yield config, f"{layers} target layers on the GPU"
    if config.draft not in MODEL_FREE_DRAFTERS:
        yield replace(config, draft="ngram"), "n-gram drafting instead of the draft model"


def fails_again(attempt: SessionConfig, failed: SessionConfig, failure: LoadFailed) -> bool:
    """Whether `attempt` is the `failed` one with a context no smaller than the one that
    could not be allocated: a context asked beyond a model's training is capped there,
    so the first halvings of a huge `--ctx` would load the same one again."""
    if failure.n_ctx is None:
        return False
    return (
        _without_ctx(attempt) == _without_ctx(failed) and attempt.target_load.n_ctx >= failure.n_ctx
    )


def _without_ctx(config: SessionConfig) -> SessionConfig:
    return replace(
        config,
        target_load=replace(config.target_load, n_ctx=0),
        draft_load=replace(config.draft_load, n_ctx=0),
    )


def with_cpu_draft(config: SessionConfig, say: Callable[[str], None]) -> SessionConfig:
    """`config` with the draft file to load: on a CPU, its Q4_0 copy (see quantize.py)."""
    if config.draft in MODEL_FREE_DRAFTERS:
        return config
    draft = resolve_model(config.draft)
    path = draft_to_load(
        draft,
        draft_on_gpu(config.draft_load),
        config.draft_quant,
        say,
        target=resolve_model(config.target),
    )
    return config if path == draft else replace(config, draft=str(path))


def _load(config: SessionConfig) -> Session:
    draft_path = None if config.draft in MODEL_FREE_DRAFTERS else resolve_model(config.draft)
    assistant = draft_path if draft_path is not None and is_assistant(draft_path) else None
    if assistant is not None:  # Gemma 4's drafter reads the target's context: its head
        draft_path = None
    # a hybrid target (Qwen3.5) keeps snapshots of its recurrent state to roll a rejected
    # draft back to; other models ignore this
    rollback = 0 if config.draft == "none" else GAMMA_MAX
    mtp = config.draft == "mtp"
    target_load = replace(config.target_load, rollback=rollback, mtp=mtp)
    target, draft_model = load_pair(
        resolve_model(config.target), target_load, draft_path, config.draft_load
    )
    head = None
    if mtp or assistant is not None:
        try:
            head = MtpHead(target) if assistant is None else AssistantHead(target, assistant)
        except BaseException:
            target.close()
            raise
    session = Session(seeded(make_engine(target, draft_model, config, head)), draft_model, config)
    session.head = head
    if target.n_ctx < config.target_load.n_ctx:
        session.notes.append(
            f"context capped at {target.n_ctx} tokens: {target.name} was trained for that"
        )
    return session


def load_pair(
    target_path: Path, target_load: LoadOptions, draft_path: Path | None, draft_load: LoadOptions
) -> tuple[LlamaModel, LlamaModel | None]:
    """Target and draft (if any), checked compatible; nothing stays loaded on a failure.
    The draft loads first: a CPU target's prompt reader is weighed against the RAM the
    draft left (and a bad target file is told of before either loads)."""
    check_gguf(target_path)
    draft = LlamaModel(draft_path, draft_load) if draft_path is not None else None
    target: LlamaModel | None = None
    try:
        target = LlamaModel(target_path, target_load)
        if draft is not None:
            check_compatible(target, draft)
    except BaseException:
        for model in (target, draft):
            if model is not None:
                model.close()
        raise
    return target, draft


def draft_on_gpu(load: LoadOptions) -> bool:
    """Whether a model loaded with `load` goes (at least partly) to a GPU."""
    return load.n_gpu_layers != 0 and supports_gpu_offload()


def make_engine(
    target: Model,
    draft_model: Model | None,
    config: SessionConfig,
    head: MtpHead | None = None,
    seq: int = 0,
    steps: HeadSteps | None = None,
) -> Engine:
    """The drafter the config names: none, n-grams, the draft model or the target's MTP
    head (n-grams where it has none to give), fixed or auto."""
    if config.draft == "none":
        return Engine(target, NoDrafter(), 0)
    mtp = MtpDrafter(head, config.p_min, seq, steps) if head is not None else None
    if config.gamma == "auto":
        return auto_engine(target, draft_model, mtp, verify_growth(target))
    if not isinstance(config.gamma, int):
        raise ModelError(f"gamma must be a number or 'auto', not {config.gamma!r}")
    drafter: Drafter = mtp or (
        NgramDrafter() if draft_model is None else DraftModel(draft_model, config.p_min)
    )
    return Engine(target, drafter, config.gamma)


def verify_growth(target: Model) -> tuple[float, ...]:
    """T(k)/T(1) at least, k = 1..PREDICTION_GAMMA_MAX+1, for a MoE target read from its
    GGUF (the experts a pass of k tokens reads, beside the pass's fixed cost where the
    model lies); () for a dense one, or no file."""
    model = getattr(target, "shared", target)  # a slot's: its model's
    path, options = getattr(model, "path", None), getattr(model, "options", None)
    if not isinstance(path, Path) or not isinstance(options, LoadOptions):
        return ()
    return _moe_growth(path, options)


@cache
def _moe_growth(path: Path, options: LoadOptions) -> tuple[float, ...]:
    from localspec.decoding.estimates import TABLE_SIZE
    from localspec.models.hardware import probe
    from localspec.models.memory import moe_weights
    from localspec.models.speed import batch_growth

    weights = moe_weights(path)
    if weights is None:
        return ()
    layers = options.n_gpu_layers if options.n_gpu_layers >= 0 else len(weights.layers) + 1
    if not draft_on_gpu(options) or options.rpc:  # rpc-servers are priced as a CPU
        layers = 0
    hw = probe()
    return tuple(
        batch_growth(weights, k, layers, hw, options.cpu_moe) for k in range(1, TABLE_SIZE + 1)
    )
