#!/usr/bin/env python3
"""Replay greedy drafting policies on a recording: see `localspec/bench/replay.py`."""

import sys

from localspec.bench.replay import main

if __name__ == "__main__":
    sys.exit(main())
