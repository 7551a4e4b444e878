"""Sources: where a model comes from. `models` builds the nn.Module a --model names (torchvision, timm, hf:,
open_clip:, your factory, a saved file) in eval mode with its weights and its own preprocessing, and records
where it came from; one module per source does the source's part; `tokens` holds what a model states of its
token sequences (prefix tokens, patch size), from which a layer's token layout is proven; `video_models` names
torchvision's video models and the clip their weights state. The lowest package of
the pipeline: it imports nothing of featdump but its errors."""
