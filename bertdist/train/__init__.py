"""Pretraining with DeepSpeed, and what surrounds a run: checkpoints, the plan, export.

trainer      Trainer: builds every component in __init__, runs the loop in train()
starting     the engine from fresh weights, a released model or a checkpoint, and the restore
deepspeed    the DeepSpeed config dict from our config; the engine
optim        AdamW parameter groups and the learning-rate schedule
lamb         LAMB (per-tensor trust ratio), for the large-batch recipes
loaders      a phase's shard loader, as the trainer builds it and the dry run checks it
checkpoint   save, resume (exact: data cursor, RNG, tracking run id), consolidate
rng          every generator's state as JSON, for the checkpoint; seeding
run_identity whether a checkpoint is this run's (the settings that may change on resume)
remote       checkpoints in an object store (checkpoint.uri): uploads, publishing, resume from the store
extensions   where DeepSpeed JIT-builds its ops (inside the installation); stale build locks
restart_event a relaunch, as the elastic supervisor (bertdist.launch) hands it to the trainer
integrity    size and sha256 of every checkpoint file, recorded at save and checked before loading
reshard      resuming on another number of ranks (DeepSpeed's universal checkpoint)
watchdog     heartbeats; a stalled rank named, the job stopped for a requeue
stopping     the stop flag: SIGTERM/SIGINT/SIGUSR1, or the launcher above a rank gone
distributed  rank/world/master from torchrun, the deepspeed launcher or SLURM; the process group, its
             store bound to the master address; rank 0 owning the output directory for the job
metrics      what a step measures and the names it is logged under
console      the one-line-per-interval console and metrics.jsonl
plan         the dry-run plan: steps, sequences, tokens, FLOPs per phase
forecast     the dry-run forecast: time and cost, estimated or measured (--calibrate)
timeline     world size, restarts and time of a run, logged against the forecast
export       a checkpoint as a Hugging Face directory and an MLflow Model
listing      `bertdist checkpoints`: every checkpoint of a run, local or in a store, intact or not
downstream   fine-tuning each new checkpoint on a small task beside training (eval.downstream)
"""
