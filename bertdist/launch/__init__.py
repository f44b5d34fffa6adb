"""Running bertdist jobs on clusters: `bertdist submit`, `bertdist status`, `bertdist logs`.

    request   the request checked and rendered into a job, submitted, recorded (start here)
    job       the data: SubmitRequest, PlannedJob, JobRecord, JobStatus
    checks    what user-supplied values may reach a script; the template renderer
    backends  local, deepspeed, slurm, ray: one module each, the same four functions
    process   detached process groups on this machine and their supervisor (local, deepspeed)
    status    status and logs of a recorded job
    ray_job   the training driver that a Ray job runs on the cluster

The scripts a job runs live in the top-level launch/ directory (shipped in the wheel too, see
`bertdist.resources`), where users read and adapt them.
"""
