#!/usr/bin/env bash
# The GPU run (issue 22): benchmarks/gpu_suite.py on one H200, installing nothing from the network.
# Prepare here first: bash benchmarks/prepare_device.sh; then on the device, from the repo root:
#   run(command="bash benchmarks/gpu.sh", carry=[".whl", "benchmarks/carry"], timeout_s=540)
# or one step alone, e.g. the model's predictions at the device's step costs (issue 55):
#   run(command="bash benchmarks/gpu.sh --only trees", carry=[".whl", "benchmarks/carry"], timeout_s=300)
# Results in $OUT (there) or benchmarks/out: results.json, tables.md, log.txt.
# Here, a dry run at a toy shape on the CPU: bash benchmarks/gpu.sh --dry-run
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/out}"
# Wheels carried from prepare_device.sh (CPython 3.12), ahead of the machine's own packages; a dry run uses this machine's.
if [[ " $* " != *" --dry-run "* ]] && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# The suite skips steps that would not fit its --budget (470 s); the timeout is a backstop.
timeout 500 python3 benchmarks/gpu_suite.py --out "$out" "$@"
