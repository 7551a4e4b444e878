"""featdump: dump intermediate activations of vision models over image folders into HDF5."""

__version__ = "0.1.0"


def __getattr__(name):
    # The Python API, imported lazily so `featdump --help` does not pay for importing torch.
    if name in ("extract", "Settings"):
        from featdump.extraction import extract
        from featdump.settings import Settings

        return {"extract": extract, "Settings": Settings}[name]
    raise AttributeError(f"module 'featdump' has no attribute {name!r}")


__all__ = ["__version__", "extract", "Settings"]
