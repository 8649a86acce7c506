"""The conversation as it is shown: user messages, and answers that stream in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from localspec.conversations import Conversation
from localspec.thinking import split_answer, written_thinking
from tui.figures import summary_line
from tui.reasoning import REASONING, split_runs

# stop reason -> the answer's status (a CSS class on the answer: -done, -stopped, ...)
STATUS = {"cancelled": "stopped", "interrupted": "stopped", "error": "error"}

WELCOME = (
    "Ask anything. **Enter** sends, **Shift+Enter** or **Ctrl+J** adds a line, "
    "**Esc** stops the answer. **Ctrl+T** colours each piece of an answer by who chose it: "
    "the draft model (accepted) or the target. **Ctrl+B** shows or hides the stats panel "
    "(hidden below 100 columns)."
)


class UserMessage(Static):
    """What the user sent, as typed."""

    def __init__(self, text: str) -> None:
        super().__init__(Text(text), markup=False)


class ProvenanceView(Widget):
    """An answer as plain text, each run coloured by its source (styles in the .tcss)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"provenance--draft", "provenance--target"}

    def __init__(self, spans: list[list[str]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.spans = spans  # shared with the Answer, which appends to it

    def render(self) -> Text:
        styles = {
            source: self.get_component_rich_style(f"provenance--{source}")
            for source in ("draft", "target")
        }
        return Text.assemble(*((text, styles.get(src, "")) for text, src in self.spans))


class Answer(Vertical):
    """An answer: a thinking model's reasoning (a block that folds once the answer
    proper begins), Markdown while it streams, the provenance view, and a summary line."""

    status: reactive[str] = reactive("streaming")
    """streaming, done, stopped or error: a CSS class (-done, ...) styles the answer."""

    summary: reactive[str] = reactive("")
    """The line under the answer once it ends."""

    def __init__(
        self,
        answer_id: int | None,
        content: str = "",
        spans: Sequence[tuple[str, str]] = (),
        status: str = "streaming",
        summary: str = "",
    ) -> None:
        super().__init__()
        self.answer_id = answer_id
        self.spans: list[list[str]] = [[t, s] for t, s in spans if s != REASONING]
        self.reasoning = "".join(t for t, s in spans if s == REASONING)
        self._content = content
        self._stream: MarkdownStream | None = None
        self._ended = status != "streaming"
        self._shown = False  # ended, and all of its Markdown mounted: it has its height
        self.folded = False
        self.set_reactive(Answer.status, status)
        self.set_reactive(Answer.summary, summary)
        self.add_class(f"-{status}")
        self.set_class(bool(self.reasoning), "-thinking")

    def compose(self) -> ComposeResult:
        thought = Static(Text(self.reasoning), classes="answer-reasoning-text", markup=False)
        # shown where the answer has reasoning (the class -thinking: folding an answer
        # sets and resets its children's display)
        yield Collapsible(
            thought, title="Reasoning", collapsed=bool(self._content), classes="answer-reasoning"
        )
        yield Markdown(self._content, classes="answer-markdown")
        yield ProvenanceView(self.spans, classes="answer-provenance")
        yield Static(self.summary, classes="answer-summary", markup=False)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)

    async def add(self, runs: Sequence[tuple[str, str]]) -> None:
        """Append (text, source) runs; a no-op once the answer has ended."""
        if self._ended:
            return
        if thought := "".join(text for text, source in runs if source == REASONING):
            self._think(thought)
        runs = [(text, source) for text, source in runs if source != REASONING]
        if not runs:
            return
        if self.reasoning and not self.spans:  # the answer proper begins: fold the thought
            self.query_one(Collapsible).collapsed = True
        for text, source in runs:
            if self.spans and self.spans[-1][1] == source:
                self.spans[-1][0] += text
            else:
                self.spans.append([text, source])
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(Markdown))
        await self._stream.write("".join(text for text, _ in runs))
        view = self.query_one(ProvenanceView)
        if view.display:  # a hidden one renders its spans as they are when it is shown
            view.refresh(layout=True)

    def _think(self, text: str) -> None:
        self.reasoning += text
        self.add_class("-thinking")
        self.query_one(".answer-reasoning-text", Static).update(Text(self.reasoning))

    def stop(self) -> None:
        """Marked stopped at once; what the engine had already sent still arrives."""
        self.status = "stopped"
        self.summary = summary_line("cancelled", {})

    async def end(self, status: str, summary: str) -> None:
        """No more text: finish the Markdown stream and show the summary."""
        self._ended = True
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.stop()
        self.status = status
        self.summary = summary
        self._shown = True

    def on_markdown_table_of_contents_updated(self, event: Markdown.TableOfContentsUpdated) -> None:
        """A saved answer's Markdown is parsed and mounted after the answer is."""
        event.stop()
        if self._ended and not self._shown:
            self._shown = True
            if isinstance(self.parent, Transcript):
                self.parent.fold_later()

    def fold(self) -> None:
        """Hide an ended answer's contents and keep its height: a blank box of the size it
        had, which a layout passes over as one widget instead of every Markdown block."""
        if self._shown and not self.folded and self.outer_size.height:  # laid out
            self.folded = True
            self.styles.height = self.outer_size.height
            for child in self.children:
                child.styles.display = "none"

    def unfold(self) -> None:
        if self.folded:
            self.folded = False
            self.styles.height = None  # back to the stylesheet's (the setter lays out again)
            for child in self.children:
                child.styles.display = None

    def watch_status(self, old: str, new: str) -> None:
        self.remove_class(f"-{old}")
        self.add_class(f"-{new}")

    def watch_summary(self, summary: str) -> None:
        if self.is_mounted:
            self.query_one(".answer-summary", Static).update(summary)


