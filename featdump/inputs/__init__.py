"""Inputs: images in, batches of model inputs out. `find_images` lists a job's images in order, asking the
`readers` (one per kind of input, each claiming the Locations it reads) in turn: a folder (`folder`), a list file
(`listfile`) or tar shards (`tars`), or the same where they live at a URL (`stores`: the fsspec file systems,
their faults and retries; `objects`: a store prefix or listed URLs; `remote_tars`), a file of image arrays
(`arrays`: HDF5, NetCDF-4, .npy, .npz) or Parquet tables of encoded images (`tables`); each gives one `ImageList`
(`imagelist`: paths, labels, where each image's bytes lie). `decode` opens an image, `preprocess` splits the
model's preprocessing into the pixels made in the loader's workers and the normalisation on the device; `loader`
batches them in source order in forked workers (`workers` chooses how many) and ends them whatever happens;
`gpu_decode` finishes a batch whose JPEGs are left to nvjpeg. Videos: `video` knows them by content, reads their
frame times and decodes a clip's frames by seeking; `clips` lists a job's videos as rows, one per clip, and decodes
a row for the loader."""

from __future__ import annotations

import importlib

# Each name's module, imported when the name is first used: the package's modules import numpy, h5py and PIL,
# which a command's help and `featdump.job.settings` do without.
_HOMES = {"IMAGE_EXTENSIONS": "folder", "Encoded": "imagelist", "ImageList": "imagelist", "Patience": "stores",
          "check_images": "finding", "find_images": "finding", "stored_image": "readers"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"featdump.inputs.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'featdump.inputs' has no attribute {name!r}")
