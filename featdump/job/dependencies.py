"""What a run depends on, read from the marks its `Settings` fields carry (`option(changes=...)`), never listed by
hand. Each field says what a change of it changes:

- `VALUES`: the rows' values; recorded by name in the output's fingerprint (a resume or `--update` with another
  value is refused);
- `LISTING`: which rows there are, and their order; recorded in the fingerprint through the listing's digest;
- `MODEL`: the model as loaded (a warm worker's model, its probe);
- `COMPILED`: the compiled forward (its package, the checked graph) but not the rows;
- `FIT`: the values of `pca:K` layers; recorded in the fingerprint as the identity of the fit set
  (`job.fitting`);
- `LAYOUT`: how the file stores its rows, not what they are (fixed when the file is made);
- nothing (an empty mark): how the run goes (workers, progress, patience, where its files are).

The rules of the marks (tests/test_dependencies.py holds each):

- a `MODEL` field is a keyword of `sources.models.load_model`, by the same name (the model's key is those keywords);
- a `VALUES` field that files made before it do not record must default to None: a missing entry reads as None, so
  those files still resume (any other default would refuse them);
- every field carries a mark, the empty one included: a field without one is refused at import.

The fields and keys are made here; `job.identity.RunIdentity` adds what the model resolved them to (layers,
reductions, decode path, device) and is what every site asks."""

from __future__ import annotations

import dataclasses

VALUES, LISTING, FIT, MODEL, COMPILED, LAYOUT = "values", "listing", "fit", "model", "compiled", "layout"
MARKS = (VALUES, LISTING, FIT, MODEL, COMPILED, LAYOUT)


def marks_of(settings_class) -> dict[str, frozenset[str]]:
    """Every field of SETTINGS_CLASS and its mark (KeyError names a field that has none)."""
    found = {}
    for field in dataclasses.fields(settings_class):
        if "changes" not in field.metadata:
            raise KeyError(f"Settings.{field.name} does not say what it changes (option(changes=...))")
        found[field.name] = field.metadata["changes"]
    return found


def marked(settings, *marks: str) -> dict[str, object]:
    """The fields of SETTINGS that change any of MARKS, by name, in declaration order."""
    return {name: getattr(settings, name) for name, mark in marks_of(type(settings)).items() if mark & set(marks)}


def model_key(settings) -> tuple:
    """What the loaded model is made of: `load_model`'s keywords."""
    return tuple(marked(settings, MODEL).items())


def run_key(settings) -> tuple:
    """Everything that makes a run's rows, model or compiled forward what they are: what a warm worker keys what it
    keeps on (a second job that differs in any of it builds again; shards of one job differ only in what changes
    nothing)."""
    return tuple((name, str(value)) for name, value in marked(settings, VALUES, LISTING, FIT, MODEL, COMPILED).items())


def fingerprinted(settings, **resolved) -> dict:
    """The fields recorded by name in the fingerprint, each as RESOLVED gives it (layers as expanded, each layer's
    reduction, the decode path in use) or as set."""
    return {name: resolved.get(name, value) for name, value in marked(settings, VALUES).items()}


def compiled_key(settings, **resolved) -> dict:
    """What a compiled forward depends on beyond its weights and input batch (`forward.ahead`'s key): every field
    that changes the model, the values or the compiled forward, RESOLVED as in `fingerprinted`."""
    return {name: resolved.get(name, value) for name, value in marked(settings, VALUES, MODEL, COMPILED).items()}
