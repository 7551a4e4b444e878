"""Sources: where a model comes from. `models` builds the nn.Module a --model names (torchvision, timm, hf:,
open_clip:, your factory, a saved file) in eval mode with its weights and its own preprocessing, and records
where it came from; one module per source does the source's part; `tokens` holds what a model states of its
token sequences (prefix tokens, patch size), from which a layer's token layout is proven. `torchvision_models`
alone knows a torchvision name's task, which decides its build, preprocessing and rows: `video_models` (the clip
their weights state), `flow_models` (pairs of frames), `segmentation_models` (a square crop), `detection_models`
(a square resize; rows from the backbone), `quantized_models` (the CPU only). The lowest package of
the pipeline: it imports nothing of featdump but its errors."""
