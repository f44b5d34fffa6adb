"""The four backends by name. Each module has the same functions:

    render(job, ctx)      fill in the PlannedJob: files, command or Ray entrypoint (checks the backend's own flags)
    start(job, record)    submit or start the rendered job; fills in the record (job id, pid, ...)
    status(record)        the job's JobStatus
    stop_hint(record)     the line that tells a person how to stop or watch the job
"""

from __future__ import annotations

from types import ModuleType

from bertdist.launch import deepspeed, local, ray, slurm

MODULES: dict[str, ModuleType] = {"local": local, "deepspeed": deepspeed, "slurm": slurm, "ray": ray}
