#!/usr/bin/env bash
# TTFT of the static prefill against the chunk length T: for each T, the
# whole loop (calibrate with chunks of T, profile the device at T, plan with
# the defaults) and `npumoe bench` of the modes over the prompt lengths.
# Rounds go through the chunk lengths in alternating order (ascending, then
# descending) so a slow phase of a shared machine does not favour one T.
# Prints one Markdown row per (T, prompt, mode): median TTFT over all rounds,
# the plan's predicted and the measured MoE time per chunk, dispatches,
# padding waste and spill rate. Calibration windows hold max(T, CTX) tokens
# (CTX defaults to 256, the shipped model's trained context).
#   bench/chunk_sweep.sh MODEL CALIB_TEXT PROMPT_TEXT [CHUNKS] [LENGTHS] [ROUNDS]
set -euo pipefail
model=$1 calib_text=$2 prompt_text=$3
chunks=${4:-64,128,256,512} lengths=${5:-512,1024,2048} rounds=${6:-2}
np=${NPUMOE:-./build/npumoe}
modes=${MODES:-dense,grouped,npumoe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "command: $0 $*"
echo "machine: $(uname -m), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
IFS=, read -r -a ts <<<"$chunks"
for t in "${ts[@]}"; do
  echo "chunk $t: calibrate, profile, plan" >&2
  ctx=${CTX:-256}
  [ "$t" -gt "$ctx" ] && ctx=$t
  $np calibrate -m "$model" -f "$calib_text" --chunk "$t" --ctx "$ctx" -o "$work/calib-$t.json" \
    >/dev/null
  $np profile -m "$model" --chunk "$t" -o "$work/profile-$t.json" >/dev/null 2>&1
  $np plan -m "$model" --calib "$work/calib-$t.json" --profile "$work/profile-$t.json" \
    -o "$work/plan-$t.json" >/dev/null
done
for r in $(seq 1 "$rounds"); do
  order=("${ts[@]}")
  if [ $((r % 2)) -eq 0 ]; then
    order=()
    for ((i = ${#ts[@]} - 1; i >= 0; i--)); do order+=("${ts[$i]}"); done
  fi
  for t in "${order[@]}"; do
    echo "round $r/$rounds: chunk $t" >&2
    $np bench -m "$model" --plan "$work/plan-$t.json" -f "$prompt_text" --modes "$modes" \
      --lengths "$lengths" -r 1 -o "$work/bench-$t-$r" >/dev/null 2>&1
  done
done
/usr/bin/python3 - "$work" "$chunks" "$rounds" <<'PY'
import json, statistics, sys
work, chunks, rounds = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], int(sys.argv[3])
print()
print("| chunk | prompt | mode | TTFT ms (median) | runs | MoE ms/chunk predicted | measured | dispatches/layer/chunk | padding waste | spill rate |")
print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
for t in chunks:
    cells = {}
    predicted = None
    for r in range(1, rounds + 1):
        b = json.load(open(f"{work}/bench-{t}-{r}.json"))
        predicted = b["predicted_chunk_ms"]
        for x in b["results"]:
            cells.setdefault((x["prompt"], x["mode"]), []).append(x)
    for (prompt, mode), xs in sorted(cells.items()):
        ttft = statistics.median(x["ttft_ms"] for x in xs)
        moe = statistics.median(x["moe_ms_per_chunk"] for x in xs)
        x = xs[0]
        layers_chunks = max(x["chunks"], 1)
        pred = f"{predicted:.3f}" if mode == "npumoe" else "-"
        print(f"| {t} | {prompt} | {mode} | {ttft:.1f} | {len(xs)} | {pred} | {moe:.3f} | "
              f"{x['dispatches'] / layers_chunks:.2f} | {100 * x['padding_waste']:.1f}% | "
              f"{100 * x['spill_rate']:.3f}% |")
PY
