#!/usr/bin/env bash
# All GPUs of one node (or several, with torchrun's --nnodes/--rdzv-endpoint): rank R extracts shard R
# on GPU LOCAL_RANK; when every rank is done (a barrier, --merge-timeout seconds at most), rank 0 writes
# OUT as one file over the shards. Killed midway? Run the same command again: finished shards return
# at once, the others resume, and rank 0 merges.
set -u
IMAGES=${IMAGES:?set IMAGES to the image folder}
OUT=${OUT:?set OUT to the merged output .h5 file}
GPUS=${GPUS:-$(nvidia-smi -L | wc -l)}

torchrun --nproc-per-node "$GPUS" -m featdump extract --model resnet50 --weights IMAGENET1K_V2 \
    --layers avgpool --batch-size 256 --num-workers $(( $(nproc) / GPUS - 1 )) "$IMAGES" "$OUT"
