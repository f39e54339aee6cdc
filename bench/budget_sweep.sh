#!/usr/bin/env bash
# Budgeted capacities against one flat capacity and the quantile tiers, at
# the same rows per layer and chunk (docs/NPUMOE.md, "Budgeted tiers"). One
# calibration and one profile; per plan, `npumoe compare` scores the
# held-out text with the exact dense model as reference and the plan's
# `grouped` mode (every group on the device, so every capacity applies),
# with --overflow drop and router salience. Prints one Markdown row per
# plan: rows reserved per layer and chunk, perplexity change, mean KL, and
# the share of assignments dropped and of routing weight dropped, each as the
# plan predicts it (on the calibration) and as measured on the held-out text.
#   bench/budget_sweep.sh MODEL CALIB_TEXT EVAL_TEXT [CHUNK] [CTX] [FLATS] [QUANTILES]
set -euo pipefail
model=$1 calib_text=$2 eval_text=$3 chunk=${4:-256} ctx=${5:-256}
flats=${6:-64 80 96} quantiles=${7:-0.8 0.95}
np=${NPUMOE:-./build/npumoe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "command: $0 $*"
echo "machine: $(uname -m), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
$np calibrate -m "$model" -f "$calib_text" --chunk "$chunk" -o "$work/calib.json" >/dev/null 2>&1
$np profile -m "$model" --chunk "$chunk" -r 2 -o "$work/profile.json" >/dev/null 2>&1
n_expert=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["n_expert"])' "$work/calib.json")
plan() { # NAME PLAN-OPTIONS...
  local name=$1
  shift
  $np plan -m "$model" --calib "$work/calib.json" --profile "$work/profile.json" \
    --overflow drop --salience router "$@" -o "$work/plan.json" >/dev/null
  cmp=$($np compare -m "$model" -f "$eval_text" --ctx "$ctx" --plan "$work/plan.json" \
    --mode grouped --json 2>/dev/null)
  /usr/bin/python3 - "$name" "$work/plan.json" "$cmp" <<'PY'
import json, sys
name, plan_path, cmp = sys.argv[1:]
p, c = json.load(open(plan_path)), json.loads(cmp)
rows = [sum(g["tier"] * len(g["experts"]) for g in l["groups"]) for l in p["layers"]]
r = c["moe"]["total"]
print(f"| {name} | {sum(rows) / len(rows):.0f} | {c['ppl_change_percent']:+.3f}% | {c['kl_mean']:.5f} | "
      f"{100*p['predicted_drop_rate']:.3f}% | {100*r['drop_rate']:.3f}% | "
      f"{100*p['predicted_drop_weight']:.3f}% | {100*r['dropped_weight']:.3f}% |")
PY
}
echo
echo "| plan | rows per layer and chunk | ppl change | mean KL | drop rate predicted | measured | dropped weight predicted | measured |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for f in $flats; do
  plan "flat $f" --objective quantile --tiers "$f"
  plan "budgeted, $((f * n_expert)) rows" --rows $((f * n_expert))
done
for q in $quantiles; do
  plan "quantile $q tiers" --objective quantile --quantile "$q"
  plan "budgeted, the q$q tiers' rows" --quantile "$q"
done
