#!/bin/bash
# Runs GPU tests on a machine whose offline sglang 0.5.17 install is the folder named by
# SGLANG_OFFLINE_ENV (its setup.sh, which puts that sglang on the path, and models/, the
# 8B-shaped model folders):
#   SGLANG_OFFLINE_ENV=/path/to/offline-sglang bash test/gpu/run.sh [pytest args]
# On any other machine with a CUDA GPU, sglang 0.5.17, this package and test/gpu/native_ops_plugin
# installed, run the README's pytest selections directly.
set -o pipefail
cd "$(dirname "$0")/../.."
SGLANG_OFFLINE_ENV=${SGLANG_OFFLINE_ENV:?set SGLANG_OFFLINE_ENV to the folder of the offline sglang 0.5.17 install (its setup.sh and models/)}
export SGLANG_OFFLINE_ENV
source "$SGLANG_OFFLINE_ENV/setup.sh" || exit 1
python3 -m pip install -q --no-deps --no-index --no-build-isolation -e . -e test/gpu/native_ops_plugin || exit 1
export OUT=${OUT:-/tmp/gpu-test-out}
export SGLANG_DE_LOG_DIR=$OUT
mkdir -p "$OUT"
# Default: the tiny-pair suite with chain drafting (float32, exact comparisons); the tree and
# catch-up control tests run with -k tree and -k control. Each other module runs in a call of
# its own: the 8B-shaped test/gpu/test_dynamic_eagle_dummy8b.py (its negative control alone
# with -k negative_control, the rest in the README's two selections: four 8B-shaped servers do not
# fit an 80 GB H100), the README's tiny-pair
# demo test/gpu/test_quickstart_demo.py with the quickstart test/gpu/test_readme_quickstart.py and the Prometheus export test/gpu/test_prometheus_export.py, the soak test/gpu/test_soak.py, and
# test/gpu/test_dynamic_eagle_configurations.py with -k non_overlap, -k fa3, -k mla_moe or
# -k flashinfer. The 8B-shaped and tiny-pair suites' servers run sglang's own backends (on Hopper fa3,
# flashinfer sampling, prefill CUDA graphs), the others' pinned triton / pytorch / no prefill graphs;
# SGLANG_DE_TEST_BACKENDS=sglang or =pinned sets every suite's, except the float32 tiny pair's
# attention (triton always) and the configuration suite's MLA + MoE (pinned) and defaults servers.
if [ $# -eq 0 ]; then
  set -- test/gpu/test_dynamic_eagle_tiny.py test/gpu/test_tiny_pair.py -k "not tree and not control"
fi
python3 -m pytest -m gpu -p no:cacheprovider -s -q "$@" 2>&1 | tee "$OUT/pytest.log"
status=$?
for log in "$OUT"/server_*.log; do
  [ -f "$log" ] || continue
  tail -n 300 "$log" > "$log.tail" && mv "$log.tail" "$log"
done
exit $status
