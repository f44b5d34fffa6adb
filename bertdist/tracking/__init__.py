"""Tracking with MLflow: one run per job across resumes, metrics that survive outages, the dashboard.

    base            the Tracker interface, which is also the no-op tracker of ranks other than 0
    build           which tracker a process gets (build_tracker: MLflow on rank 0, the no-op elsewhere)
    mlflow_tracker  rank 0's tracker: what the training loop calls, and the one delivery thread's loop
    record_queue    the records between the two threads: bounded in memory, mirrored in a spool file
    connection      the delivery thread's side of the store: the run started or continued, requests retried
    delivery        records, the requests that send them, the write-ahead spool file
    store           where the data goes (URIs), the experiment, which errors are transient
    params          what a run records besides metrics (config, data manifests, environment)
    system          CPU/memory/disk/network/GPU samples of each node
    models          the exported model as an MLflow Model of the run, optionally registered
    fill_mask_model the pyfunc model of an export: fill-mask queries answered by transformers
    ui              `bertdist ui`: the MLflow dashboard over a run's store
    server_guard    the dashboard's server stops when `ui` does, however `ui` ends

Nothing here decides what is trained or when to log: the trainer calls these.
"""
