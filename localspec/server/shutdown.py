"""How `localspec serve` stops, as llama-server does: the first Ctrl-C (or SIGTERM) ends
the answers in flight within a round, each client told why (a 503, or the stream's error
event), and the process exits once they are written; a second Ctrl-C exits at once.

uvicorn's own first signal waits for every answer to end, however long, and its second
cancels the handlers mid-write, printing their tracebacks.
"""

from __future__ import annotations

import os
import sys
import threading
from types import FrameType

import uvicorn

from localspec.server.worker import Worker


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker: Worker) -> None:
        super().__init__(config)
        self.worker = worker

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:  # asked again: the answers did not end (a pass still runs)
            print("\nlocalspec: stopped without waiting for the answers", file=sys.stderr)
            sys.stderr.flush()
            os._exit(128 + sig)
        super().handle_exit(sig, frame)
        # from a thread: the signal may have come while this one held the worker's lock
        threading.Thread(target=self.worker.stop_answers, daemon=True).start()
