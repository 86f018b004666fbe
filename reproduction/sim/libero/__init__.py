"""LIBERO as a second simulator backend: task ids, one env per task, upstream's observation and protocol.

    tasks.py     task ids (`libero_10/0`, `libero_spatial/*`), suites, step limits    env.py     LiberoSim
    protocol.py  evaluate_libero: first N init states in order, success_once/_at_end  expert.py  scripted experts
    _runtime.py  imports LIBERO with every cache/config/log write redirected under a cache folder

Nothing here imports LIBERO (or robosuite, numba) at import time; the first env built does, after pointing
every write at `PORTABLE_CACHE_DIR/libero` (or the cache_dir given). Install: `pip install -e '.[libero]'`.
The simulator sees a policy only as a callable (protocol.py's docstring has the contract).
"""

from reproduction.sim.libero._runtime import INSTALL_HINT, available, check_render_backend
from reproduction.sim.libero.tasks import SUITES, LiberoTask, TaskRef, is_libero_id, parse_task_id, resolve_tasks

__all__ = [
    "INSTALL_HINT",
    "SUITES",
    "LiberoTask",
    "TaskRef",
    "available",
    "check_render_backend",
    "is_libero_id",
    "parse_task_id",
    "resolve_tasks",
]
