#!/usr/bin/env bash
# Checks a build of examples/simple.c: on the same model and prompt it must
# print exactly what `npumoe run --temp 0` prints (the prompt's text, then
# the greedy continuation), and the continuation must not be empty. With a
# fourth argument, `npumoe --version` must print that version.
# Usage: check_simple.sh SIMPLE NPUMOE MODEL [VERSION]
set -euo pipefail
simple=$1 npumoe=$2 model=$3
prompt="And God said"
n=24
if [ $# -ge 4 ]; then
    version=$("$npumoe" --version)
    [ "$version" = "npumoe $4" ] || { echo "npumoe --version: '$version', want 'npumoe $4'"; exit 1; }
fi
want=$("$npumoe" run -m "$model" -p "$prompt" -n "$n" --temp 0 2>/dev/null)
got=$("$simple" "$model" "$prompt" "$n")
if [ "$got" != "$want" ]; then
    printf 'examples/simple printed:\n%s\nnpumoe run printed:\n%s\n' "$got" "$want"
    exit 1
fi
if [ "${got#"$prompt"}" = "$got" ] || [ -z "${got#"$prompt"}" ]; then
    printf 'the text does not start with the prompt or has nothing after it:\n%s\n' "$got"
    exit 1
fi
printf '%s: %s\n' "$simple" "$got"
