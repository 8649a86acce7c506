"""Downloading a pair from the models screen, one at a time; it goes on when the screen
closes. The app's `download` reactive holds the progress, which the models screen
mirrors in its progress bar.
"""

from __future__ import annotations

import threading
import time

from textual import work

from localspec.models.inventory import PairStatus
from tui.advice import advice
from tui.base import ChatBase
from tui.listing import download_files, downloaded_bytes, pull_pair
from tui.messages import Download, DownloadUpdate

PROGRESS_EVERY_S = 0.5  # between readings of the bytes on disk, while a pair downloads


class Downloads(ChatBase):
    """Pull a pair in a worker; read its progress off the disk meanwhile."""

    def start_download(self, pair: PairStatus) -> None:
        if self.download is not None and not self.download.finished:
            self.notify(
                f"{self.download.pair_id} is downloading; one at a time.", severity="warning"
            )
            return
        self.download = Download(pair.id, 0, pair.missing, "starting…")
        self.pull(pair)

    @work(thread=True, exclusive=True, exit_on_error=False, group="download")
    def pull(self, pair: PairStatus) -> None:
        """Download a pair; progress is read off the disk twice a second meanwhile."""
        since = time.time() - 1
        line = ["starting…"]
        finished, posting = threading.Event(), threading.Lock()

        def progress() -> None:
            while not finished.wait(PROGRESS_EVERY_S) and not self._stopping.is_set():
                done = downloaded_bytes(since, download_files)
                with posting:  # never after the end's message: it would undo it
                    if finished.is_set():
                        return
                    update = Download(pair.id, done, pair.missing, line[0])
                    self.post_message(DownloadUpdate(update))

        self.call_from_thread(
            self.run_worker, progress, thread=True, group="download-progress", exit_on_error=False
        )
        try:
            pull_pair(pair.id, say=lambda text: line.__setitem__(0, text))
        except Exception as e:
            what, todo = advice(e)
            end = Download(pair.id, 0, pair.missing, "", True, f"{what} {todo}".strip())
        else:
            end = Download(pair.id, pair.missing, pair.missing, "done", True)
        finally:
            with posting:
                finished.set()
        self.post_message(DownloadUpdate(end))

    def on_download_update(self, message: DownloadUpdate) -> None:
        if not self.is_running:
            return  # shutting down: the widgets may be gone already
        self.download = message.download
        if not message.download.finished:
            return
        if message.download.error:
            self.notify(
                message.download.error,
                title=f"{message.download.pair_id} not downloaded",
                severity="error",
                timeout=20,
            )
        else:
            self.notify(
                f"{message.download.pair_id} is ready: use it on the models screen (Ctrl+L).",
                title="Downloaded",
            )
