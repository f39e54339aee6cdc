#!/usr/bin/env bash
# The README's main command: builds npumoe and runs the whole NPUMoE loop on
# the shipped model: calibrate on text, profile the device, plan, generate
# with the plan, and the bench table of the prefill modes. A few minutes on
# 2 cores. Outputs go to build/demo/.
#   MODEL=... TEXT=... DEVICE=... CHUNK=... LENGTHS=... REPS=... to change.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/npumoe-tiny-moe.gguf}
TEXT=${TEXT:-models/heldout.txt}
DEVICE=${DEVICE:-cpu}
CHUNK=${CHUNK:-256}
LENGTHS=${LENGTHS:-512,1024,2048}
REPS=${REPS:-3}
# the model was trained on the King James Bible (models/README.md): a prompt
# in its language shows what it learned
PROMPT=${PROMPT:-"In the beginning God created"}
out=build/demo

# what the build needs beyond a compiler and CMake: pkg-config and jansson
# (JSON); installed when missing and apt-get is there (tools/test.sh
# installs everything the tests need)
missing=()
for p in pkg-config libjansson-dev; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null; then
    echo "== installing: ${missing[*]}"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi

echo "== building build/release/npumoe (the command alone; tools/test.sh builds the tests)"
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release --target npumoe -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
mkdir -p "$out"
np=./build/release/npumoe

echo "== the model"
# the first lines (sed reads to the end: head would close the pipe early,
# and with pipefail npumoe's SIGPIPE would end the script)
$np info -m "$MODEL" | sed -n 1,14p
echo "== 1. calibrate: per-chunk expert loads on $TEXT"
$np calibrate -m "$MODEL" -f "$TEXT" --chunk "$CHUNK" -o "$out/calib.json"
echo "== 2. profile the $DEVICE device and the host"
$np profile -m "$MODEL" --device "$DEVICE" --chunk "$CHUNK" -o "$out/profile.json"
echo "== 3. plan: tiers, groups, residency"
$np plan -m "$MODEL" --calib "$out/calib.json" --profile "$out/profile.json" -o "$out/plan.json"
echo "== 4. generate with the plan"
$np run -m "$MODEL" --plan "$out/plan.json" --device "$DEVICE" -p "$PROMPT" -n 48 --temp 0 --seed 1
echo "== 5. bench: TTFT of every mode by prompt length (report: $out/bench.md, .json, .svg)"
$np bench -m "$MODEL" --plan "$out/plan.json" --device "$DEVICE" -f "$TEXT" \
    --lengths "$LENGTHS" -r "$REPS" -o "$out/bench"
