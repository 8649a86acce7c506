"""The request bodies the server reads, as OpenAI defines them, and what they ask of the
engine. Unknown fields are ignored (clients send many); fields the server cannot honour
(echo, best_of, DRY or mirostat switched on) are refused with a 400 that names them,
never ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, cast

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from localspec.decoding.sampling import SamplingParams
from localspec.server.errors import ApiError

# llama-server's sampling where its own endpoints' requests say nothing (/completion, /infill)
LLAMA_SERVER_DEFAULTS = SamplingParams(temperature=0.8)
MAX_STOPS = 64  # OpenAI allows 4; Continue sends 14 for Qwen-Coder, and users add theirs
MAX_CHOICES = 16  # answers to one request (n, times a batch's prompts): each takes a slot
MAX_PROBS = 100  # n_probs: the likeliest tokens each of /completion's tokens lists
# llama.cpp's other samplers, by the values that turn each off (what llama.vscode's chat
# sends): taken so, refused otherwise, as the speculative sampler does not apply them
SAMPLERS_OFF: dict[str, Callable[[float], bool]] = {
    "typical_p": lambda v: v >= 1,
    "dry_multiplier": lambda v: v == 0,
    "xtc_probability": lambda v: v == 0,
    "dynatemp_range": lambda v: v <= 0,
    "top_n_sigma": lambda v: v <= 0,
    "mirostat": lambda v: v == 0,
}


def no_limit_or_positive(n: int) -> int:
    if n == 0 or n < -1:
        raise PydanticCustomError(
            "token_limit", "must be at least 1, or -1 for as many as the context holds"
        )
    return n


# a token limit: llama-server (and llama.vscode, which sends it) reads -1 as "no limit"
TokenLimit = Annotated[int, AfterValidator(no_limit_or_positive)]
# llama-server's -1 (its default, which clients made for it send): a random seed, as none
Seed = Annotated[int | None, Field(ge=-1), AfterValidator(lambda s: None if s == -1 else s)]


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(Body):
    type: Literal["text"]
    text: str


class OtherPart(Body):
    """A part that is not text (an image, audio, a file): refused with a clear 400."""

    type: str


Content = str | list[TextPart | OtherPart] | None


def refuse_parts(content: Content, where: str) -> None:
    """A 400 for the first part that is not text: the models served take text only."""
    for part in content if isinstance(content, list) else ():
        if isinstance(part, OtherPart):
            kind = "an image" if "image" in part.type else f"a {part.type!r} part"
            raise ApiError(400, f"{where} has {kind}: this model takes text only", where)


def content_text(content: Content) -> str:
    """A message's text: a string, or its text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


class FunctionCall(Body):
    name: str
    arguments: str = "{}"  # JSON, as the model wrote it

    @field_validator("arguments", mode="before")
    @classmethod
    def as_json_text(cls, value: Any) -> Any:
        """An object, as Ollama's clients send a past call's arguments, as its JSON text."""
        return json.dumps(value) if isinstance(value, dict) else value


