#!/usr/bin/env bash
# All GPUs of one node (or several, with torchrun's --nnodes/--rdzv-endpoint): rank R extracts shard R
# on GPU LOCAL_RANK; when every rank is done (a barrier, --merge-timeout seconds at most), rank 0 writes
# OUT as one file over the shards. Killed midway? Run the same command again: finished shards return
# at once, the others resume, and rank 0 merges.
set -u
IMAGES=${IMAGES:?set IMAGES to the image folder}
OUT=${OUT:?set OUT to the merged output .h5 file}
if [ -z "${GPUS:-}" ]; then
    GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
fi
if [ "${GPUS:-0}" -lt 1 ]; then
    echo "No GPU found (nvidia-smi): set GPUS to the number of processes to start." >&2
    exit 2
fi
# Each rank decodes with the node's CPUs shared out, less one for its own main process (at least one).
WORKERS=$(( $(nproc) / GPUS - 1 ))
[ "$WORKERS" -ge 1 ] || WORKERS=1

torchrun --nproc-per-node "$GPUS" -m featdump extract --model resnet50 --weights IMAGENET1K_V2 \
    --layers avgpool --batch-size 256 --num-workers "$WORKERS" "$IMAGES" "$OUT"
