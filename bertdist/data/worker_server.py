"""Imported by the loader's fork server before it forks a worker, and by nothing else (bertdist.data.worker_processes
names it as the server's preload; importing it anywhere else would make that process ignore the stop signals).

The server sits in the rank's process group: a signal sent to the group (torchrun, SLURM, Ctrl-C) reaches it,
and a server ended by one would take its workers with it (they watch their parent) before the rank had finished
its step and checkpointed. So it ignores the stop signals as its workers do; it ends when the rank ends. Importing
the loader here is the preload: each worker is forked with torch and the loader imported, instead of spending a
second on them.
"""

from bertdist.data.worker_processes import ignore_stop_signals

ignore_stop_signals()

import bertdist.data.loader  # noqa: E402, F401  (imported for the workers forked from here)
