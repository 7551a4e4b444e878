"""What a run checks before it imports torch: that IMAGES, where it lies on this machine, is something a reader
reads, and that --model names a model its source knows (torchvision's names are known without torchvision once
listed: `sources.torchvision_names`). A typo answers in a fraction of a second, not after the seconds of importing
torch, torchvision and a model's library; the run checks both again where it uses them."""

from __future__ import annotations

from featdump import plugins
from featdump.errors import UsageProblem
from featdump.inputs import check_images
from featdump.job.settings import Settings
from featdump.sources.registry import SOURCES_GROUP, source_for


def check_before_loading(settings: Settings) -> None:
    """NoImages, UnknownModel or a UsageProblem for what SETTINGS name that cannot be read or built."""
    check_images(settings.images, settings.array, settings.image_column, settings.label_column, settings.split,
                 settings.reader, settings.reader_option, settings.image_root)
    try:
        source_for(settings.model).check(settings.model)
    except UsageProblem as error:
        raise plugins.noting_left_out(SOURCES_GROUP, error) from error.__cause__
