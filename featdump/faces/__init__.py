"""Faces: how people reach featdump. `cli` is the `featdump` command (Click: extract, list-layers, info, merge,
show), turning featdump's errors into one-line messages and exit codes; `api` is the Python API
(`featdump.extract`, `load`, `capture`); `info` describes an output or a running job; `show` draws a layer's
feature maps over the image they came from. The highest package: it may import every other."""
