"""Info: what an output file holds and how far its run got, as a dict (--json) or as lines to read."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import NotAnOutput
from featdump.faces.info_results import read_result, result_lines
from featdump.output import skipped as skips
from featdump.output.layout import Output, partial_path, text_of
from featdump.output.lock import lock_holder
from featdump.output.merge import merge_problem
from featdump.output.places import place_of
from featdump.output.progress import describe_running, read_record, running_lines, stopped_line
from featdump.output.shard_files import shard_count, shard_counts, shard_path
from featdump.output.update import grow_path, staging_path

_SHOWN = 20  # skipped and stale images listed by name
_PROVENANCE = ("image_root", "image_listing", "clip_frames", "clip_fps", "clip_every", "clip_anchor", "clip_pad",
               "preprocessing", "command", "featdump_version", "torch_version", "created")


def read_info(output: Path | str) -> dict:
    """Everything `featdump info` reports on OUTPUT (or OUTPUT.partial, or OUTPUT's shards; at a URL, the output
    or its shards in the store) as plain values."""
    stored = place_of(output).stored()
    if stored is not None:
        return stored
    path = Path(output)
    results = read_result(path)
    if results is not None:
        return results
    job = _job_state(path)
    if job is not None and job["state"] in ("running", "starting"):
        return job  # the file is being written: everything comes from the progress record
    if not path.exists() and partial_path(path).exists():
        path = partial_path(path)
    if not path.exists():
        shards = _shards_info(path)
        if shards:
            return shards
        if job is not None:  # killed while starting: its record is all there is
            raise NotAnOutput(f"No file {str(output)!r}: the job that started it (pid {job['pid']}) stopped before "
                              "writing anything; run the same command again.")
        raise NotAnOutput(f"No file {str(output)!r} (nor {str(partial_path(Path(output)))!r}, nor shards of it).")
    with Output.open(path) as output:
        info = _file_info(output)
    if job is not None and not info["complete"]:
        info["state"], info["job"] = "stopped", job  # a writer that died: its last record
    return info


def _job_state(path: Path) -> dict | None:
    """The running (or stopped) job writing PATH, from its progress record and its lock; None if none."""
    output = path.with_name(path.name.removesuffix(".partial"))
    record, holder = read_record(output), lock_holder(output)
    if record is None:
        if holder is None:
            return None
        record = {"state": "starting", "pid": holder, "file": str(output)}  # between the lock and its record
    return describe_running(record, running=holder is not None)


def _file_info(output: Output) -> dict:
    attrs, committed, fingerprint = output.attrs, output.committed, output.fingerprint
    return {
        "state": "complete" if output.complete else "partial",
        "file": str(output.path),
        "model": text_of(attrs.get("model")),
        "weights": text_of(attrs.get("weights")),
        "seed": int(attrs["seed"]) if "seed" in attrs else None,
        "complete": output.complete,
        "rows": committed.rows,
        "row": output.noun,  # what a row is
        "images_done": committed.images,
        "image_count": fingerprint.get("image_count"),
        "layers": {name: _layer(output, name) for name in output.layers},
        "classes": output.classes,
        "skipped": committed.skipped,
        "skipped_examples": output.named_rows("skipped", _SHOWN),
        "skipped_changed": [skip.key for skip in skips.changed_under(output.file, text_of(attrs.get("image_root")),
                                                                      committed.skipped)],
        "shard": fingerprint.get("shard"),
        "merged": _merged_info(output.path, attrs) if "merged_from" in attrs else None,
        "update": _update_info(output.path),
        "stale": output.stale_count(),
        "stale_examples": output.named_rows("stale", _SHOWN),
        "stale_groups": _stale_groups(output),
        "provenance": {key: text_of(attrs[key]) for key in _PROVENANCE if key in attrs},
        "proof": output.proofs,
    }


def _stale_groups(output) -> list[list]:
    """The stale rows counted by folder (an array's rows: by array) and reason, the first few names of each:
    [folder, reason, count, examples], most first."""
    import collections

    if "stale" not in output.file:
        return []
    paths, reasons = output.file["stale/paths"].asstr()[:], output.file["stale/reasons"].asstr()[:]
    counts: collections.Counter = collections.Counter()
    examples: dict[tuple[str, str], list[str]] = {}
    for path, reason in zip(paths, reasons):
        folder, _, name = path.rpartition("/")
        key = (folder or ".", reason)
        counts[key] += 1
        if len(examples.setdefault(key, [])) < 3:
            examples[key].append(name)
    return [[folder, reason, count, examples[(folder, reason)]] for (folder, reason), count in counts.most_common()]


def _update_info(path: Path) -> dict | None:
    """An --update of PATH not finished (killed, or running): each of its staging files, the new layers of the
    stored rows (OUT.grow) and the new images (OUT.update), and how far it got; None when there is none."""
    parts = {}
    for what, staged in (("new layers", grow_path(path)), ("new images", staging_path(path))):
        for file in (staged, partial_path(staged)):
            if file.exists():
                try:
                    with Output.open(file) as held:
                        parts[what] = {"file": str(file), "layers": held.layers, "done": held.committed.images,
                                       "of": held.fingerprint.get("image_count"), "finished": held.complete}
                except NotAnOutput:
                    parts[what] = {"file": str(file), "layers": [], "done": 0, "of": None, "finished": False}
    return parts or None


def _update_line(update: dict) -> str:
    parts = []
    for what, part in update.items():
        layers = f" ({', '.join(part['layers'])})" if what == "new layers" else ""
        rows = "stored rows" if what == "new layers" else "new images"
        state = "staged, not yet joined" if part["finished"] else f"{part['done']} of {part['of'] or '?'} {rows} done"
        parts.append(f"{what}{layers}: {state} in {Path(part['file']).name}")
    return ("update:     not finished (killed, or running): " + "; ".join(parts) + ". The rows shown are valid; run "
            "the same --update command again to finish it")


def _merged_info(path: Path, attrs) -> dict:
    """What a merged file was made from (a virtual one opens only when its shards are all there, unchanged)."""
    return {"shards": [text_of(name) for name in attrs["merged_from"]], "virtual": bool(attrs.get("virtual", False))}


def _shards_info(output: Path) -> dict | None:
    """For an OUTPUT not merged yet: each shard's state and the sums (None when it has no shards)."""
    if not shard_counts(output):
        return None
    count = shard_count(output)  # ShardProblem naming the counts when shards of two runs lie side by side
    shards = []
    for index in range(count):
        path = shard_path(output, index, count)
        try:
            state = read_info(path)
        except NotAnOutput:
            shards.append({"index": index, "file": str(path), "state": "missing", "images_done": 0,
                           "image_count": None})
            continue
        done = state["images_done"] if state["state"] != "complete" else state["rows"] + state["skipped"]
        shards.append({"index": index, "file": str(path), "state": state["state"], "images_done": done,
                       "image_count": state["image_count"] if state["state"] != "complete" else done})
    finished = all(shard["state"] == "complete" for shard in shards)
    return {"state": "sharded", "file": str(output), "merged": None, "shards": shards,
            "merge_problem": merge_problem(output) if finished else None,
            "images_done": sum(shard["images_done"] for shard in shards),
            "image_count": sum(shard["image_count"] or 0 for shard in shards)}


def _store_lines(info: dict) -> list[str]:
    if info["state"] == "in store":
        return [f"{info['file']}: finished, in the store: {info['rows']} rows ({info['skipped']} skipped), "
                f"{info['bytes']} bytes (h5py reads it through fsspec; or download it)",
                f"model:      {info['model']} (weights {info['weights']})",
                f"layers:     {', '.join(info['layers'])}"]
    shards, finished = info["shards"], info["finished"]
    if finished == len(shards) and info.get("merge_problem"):
        return [f"{info['file']}: not merged yet; all {len(shards)} shards are finished in the store but cannot be "
                f"merged: {info['merge_problem']}"]
    if finished == len(shards):
        return [f"{info['file']}: not merged yet; all {len(shards)} shards are finished in the store: run "
                f"`featdump merge {info['file']}`"]
    waiting = [str(shard["index"]) for shard in shards if shard["state"] != "complete"]
    return [f"{info['file']}: not merged yet; {finished} of {len(shards)} shards finished in the store (a shard "
            f"is uploaded when it is finished); not there yet: shard {', '.join(waiting[:_SHOWN])}"
            f"{' ...' if len(waiting) > _SHOWN else ''}"]


def _shard_lines(info: dict) -> list[str]:
    shards = info["shards"]
    finished = sum(shard["state"] == "complete" for shard in shards)
    if finished == len(shards) and info["merge_problem"]:
        head = f"not merged yet; all {len(shards)} shards are finished but cannot be merged: {info['merge_problem']}"
    elif finished == len(shards):
        head = f"not merged yet; all {len(shards)} shards are finished: run `featdump merge {info['file']}`"
    else:
        head = f"not merged yet; {finished} of {len(shards)} shards finished"
    lines = [f"{info['file']}: {head}",
             f"progress:   {info['images_done']} images done in all shards (of {info['image_count']} known)"]
    for shard in shards:
        total = shard["image_count"] if shard["image_count"] is not None else "?"
        lines.append(f"  shard {shard['index']}: {shard['state']}, {shard['images_done']} of {total} images "
                     f"({shard['file']})")
    return lines


def describe(output: Path) -> list[str]:
    """Lines saying what OUTPUT (or OUTPUT.partial) holds and how far its run got."""
    stored = place_of(output).stored()
    if stored is not None:
        return _store_lines(stored)
    path = Path(output) if Path(output).exists() else partial_path(Path(output))
    results = read_result(path)
    if results is not None:
        return result_lines(path, results)
    info = read_info(output)
    if info.get("state") in ("running", "starting"):
        return running_lines(info)
    if info["state"] == "sharded":
        return _shard_lines(info)
    return _output_lines(output, info)


def _output_lines(output: Path, info: dict) -> list[str]:
    """Lines saying what the output INFO describes holds (`read_info`)."""
    lines = [
        f"file:       {info['file']}",
        f"model:      {info['model']} (weights {info['weights']}, seed {info['seed']})",
        f"complete:   {'yes' if info['complete'] else 'no'}",
        f"rows:       {info['rows']}{' (clips of videos)' if info['row'] == 'clip' else ''}",
    ]
    if info["shard"]:
        index, count = info["shard"]
        lines.append(f"shard:      {index} of {count} (0-based); `featdump merge` joins the shards")
    if info["merged"]:
        merged = info["merged"]
        kind = "virtual datasets reading the shards" if merged["virtual"] else "a self-contained copy"
        lines.append(f"merged:     {len(merged['shards'])} shards, {kind}")
    if info["update"]:
        lines.append(_update_line(info["update"]))
    if info.get("job"):
        lines.append(stopped_line(info["job"]))
    if not info["complete"]:
        lines.append(f"progress:   {info['images_done']} of {info['image_count'] or '?'} {info['row']}s done; "
                     "run the same extract command again to resume")
    lines.append("layers:")
    lines += [f"  {name}: {tuple(layer['shape'])} {layer['dtype']}{_reduction_note(layer)}{_added_note(layer)}"
              for name, layer in info["layers"].items()]
    if info["classes"]:
        names = info["classes"]
        more = f", and {len(names) - 8} more (info --json lists them all)" if len(names) > 8 else ""
        lines.append(f"classes:    {len(names)} ({', '.join(names[:8])}{more})")
    lines.append(f"skipped:    {info['skipped']}")
    lines += [f"  {name}: {reason}" for name, reason in info["skipped_examples"]]
    if info["skipped_changed"]:
        changed = info["skipped_changed"]
        lines.append(f"  {len(changed)} skipped file(s) changed since (--update reads them again): "
                     f"{', '.join(changed[:_SHOWN])}{', ...' if len(changed) > _SHOWN else ''}")
    if info["stale"]:
        lines.append(f"stale:      {info['stale']} rows whose image disappeared or changed since it was read "
                     "(kept; --overwrite recomputes)")
        lines += [f"  {folder}: {count} {reason} ({', '.join(examples)}{', ...' if count > len(examples) else ''})"
                  for folder, reason, count, examples in info["stale_groups"]]
    for name, count in (("skipped", info["skipped"]),):
        if count > _SHOWN:
            lines.append(f"  ({count - _SHOWN} more {name}: h5py f['{name}/paths'], f['{name}/reasons'])")
    lines += _proof_lines(info["proof"])
    from featdump.units.top import default_place  # (its arithmetic's modules only where an output is described)

    ranked = default_place(output)
    if ranked.exists():
        lines.append(f"top:        {ranked} (featdump top; browse it with featdump atlas {output} -o DIR)")
    for key, value in info["provenance"].items():
        lines.append(f"{key + ':':<11} {_CLIP_DEFAULTS.get((key, value), value).replace(chr(10), ' ')}")
    return lines


_CLIP_DEFAULTS = {("clip_fps", "0.0"): "each video's own rate", ("clip_every", "0.0"): "back to back (--clip / --fps)"}


def _proof_lines(proofs: list[dict]) -> list[str]:
    """Each run's proof (which run: a shard, an update, added layers): its configuration, the rows recomputed on the
    reference path, each layer's errors against its bound."""
    lines = []
    for proof in proofs:
        run = _proof_run(proof)
        if not proof.get("proved"):
            lines.append(f"proof:      none{run} ({proof['configuration']}: {proof.get('why', 'nothing proved')})")
            continue
        emulated = f", emulated in {' and '.join(proof['emulated'])}" if proof.get("emulated") else ""
        lines.append(f"proof:      {proof['configuration']}{run}: {len(proof['images'])} {proof.get('rows', 'image')}s "
                     f"recomputed on the reference path ({proof['reference']}){emulated}")
        lines += [_proof_layer_line(name, errors) for name, errors in proof["layers"].items()]
    return lines


def _proof_run(proof: dict) -> str:
    """Which run a proof entry is of, in words (" of shard 2", " of the update"); "" for the job's own."""
    if "shard" in proof:
        return f" of shard {proof['shard']}"
    run = proof.get("run")
    return "" if run is None else " of the update" if run == "update" else f" of the run that {run}"


def _proof_layer_line(name: str, errors: dict) -> str:
    """One layer's proof: its largest and median error, and its bound (files before bounds: the tolerance)."""
    line = f"  {name}: largest {float(errors['largest']):.1e}, median {float(errors['median']):.1e}"
    if "bound" in errors:
        line += (f" (bound {errors['bound']:.1e}); whole row {float(errors['whole']):.1e} (bound "
                 f"{errors['whole_bound']:.1e}); channel shift {errors['channel_shift']:.1e}")
    if "used" in errors:
        line += f", scale {errors['channel_scale']:.1e}; {float(errors['used']):.2f} of a bound used"
    return line


def _layer(output: Output, name: str) -> dict:
    """A layer's shape, dtype and reduction (with what a projection records: its input size, seed, fit)."""
    dataset = output.features(name)
    recorded = {key: _plain(value) for key, value in dataset.attrs.items()
                if key.startswith(("srp_", "pca_", "channels", "added_"))}
    return {"shape": list(dataset.shape[1:]), "dtype": str(dataset.dtype), "reduction": output.reduction(name),
            **recorded}


def _added_note(layer: dict) -> str:
    """Which --update added a layer, and when (the others came with the file's first command)."""
    return f" (added {layer['added_at']} by: {layer['added_by']})" if "added_by" in layer else ""


def _reduction_note(layer: dict) -> str:
    reduction = layer.get("reduction", "none")
    if reduction == "none":
        return ""
    if reduction.startswith(("srp:", "countsketch:")):
        return (f", {reduction} of {layer['srp_input_dim']} values (seed {layer['srp_seed']}, density "
                f"{layer['srp_density']:.2g})")
    if reduction.startswith("pca:"):
        return (f", {reduction} of {layer['pca_input_dim']} values, fitted on {layer['pca_fitted_on']} "
                f"({100 * layer['pca_explained_variance_ratio']:.1f}% of the variance)")
    return f", {reduction}"


def _plain(value):
    """An attribute as a JSON value (numpy scalars and arrays, bytes)."""
    if isinstance(value, bytes):
        return text_of(value)
    return value.tolist() if hasattr(value, "tolist") else value
