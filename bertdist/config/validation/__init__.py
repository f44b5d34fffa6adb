"""Every rule a command's options must meet, in one place: each command calls its entry before anything starts
(no process group, no Ray, no model), and each entry reports every problem at once.

    validate(cfg, world_size, check_files)   train, and train's dry run, submit, the elastic supervisor: train
    validate_finetune(cfg, world_size)       finetune, and evaluate for every task of its suite: finetune
    validate_prepare(opts)                   prepare (PrepareOptions, problems named by flag): prepare

A rule two commands share is one function that both call (`local_only_problems`, `compile_problems`,
`heads_divide_problem`, which the model's own guard bertdist.model.initialisation.check_heads_divide raises too).
`bertdist embed` checks its few flags beside its options (bertdist.finetune.embed.check).
"""

from bertdist.config.validation.finetune import data_problems, source_problems, validate_finetune
from bertdist.config.validation.model import family_fields, heads_divide_problem
from bertdist.config.validation.prepare import validate_prepare
from bertdist.config.validation.train import (
    BACKENDS,
    PRECISIONS,
    VERIFY_MODES,
    deepspeed_passthrough_problems,
    local_only_problems,
    validate,
)

__all__ = [
    "family_fields",
    "BACKENDS",
    "PRECISIONS",
    "VERIFY_MODES",
    "data_problems",
    "deepspeed_passthrough_problems",
    "heads_divide_problem",
    "local_only_problems",
    "source_problems",
    "validate",
    "validate_finetune",
    "validate_prepare",
]
