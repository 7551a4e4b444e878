"""The analyses' choices, without torch (the CLI's --help reads them): metrics and the default memory budget."""

METRICS = ("correlation", "euclidean", "cosine")
DEFAULT_MEMORY = "1GB"  # a laptop's share for the slabs of a layer read at once; the N x N results come on top
# how `compare` compares RDMs, as rsatoolbox names them
COMPARISONS = ("corr", "spearman", "tau-a", "cosine", "corr_cov", "cosine_cov")
RESAMPLES = ("subjects", "images", "both", "none")  # what `compare`'s bootstrap draws
