#!/usr/bin/env bash
# Tune in time-boxed slices, on a GPU machine that may be a different one each time. The
# results DB and the Optuna studies live in STATE_DIR, which is copied to each machine;
# every slice resumes the studies where the last one stopped and copies the state and an
# exported YAML to OUT_DIR, to be copied back as STATE_DIR for the next slice.
#
# usage: bash benchmarks/tune_slice.sh STATE_DIR OUT_DIR SECONDS [more fa2gen tune options]
set -euo pipefail
state=$1 out=$2 budget=$3
shift 3
mkdir -p "$state" "$out"
python3 -m fa2gen tune --arch sm90 --db "$state/tuned.sqlite" --storage "sqlite:///$state/studies.sqlite" \
  --time-budget "$budget" "$@" 2>&1 | tee "$out/tune.log"
# Consistent copies of the WAL-mode databases (the backup API folds in the write-ahead log).
for f in tuned studies; do
  python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
    "$state/$f.sqlite" "$out/$f.sqlite"
done
python3 -m fa2gen export --arch sm90 -o "$out/tuned.yaml" --db "$state/tuned.sqlite"
