#!/usr/bin/env bash
# One command of a GPU visit: install this tree (once per warm machine), then run the named jobs in
# order, each under what is left of SECONDS, each writing under $OUT (a folder per visit elsewhere).
#
#   bash benchmarks/visit.sh SECONDS JOB...
#
# jobs:
#   tests[=PATHS]   GPU tests (pytest -m gpu -n 8 --dist loadgroup: the xdist_group-marked benchmark-size tests share one worker) of PATHS (comma-separated; default: tests) -> gpu_tests.txt
#   bench           mxlab bench step, the six gem-synthetic arms at the h200 preset -> bench_step.txt/.json
#   anatomy[=ARMS]  benchmarks/step_anatomy.py (default arms bf16,mxfp8-rceil) -> anatomy.txt/.json
#   attention       mxlab bench attention -> bench_attention.txt/.json
#   linear          mxlab bench linear -> bench_linear.txt/.json
#   ab=DIR          benchmarks/ab_step.sh DIR (a folder of files laid out as in the tree) -> ab_*.txt
#   gelu            benchmarks/gelu_cast_probe.py at the h200 model's hidden activation -> gelu.txt/.json
#   quant           mxlab bench quant at the h200 model's activation shapes (widths 256, 768, 1024) -> bench_quant.txt/.json
# Records the commit it ran in visit.txt: $COMMIT (the tree sent carries no .git), else git rev-parse HEAD.
set -u
if [ $# -lt 2 ]; then sed -n 2,18p "$0" >&2; exit 2; fi
seconds=$1; shift
out=${OUT:?set OUT to the folder results go to}
start=$(date +%s)
left() { echo $(( seconds - ($(date +%s) - start) )); }
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
{ echo "commit: ${COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"; git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; } > "$out/visit.txt"
if ! python3 -c "import mxlab.kernels, mxlab, sys; sys.exit(0 if mxlab.__file__.startswith('$PWD') else 1)" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$out/visit.txt" 2>&1
fi
for job in "$@"; do
  name=${job%%=*}; arg=${job#*=}; [ "$arg" = "$job" ] && arg=
  budget=$(left)
  if [ "$budget" -lt 20 ]; then echo "$job: skipped, $budget s left" | tee -a "$out/visit.txt"; continue; fi
  t0=$(date +%s)
  case $name in
    tests) paths=${arg:-tests}; timeout "$budget" python3 -m pytest -q -m gpu -n 8 --dist loadgroup ${paths//,/ } > "$out/gpu_tests.txt" 2>&1 ;;
    bench) timeout "$budget" python3 -m mxlab.cli bench step --spec experiments/gem-synthetic.toml --preset h200 \
             --batch 4096 --max-history 1024 --warmup 3 --steps 10 --batches 2 --json "$out/bench_step.json" > "$out/bench_step.txt" 2>&1 ;;
    anatomy) timeout "$budget" python3 benchmarks/step_anatomy.py --preset h200 --batch 4096 --max-history 1024 \
             --arms "${arg:-bf16,mxfp8-rceil}" --profile-steps 2 --json "$out/anatomy.json" > "$out/anatomy.txt" 2>&1 ;;
    attention) timeout "$budget" python3 -m mxlab.cli bench attention --json "$out/bench_attention.json" > "$out/bench_attention.txt" 2>&1 ;;
    linear) timeout "$budget" python3 -m mxlab.cli bench linear --json "$out/bench_linear.json" > "$out/bench_linear.txt" 2>&1 ;;
    gelu) timeout "$budget" python3 benchmarks/gelu_cast_probe.py --json "$out/gelu.json" > "$out/gelu.txt" 2>&1 ;;
    quant) timeout "$budget" python3 -m mxlab.cli bench quant --size 1482752x256 --size 1482752x768 --size 1482752x1024 \
             --no-compile --json "$out/bench_quant.json" > "$out/bench_quant.txt" 2>&1 ;;
    ab) bash benchmarks/ab_step.sh "$arg" "$out/ab" "$budget" > "$out/ab.txt" 2>&1 ;;
    *) echo "unknown job: $job" >> "$out/visit.txt"; continue ;;
  esac
  echo "$job: rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$out/visit.txt"
done
