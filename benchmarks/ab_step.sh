#!/usr/bin/env bash
# An A/B of the training step on one GPU in one command: `mxlab bench step` (arms bf16, mxfp8-rceil, mxfp8-rceil-sr,
# mxfp4-all at the h200 preset) on this tree, then with the files under OTHER copied over it (same relative paths),
# then on this tree again, whose two runs show the machine's drift. The tree is restored at the end, also when a run
# fails. Each run gets a third of SECONDS. Writes OUT_PREFIX_{base,other,base2}.txt and prints the arms' rows.
# The A/Bs of docs/performance.md and reports/benchmarks/ab_*.txt ran this way (OTHER: a branch's changed files).
#
#   bash benchmarks/ab_step.sh OTHER OUT_PREFIX [SECONDS]     e.g.  bash benchmarks/ab_step.sh ab/branch $OUT/ab 540
set -u
if [ $# -lt 2 ] || [ ! -d "$1" ]; then
  echo "usage: bash benchmarks/ab_step.sh OTHER OUT_PREFIX [SECONDS]   (OTHER: a folder of files laid out as in the tree)" >&2
  exit 2
fi
other=$1; prefix=$2; seconds=${3:-540}
files=$(cd "$other" && find . -type f | sed 's#^\./##')
saved=$(mktemp -d)
for f in $files; do [ -f "$f" ] && mkdir -p "$saved/$(dirname "$f")" && cp "$f" "$saved/$f"; done
restore() { for f in $files; do if [ -f "$saved/$f" ]; then cp "$saved/$f" "$f"; else rm -f "$f"; fi; done; }
trap restore EXIT
run() {
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $((seconds / 3)) python3 -m mxlab.cli bench step \
    --spec experiments/gem-synthetic.toml --preset h200 --batch 4096 --max-history 1024 \
    --arm bf16 --arm mxfp8-rceil --arm mxfp8-rceil-sr --arm mxfp4-all --warmup 3 --steps 10 --batches 2 \
    > "${prefix}_$1.txt" 2>&1
  echo "$1 (rc=$?):"; grep -E "^\| (bf16|mxfp)" "${prefix}_$1.txt"
}
run base
cp -r "$other/." .
run other
restore
run base2
