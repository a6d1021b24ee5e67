# The parameter-server tests' shared job and runner (sourced after genesis_setup.sh): a 20-step
# tiny GPT on 2 micro-batches, and run NAME ARGS..., which trains it into $scratch/NAME.
ps_job=(--data "$scratch/data" --vocab 256 --context 16 --layers 2 --heads 4 --width 64 --batch 8
        --microbatches 2 --steps 20 --warmup 2 --lr 3e-3 --clip 0.5 --eval_every 10 --eval_seqs 8
        --sample_tokens 0 --threads 1)
failed=0

# run NAME ARGS...: trains the job into $scratch/NAME within PS_RUN_SECONDS (default 120), its
# output in $scratch/NAME.log, shown and counted as a failure when the run fails.
run() {
  local name=$1
  shift
  if ! timeout "${PS_RUN_SECONDS:-120}" "$meshtrain" train "${ps_job[@]}" --out "$scratch/$name" \
       "$@" >"$scratch/$name.log" 2>&1; then
    echo "FAIL $name: the run failed"
    tail -n 20 "$scratch/$name.log"
    failed=1
    return 1
  fi
}
