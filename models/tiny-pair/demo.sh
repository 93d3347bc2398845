#!/bin/bash
# The tiny trained pair served with EAGLE3_DYNAMIC, on any CUDA machine with sglang 0.5.17 and
# this package installed: start a server, send four greedy requests of 16, 32, 48 and 64 new
# tokens at once (the batch shrinks from 4 to 1 as they finish, so it crosses the thresholds
# of 2 below), print one completion and the server's mode counters, stop the server.
#   bash models/tiny-pair/demo.sh [port]
set -euo pipefail
cd "$(dirname "$0")"
port=${1:-30000}
url=http://127.0.0.1:$port
start_timeout_s=600
work=$(mktemp -d)
python3 -m sglang.launch_server --model-path target --port "$port" \
  --speculative-algorithm EAGLE3_DYNAMIC --speculative-draft-model-path draft \
  --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 \
  --attention-backend triton --sampling-backend pytorch --cuda-graph-max-bs-decode 32 \
  --disable-prefill-cuda-graph \
  --speculative-disable-batch-threshold 2 --speculative-enable-batch-threshold 2 \
  > "$work/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
started=$SECONDS
until curl -sf "$url/health" > /dev/null; do
  if ! kill -0 $server 2>/dev/null || (( SECONDS - started > start_timeout_s )); then
    echo "server not healthy; last log lines:"; tail -20 "$work/server.log"; exit 1
  fi
  sleep 2
done
requests=()
for tokens in 16 32 48 64; do
  curl -s "$url/generate" -H 'Content-Type: application/json' \
    -d "{\"text\": \"def main(\", \"sampling_params\": {\"max_new_tokens\": $tokens, \"temperature\": 0}}" \
    > "$work/completion.$tokens" &
  requests+=($!)
done
wait "${requests[@]}"
python3 -c 'import json,sys; print("completion of 64 tokens:", repr(json.load(open(sys.argv[1]))["text"]))' "$work/completion.64"
curl -s "$url/server_info" | python3 -c '
import json, sys
counters = json.load(sys.stdin)["internal_states"][0]["dynamic_eagle"]
for key in ("speculative_steps", "plain_steps", "switches_to_plain", "switches_to_speculative",
            "catchup_tokens", "mean_accept_length"):
    print(f"{key}: {counters[key]}")'
