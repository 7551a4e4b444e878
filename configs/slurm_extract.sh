#!/usr/bin/env bash
# A preemptible, requeueable SLURM job: featdump commits on SIGTERM and resumes when the job restarts.
#SBATCH --job-name=featdump
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=16
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --signal=B:TERM@120        # SIGTERM to this script 2 minutes before the time limit
#SBATCH --open-mode=append
set -u
IMAGES=${IMAGES:?set IMAGES to the image folder}
OUT=${OUT:?set OUT to the output .h5 file}

featdump extract --model resnet50 --weights IMAGENET1K_V2 --layers avgpool \
    --batch-size 256 --num-workers "$(( ${SLURM_CPUS_PER_TASK:-8} > 1 ? ${SLURM_CPUS_PER_TASK:-8} - 1 : 1 ))" "$IMAGES" "$OUT" &
pid=$!
trap 'kill -TERM "$pid"' TERM       # pass SLURM's signal on to featdump
wait "$pid"; status=$?
if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then
    wait "$pid"; status=$?           # the trap interrupted wait: now wait for featdump's own exit
fi
if [ "$status" -eq 143 ] || [ "$status" -eq 130 ]; then
    scontrol requeue "$SLURM_JOB_ID"   # the same command resumes from the committed rows
fi
exit "$status"
