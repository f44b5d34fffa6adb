"""Ray job entry point for `bertdist prepare`: the preprocessing runs on the cluster the job was submitted to.

    bertdist submit --backend ray --job prepare -- --input /data/wiki --output /data/shards --vocab /data/vocab.txt

`bertdist submit` ships the source tree as the job's working directory and runs `python
launch/ray_prepare.py ARGS` there. Arguments are those of `bertdist prepare`. Inside a Ray job the
supervisor sets RAY_ADDRESS, so the pipeline's `ray.init()` joins the job's cluster instead of starting a
local one. Paths are read on the cluster: use absolute paths on shared storage, not paths relative to the
(temporary) working directory.
"""

import sys

from bertdist.cli import main

if __name__ == "__main__":
    sys.exit(main(["prepare", *sys.argv[1:]]))