class Transcript(VerticalScroll):
    """The scrolling conversation; it follows new text unless the user scrolls up.

    Answers more than a screen out of view are folded (`Answer.fold`). Textual lays out
    every widget of the screen whenever one changes size, as a streaming answer does, so
    unfolded, each answer in a chat makes every later redraw dearer; folding takes most
    of that back (docs/chat-performance.md, scripts/redraw_cost.py).
    """

    _fold_pending = False
    _laid_out_width = 0

    def on_mount(self) -> None:
        self.anchor()
        self.clear()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.fold_later()

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != self._laid_out_width:  # answers change height with the width
            self._laid_out_width = event.size.width
            self.refold()

    def refold(self) -> None:
        """Unfold all, and fold again once laid out: for what changes an answer's height
        (the width, the provenance view)."""
        for answer in self.query_children(Answer):
            answer.unfold()
        self.fold_later()

    def fold_later(self) -> None:
        """Fold and unfold once the screen is laid out (many scroll steps, one pass)."""
        if not self._fold_pending:
            self._fold_pending = True
            self.call_after_refresh(self._fold_out_of_view)

    def _fold_out_of_view(self) -> None:
        self._fold_pending = False
        height = self.scrollable_content_region.height
        top, bottom = self.scroll_y - height, self.scroll_y + 2 * height
        for answer in self.query_children(Answer):
            region = answer.virtual_region
            if region.bottom < top or region.y > bottom:
                answer.fold()
            else:
                answer.unfold()

    def clear(self) -> None:
        self.remove_children()
        self.mount(Markdown(WELCOME, id="welcome"))

    def _drop_welcome(self) -> None:
        for welcome in self.query("#welcome"):
            welcome.remove()

    async def add_turn(self, text: str, answer_id: int) -> Answer:
        """The user's message and an empty answer, mounted before any piece arrives."""
        self._drop_welcome()
        answer = Answer(answer_id)
        await self.mount_all([UserMessage(text), answer])
        self.anchor()
        self.fold_later()
        return answer

    def answer(self, answer_id: int) -> Answer | None:
        for answer in self.query(Answer):
            if answer.answer_id == answer_id:
                return answer
        return None

    def show(self, conversation: Conversation) -> None:
        """Replace the transcript with a saved conversation."""
        self.remove_children()
        widgets: list[Widget] = []
        for m in conversation.messages:
            if m.role == "user":
                widgets.append(UserMessage(m.content))
            elif m.role == "assistant":
                status = STATUS.get(m.stop_reason or "", "done")
                summary = summary_line(m.stop_reason or "", m.stats)
                content, spans = m.content, list(m.spans)
                if thinking := written_thinking(content):
                    content = split_answer(thinking, content)[1]
                    spans = split_runs(thinking.split(), spans)
                widgets.append(Answer(None, content, spans, status, summary))
        self.mount_all(widgets or [Markdown(WELCOME, id="welcome")])
        self.anchor()  # each answer folds once its Markdown is mounted (Answer._shown)
