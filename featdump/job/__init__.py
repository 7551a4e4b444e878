"""Job: one extract run from its settings to its summary. `options` declares each option once (type, default,
check), `settings` holds a run's values and `config` reads them from a TOML file; `runner` plans the run (images,
shard, model, layers, reductions), opens its output, runs the PCA fit pass (`fitting`) and the batches through
the capture into the writer, and finishes it; `shards` decides which part of the images this process owns
(--shard, SLURM arrays, torchrun); `proof` recomputes a sample of a run's rows on the reference path (CPU, fp32,
eager) and judges them by `tolerances`; `signals` turns SIGINT/SIGTERM into a stop after the batch in flight; `report`
is what the run tells its user (progress, summary)."""
