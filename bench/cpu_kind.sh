#!/usr/bin/env bash
# What a new kind of CPU needs checked, written as one markdown table: the CPU's name and the flags
# that decide the products (AVX-512, AVX512-BF16, AMX), the bfloat16 product fast/cpu_matmul.py
# picks for it, and minirl.generate against transformers' generate in the same process in float32
# and in bfloat16 (the picked product, then the other one). Qwen2.5-0.5B shape, random weights,
# batch 16, greedy: the replies are compared token by token. The suite itself is plain `pytest`.
#
#   bench/cpu_kind.sh [OUT.md]          # about 6 min on 2 cores (NEW_TOKENS=64, REPEATS=3)
#   bench/cpu_kind.sh --tiny [OUT.md]   # the same rows on a tiny model (seconds; tests/test_bench.py)
#
# PYTHON picks the interpreter (default: python3); each row has a time limit (ROW_LIMIT seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
model="--preset 0.5b"
if [ "${1:-}" = "--tiny" ]; then model="--tiny"; shift; fi
out=${1:-bench/cpu_results.md}
shape="$model --batch 16 --new-tokens ${NEW_TOKENS:-64} --repeats ${REPEATS:-3}"
status=0

flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_bf16|amx_tile)$' | tr '\n' ' ')
pick=$("$PY" -c 'from minirl.fast import cpu_matmul; print("float32 blocks" if cpu_matmul.emulated_bfloat16() else "torch bfloat16")') \
    || { echo "$PY cannot import minirl (PYTHON= names the interpreter)" >&2; exit 1; }
{
    echo "# minirl on this CPU, $(date -u +%Y-%m-%d): $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
    echo
    echo "flags: ${flags:-none of avx2/avx512f/avx512_bf16/amx}; bfloat16 product picked: $pick; torch $("$PY" -c 'import torch; print(torch.__version__)')"
    echo
    echo "| script | model | dtype, hardware | workload | minirl | peer or split | ratio / peak |"
    echo "|---|---|---|---|---|---|---|"
} > "$out"

row() {  # row ARGS...: one sample.py run, its row appended to the table
    echo "+ $PY bench/sample.py $*" >&2
    if ! timeout "${ROW_LIMIT:-300}" "$PY" bench/sample.py "$@" --table "$out"; then
        echo "| sample.py | FAILED or over ${ROW_LIMIT:-300}s: $* | | | | | |" >> "$out"
        status=1
    fi
}

row $shape --dtype float32
row $shape --dtype bfloat16
if [ "$pick" = "float32 blocks" ]; then other=torch; else other=blocks; fi
row $shape --dtype bfloat16 --bf16-products $other
cat "$out"
exit $status
