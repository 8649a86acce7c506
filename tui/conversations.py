"""Saved conversations: start a new one, or reopen one from the conversations screen.

The file is read in a worker (group "open"); the transcript and the stats panel then
show it, and the next message continues it.
"""

from __future__ import annotations

from textual import work

from localspec.conversations import ConversationError, new_id
from tui.base import ChatBase
from tui.messages import ConversationOpened
from tui.widgets import PromptInput


class Conversations(ChatBase):
    """Switch between conversations; the one shown is `conversation_id`."""

    async def action_new_conversation(self) -> None:
        await self.action_stop()
        self.conversation_id = new_id()
        self.transcript.clear()
        self.stats_panel.figures = {}
        self.stats_panel.why = ""  # the last round's reason was the old conversation's
        self.query_one(PromptInput).focus()

    def action_conversations(self) -> None:
        from tui.screens.conversations import ConversationsScreen

        def chosen(conversation_id: str | None) -> None:
            if conversation_id:
                self.open_conversation(conversation_id)

        self.push_screen(ConversationsScreen(self.store, self.conversation_id), chosen)

    @work(thread=True, exclusive=True, exit_on_error=False, group="open")
    def open_conversation(self, conversation_id: str) -> None:
        try:
            conversation = self.store.load(conversation_id)
        except (ConversationError, OSError) as e:
            self.call_from_thread(self.notify, str(e), title="Cannot open", severity="error")
            return
        self.post_message(ConversationOpened(conversation))

    def on_conversation_opened(self, message: ConversationOpened) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        if self.current is not None:
            self.cancel_current()
            self.finish_current()
        conversation = message.conversation
        self.conversation_id = conversation.id
        self.transcript.show(conversation)
        last = next((m for m in reversed(conversation.messages) if m.role == "assistant"), None)
        self.stats_panel.figures = dict(last.stats) if last else {}
        self.stats_panel.why = ""
        self.query_one(PromptInput).focus()
