#!/usr/bin/env bash
# The backward pass's GPU measurements in one run, each step time-boxed so that one slow
# step cannot take the others' time; everything lands in OUT_DIR, a summary prints last.
#
# usage: bash benchmarks/backward_gpu.sh OUT_DIR [steps]   (steps: any of tests gluon-tests dqab bwdsplit hostprof tplab
#        pkgab sweep tune fwd fp8 gluon gluon-odd gluon-bwd bench fwdbwd memory train; default: tests dqab bench
#        memory train).
#        "bwdsplit" times each backward kernel and the dQ kernel on tiles of its own
#        (benchmarks/experiments/bwd_split.py); "hostprof" the host time of a call, piece by
#        piece (benchmarks/host_profile.py). "tests" runs the whole
#        GPU suite. "fwd", "bench" and "fwdbwd" time the forward, the backward and both; "fp8" the fp8
#        forward against fa2gen's own bf16 and cuDNN, where its time goes, and its accuracy; "gluon"
#        times the Gluon forward variants of benchmarks/experiments/gluon_fwd.py on the canonical grid
#        ($GLUON_DTYPES, default fp16); "gluon-odd" checks them on odd shapes; "gluon-bwd" times the
#        Gluon dK/dV kernels of benchmarks/experiments/gluon_bwd.py in place of fa2gen's.
#        "pkgab" times the forward of two versions of the package at the same params ($PKG_A,
#        $PKG_B, $PKG_FORCE, $PKG_CELLS: see the step). "tplab" times the backward template $AB_B
#        against $AB_A (default: the working tree's) at the same params, for each dtype in
#        $BENCH_DTYPES (benchmarks/template_ab.py).
#        "tune" re-tunes the $TUNE_DIRECTIONS (default bwd) buckets of $TUNE_GRID (default the
#        built-in grid) into the state in $TUNE_STATE (default .tune-state) for $TUNE_SECONDS
#        (default 400), $TUNE_TRIALS (default 16) trials per bucket, starting from $TUNE_SEED (default
#        the shipped configs), with $TUNE_WORKERS compile processes (default: the tuner's; two
#        tuners on one host should each take well under half its cores, docs/tuning.md).
#        "gluon-tests" runs the Gluon kernels' GPU tests alone.
#        "fwd", "bench" and "fwdbwd" run the dtypes in $BENCH_DTYPES (default "fp16 bf16").
# One GPU per run: CUDA_VISIBLE_DEVICES picks it, so two runs can share a two-GPU host
# (benchmarks/on_gpus.sh). $BUDGET_SECONDS caps the whole run: a step gets what is left of it,
# and one with under 20 s left is skipped, so the summary is always written.
# A device machine returns at most a few files: tar OUT_DIR afterwards.
set -uo pipefail
out=$1
shift
steps=${*:-tests dqab bench memory train}
mkdir -p "$out" && touch "$out/summary.txt"
deadline=$(( SECONDS + ${BUDGET_SECONDS:-86400} ))
run() {  # name seconds command...
  local name=$1 secs=$2 left=$(( deadline - SECONDS - 5 ))
  shift 2
  if (( left < 20 )); then
    echo "$name: skipped, $left s left of the budget" | tee -a "$out/summary.txt"
    return
  fi
  (( secs > left )) && secs=$left
  local t0=$SECONDS
  timeout "$secs" "$@" > "$out/$name.log" 2>&1
  echo "$name: exit $? in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
}
bench_dtypes() {  # mode name: the canonical grid in each of $BENCH_DTYPES, side by side with the bench's GPU
  # providers: fa2gen tuned and default, SDPA's three backends and compiled Flex
  local dt
  for dt in ${BENCH_DTYPES:-fp16 bf16}; do
    run "bench-$2-$dt" 300 python3 -m fa2gen bench --mode "$1" --dtypes "$dt" \
      --json "$out/bench-$2-$dt.json" --markdown "$out/bench-$2-$dt.md" --png "$out/bench-$2-$dt.png"
  done
}
for step in $steps; do
  case $step in
    tests) run gpu-tests 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests ;;
    gluon-tests) run gluon-tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gluon_forward.py \
                   tests/test_gluon_backward.py ;;
    dqab) run dq-ab 300 python3 benchmarks/dq_ab.py --out "$out/dq-ab-fp16.json" ;;
    bwdsplit) run bwd-split 300 python3 benchmarks/experiments/bwd_split.py --out "$out/bwd-split-fp16.json" ;;
    hostprof) run host-profile 120 python3 benchmarks/host_profile.py "$out/host-profile.json" ;;
    tplab)
      for dt in ${BENCH_DTYPES:-fp16 bf16}; do
        run "template-ab-$dt" 420 python3 benchmarks/template_ab.py --a "${AB_A:-fa2gen/templates/attn_bwd.py.jinja}" \
          --b "${AB_B:?tplab needs AB_B, the template to time against AB_A}" --dtype "$dt" --out "$out/template-ab-$dt.json"
      done ;;
    tune)
      state=${TUNE_STATE:-.tune-state}
      # The tuner's own budget fits what is left, with a minute for the import, the copies
      # of its databases and the export, which a timeout would otherwise cut off.
      tune_s=${TUNE_SECONDS:-400}
      dirs=${TUNE_DIRECTIONS:-bwd}
      left=$(( deadline - SECONDS - 90 ))
      (( tune_s > left )) && tune_s=$left
      if (( tune_s < 30 )); then
        echo "tune-$dirs: skipped, $left s left of the budget" | tee -a "$out/summary.txt"
        continue
      fi
      if [ ! -f "$state/tuned.sqlite" ]; then  # start from the shipped entries, so the export holds both directions
        # (with $TUNE_SEED, a tuned-config file to start from instead: benchmarks/carry_over.py's
        # output after a template change, whose unchanged entries keep applying)
        mkdir -p "$state" && python3 -m fa2gen import "${TUNE_SEED:-tuned_configs/sm90/NVIDIA_H200.yaml}" \
          --db "$state/tuned.sqlite"
      fi
      run "tune-$dirs" "$(( tune_s + 60 ))" bash benchmarks/tune_slice.sh "$state" \
        "$out/tune" "$tune_s" --directions "$dirs" --trials "${TUNE_TRIALS:-16}" ${TUNE_GRID:+--grid "$TUNE_GRID"} \
        ${TUNE_WORKERS:+--workers "$TUNE_WORKERS"} ;;
    pkgab)
      # The forward at the same params in two versions of the package: $PKG_A, a folder holding
      # the base's fa2gen and tuned_configs (git archive REV fa2gen tuned_configs | tar -x -C DIR),
      # and $PKG_B (default: this tree). The params are those $PKG_A dispatches or, with $PKG_FORCE
      # (block_m,block_n,num_warps,num_stages,loads,dq_mode,persistent,gluon), that point on every
      # cell; $PKG_CELLS, a regular expression, picks cells. The versions alternate, twice.
      a=${PKG_A:?pkgab needs PKG_A, a folder holding the base package}
      b=${PKG_B:-.}
      f=$out/ab-params.json
      if [ -n "${PKG_FORCE:-}" ]; then
        f=$out/ab-force.json
        run ab-force 60 python3 benchmarks/experiments/package_ab.py force "$f" "$PKG_FORCE" "${PKG_CELLS:-}"
      else
        run ab-params 300 env PYTHONPATH="$a" python3 benchmarks/experiments/package_ab.py params "$f" "${PKG_CELLS:-}"
      fi
      name=$(basename "$f" .json)
      for pass in 1 2; do
        run "$name-a$pass" 300 python3 benchmarks/experiments/package_ab.py time "$a" base "$f" "$out/$name.jsonl" \
          "${PKG_CELLS:-}"
        run "$name-b$pass" 300 python3 benchmarks/experiments/package_ab.py time "$b" change "$f" "$out/$name.jsonl" \
          "${PKG_CELLS:-}"
      done
      # each cell's time over the base's
      python3 benchmarks/experiments/package_ab.py report "$out/$name.jsonl" base > "$out/$name-report.txt" 2>&1
      tail -n 40 "$out/$name-report.txt" ;;
    sweep) run sweep-bwd 480 python3 benchmarks/sweep.py --direction bwd --head-dims 128,64 --seqlens 2048,8192 \
             --out "$out/sweep-bwd-fp16.json" ;;
    fwd) bench_dtypes fwd fwd ;;
    fp8)
      run bench-fwd-fp8 240 python3 -m fa2gen bench --mode fwd --dtypes fp8e4m3 \
        --providers fa2gen,fa2gen-bf16,sdpa-cudnn --json "$out/bench-fwd-fp8.json" --markdown "$out/bench-fwd-fp8.md"
      run fp8-paths 120 python3 benchmarks/experiments/fp8_paths.py
      run fp8-accuracy 120 python3 benchmarks/fp8_accuracy.py --out "$out/fp8-accuracy.json" ;;
    gluon) run gluon-fwd 540 python3 benchmarks/experiments/gluon_fwd.py --dtypes "${GLUON_DTYPES:-fp16}" \
             --out "$out/gluon-fwd.json" ;;
    gluon-odd) run gluon-odd 540 python3 benchmarks/experiments/gluon_fwd.py --odd --dtypes fp16,bf16 \
                 --out "$out/gluon-odd.json" ;;
    gluon-bwd) run gluon-bwd 540 python3 benchmarks/experiments/gluon_bwd.py --dtypes "${GLUON_DTYPES:-fp16}" \
                 --out "$out/gluon-bwd.json" ;;
    bench) bench_dtypes bwd bwd ;;
    fwdbwd) bench_dtypes fwd+bwd fwdbwd ;;
    memory) run memory 180 python3 benchmarks/memory.py --out "$out/memory.json" ;;
    train) run train 420 python3 benchmarks/train_gpt.py --out "$out/train.json" ;;
    *) echo "unknown step $step" >&2 ;;
  esac
done
cat "$out/summary.txt"
tail -n 3 "$out"/gpu-tests.log 2>/dev/null
grep -h geomean "$out"/bench-*.log "$out"/dq-ab.log "$out"/template-ab-*.log 2>/dev/null
tail -n 6 "$out"/memory.log "$out"/train.log 2>/dev/null
