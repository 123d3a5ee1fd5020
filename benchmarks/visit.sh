#!/usr/bin/env bash
# One command of a GPU machine: install this tree (once per warm machine), then run the named jobs in
# order, each under what is left of SECONDS, each writing under $OUT.
#
#   bash benchmarks/visit.sh SECONDS JOB...
#
# jobs (CARD: h100, h200, ... from nvidia-smi; each .txt starts with its command, commit, device and date,
# ready to be copied to reports/benchmarks/ under the same name):
#   tests[=PATHS]   GPU tests (pytest -m gpu -n 8 --dist loadgroup: the xdist_group-marked benchmark-size tests share one worker) of PATHS (comma-separated; default: tests) -> gpu_tests.CARD.txt
#   bench           mxlab bench step, the six gem-synthetic arms at the h200 preset -> bench_step.CARD.txt/.json
#   anatomy[=ARMS]  benchmarks/step_anatomy.py (default arms bf16,mxfp8-rceil) -> anatomy.CARD.txt/.json
#   attention       mxlab bench attention -> bench_attention.CARD.txt/.json
#   linear          mxlab bench linear (with its torchao arm when the run carries a torchao wheel in .whl/) -> bench_linear.CARD.txt/.json
#   linear-compile  mxlab bench linear --compile at M = 65536, K = N = 512 / 1024 / 4096 -> bench_linear_compile.CARD.txt/.json
#   ab=DIR          benchmarks/ab_step.sh DIR (a folder of files laid out as in the tree) -> ab.txt, ab_{base,other,base2}.txt
#   gelu            benchmarks/gelu_cast_probe.py at the h200 model's hidden activation -> gelu_cast_probe.CARD.txt/.json
#   step=SPEC       mxlab bench step of every arm of SPEC at its own sizes (the step times `mxlab power --plan` prices
#                   a plan by) -> bench_step_NAME.CARD.txt/.json
#   step-compile[=SPEC]  mxlab bench step --compile, bf16 and mxfp8-rceil: at the h200 preset -> bench_step_compile.CARD.txt/.json;
#                   with SPEC at that spec's own sizes -> bench_step_compile_NAME.CARD.txt/.json (NAME: the spec file's name)
#   baseline        benchmarks/baseline_check.py: 16 + 16 gem-mxfp8 BF16 warm-ups, new and old training recipe -> baseline_check.CARD.txt/.json
#   plateau         mxlab run experiments/learnable-plateau.toml (MPS) -> plateau.CARD.txt, plateau.tar.gz (the study's small files: metrics, configs, no .npz or .pt)
#   resume=SPEC[@SEEDS][+ARMS]  mxlab run SPEC --resume --no-keep-runs (MPS) in $HOME/studies/NAME, seeded from the tree's
#                   reports/NAME when that holds earlier visits' records: a study longer than one visit goes on
#                   where the last left off; @SEEDS (e.g. @0,1) runs only those seeds (--set seeds=[0,1]; list the
#                   earlier visits' seeds too: the report covers the seeds listed, and done ones are not trained
#                   again); +ARMS (e.g. +bf16,placebo) trains only those arms now (--only-arms) -> resume_NAME.CARD.txt, NAME.tar.gz (the study folder without eval.npz: the records of
#                   finished runs, written also when the time limit cuts the study, and the cut runs' checkpoints
#                   only while the archive stays under 45 MiB: one of gem-mxfp8's model size is about 25 MB, so plan
#                   visits in which all but one run finish, or call again on the warm machine, whose
#                   $HOME/studies keeps them; a larger archive is split into
#                   NAME.tar.gz.part-*: `cat NAME.tar.gz* | tar -xz -C reports` and commit; NAME: the spec file's name)
#   study=SPEC      mxlab bench study SPEC --steps 50 --mps (default experiments/gem-mxfp8.toml) -> bench_study.CARD.txt/.json
#   quant           mxlab bench quant at the h200 model's activation shapes (widths 256, 768, 1024) -> bench_quant.CARD.txt/.json
#   mps             one CUDA MPS daemon for the rest of the visit (every later job's CUDA processes share it)
#   JOB&            (quote it) runs JOB in the background: the next jobs start at once, side by side on the GPU
#                   under `mps`; each still ends at the visit's time limit
#   wait            waits for the background jobs before the next job (the visit also waits for them at its end)
# e.g. bash benchmarks/visit.sh 560 mps 'resume=experiments/A.toml@0,1+bf16&' resume=experiments/B.toml wait
# Records the commit it ran in visit.txt: $COMMIT, else git rev-parse HEAD. Pass COMMIT (the short hash here): the
# copy of the tree on the GPU machine may carry a stale .git whose HEAD is not the tree sent.
set -u
if [ $# -lt 2 ]; then sed -n "2,/^set -u/p" "$0" | sed "\$d" >&2; exit 2; fi
seconds=$1; shift
out=${OUT:?set OUT to the folder results go to}
start=$(date +%s)
left() { echo $(( seconds - ($(date +%s) - start) )); }
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
device=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
card=$(echo "$device" | grep -o -E 'H[0-9]+' | head -1 | tr 'A-Z' 'a-z'); card=${card:-gpu}
{ echo "commit: $commit"; git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; } > "$out/visit.txt"
if ! python3 -c "import mxlab.kernels, mxlab, sys; sys.exit(0 if mxlab.__file__.startswith('$PWD') else 1)" 2>/dev/null; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$out/visit.txt" 2>&1
fi
# run_to FILE CMD...: FILE gets a header line (the command, commit, device, date), then the command's output.
run_to() {
  local file=$1; shift
  echo "# PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF $* (tree of $commit, one $device, $(date -u +%Y-%m-%d), via benchmarks/visit.sh)" > "$file"
  timeout "$budget" "$@" >> "$file" 2>&1
}
# run_job JOB: one job of the list above, under $budget seconds; appends its exit status and time to visit.txt.
run_job() {
  local job=$1 name arg t0 file paths seeds arms folder status
  name=${job%%=*}; arg=${job#*=}; [ "$arg" = "$job" ] && arg=
  t0=$(date +%s)
  case $name in
    tests) paths=${arg:-tests}; run_to "$out/gpu_tests.$card.txt" python3 -m pytest -q -m gpu -n 8 --dist loadgroup ${paths//,/ } ;;
    bench) run_to "$out/bench_step.$card.txt" python3 -m mxlab.cli bench step --spec experiments/gem-synthetic.toml --preset h200 \
             --batch 4096 --max-history 1024 --warmup 3 --steps 10 --batches 2 --json "$out/bench_step.$card.json" ;;
    anatomy) run_to "$out/anatomy.$card.txt" python3 benchmarks/step_anatomy.py --preset h200 --batch 4096 --max-history 1024 \
             --arms "${arg:-bf16,mxfp8-rceil}" --profile-steps 2 --json "$out/anatomy.$card.json" ;;
    attention) run_to "$out/bench_attention.$card.txt" python3 -m mxlab.cli bench attention --json "$out/bench_attention.$card.json" ;;
    linear) ls .whl/torchao-*.whl >/dev/null 2>&1 && python3 -m pip install -q --no-deps .whl/torchao-*.whl >> "$out/visit.txt" 2>&1
             run_to "$out/bench_linear.$card.txt" python3 -m mxlab.cli bench linear --json "$out/bench_linear.$card.json" ;;
    linear-compile) run_to "$out/bench_linear_compile.$card.txt" python3 -m mxlab.cli bench linear --compile \
             --shape 65536x512x512 --shape 65536x1024x1024 --shape 65536x4096x4096 --json "$out/bench_linear_compile.$card.json" ;;
    step) file=bench_step_$(basename "${arg%.toml}")
          run_to "$out/$file.$card.txt" python3 -m mxlab.cli bench step --spec "$arg" --warmup 3 --steps 10 --batches 2 \
            --json "$out/$file.$card.json" ;;
    step-compile) if [ -n "$arg" ]; then file=bench_step_compile_$(basename "${arg%.toml}")
               run_to "$out/$file.$card.txt" python3 -m mxlab.cli bench step --spec "$arg" --arm mxfp8-rceil --warmup 3 \
                 --steps 20 --batches 2 --compile --json "$out/$file.$card.json"
             else run_to "$out/bench_step_compile.$card.txt" python3 -m mxlab.cli bench step --spec experiments/gem-synthetic.toml \
               --preset h200 --batch 4096 --max-history 1024 --arm mxfp8-rceil --warmup 3 --steps 10 --batches 2 --compile \
               --json "$out/bench_step_compile.$card.json"; fi ;;
    baseline) run_to "$out/baseline_check.$card.txt" python3 benchmarks/baseline_check.py --spec experiments/gem-mxfp8.toml \
             --seeds 16 --mps --runs-per-device 16 --out "$HOME/baseline" --json "$out/baseline_check.$card.json" ;;
    plateau) run_to "$out/plateau.$card.txt" python3 -m mxlab.cli run experiments/learnable-plateau.toml --device cuda --mps \
             --runs-per-device 2 --out "$HOME/plateau" --no-keep-runs; status=$?
             tar -czf "$out/plateau.tar.gz" --exclude='*.pt' --exclude='*.npz' -C "$HOME" plateau; (exit $status) ;;
    study) run_to "$out/bench_study.$card.txt" python3 -m mxlab.cli bench study "${arg:-experiments/gem-mxfp8.toml}" \
             --steps 50 --mps --json "$out/bench_study.$card.json" ;;
    resume) arms=; case $arg in *+*) arms=${arg#*+}; arg=${arg%+*} ;; esac
             seeds=; case $arg in *@*) seeds=${arg#*@}; arg=${arg%@*} ;; esac
             name=$(basename "${arg%.toml}"); folder=$HOME/studies/$name
             if [ ! -d "$folder" ] && [ -d "reports/$name/records" ]; then mkdir -p "$HOME/studies"; cp -r "reports/$name" "$folder"; fi
             run_to "$out/resume_$name.$card.txt" python3 -m mxlab.cli run "$arg" --device cuda --mps --resume --no-keep-runs \
               --out "$folder" ${seeds:+--set "seeds=[$seeds]"} ${arms:+--only-arms "$arms"}; status=$?
             tar -czf "$out/$name.tar.gz" --exclude=eval.npz --exclude=checkpoint.prev.pt -C "$HOME/studies" "$name"
             if [ "$(stat -c %s "$out/$name.tar.gz")" -gt 47185920 ]; then  # three 15 MiB parts at most
               tar -czf "$out/$name.tar.gz" --exclude=eval.npz --exclude='checkpoint*.pt' -C "$HOME/studies" "$name"
             fi
             if [ "$(stat -c %s "$out/$name.tar.gz")" -gt 15728640 ]; then  # a file comes back only under 16 MiB
               split -b 15m "$out/$name.tar.gz" "$out/$name.tar.gz.part-" && rm "$out/$name.tar.gz"
             fi; (exit $status) ;;
    gelu) run_to "$out/gelu_cast_probe.$card.txt" python3 benchmarks/gelu_cast_probe.py --json "$out/gelu_cast_probe.$card.json" ;;
    quant) run_to "$out/bench_quant.$card.txt" python3 -m mxlab.cli bench quant --size 1482752x256 --size 1482752x768 \
             --size 1482752x1024 --no-compile --json "$out/bench_quant.$card.json" ;;
    ab) bash benchmarks/ab_step.sh "$arg" "$out/ab" "$budget" > "$out/ab.txt" 2>&1 ;;
    *) echo "unknown job: $job" >> "$out/visit.txt"; return ;;
  esac
  echo "$job: rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$out/visit.txt"
}
# mps: one CUDA MPS daemon for the rest of the visit in $HOME/mps (kept by a warm machine); `mxlab run --mps`
# and every other CUDA process of the visit then share it, so jobs run side by side on the GPU.
mps_started=
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=$HOME/mps/pipe CUDA_MPS_LOG_DIRECTORY=$HOME/mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then echo "mps: daemon already running" >> "$out/visit.txt"
  elif nvidia-cuda-mps-control -d >> "$out/visit.txt" 2>&1; then mps_started=1; echo "mps: daemon started" >> "$out/visit.txt"
  else echo "mps: the daemon did not start" | tee -a "$out/visit.txt"; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; fi
}
for job in "$@"; do
  budget=$(left)
  case $job in
    mps) start_mps; continue ;;
    wait) wait; continue ;;
  esac
  if [ "$budget" -lt 20 ]; then echo "$job: skipped, $budget s left" | tee -a "$out/visit.txt"; continue; fi
  case $job in
    *'&') run_job "${job%&}" & ;;
    *) run_job "$job" ;;
  esac
done
wait
if [ -n "$mps_started" ]; then echo quit | nvidia-cuda-mps-control; fi
