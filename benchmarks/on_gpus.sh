#!/usr/bin/env bash
# Several backward_gpu.sh runs side by side, one per GPU of this host, each within SECONDS.
#
# usage: bash benchmarks/on_gpus.sh OUT_DIR SECONDS 'JOB' ['JOB' ...]
#   JOB: "[VAR=value ...] step [step ...]" for backward_gpu.sh; the i-th job runs on GPU i
#   with its output in OUT_DIR/gpu<i>. Example, tuning the two dtypes on two GPUs:
#   bash benchmarks/on_gpus.sh r 500 'TUNE_GRID=benchmarks/grids/bwd-fp16.yaml TUNE_STATE=state/fp16 tune' \
#                                    'TUNE_GRID=benchmarks/grids/bwd-bf16.yaml TUNE_STATE=state/bf16 tune'
# Words split at spaces (no quoting): a value cannot hold a space. A job of only VAR=value
# words runs backward_gpu.sh's default steps.
# Jobs on one host share its CPUs: compile-heavy steps (Flex, tuning) can disturb the timing
# of another GPU's short cells.
set -uo pipefail
out=$1 budget=$2
shift 2
here=$(dirname "$0")
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( gpus > 0 && $# > gpus )); then
  echo "on_gpus.sh: $# jobs for $gpus GPUs" >&2
  exit 2
fi
gpu=0
for job in "$@"; do
  mkdir -p "$out/gpu$gpu"
  # The job's words: leading VAR=value pairs become its environment, the rest its steps.
  read -ra words <<< "$job"
  envs=() steps=()
  for w in "${words[@]}"; do
    if (( ${#steps[@]} == 0 )) && [[ $w == [A-Z_]*=* ]]; then envs+=("$w"); else steps+=("$w"); fi
  done
  env ${envs[@]+"${envs[@]}"} CUDA_VISIBLE_DEVICES=$gpu BUDGET_SECONDS="$budget" \
    bash "$here/backward_gpu.sh" "$out/gpu$gpu" "${steps[@]}" > "$out/gpu$gpu.out" 2>&1 &
  gpu=$(( gpu + 1 ))
done
wait
for f in "$out"/gpu*.out; do echo "== $f"; tail -n 12 "$f"; done
