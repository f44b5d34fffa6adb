"""`bertdist prepare` on Ray.

    options     what a run is asked to do
    stages      the three kinds of task: read, instances, shards
    driver      runs the stages in order, deals the instances to the shards, writes the manifest
    ray_tasks   Ray started or joined; a stage's tasks run with bounded concurrency, results in order
    planning    between the stages: bad input files, duplicate documents, groups of documents
    output_dir  OUTPUT claimed for one command: its fingerprint, resume after a kill, the manifest's contents
    report      what a finished run reports and the summary the command prints

The rules that turn documents into masked sentence pairs are `bertdist.data.instances`.
"""
