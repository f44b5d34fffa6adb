"""The named model sizes (`model.size`), gathered from every family's spec (bertdist.model.<arch> `PRESETS`),
each with the architecture (`model.arch`) it belongs to (BERT's name none: it is the default).

A new size is a line in its family's presets. The specs are torch-free and import no config, so the schema reads
them here at import.
"""

from __future__ import annotations

from typing import Any

from bertdist.model import registry

MODEL_SIZES: dict[str, dict[str, Any]] = {
    name: settings for arch in registry.FAMILIES for name, settings in registry.spec(arch).presets.items()
}
"""model.size -> its settings."""