class ToolCallIn(Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall

    @model_validator(mode="before")
    @classmethod
    def custom_as_function(cls, data: Any) -> Any:
        """A custom tool's call sent back (`{type: custom, custom: {name, input}}`), as
        the function's call the model wrote."""
        if not (isinstance(data, dict) and data.get("type") == "custom"):
            return data
        custom = data.get("custom")
        if not (isinstance(custom, dict) and isinstance(custom.get("input"), str)):
            raise ValueError("a custom tool call is {type: custom, custom: {name, input}}")
        arguments = json.dumps({"input": custom["input"]})
        function = {"name": custom.get("name"), "arguments": arguments}
        return {"id": data.get("id"), "function": function}


class ChatMessageIn(Body):
    # "function": OpenAI's deprecated tool message (ChatRequest.functions)
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None  # the deprecated form of one tool call
    # an assistant's reasoning sent back (llama-server's and vLLM's field): a thinking
    # model's template keeps it for the turn in progress (an agent's calls and results)
    reasoning_content: str | None = None


class FunctionDef(Body):
    model_config = ConfigDict(extra="allow")  # passed to the template as given
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Body):
    type: Literal["function"]
    function: FunctionDef
    # OpenAI's custom tool (free text in, as Codex's apply_patch): to the model, a
    # function of one string, `input`; its calls go out as custom calls
    _custom: bool = PrivateAttr(False)
    # and the grammar its input follows: (syntax, definition), the syntax "lark" or
    # "regex" (localspec.server.lark_gbnf)
    _input_grammar: tuple[str, str] | None = PrivateAttr(None)

    @classmethod
    def of(cls, name: str, description: str | None, parameters: dict[str, Any] | None) -> Tool:
        """A function tool (what other APIs' tools are here)."""
        function = FunctionDef(name=name, description=description, parameters=parameters or {})
        return cls(type="function", function=function)

    @classmethod
    def custom(cls, name: str, description: str | None, fmt: dict[str, Any] | None) -> Tool:
        """A custom tool, its `format` as the Responses API (`{type: grammar, syntax,
        definition}`) or Chat Completions (`{type: grammar, grammar: {...}}`) nest it."""
        fmt = fmt or {}
        grammar = fmt.get("grammar", fmt) if fmt.get("type") == "grammar" else None
        grammar = grammar if isinstance(grammar, dict) else {}
        definition, syntax = grammar.get("definition"), grammar.get("syntax") or "lark"
        described = description or ""
        if definition:  # shown to the model; held to it where GBNF can hold it
            described += f"\n\nThe input follows this {syntax} grammar:\n{definition}"
        tool = cls.of(name, described or None, CUSTOM_PARAMETERS)
        tool._custom = True
        if definition:
            tool._input_grammar = (syntax, definition)
        return tool

    @model_validator(mode="wrap")
    @classmethod
    def custom_as_function(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Tool:
        """Chat Completions' custom tool (`{type: custom, custom: {name, description,
        format}}`), as the function it is to the model."""
        if isinstance(data, dict) and data.get("type") == "custom":
            try:
                custom = CustomDef.model_validate(data.get("custom"))
            except ValidationError:
                raise ValueError(
                    "a custom tool is {type: custom, custom: {name, description, format}}"
                ) from None
            return cls.custom(custom.name, custom.description, custom.format)
        return cast(Tool, handler(data))


def tool_name(tool: Any) -> str | None:
    """A tool's name as Chat Completions nests it (`{type: T, T: {name}}`)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if not isinstance(kind, str) or not isinstance(inner := tool.get(kind), dict):
        return None
    name = inner.get("name")
    return name if isinstance(name, str) else None


class CustomDef(Body):
    name: str
    description: str | None = None
    format: dict[str, Any] | None = None  # text, or a grammar its input follows


# a custom tool's call as the model writes it: its free text in one string
CUSTOM_PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


class NamedFunction(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: NamedFunction

    @classmethod
    def of(cls, name: str) -> NamedToolChoice:
        return cls(type="function", function=NamedFunction(name=name))

    @model_validator(mode="before")
    @classmethod
    def custom_as_function(cls, data: Any) -> Any:
        """A custom tool named (`{type: custom, custom: {name}}`), as its function."""
        if isinstance(data, dict) and data.get("type") == "custom":
            custom = data.get("custom")
            if not (isinstance(custom, dict) and isinstance(custom.get("name"), str)):
                raise ValueError("a custom tool is named as {type: custom, custom: {name}}")
            return {"type": "function", "function": custom}
        return data


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
# OpenAI's and Anthropic's reasoning efforts beyond the three a template's reasoning_effort
# takes (gpt-oss's: low, medium, high), as the nearest of them
EFFORTS = {"none": "low", "minimal": "low", "xhigh": "high", "max": "high"}


class PredictionIn(Body):
    type: Literal["content"]
    content: str | list[TextPart | OtherPart]


class StreamOptions(Body):
    include_usage: bool = False


class GrammarTrigger(Body):
    """llama-server's trigger of a lazy grammar (`grammar_triggers`): type 0 a token (its
    id), 1 a word, 2 a pattern (the grammar reads from its first group, else the match),
    3 a pattern that the whole answer so far matches."""

    type: Literal[0, 1, 2, 3]
    value: str = ""
    token: int | None = None


class GenerationBody(Body):
    """What chat and plain completions share: the model, sampling, stops, streaming."""

    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: TokenLimit | None = None
    # llama-server's own limit, read before max_tokens there (0: only read the prompt,
    # as llama.vscode's warm-up of its chat asks)
    n_predict: int | None = Field(None, ge=-1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    # llama.cpp's own knobs, accepted as llama-server accepts them
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, lt=1)
    repeat_penalty: float | None = Field(None, gt=0)
    repeat_last_n: int | None = Field(None, ge=-1)  # the penalties' window (-1: all)
    seed: Seed = None
    stop: str | list[str] | None = None
    n: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    logit_bias: dict[str, float] | None = None
    grammar: str | None = None  # llama-server's: a GBNF grammar the answer follows
    grammar_lazy: bool = False  # ... from the first of its triggers on
    grammar_triggers: list[GrammarTrigger] | None = None
    ignore_eos: bool | None = None  # llama-server's: the answer runs to its token limit
    typical_p: float | None = None  # these: SAMPLERS_OFF
    dry_multiplier: float | None = None
    xtc_probability: float | None = None
    dynatemp_range: float | None = None
    top_n_sigma: float | None = None
    mirostat: int | None = None

    # what a field the request leaves out takes: OpenAI's temperature and top_p, and
    # localspec's own sampler's top_k and min_p
    DEFAULTS: ClassVar[SamplingParams] = SamplingParams(temperature=1.0, top_p=1.0)
    SCHEMA_PARAM: ClassVar[str] = "response_format.json_schema.schema"  # named in a 400

    def token_limit(self) -> int | None:
        """The answer's token limit as asked (None: not asked; -1: no limit)."""
        return self.max_tokens if self.n_predict is None else self.n_predict

    def logprob_count(self) -> int | None:
        """How many top log-probabilities each token carries (None: no logprobs)."""
        return None

    def sampling(self) -> SamplingParams:
        """The request's sampling, DEFAULTS where it says nothing."""
        defaults = self.DEFAULTS
        window = defaults.repeat_last_n if self.repeat_last_n is None else self.repeat_last_n
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            min_p=defaults.min_p if self.min_p is None else self.min_p,
            repeat_penalty=1.0 if self.repeat_penalty is None else self.repeat_penalty,
            frequency_penalty=self.frequency_penalty or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            repeat_last_n=window,
            logit_bias=self.token_biases(),
            seed=self.seed,
        )

    def token_biases(self) -> tuple[tuple[int, float], ...]:
        """`logit_bias` as (token id, bias) pairs; a 400 for a key that is not a token
        id or a bias outside OpenAI's [-100, 100] (-100 bans a token, 100 all but forces it)."""
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise ApiError(400, f"logit_bias keys are token ids, not {key!r}", "logit_bias")
            if not -100 <= bias <= 100:
                raise ApiError(400, f"logit_bias[{key}] must be in [-100, 100]", "logit_bias")
            pairs.append((int(key), bias))
        return tuple(pairs)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOPS:
            raise ApiError(400, f"at most {MAX_STOPS} stop sequences", "stop")
        return tuple(s for s in stops if s)

    @property
    def choices(self) -> int:
        """Answers asked for each prompt (OpenAI's `n`)."""
        return 1 if self.n is None else self.n

    def refuse_unsupported(self) -> None:
        """A 400 for each field the server cannot honour."""
        if not 1 <= self.choices <= MAX_CHOICES:
            raise ApiError(400, f"n must be between 1 and {MAX_CHOICES}", "n")
        for name, off in SAMPLERS_OFF.items():
            if (value := getattr(self, name)) is not None and not off(value):
                raise ApiError(
                    400,
                    f"{name} {value} is not supported: the samplers here are temperature, "
                    "top_k, top_p, min_p and the repeat, presence and frequency penalties",
                    name,
                )


