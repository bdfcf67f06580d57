#!/usr/bin/env bash
# Regenerates the published sweeps in simulator/results/: B1 and B0, 10 seeds (0-9), in each of
# the three information modes (what Kudos is told about each job: declared work, measured
# progress, nothing). Run from the repository root:
#   KUDOS_DATA_DIR=../shared/data simulator/results/reproduce.sh [path/to/kudos-sim]
# Without a binary argument it builds one (cargo build --release -p kudos-sim).
set -euo pipefail
: "${KUDOS_DATA_DIR:?set KUDOS_DATA_DIR to the shared/data directory (full data sets)}"
if [[ $# -ge 1 ]]; then
    SIM=$1
else
    cargo build --release -p kudos-sim
    SIM=${CARGO_TARGET_DIR:-target}/release/kudos-sim
fi
OUT=simulator/results
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SEEDS=0,1,2,3,4,5,6,7,8,9
B1_RATES=0.05,0.1,0.15,0.2,0.225,0.25,0.26,0.275,0.3,0.325,0.35
B0_RATES=1,2,3,3.5,4,4.25,4.5,4.75,5,5.5,6
for info in declared progress none; do
    # B1: Philly job mix on Gavel throughputs, 9 nodes x 4 GPUs per type (108 GPUs).
    "$SIM" --data-dir "$KUDOS_DATA_DIR" --workload b1 --jobs 6000 --seeds $SEEDS \
        --sweep $B1_RATES --info $info --plot $OUT/b1-$info.svg \
        --summary $OUT/b1-$info.md --seeds-csv $OUT/b1-$info.csv > /dev/null
    # B0: Gavel's generator on Gavel's cluster, 36 one-GPU nodes per type (108 GPUs).
    "$SIM" --data-dir "$KUDOS_DATA_DIR" --workload b0 --cluster per-type:36x1 --jobs 6000 \
        --seeds $SEEDS --sweep $B0_RATES --info $info --plot $OUT/b0-$info.svg \
        --summary $OUT/b0-$info.md --seeds-csv $OUT/b0-$info.csv > /dev/null
    # MAPE with the batch size in the class (--class-by-job-type), Kudos only, three rates.
    "$SIM" --data-dir "$KUDOS_DATA_DIR" --workload b1 --jobs 6000 --seeds $SEEDS \
        --sweep 0.1,0.25,0.3 --info $info --policies kudos --class-by-job-type \
        --plot "$TMP/plot.svg" --seeds-csv $OUT/b1-jobtype-$info.csv > /dev/null
    "$SIM" --data-dir "$KUDOS_DATA_DIR" --workload b0 --cluster per-type:36x1 --jobs 6000 \
        --seeds $SEEDS --sweep 2,4,5 --info $info --policies kudos --class-by-job-type \
        --plot "$TMP/plot.svg" --seeds-csv $OUT/b0-jobtype-$info.csv > /dev/null
done
python3 simulator/results/condense.py
