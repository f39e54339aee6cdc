#!/usr/bin/env bash
# Budgeted capacities against one flat capacity and the quantile tiers, at
# the same rows per layer and chunk (docs/NPUMOE.md, "Budgeted tiers"). One
# calibration and one profile; per plan, `npumoe compare` scores the
# held-out text with the exact dense model as reference and the plan's
# `grouped` mode (every group on the device, so every capacity applies),
# with --overflow drop and router salience. Prints one Markdown row per
# plan: rows reserved per layer and chunk, perplexity change with its
# standard error, mean KL, and the share of assignments dropped and of
# routing weight dropped, each as the plan predicts it (on the calibration)
# and as measured on the held-out text.
#   bench/budget_sweep.sh MODEL CALIB_TEXT EVAL_TEXT [CHUNK] [CTX] [FLATS] [QUANTILES]
# The standard error is that of a paired difference (bench/budget_blocks.py):
# the text's tokens are cut into blocks of BLOCK_WINDOWS windows of CTX
# tokens (default 4), each
# block scored by reference and candidate alike (the same windows, in the
# same places, as one run over the whole text), and the spread of the
# blocks' mean log-likelihood differences gives the error of their mean
# (batch means; windows are independent, so blocks are too). Each budgeted
# row is followed by its paired difference to the flat capacity (or the
# quantile tiers) of the same rows, over the same blocks: of the perplexity
# and of the mean KL, each with its standard error.
set -euo pipefail
model=$1 calib_text=$2 eval_text=$3 chunk=${4:-256} ctx=${5:-256}
flats=${6-64 80 96} quantiles=${7-0.8 0.95}
block_windows=${BLOCK_WINDOWS:-4}
np=${NPUMOE:-./build/npumoe}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "command: $0 $*"
echo "machine: $(uname -m), $(nproc) cores; $(date -u +%Y-%m-%dT%H:%MZ)"
$np calibrate -m "$model" -f "$calib_text" --chunk "$chunk" -o "$work/calib.json" >/dev/null 2>&1
$np profile -m "$model" --chunk "$chunk" -r 2 -o "$work/profile.json" >/dev/null 2>&1
$np tokenize -m "$model" -f "$eval_text" >"$work/ids.txt"
n_expert=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["n_expert"])' "$work/calib.json")
blocks=(/usr/bin/python3 "$(dirname "$0")/budget_blocks.py")
"${blocks[@]}" windows "$work/ids.txt" "$ctx" "$block_windows"
plan() { # NAME BLOCKS-FILE PLAN-OPTIONS...
  local name=$1 out=$2
  shift 2
  $np plan -m "$model" --calib "$work/calib.json" --profile "$work/profile.json" \
    --overflow drop --salience router "$@" -o "$work/plan.json" >/dev/null
  "${blocks[@]}" score "$name" "$work/plan.json" "$work/ids.txt" "$np" "$model" "$ctx" \
    "$block_windows" "$out"
}
diff_row() { # NAME BLOCKS-A BLOCKS-B: A less B, block by block
  "${blocks[@]}" diff "$@"
}
echo
echo "| plan | rows per layer and chunk | ppl change | s.e. | mean KL | drop rate predicted | measured | dropped weight predicted | measured |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for f in $flats; do
  plan "flat $f" "$work/a.json" --objective quantile --tiers "$f"
  plan "budgeted, $((f * n_expert)) rows" "$work/b.json" --rows $((f * n_expert))
  diff_row "budgeted less flat $f (paired)" "$work/b.json" "$work/a.json"
done
for q in $quantiles; do
  plan "quantile $q tiers" "$work/a.json" --objective quantile --quantile "$q"
  plan "budgeted, the q$q tiers' rows" "$work/b.json" --quantile "$q"
  diff_row "budgeted less quantile $q (paired)" "$work/b.json" "$work/a.json"
done
