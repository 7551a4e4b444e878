"""Programs saved with `torch.export.save` (`--model export:PATH.pt2`): loaded with `torch.export.load` and given
back their module paths by `torch.export.unflatten`, so that hooks reach the layers by the names the model had
(`layer3.0.conv1`). The weights are the program's own: --weights is refused. A program exported with a fixed batch
size runs only batches of that size: export it with a dynamic batch dimension (`torch.export.Dim`), as
docs/models.md shows. Registered through the entry point group `featdump.sources`, as a plugin would be."""

from __future__ import annotations

from pathlib import Path

from featdump.errors import InvalidWeights, UsageProblem, first_sentence
from featdump.sources.files import file_digest
from featdump.sources.registry import Built, ModelRequest, Source


class ExportSource(Source):
    """A program torch.export.save wrote, its module paths restored (torch.export.unflatten)."""

    name = prefix = "export"
    kind = "a program saved with torch.export.save (export:PATH.pt2), its module paths restored by unflatten"
    example = "-m export:model.pt2 -l layer3"

    def check(self, spec: str) -> None:
        path = Path(self.bare(spec))
        if not path.is_file():
            raise UsageProblem(f"--model {spec}: no file {str(path)!r} (a program saved with torch.export.save).")

    def build(self, request: ModelRequest) -> Built:
        import torch

        self.check(request.spec)
        if request.wanted not in ("default", "structure"):
            asked = "a checkpoint" if request.wanted == "checkpoint" else f"--weights {request.weights}"
            raise UsageProblem(f"{asked}: {request.spec} holds its program's own weights, which it runs; leave "
                               "--weights out.")
        path = Path(self.bare(request.spec))
        try:
            program = torch.export.load(path)
        except Exception as error:  # a file that is no exported program fails in many ways
            raise InvalidWeights(f"Could not load {str(path)!r} as a program torch.export.save wrote: "
                                 f"{first_sentence(error)}.") from error
        module = torch.export.unflatten(program)
        return Built(module, "the exported program's", {"source": "export", "sha256": file_digest(path)})
