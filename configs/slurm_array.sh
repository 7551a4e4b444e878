#!/usr/bin/env bash
# A SLURM job array: task K of N extracts shard K of the sorted images into OUT.shard-K-of-N.h5.
#   sbatch --array=0-7 configs/slurm_array.sh          # 8 shards, one GPU each
#   sbatch --dependency=afterok:<array job id> --wrap "featdump merge $OUT"   # then one merged file
# featdump reads SLURM_ARRAY_TASK_ID/COUNT/MIN itself (and says so in the log); no --shard needed.
# Preempted or timed-out tasks: SIGTERM makes featdump commit and exit 143, the task requeues itself,
# and the same command resumes its shard. Re-submitting the whole array later is safe too: finished
# shards return at once, partial ones resume.
#SBATCH --job-name=featdump-array
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16          # featdump uses SLURM_CPUS_PER_TASK - 1 loader workers
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:TERM@120         # SIGTERM to this script 2 minutes before the time limit
#SBATCH --open-mode=append
set -u
IMAGES=${IMAGES:?set IMAGES to the image folder}
OUT=${OUT:?set OUT to the merged output .h5 file}

featdump extract --model resnet50 --weights IMAGENET1K_V2 --layers avgpool --batch-size 256 "$IMAGES" "$OUT" &
pid=$!
trap 'kill -TERM "$pid"' TERM       # pass SLURM's signal on to featdump
wait "$pid"; status=$?
if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then
    wait "$pid"; status=$?           # the trap interrupted wait: now wait for featdump's own exit
fi
if [ "$status" -eq 143 ] || [ "$status" -eq 130 ]; then
    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"   # resumes from the committed rows
fi
exit "$status"
