"""featdump: dump intermediate activations of vision models over images into HDF5.

    import featdump
    featdump.extract("images/", "out.h5", model="resnet18", layers=["avgpool"], weights="none")
    featdump.extract_on_ray("s3://b/images/", "s3://b/run/out.h5", model="resnet50", layers="avgpool", shards=64)
    data = featdump.load("out.h5", "avgpool")
    with featdump.capture(model, ["layer4"]) as features: ...
    rdms = featdump.rdm("out.h5", metric="correlation")     # {layer: (N, N)}, out of core
    similarity = featdump.cka("resnet.h5", "vit.h5")         # linear CKA between their layers
    batches = featdump.FeatureDataset("out.h5", "avgpool")   # shuffled, resumable batches to train on
    probes = featdump.probe("out.h5")                         # {layer: Readout}: cross-validated ridge probes
    models = featdump.encode("out.h5", "it_neurons.csv")      # {layer: Readout}: ridge encoding models
    ranked = featdump.top("out.h5", "layer4", k=16)           # {layer: Ranking}: each unit's top and bottom images
    scored = featdump.compare("rdms.h5", "v4.npz", resample="both")  # layers against data RDMs: ceiling, tests
"""

from featdump.version import __version__

_API = ("extract", "extract_on_ray", "capture", "load", "Features", "Settings", "srp_matrix", "rdm", "cka",
        "FeatureDataset", "probe", "encode", "Readout", "top", "compare")
# Where each name lives; the rest are in featdump.faces.api.
_HOMES = {"Settings": "featdump.job.settings", "srp_matrix": "featdump.reductions.srp",
          "rdm": "featdump.analysis.rdm", "cka": "featdump.analysis.cka",
          "FeatureDataset": "featdump.training.dataset", "probe": "featdump.readout.readouts",
          "encode": "featdump.readout.readouts", "Readout": "featdump.readout.readouts", "top": "featdump.units.top",
          "compare": "featdump.analysis.compare"}


def __getattr__(name):
    # The Python API, imported lazily so `featdump --help` does not pay for importing torch.
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_HOMES.get(name, "featdump.faces.api")), name)
    raise AttributeError(f"module 'featdump' has no attribute {name!r}")


__all__ = ["__version__", *_API]
