#!/usr/bin/env bash
# Accuracy of static capacities on a model: for each quantile, overflow
# policy and salience policy, a plan is made from one calibration and one
# profile, and `npumoe compare` scores the held-out text with the exact dense
# model as reference and the plan's `grouped` mode (every group on the
# device, so capacities apply to every expert) as candidate. Prints one
# Markdown row per plan: padding waste, drop and spill rates, dispatches per
# layer and chunk, perplexity change, mean KL and top-1 agreement.
#   bench/capacity_sweep.sh MODEL CALIB_TEXT EVAL_TEXT [CHUNK] [CTX]
set -euo pipefail
model=$1 calib_text=$2 eval_text=$3 chunk=${4:-256} ctx=${5:-512}
np=${NPUMOE:-./build/npumoe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "command: $0 $*"
echo "machine: $(uname -m), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
$np calibrate -m "$model" -f "$calib_text" --chunk "$chunk" -o "$work/calib.json" >/dev/null 2>&1
$np profile -m "$model" --chunk "$chunk" -o "$work/profile.json" >/dev/null 2>&1
echo
echo "| quantile | overflow | salience | padding waste | drop rate | spill rate | dispatches/layer/chunk | ppl change | mean KL | top-1 |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for q in ${QUANTILES:-0.5 0.8 0.9 0.95 0.99}; do
  for overflow in drop spill; do
    for salience in ${SALIENCES:-router residual-norm input-norm}; do
      [ "$overflow" = spill ] && [ "$salience" != router ] && continue # salience only matters for drop
      $np plan -m "$model" --calib "$work/calib.json" --profile "$work/profile.json" --objective quantile --quantile "$q" \
        --overflow "$overflow" --salience "$salience" -o "$work/plan.json" >/dev/null
      cmp=$($np compare -m "$model" -f "$eval_text" --ctx "$ctx" --plan "$work/plan.json" \
        --mode grouped --json 2>/dev/null)
      /usr/bin/python3 - "$q" "$overflow" "$salience" "$cmp" <<'PY'
import json, sys
q, overflow, salience, cmp = sys.argv[1:]
c = json.loads(cmp)
r = c["moe"]["total"]
chunks = max(r["chunks"], 1)
print(f"| {q} | {overflow} | {salience if overflow == 'drop' else '-'} | {100*r['padding_waste']:.1f}% | "
      f"{100*r['drop_rate']:.3f}% | {100*r['spill_rate']:.3f}% | {r['dispatches']/chunks:.2f} | "
      f"{c['ppl_change_percent']:+.3f}% | {c['kl_mean']:.5f} | {100*c['top1_agreement']:.2f}% |")
PY
    done
  done
done
