"""Loading a pair of models: at start, and when the models screen picks another.

The load worker (group "load", exclusive: a newer choice cancels an older one) closes
the current pair once no answer uses it, loads the new one off the UI thread, and says
how it went through PairLoading, PairLoaded and PairFailed.
"""

from __future__ import annotations

from dataclasses import replace

from textual import work
from textual.notifications import Notification
from textual.worker import get_current_worker

from tui.advice import advice
from tui.base import ChatBase
from tui.messages import PairFailed, PairLoaded, PairLoading
from tui.pair import LoadedPair, PairSpec


class Loading(ChatBase):
    """Load a pair in a worker and show what came of it."""

    # the toasts that say what a load is doing, withdrawn once it is done: left up, they
    # would cover the stats panel through the first answer
    loading_toasts: tuple[Notification, ...] = ()

    def switch_pair(self, spec: PairSpec) -> None:
        self.pair_state = "loading"
        self.stats_panel.pair = f"loading {spec.label}…"
        self.load_pair(spec)

    @work(thread=True, exclusive=True, exit_on_error=False, group="load")
    def load_pair(self, spec: PairSpec) -> None:
        """Unload the current pair (once no answer uses it), then load `spec`."""
        with self.turn_lock:
            old, self.pair = self.pair, None
            if old is not None:
                old.close()

        def say(line: str) -> None:
            self.post_message(PairLoading(spec, line))

        try:
            session = self.loader(spec, say)
        except Exception as e:
            self.post_message(PairFailed(spec, *advice(e)))
            return
        if get_current_worker().is_cancelled:  # another pair was asked for meanwhile
            session.close()
            return
        pair = LoadedPair(spec, session)
        with self.turn_lock:
            self.pair = pair
        self.post_message(PairLoaded(pair, tuple(getattr(session, "notes", ()))))

    def on_pair_loading(self, message: PairLoading) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        if not self.can_withdraw_toasts():  # another Textual: a toast that times out
            self.notify(message.line, title="Loading models", severity="warning")
            return
        # shown at once, not through a Notify message, which could arrive after PairLoaded
        toast = Notification(message.line, "Loading models", "warning", self.NOTIFICATION_TIMEOUT)
        self.loading_toasts = (*self.loading_toasts, toast)
        self._notifications.add(toast)
        self._refresh_notifications()

    def can_withdraw_toasts(self) -> bool:
        """Textual's `notify` has no withdraw: the app's collection of notifications (not
        public: Textual 8.2) forgets them instead, where this Textual has it."""
        return all(
            hasattr(self, name)
            for name in ("_notifications", "_unnotify", "_refresh_notifications")
        )

    def withdraw_loading_toasts(self) -> None:
        if not self.loading_toasts:
            return
        for toast in self.loading_toasts:
            self._unnotify(toast, refresh=False)
        self.loading_toasts = ()
        self._refresh_notifications()

    def on_pair_loaded(self, message: PairLoaded) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.withdraw_loading_toasts()
        self.pair_state = "ready"
        self.spec = message.pair.spec
        self.sub_title = self.spec.label
        self.stats_panel.pair = self.spec.lines
        for note in message.notes:
            self.notify(note, title="Models", severity="warning", timeout=10)
        if switch := message.pair.base.switch_note(self.settings.reasoning):
            self.notify(switch, title="Thinking", timeout=10)
        if self.settings.drafter == "model" and not message.pair.has_draft_model:
            self.notify("This pair has no draft model: drafting with n-grams.", title="Models")

    def on_pair_failed(self, message: PairFailed) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.withdraw_loading_toasts()
        self.pair_state = "failed"
        self.stats_panel.pair = f"not loaded: {short_line(message.error)}"
        self.sub_title = "no models loaded"
        self.notify(
            f"{message.error}\n{message.advice}".strip(),
            title=f"Could not load {message.spec.label}",
            severity="error",
            timeout=20,
        )

    def action_models(self) -> None:
        from tui.screens.models import ModelsScreen

        def chosen(spec: PairSpec | None) -> None:
            if spec is None or spec == self.spec:
                return
            self.cancel_current()  # the answer in progress ends with the old pair
            self.settings = replace(self.settings, target=spec.target, draft=spec.draft)
            self.save_settings(self.settings)  # the next run opens this pair too
            self.switch_pair(spec)

        self.push_screen(ModelsScreen(self.spec), chosen)


def short_line(text: str, limit: int = 60) -> str:
    """The first line of `text`, cut to `limit` characters."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
