"""Run: forgetwatch attached to a training run, in the trainer's process or beside it.

`monitor.py` turns one evaluation's results into figures, the record, the loggers' rows and the budget's verdict;
`callback.py` is `ForgetWatchCallback`, which scores probes inside any HF Trainer and hands them to the monitor, with
`inloop.py` scoring the live model (every probe, the fp32 reference, a partial pass under max_share) and
`hook_inputs.py` reading what the Trainer's hooks hand it; `start.py` is the run start the callback and the watcher share;
`watcher.py` scores a run's checkpoints from another process (`forgetwatch watch`), with `sidecar.py`'s manifest;
`distributed.py` and `launch.py` split the probes across ranks and read how the model is sharded; `loggers.py`,
`keys.py`, `console.py` and `wandb_workspace.py` say where and under which names the figures go; `steering.py` steers
replay streams by the monitor; `base_rescore.py` scores the base with the watcher's engine. The callback and the
watcher only adapt their events: the figures belong to the monitor.

Example:
    >>> from forgetwatch.run import ForgetWatchCallback  # loads transformers  # doctest: +SKIP
    >>> callback = ForgetWatchCallback(probes="arc_easy,sciq", eval_steps=50)  # doctest: +SKIP
"""

from .._lazy import lazy
from .monitor import Monitor

__all__ = ["ForgetWatchCallback", "Monitor", "Watcher"]

__getattr__, __dir__ = lazy(__name__, globals(), {"ForgetWatchCallback": ".callback", "Watcher": ".watcher"})
