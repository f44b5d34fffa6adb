"""`python -m bertdist`: the `bertdist` command (the deepspeed launcher and torchrun start ranks this way)."""

from bertdist.cli import main

raise SystemExit(main())
