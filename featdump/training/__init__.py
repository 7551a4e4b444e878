"""Training: the stored features read back to train on (`FeatureDataset`): an output, a merged view's shards or a
job's shard files as one set of rows (`stored`), the plan of an epoch (`plan`: chunks in a seeded order, dealt to
ranks, read in windows that are shuffled and cut into batches, dealt to loader workers, resumable at any batch), and
the iterable dataset that reads the windows with chunk-aligned slices and yields the batches (`dataset`)."""
