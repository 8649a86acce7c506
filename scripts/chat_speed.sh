#!/usr/bin/env bash
# The chat's decoding speed beside `localspec run`'s, on the same prompt and pair: the
# chat runs in a real terminal (tmux), and its UI thread's CPU share is read from /proc.
# Usage: scripts/chat_speed.sh ["prompt"] [repeats]   (Linux, tmux, the default pair)
set -euo pipefail
cd "$(dirname "$0")/.."
PROMPT=${1:-"Write a Python class for an LRU cache with get and put, with docstrings and an example."}
REPEATS=${2:-2}
SYSTEM=$(.venv/bin/python -c "from localspec.settings import Settings; print(Settings().system_prompt)")
SESSION=localspec-chat-speed
ticks() { awk '{print $14 + $15}' "/proc/$1/task/$1/stat"; }  # user + system, 1/100 s

for _ in $(seq "$REPEATS"); do
    tmux kill-session -t $SESSION 2>/dev/null || true
    tmux new-session -d -s $SESSION -x 120 -y 40 -e COLUMNS=120 -e LINES=40 ".venv/bin/localspec chat"
    until tmux capture-pane -t $SESSION -p | grep -q "▏ target "; do sleep 1; done  # loaded
    sleep 2
    pid=$(pgrep -f "python.*localspec chat" | head -1)
    cpu0=$(ticks "$pid"); t0=$(date +%s.%N)
    tmux send-keys -t $SESSION "$PROMPT" Enter
    until line=$(tmux capture-pane -t $SESSION -p -S -1000 | grep "done ·"); do sleep 0.25; done
    cpu1=$(ticks "$pid"); t1=$(date +%s.%N)
    tmux kill-session -t $SESSION
    echo "chat: ${line#*done · }" | sed 's/ *▏.*//'
    python3 -c "print(f'  UI thread busy {($cpu1 - $cpu0) / 100 / ($t1 - $t0):.1%} of the answer')"
    echo "run:  $(.venv/bin/localspec run "$PROMPT" --system "$SYSTEM" 2>&1 >/dev/null | tail -1)"
done
