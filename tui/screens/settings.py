"""Settings: system prompt, sampling, max tokens, thinking and its budget, γ and drafter.
Saved on the way out."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Select, Static, TextArea

from localspec.settings import MAX_GAMMA, Settings, SettingsError, updated

GAMMAS = ["auto", *map(str, range(MAX_GAMMA + 1))]
DRAFTERS = [
    ("draft model (the pair's small model)", "model"),
    ("n-grams (repeats from the conversation)", "ngram"),
    ("none (plain decoding)", "none"),
]
THINKING = [  # a thinking model's chat template switch (enable_thinking)
    ("as the model's template has it", "auto"),
    ("on", "on"),
    ("off (it answers at once)", "off"),
]


LABELS = {  # settings.toml's keys, as the form names them
    "temperature": "Temperature",
    "top_p": "Top-p",
    "max_tokens": "Max tokens",
    "reasoning_budget": "Reasoning budget",
}


class SettingsScreen(ModalScreen[Settings | None]):
    """Edit the settings; dismisses with the new Settings, or None when cancelled."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "save", "Save", priority=True),
    ]

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with VerticalScroll(id="settings-dialog", classes="dialog"):
            yield Static("Settings", classes="dialog-title")
            yield Label("System prompt")
            yield TextArea(s.system_prompt, id="system_prompt", soft_wrap=True)
            with Grid(id="settings-grid"):
                yield Label("Temperature (0 = greedy)")
                yield Input(str(s.temperature), id="temperature", type="number")
                yield Label("Top-p")
                yield Input(str(s.top_p), id="top_p", type="number")
                yield Label("Max tokens")
                yield Input(str(s.max_tokens), id="max_tokens", type="integer")
                yield Label("Thinking")
                yield Select(THINKING, value=s.reasoning, id="reasoning", allow_blank=False)
                yield Label("Reasoning budget (-1 = no limit)")
                yield Input(str(s.reasoning_budget), id="reasoning_budget", type="integer")
                yield Label("γ (tokens drafted per round)")
                yield Select(
                    [(g, g) for g in GAMMAS], value=str(s.gamma), id="gamma", allow_blank=False
                )
                yield Label("Drafter")
                yield Select(DRAFTERS, value=s.drafter, id="drafter", allow_blank=False)
            yield Static("", id="settings-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")
        yield Footer(compact=True)  # this screen's keys, not the chat's under it

    def read(self) -> Settings:
        """The settings as the form has them; SettingsError or ValueError when invalid."""

        def value(field: str) -> str:
            return self.query_one(f"#{field}", Input).value.strip()

        gamma = str(self.query_one("#gamma", Select).value)
        return updated(
            self.settings,
            system_prompt=self.query_one("#system_prompt", TextArea).text,
            temperature=_number(value("temperature"), "temperature", float),
            top_p=_number(value("top_p"), "top-p", float),
            max_tokens=_number(value("max_tokens"), "max tokens", int),
            reasoning=self.query_one("#reasoning", Select).value,
            reasoning_budget=_number(value("reasoning_budget"), "reasoning budget", int),
            gamma=gamma if gamma == "auto" else int(gamma),
            drafter=self.query_one("#drafter", Select).value,
        )

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            settings = self.read()
        except SettingsError as e:
            # the form's own name for the field, not the file's key
            text = e.named(LABELS[e.key]) if e.key in LABELS else str(e)
            self.query_one("#settings-error", Static).update(text)
            self.add_class("-invalid")
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


def _number(text: str, name: str, kind: type[int] | type[float]) -> int | float:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise SettingsError(f"{name} must be {what}, not {text!r}") from None
