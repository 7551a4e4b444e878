"""Readout: linear read-outs of stored features, out of core: ridge probes of class labels and ridge encoding models
of numeric targets (brain responses, behaviour), one per layer, cross-validated over seeded folds with the alpha
chosen by leave-one-out in each; `targets` reads and matches what is predicted, `folds` deals the rows, `ridge` is
the fit's algebra, `passes` reads a layer into it, `readouts` runs them and writes the resumable result,
`scores` defines a layer's one number (accuracy, median r)."""
