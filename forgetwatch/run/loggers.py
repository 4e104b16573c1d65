"""Where the callback's numbers go: the trainer's own `report_to` backends, each behind `log` / `log_table` / `close`.

The callback writes to each backend's live run directly instead of through `trainer.log()`: that route
resets the trainer's pending `should_log`, flushes TRL's accumulated GRPO metrics early and merges keys into
the trainer's rows. Here the trainer's own logs stay exactly as they would be without forgetwatch.

A backend that fails is switched off with one warning; training goes on and the local record stays complete.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .._warnings import warn_once
from ..versions import installed_versions, release

logger = logging.getLogger(__name__)

__all__ = ["make_loggers", "MetricLogger"]

STEP_KEY = "train/global_step"  # the step axis WandbCallback defines for every metric


class MetricLogger:
    """One backend. Subclasses implement `_log`, and optionally `_log_table`, `_log_image`, `_summary`, `_alert`, `_close`."""

    name = "base"
    # whether a value logged at a step lower than one already logged is kept and shown in step order (TensorBoard,
    # MLflow); W&B and trackio keep rows in the order logged, so a step scored late goes to a table instead
    takes_late_steps = False

    def __init__(self) -> None:
        self.broken = False

    def _guard(self, what: str, fn, *args) -> None:
        if self.broken:
            return
        try:
            fn(*args)
        except Exception as e:  # never let logging crash a training run
            self.broken = True
            logger.warning("forgetwatch: logging to %s failed (%s: %s); it is off for the rest of this run, "
                           "the local record goes on", self.name, type(e).__name__, e)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._guard("log", self._log, metrics, step)

    def log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        self._guard("table", self._log_table, key, columns, rows, step)

    def summary(self, metrics: dict[str, float]) -> None:
        self._guard("summary", self._summary, metrics)

    def log_image(self, key: str, path: str | os.PathLike, step: int) -> None:
        """A PNG where the backend shows images (W&B); the others skip it (the file stays in the record)."""
        self._guard("image", self._log_image, key, path, step)

    def alert(self, title: str, text: str) -> None:
        """A notification where the backend has them (W&B, trackio); others have the logged warning only."""
        self._guard("alert", self._alert, title, text)

    def close(self) -> None:
        self._guard("close", self._close)

    def _alert(self, title: str, text: str) -> None:
        pass

    def _log_image(self, key: str, path: str | os.PathLike, step: int) -> None:
        pass

    def _log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def _log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        pass

    def _summary(self, metrics: dict[str, float]) -> None:
        pass

    def _close(self) -> None:
        pass


class WandbLogger(MetricLogger):
    name = "wandb"

    def __init__(self, run: Any) -> None:
        super().__init__()
        import wandb

        self.wandb = wandb
        self.run = run
        # Plot our keys on the trainer's step axis: the value from step 50 sits at step 50.
        run.define_metric(STEP_KEY)
        run.define_metric("forgetwatch/*", step_metric=STEP_KEY)
        run.define_metric("forgetwatch_*", step_metric=STEP_KEY)  # per-category keys: forgetwatch_<metric>/<category>

    def _log(self, metrics: dict[str, float], step: int) -> None:
        # Never `step=`: WandbCallback owns wandb's internal step; the row carries the trainer's step instead.
        self.run.log({**metrics, STEP_KEY: step})

    def _log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        # Only this evaluation's rows: re-logging an ever-growing table gets slow.
        self.run.log({key: self.wandb.Table(columns=columns, data=rows), STEP_KEY: step})

    def _summary(self, metrics: dict[str, float]) -> None:
        self.run.summary.update(metrics)

    def _log_image(self, key: str, path: str | os.PathLike, step: int) -> None:
        self.run.log({key: self.wandb.Image(str(path)), STEP_KEY: step})

    def _alert(self, title: str, text: str) -> None:
        # wait_duration=0: every trip is sent (W&B would drop a second alert of the same title within 10 minutes)
        self.run.alert(title=title, text=text, level=self.wandb.AlertLevel.WARN, wait_duration=0)


class TensorBoardLogger(MetricLogger):
    name = "tensorboard"
    takes_late_steps = True

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def _log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def _close(self) -> None:
        self.writer.close()


class MLflowLogger(MetricLogger):
    name = "mlflow"
    takes_late_steps = True

    def __init__(self) -> None:
        super().__init__()
        import mlflow

        self.mlflow = mlflow

    def _log(self, metrics: dict[str, float], step: int) -> None:
        if self.mlflow.active_run() is not None:
            self.mlflow.log_metrics(metrics, step=step)

    def _log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        # MLflow keeps tables as run artifacts: one per evaluation, named by its step
        if self.mlflow.active_run() is not None:
            self.mlflow.log_table(data={c: [r[i] for r in rows] for i, c in enumerate(columns)},
                                  artifact_file=f"{key}/step-{step:08d}.json")


class TrackioLogger(MetricLogger):
    name = "trackio"
    # trackio 0.20.2 (the newest that installs beside transformers 4, whose huggingface_hub < 1 it needs) fails to
    # serialise a trackio.Table ("Dict key must be str") in its writer thread and drops every row of that batch with
    # it; the scalars are kept by not sending tables there. Tested with tables: trackio 0.43.
    TABLES_FROM = (0, 21)

    def __init__(self) -> None:
        super().__init__()
        import trackio

        self.trackio = trackio
        self.trackio_version = installed_versions(("trackio",))["trackio"] or "0"
        self.tables = release(self.trackio_version) >= self.TABLES_FROM

    def _log(self, metrics: dict[str, float], step: int) -> None:
        # Like the trainer's TrackioCallback: no `step=` (it would move trackio's own counter under the trainer's rows)
        self.trackio.log({**metrics, STEP_KEY: step})

    def _log_table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        if not self.tables:
            warn_once(logger, "trackio-tables", f"forgetwatch: trackio {self.trackio_version} cannot store tables; the flips "
                      "table goes to the local record only (tables need trackio >= "
                      f"{'.'.join(map(str, self.TABLES_FROM))}, which needs transformers 5)")
            return
        # The dashboard's "Media & Tables" page shows it; only this evaluation's rows, as for W&B.
        self.trackio.log({key: self.trackio.Table(columns=columns, data=rows), STEP_KEY: step})

    def _alert(self, title: str, text: str) -> None:
        self.trackio.alert(title=title, text=text, level=self.trackio.AlertLevel.WARN)


def tensorboard_dir(output_dir: str, logging_dir: str | None = None) -> str:
    """The TensorBoardCallback's directory: `TrainingArguments.logging_dir` (transformers 4), $TENSORBOARD_LOGGING_DIR
    (transformers 5, which removed the argument), else its newest `<output_dir>/runs/*`."""
    if logging_dir:
        return os.path.expanduser(logging_dir)
    env = os.environ.get("TENSORBOARD_LOGGING_DIR")
    if env:
        return os.path.expanduser(env)
    runs = Path(output_dir) / "runs"
    subdirs = sorted((p for p in runs.glob("*") if p.is_dir()), key=lambda p: p.stat().st_mtime) if runs.is_dir() else []
    return str(subdirs[-1]) if subdirs else str(runs / "forgetwatch")


def make_loggers(report_to: list[str] | str | None, output_dir: str, logging_dir: str | None = None) -> list[MetricLogger]:
    """A logger for each of the trainer's `report_to` backends that forgetwatch can write to (`logging_dir`: the
    trainer's TensorBoard directory where its arguments still name one, transformers 4)."""
    if isinstance(report_to, str):
        report_to = [report_to]
    names = [n for n in (report_to or []) if n not in ("none", None)]
    loggers: list[MetricLogger] = []
    for name in names:
        try:
            if name == "wandb":
                import wandb

                if wandb.run is None:
                    logger.warning("forgetwatch: report_to includes wandb but no W&B run is active; not logging to W&B")
                    continue
                loggers.append(WandbLogger(wandb.run))
            elif name == "tensorboard":
                loggers.append(TensorBoardLogger(tensorboard_dir(output_dir, logging_dir)))
            elif name == "mlflow":
                loggers.append(MLflowLogger())
            elif name == "trackio":
                loggers.append(TrackioLogger())
            else:
                logger.warning("forgetwatch: does not log to %r (it logs to wandb, tensorboard, mlflow, trackio)", name)
        except Exception as e:
            logger.warning("forgetwatch: cannot log to %s (%s: %s); the local record goes on", name, type(e).__name__, e)
    return loggers