class ChatRequest(GenerationBody):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: TokenLimit | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: one call at most (OpenAI's default: true)
    # OpenAI's deprecated tools (older LangChain and scripts): read as tools, answered in
    # their own shape (message.function_call; answer.as_function_call)
    functions: list[FunctionDef] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    prediction: PredictionIn | None = None
    response_format: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None  # llama-server's: as response_format's
    # the chat template's own variables (llama-server's and vLLM's): Qwen3's
    # enable_thinking, gpt-oss's reasoning_effort (OpenAI's field sets that one too)
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # llama-server's: "none" leaves the reasoning in the content, as written
    reasoning_format: str | None = None
    # llama-server's (and Anthropic's thinking.budget_tokens): a thinking model's block
    # ends after this many tokens (0: at once), after the message if one is given; -1
    # is the server's own budget, as there
    reasoning_budget_tokens: int | None = Field(
        None,
        ge=-1,
        validation_alias=AliasChoices("reasoning_budget_tokens", "thinking_budget_tokens"),
    )
    reasoning_budget_message: str | None = None

    @field_validator("reasoning_budget_tokens")
    @classmethod
    def servers_budget(cls, value: int | None) -> int | None:
        return None if value == -1 else value

    def token_limit(self) -> int | None:
        if self.n_predict is not None:
            return self.n_predict
        return self.max_completion_tokens or self.max_tokens

    def template_variables(self) -> dict[str, Any]:
        """The chat template's variables this request sets."""
        kwargs = dict(self.chat_template_kwargs or {})
        if (effort := self.reasoning_effort) is not None:
            kwargs.setdefault("reasoning_effort", EFFORTS.get(effort, effort))
            if effort == "none":  # as llama-server's: no thinking, where the template can
                kwargs.setdefault("enable_thinking", False)
        return kwargs

    def custom_names(self) -> frozenset[str]:
        """The custom tools' names: their calls go out as custom calls."""
        return frozenset(t.function.name for t in self.tools or [] if t._custom)

    @model_validator(mode="before")
    @classmethod
    def allowed_tools_only(cls, data: Any) -> Any:
        """`tool_choice: {type: allowed_tools, allowed_tools: {mode, tools}}`: the tools
        it lists, under its mode (auto or required), as OpenAI reads it."""
        choice = data.get("tool_choice") if isinstance(data, dict) else None
        if not (isinstance(choice, dict) and choice.get("type") == "allowed_tools"):
            return data
        allowed = choice.get("allowed_tools")
        allowed = allowed if isinstance(allowed, dict) else {}
        names = {tool_name(t) for t in allowed.get("tools") or []} - {None}
        tools = [t for t in data.get("tools") or [] if tool_name(t) in names]
        if not tools:
            raise ApiError(400, "allowed_tools names none of the request's tools", "tool_choice")
        return data | {"tools": tools, "tool_choice": allowed.get("mode", "auto")}

    @property
    def answers_functions(self) -> bool:
        """Whether the answer takes the deprecated `functions` API's shape."""
        return self.functions is not None or self.function_call is not None

    @model_validator(mode="after")
    def functions_as_tools(self) -> ChatRequest:
        """`functions`, `function_call` and the messages of that API, as the tools, tool
        choice and tool messages they became (a past call gets an id its result takes)."""
        if self.functions is None and self.function_call is None:
            return self
        if self.tools is not None or self.tool_choice is not None:
            raise ValueError(
                "send tools and tool_choice, or the deprecated functions and "
                "function_call: not both"
            )
        self.tools = [Tool(type="function", function=f) for f in self.functions or []]
        self.parallel_tool_calls = False  # its answer has room for one call
        choice = self.function_call
        self.tool_choice = (
            NamedToolChoice.of(choice.name) if isinstance(choice, NamedFunction) else choice
        )
        return self

    @model_validator(mode="after")
    def function_messages_as_tool_messages(self) -> ChatRequest:
        last_id = None
        for i, message in enumerate(self.messages):
            if message.function_call is not None and not message.tool_calls:
                last_id = f"call_{i}"
                message.tool_calls = [ToolCallIn(id=last_id, function=message.function_call)]
            elif message.role == "function":
                message.role, message.tool_call_id = "tool", message.tool_call_id or last_id
        return self

    def logprob_count(self) -> int | None:
        """How many top log-probabilities each token carries (None: no logprobs)."""
        if not self.logprobs:
            if self.top_logprobs:
                raise ApiError(400, "top_logprobs needs logprobs: true", "top_logprobs")
            return None
        return self.top_logprobs or 0

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        for i, message in enumerate(self.messages):
            refuse_parts(message.content, f"messages[{i}].content")


class CompletionRequest(GenerationBody):
    # OpenAI's four shapes: text, token ids, and a batch of one of either (lm-eval's
    # local-completions sends [[ids]])
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    # JSON as a chat asks for it (llama-server reads json_schema here; response_format
    # too, so that a schema is never dropped): the answer follows it, unfenced
    response_format: dict[str, Any] | None = None
    json_schema: dict[str, Any] | None = None

    def logprob_count(self) -> int | None:
        """The legacy API's `logprobs: N`: each token's and its N most likely ones'."""
        if self.logprobs is None or self.logprobs is False:
            return None
        if not 0 <= int(self.logprobs) <= 20:
            raise ApiError(400, "logprobs must be between 0 and 20", "logprobs")
        return int(self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompts, each text or token ids: one, or a batch (each answered `n` times,
        at most MAX_CHOICES answers in all)."""
        prompt = self.prompt
        if isinstance(prompt, str) or all(isinstance(t, int) for t in prompt):
            return [cast(str | list[int], prompt)]
        if len(prompt) * self.choices > MAX_CHOICES:
            raise ApiError(
                400,
                f"{len(prompt)} prompts x n {self.choices} asks for more than "
                f"{MAX_CHOICES} answers",
                "prompt",
            )
        return [cast(str | list[int], p) for p in prompt]

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise ApiError(400, "echo is not supported", "echo")
        if self.best_of not in (None, 1):
            raise ApiError(400, "best_of must be 1", "best_of")


class ProbsAsked(Body):
    """llama-server's n_probs (its /completion and /infill): each token's log-probability
    and its n_probs likeliest, as `completion_probabilities`."""

    n_probs: int = Field(0, ge=0, le=MAX_PROBS)
    post_sampling_probs: bool = False

    def logprob_count(self) -> int | None:
        if self.post_sampling_probs and self.n_probs:
            raise ApiError(
                400,
                "post_sampling_probs is not supported: n_probs alone gives the target's "
                "log-probabilities before sampling",
                "post_sampling_probs",
            )
        return self.n_probs or None


class LlamaCompletionRequest(ProbsAsked, GenerationBody):
    """llama-server's own `POST /completion` (Continue's `llama.cpp` provider, scripts
    written for llama-server): a raw prompt (text, or token ids), no token limit unless
    asked, its sampling defaults (temperature 0.8), `grammar` or `json_schema`."""

    DEFAULTS: ClassVar[SamplingParams] = LLAMA_SERVER_DEFAULTS
    SCHEMA_PARAM: ClassVar[str] = "json_schema"
    prompt: str | list[int]
    json_schema: dict[str, Any] | None = None
    response_fields: list[str] | None = None  # only these ("timings/prompt_n": a path)
    return_tokens: bool = False

    @property
    def response_format(self) -> dict[str, Any] | None:
        if self.json_schema is None:
            return None
        return {"type": "json_schema", "json_schema": {"schema": self.json_schema}}

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.choices != 1:
            raise ApiError(400, "n must be 1 here: /v1/completions answers n times", "n")
