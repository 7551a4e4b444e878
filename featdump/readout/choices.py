"""The read-outs' defaults, without torch (the CLI's --help reads them)."""

DEFAULT_ALPHAS = "1e-2:1e8:11"  # 0.01, 0.1, ..., 1e8: layers' feature scales (and so their fit alphas) vary that much
DEFAULT_FOLDS = 5
