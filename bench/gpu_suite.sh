#!/usr/bin/env bash
# Every benchmark of the GPU plan in one run, written as one markdown table (at most 8 minutes by
# default on one GPU; each command has a time limit so a stuck one cannot eat the rest).
#
#   bench/gpu_suite.sh [OUT.md]            # on a CUDA machine: real shapes (0.5B, 1.5B, 7B), random weights
#   bench/gpu_suite.sh --tiny [OUT.md]     # the same scripts on the CPU with a tiny model (no --compile)
#
# Rows: sample.py (batch 1 and group sampling, 0.5B and 7B, vs transformers generate; LoRA folded in
# vs unmerged, the measurement behind grpo --merge-lora auto), grpo_step.py
# (a GRPO step's time split and peak: 0.5B and 1.5B full fine-tuning, capped to 40 GB), memory.py (the
# 7B LoRA step: measured peak vs minirl.run.memory's estimate, capped to 40 GB), after pytest -m gpu.
# The rows run most important first under one time budget (SUITE_BUDGET seconds, default 480): a row
# gets at most what is left, and rows that no longer fit are written as skipped, so the suite ends
# in time with every row it managed. PYTHON picks the interpreter (default: python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
tiny=0
if [ "${1:-}" = "--tiny" ]; then tiny=1; shift; fi
out=${1:-bench/gpu_results.md}
status=0
deadline=$((SECONDS + ${SUITE_BUDGET:-480}))

run() {  # run LIMIT_SECONDS SCRIPT ARGS...: one benchmark, its row appended to the table
    local limit=$1; shift
    local left=$((deadline - SECONDS))
    if [ "$left" -lt 30 ]; then
        echo "| $1 | SKIPPED (suite budget spent): $* | | | | | |" >> "$out"
        status=1
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo "+ $PY $*  (limit ${limit}s)" >&2
    local start=$SECONDS
    if ! timeout "$limit" "$PY" "$@" --table "$out"; then
        echo "| $1 | FAILED or over ${limit}s: $* | | | | | |" >> "$out"
        status=1
    fi
    echo "  took $((SECONDS - start))s" >&2
}

{
    echo "# minirl GPU suite, $(date -u +%Y-%m-%d) — $("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (--tiny)")'), torch $("$PY" -c 'import torch; print(torch.__version__)')"
    echo
    echo "| script | model | dtype, hardware | workload | minirl | peer or split | ratio / peak |"
    echo "|---|---|---|---|---|---|---|"
} > "$out"

if [ "$tiny" = 1 ]; then
    run 300 bench/sample.py --tiny --repeats 1
    # the group row without --compile: compiling on a CPU costs ~20-40 s here, and the compiled
    # decode step has its own test (tests/test_sampling.py); on the GPU the row compiles
    run 300 bench/sample.py --tiny --batch 2 --group 4 --new-tokens 8 --repeats 1
    run 300 bench/sample.py --tiny --repeats 1 --lora 4
    run 300 bench/grpo_step.py --tiny --repeats 1
    run 300 bench/grpo_step.py --tiny --repeats 1 --full
    run 300 bench/memory.py --tiny
else
    gpu="--device cuda --dtype bfloat16"
    # the correctness tests first (a wrong CUDA path makes every speed moot), then the issue's
    # targets, then the LoRA fold's speed
    echo "+ pytest -m gpu  (limit 150s)" >&2
    if ! timeout 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py >&2; then
        echo "| pytest -m gpu | FAILED or over 150s (the log has which) | | | | | |" >> "$out"
        status=1
    fi
    run 120 bench/sample.py $gpu --preset 0.5b --batch 1 --new-tokens 256 --repeats 3 --compile
    run 150 bench/sample.py $gpu --preset 7b --batch 1 --new-tokens 128 --repeats 2 --compile
    run 150 bench/sample.py $gpu --preset 0.5b --batch 8 --group 8 --new-tokens 512 --repeats 2 --compile
    # memory rows decode eagerly: what they measure is the peak, and compiling would cost a minute each
    run 150 bench/memory.py --device cuda --preset 7b --group 8 --prompts 1 --prompt-len 256 --new-tokens 768 --minibatch 8 --cap-gb 40
    run 100 bench/grpo_step.py --device cuda --preset 0.5b --full --group 8 --prompts 2 --new-tokens 512 --minibatch 4 --cap-gb 40 --repeats 1
    run 120 bench/grpo_step.py --device cuda --preset 1.5b --full --group 8 --prompts 1 --new-tokens 512 --minibatch 2 --cap-gb 40 --repeats 1
    run 120 bench/sample.py $gpu --preset 0.5b --batch 2 --group 8 --new-tokens 256 --repeats 2 --compile --lora 16
fi
cat "$out"
exit $status
