#!/usr/bin/env bash
# Claude Code and Codex CLI, the real ones (from npm), and Aider (from PyPI, in a venv of
# its own) against `localspec serve` with the default pair: each asked to create or edit
# a file, each turn's figures in the server's log.
# A check by hand, not a test (it downloads ~700 MB of CLIs and takes minutes on 2 cores):
#   ./scripts/agents_check.sh            # after ./scripts/setup.sh
#   SERVE_ARGS="--temperature 0.2" CODEX_RUNS=6 ./scripts/agents_check.sh   # a tally
set -euo pipefail
cd "$(dirname "$0")/.."
AGENTS=${LOCALSPEC_AGENTS_DIR:-$HOME/.cache/localspec/agents}
PORT=${PORT:-8093}
KEY=agents-check
mkdir -p "$AGENTS/work"
if [ ! -x "$AGENTS/node_modules/.bin/claude" ] || [ ! -x "$AGENTS/node_modules/.bin/codex" ]; then
  # --prefix: in a folder without package.json npm would install into a parent's
  npm install --prefix "$AGENTS" --silent --no-audit --no-fund @anthropic-ai/claude-code @openai/codex
fi
if [ ! -x "$AGENTS/aider/bin/aider" ]; then
  python3 -m venv "$AGENTS/aider"
  "$AGENTS/aider/bin/pip" install --quiet aider-chat >"$AGENTS/aider-install.log" 2>&1 \
    || { tail -5 "$AGENTS/aider-install.log"; exit 1; }
fi
# shellcheck disable=SC2086 # SERVE_ARGS: flags, split as written
.venv/bin/localspec serve --ctx 24576 --parallel 1 --port "$PORT" --api-key "$KEY" \
  ${SERVE_ARGS:-} >"$AGENTS/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $server || { cat "$AGENTS/serve.log"; exit 1; }
  sleep 2
done
cd "$AGENTS/work"
rm -f hello.py hello.txt

echo "== Claude Code (Anthropic's Messages API): Write tool"
ANTHROPIC_BASE_URL="http://127.0.0.1:$PORT" ANTHROPIC_AUTH_TOKEN=$KEY \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 \
  ../node_modules/.bin/claude -p "Create the file hello.py containing: print('hello')" \
  --tools Write --allowedTools Write --permission-mode acceptEdits --max-turns 3 || true
echo "hello.py: $(cat hello.py 2>/dev/null || echo missing)"

echo "== Codex CLI (OpenAI's Responses API): exec_command tool, ${CODEX_RUNS:=1} run(s)"
created=0
for run in $(seq "$CODEX_RUNS"); do
  rm -f hello.txt
  LOCALSPEC_KEY=$KEY HOME="$AGENTS/home" timeout 600 ../node_modules/.bin/codex exec \
    --skip-git-repo-check -s workspace-write -c model_provider=localspec -c model=localspec \
    -c "model_providers.localspec={name=\"localspec\", base_url=\"http://127.0.0.1:$PORT/v1\", wire_api=\"responses\", env_key=\"LOCALSPEC_KEY\"}" \
    "Call the exec_command tool with cmd set to: echo hi > hello.txt" </dev/null | tail -5 || true
  echo "run $run, hello.txt: $(cat hello.txt 2>/dev/null || echo missing)"
  [ -f hello.txt ] && created=$((created + 1))
done
echo "Codex created the file in $created of $CODEX_RUNS run(s)"

echo "== Aider (OpenAI's chat completions, streamed; its whole-file edit format)"
rm -f hello.py
for ask in "Create the file hello.py that prints hello" "Add a function add(a, b) that returns a + b to hello.py"; do
  HOME="$AGENTS/home" timeout 600 "$AGENTS/aider/bin/aider" --model openai/localspec \
    --openai-api-base "http://127.0.0.1:$PORT/v1" --openai-api-key $KEY --no-git --yes-always \
    --no-check-update --no-show-model-warnings --no-analytics --message "$ask" hello.py \
    </dev/null | tail -3 || true
done
echo "hello.py: $(cat hello.py 2>/dev/null || echo missing)"

echo "== the server's log (a line a request)"
grep -E "^localspec serve: (message|response|chat)" "$AGENTS/serve.log" || true
