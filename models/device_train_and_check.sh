#!/bin/bash
# On a GPU machine with an offline sglang 0.5.17 install (the folder named by SGLANG_OFFLINE_ENV): train the tiny target + EAGLE-3 draft, pack them, then serve the
# target with sglang (plain, and EAGLE3 with 3 steps / topk 1 / 4 draft tokens) and check that
# EAGLE3 is lossless and accepts (test/gpu/test_tiny_pair.py). About 6-7 minutes on a fresh H200.
#   source $SGLANG_OFFLINE_ENV/setup.sh \
#     && python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . \
#     && bash models/device_train_and_check.sh
# $OUT gets tiny-pair.tar (unpack it into models/ to commit the pair), train.log, pytest.log and
# summary.txt; server logs (tails) only when a check fails. If float32 servers do not come up,
# the checks run again in bfloat16 (differences then pass only as ties, margin < 1e-3).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to an output folder}"
begin=$SECONDS
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e test/gpu/native_ops_plugin || exit 1
work=$(mktemp -d)

if ! python3 models/train_tiny_pair.py --out "$work/tiny-pair" --tar "$OUT/tiny-pair.tar" \
    > "$OUT/train.log" 2>&1; then
  echo "training failed:"; grep -v "it/s" "$OUT/train.log" | tail -40; exit 1
fi
echo "trained and packed in $((SECONDS - begin)) s"
# The test reads models/tiny-pair, where the pair is committed.
rm -rf models/tiny-pair/target models/tiny-pair/draft
tar -C models -xf "$OUT/tiny-pair.tar"

run_checks() {  # $1: dtype; server logs land in $OUT (test/gpu/gpu_servers.py)
  TINY_PAIR_DTYPE=$1 TINY_PAIR_REPORT="$OUT/summary.txt" python3 -m pytest -m gpu \
    -p no:cacheprovider -q -s test/gpu/test_tiny_pair.py test/gpu/test_dynamic_eagle_tiny.py > "$OUT/pytest.log" 2>&1
}

trim_server_logs() {  # keep the tails, without the long server_args line
  for log in "$OUT"/server_tiny_*.log; do
    [ -f "$log" ] || continue
    grep -v "server_args=" "$log" | tail -c 30000 > "$log.tail" && mv "$log.tail" "$log"
  done
}

run_checks float32
status=$?
if [ $status -ne 0 ] && [ ! -s "$OUT/summary.txt" ] \
    && grep -qE "died|not healthy" "$OUT/pytest.log"; then
  echo "float32 servers did not come up; checking in bfloat16 instead"
  trim_server_logs
  cat "$OUT"/server_tiny_*.log >> "$OUT/pytest.log"
  mv "$OUT/pytest.log" "$OUT/pytest_float32.log"
  rm -f "$OUT"/server_tiny_*.log
  run_checks bfloat16
  status=$?
fi
if [ $status -eq 0 ]; then
  rm -f "$OUT"/server_tiny_*.log
else
  trim_server_logs
  grep -v "it/s" "$OUT/pytest.log" | tail -60
fi

python3 - "$work/tiny-pair/card.json" <<'EOF'
import json, sys
card = json.load(open(sys.argv[1]))
print("training:", json.dumps({"target": card["target"], "draft": card["draft"],
                               "timings": card["timings"]}))
print("offline acceptance:", json.dumps(card["offline_acceptance"]),
      "reference check ok:", card["reference_check_ok"])
EOF
tail -1 "$OUT/pytest.log"
echo "total $((SECONDS - begin)) s, pytest status $status"
cat "$OUT/summary.txt" 2>/dev/null || echo "no summary (servers did not serve)"
exit $status
