"""Running bertdist jobs on clusters: `bertdist submit`, `bertdist status`, `bertdist logs`.

    request   the request checked and rendered into a job, submitted, recorded (start here)
    job       the data: SubmitRequest, PlannedJob, JobRecord, JobStatus
    checks    what user-supplied values may reach a script; the template renderer
    backends  the backend contract (Backend: check, render, describe, start, status, logs, stop_hint) and
              the registry, the one place that names the backends; one module each:
    local     N ranks on this machine under torchrun, detached
    deepspeed many machines over SSH from a DeepSpeed hostfile, under the elastic supervisor
    slurm     sbatch of launch/slurm_train.sbatch, one task per GPU, checkpoint and requeue
    ray       a Ray job through Ray's job API
    process   detached process groups on this machine and their supervisor (local, deepspeed)
    elastic   the supervisor of multi-host jobs: lost hosts dropped, the job relaunched, hosts taken back
    ssh_fleet the hosts of a hostfile as the supervisor's fleet (SSH probes, DeepSpeed's launcher per launch)
    ray_job   the training driver that a Ray job runs on the cluster: the supervisor over Ray nodes
    log_file  the log file that the local, deepspeed and slurm jobs write, printed or followed
    status    status and logs of a recorded job, asked of its backend
    commands  the command lines of submit, status and logs

The scripts a job runs live in the top-level launch/ directory (shipped in the wheel too, see
`bertdist.resources`), where users read and adapt them.
"""
