#!/usr/bin/env bash
# Run HERE (with pip's registry) before a device run: what benchmarks/gpu.sh needs that the device
# machine lacks, in two folders git ignores (each holds a '*' .gitignore) and a run must carry:
#   .whl/               wheels for the device's python (CPython 3.12, x86-64): pyahocorasick (absent
#                       there) and transformers at this machine's version (the device has 5.17);
#   benchmarks/carry/   the first 40 requests of each ../shared/traces file and the trained tiny Llama,
#                       stories260K (../shared does not travel).
# Then, on the device: run(command="bash benchmarks/gpu.sh", carry=[".whl", "benchmarks/carry"]).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${SHARED:-../shared}"
mkdir -p .whl benchmarks/carry/traces
echo '*' > .whl/.gitignore
echo '*' > benchmarks/carry/.gitignore
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
platforms=""
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms="$platforms --platform $tag"
done
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl \
  "pyahocorasick==$(version pyahocorasick)" "transformers==$(version transformers)"
for f in "$shared"/traces/*.dev.jsonl; do
  head -n 40 "$f" > "benchmarks/carry/traces/$(basename "$f")"
done
cp -r "$shared/models/stories260K" benchmarks/carry/
ls .whl benchmarks/carry/traces benchmarks/carry/stories260K
du -sh .whl benchmarks/carry
