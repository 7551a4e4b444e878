"""featdump's benchmarks: one module per question, each run from the repository's root as `python -m
benchmarks.NAME` (`--help` says what it measures). `common` holds what they share (images made once, a featdump
command timed in its own process, the machine, a benchmark's own section of RESULTS.md); `faults`, `photos`,
`videos`, `outputs`, `seaweed` and `tiny_models` make what the tests use too (injected faults, camera photos,
films, synthetic outputs, an S3 store on loopback, small factory models). Nothing here imports the tests."""
