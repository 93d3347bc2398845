#!/bin/bash
# Runs the GPU tests in one call on the project's GPU machine (device tool):
#   bash test/gpu/run_on_device.sh [pytest args]      (carry .gpu-kit)
# On any machine with a CUDA GPU, sglang 0.5.17 and this package installed,
# `python -m pytest -m gpu test/gpu` does the same.
set -o pipefail
cd "$(dirname "$0")/../.."
KIT_DIR=${KIT_DIR:-.gpu-kit}
export KIT_DIR
source "$KIT_DIR/setup.sh" || exit 1
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . -e test/gpu/native_ops_plugin || exit 1
export OUT=${OUT:-/tmp/gpu-test-out}
mkdir -p "$OUT"
python3 -m pytest -m gpu -p no:cacheprovider -s -q "${@:-test/gpu}" 2>&1 | tee "$OUT/pytest.log"
status=$?
for log in "$OUT"/server_*.log; do
  [ -f "$log" ] || continue
  tail -n 300 "$log" > "$log.tail" && mv "$log.tail" "$log"
done
exit $status
