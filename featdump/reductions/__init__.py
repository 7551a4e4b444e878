"""Reductions: what is kept of each layer's output, computed on the device before anything is copied to the
host. `rules` picks each layer's reduction from --reduce (PATTERN=REDUCTION, the most specific wins);
`methods` binds it to the layer (none, flatten, avgpool, maxpool, cls, patchmean, channels:A-B) and makes the
snapshot the capture takes; `srp` (sparse random projections) and `pca` (exact fits with bounded memory, and
their projection) are the two that need a matrix; `record` is the Reduction every method returns."""
