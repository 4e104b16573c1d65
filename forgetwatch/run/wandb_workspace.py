"""A W&B workspace that opens on what matters: forgetting and backward transfer first, then each overview figure with
every category on one chart, then the rest.

W&B's automatic workspace makes a panel per key and a section per key prefix, in an order the run cannot set. A saved
workspace (`wandb-workspaces`, W&B's Workspace API) can: its sections come in the order given, the first one pinned.
The panels' keys come from the same code that names the logged keys (`forgetwatch.run.keys`, `Monitor`'s figures), for
the figures a run's record holds, so the template never names a key the callback does not log.

`workspace_sections` lays the sections out as plain data (no W&B needed); `build_workspace` turns them into a
`wandb_workspaces.workspaces.Workspace` (imported lazily: `pip install 'forgetwatch[workspace]'`), which `.save()`s it
to W&B (network and a logged-in W&B: `wandb login`).

Example:
    >>> sections = sections_of_record("outputs/sft")  # doctest: +SKIP
    >>> [s.name for s in sections]  # doctest: +SKIP
    ['forgetwatch: overview', 'forgetwatch: by category', 'forgetwatch: details']
    >>> build_workspace(sections, entity="me", project="sft").save()  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RecordError
from ..record.store import load_record
from .keys import DETAILS, OVERALL, OVERVIEW, figure_key, table_key
from .loggers import STEP_KEY
from .rows import group_figures  # the figures as the Monitor logs them

__all__ = ["Panel", "Section", "workspace_sections", "sections_of_rows", "sections_of_record", "build_workspace",
           "save_workspace", "save_for_run", "INSTALL"]

logger = logging.getLogger(__name__)

INSTALL = "pip install 'forgetwatch[workspace]'  (wandb-workspaces)"
DEFAULT_NAME = "forgetwatch"


@dataclass(frozen=True)
class Panel:
    """One panel: a line plot of `keys` on the trainer's step axis, or (`table`) the last logged table `keys[0]`."""

    title: str
    keys: tuple[str, ...]
    table: bool = False


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Panel, ...]
    is_open: bool = True
    pinned: bool = False

    def keys(self) -> list[str]:
        return [k for p in self.panels for k in p.keys]


@dataclass
class _Figures:
    """Which figures were logged for which groups (the union over evaluations), in first-seen order."""

    groups: dict[str, list[str]] = field(default_factory=dict)

    def add(self, figures: Mapping[str, Iterable[str]]) -> None:
        for group, names in figures.items():
            seen = self.groups.setdefault(group, [])
            seen.extend(n for n in names if n not in seen)


def workspace_sections(figures: Mapping[str, Iterable[str]], tables: Iterable[str] = ("flips",)) -> list[Section]:
    """The workspace's sections for the figures logged by group (`{"overall": [...], "sciq": [...], ...}`, as
    `forgetwatch.run.monitor.group_figures` gives them) and the tables logged ("flips", "at_risk_probes"):

    1. overview (pinned, open): each overview figure overall, forgetting and backward transfer first, then the flips table;
    2. by category (open): each overview figure with every category (and kind group) as a line on one chart;
    3. details (closed): every other figure, overall and every category on one chart; the at-risk probes table.

    Example:
        >>> s = workspace_sections({"overall": ["forgetting", "kl"], "sciq": ["forgetting", "kl"]}, tables=())
        >>> [(x.name, [p.title for p in x.panels]) for x in s]  # doctest: +NORMALIZE_WHITESPACE
        [('forgetwatch: overview', ['forgetting']), ('forgetwatch: by category', ['forgetting by category']),
         ('forgetwatch: details', ['kl'])]
    """
    tables = list(tables)
    overall = list(figures.get(OVERALL, ()))
    categories = [g for g in figures if g != OVERALL]
    logged = {g: set(names) for g, names in figures.items()}

    def per_category(name: str) -> tuple[str, ...]:
        return tuple(figure_key(g, name) for g in categories if name in logged[g])

    overview = [Panel(name, (figure_key(OVERALL, name),)) for name in OVERVIEW if name in logged.get(OVERALL, ())]
    overview += [Panel(name, (table_key(name),), table=True) for name in tables if table_key(name).split("/")[0] != DETAILS]
    by_category = [Panel(f"{name} by category", keys) for name in OVERVIEW if (keys := per_category(name))]
    rest = [n for n in overall if n not in OVERVIEW]
    rest += [n for g in categories for n in figures[g] if n not in OVERVIEW and n not in rest]
    details = [Panel(name, ((figure_key(OVERALL, name),) if name in logged.get(OVERALL, ()) else ()) + per_category(name))
               for name in rest]
    details += [Panel(name, (table_key(name),), table=True) for name in tables if table_key(name).split("/")[0] == DETAILS]
    sections = [Section("forgetwatch: overview", tuple(overview), pinned=True),
                Section("forgetwatch: by category", tuple(by_category)),
                Section("forgetwatch: details", tuple(details), is_open=False)]
    return [s for s in sections if s.panels]


def sections_of_rows(evaluations: Iterable[Mapping[str, Mapping[str, Any]]], budget: bool, tables: Iterable[str]
                     ) -> list[Section]:
    """The sections for the evaluations' metrics.jsonl rows by group (`budget`: the run has one, so the budget's state
    is logged; `tables`: the tables it logs)."""

    seen = _Figures()
    for rows in evaluations:
        seen.add(group_figures(dict(rows), seconds=0.0, over_budget=0 if budget else None))
    return workspace_sections(seen.groups, tables)


def sections_of_record(output_dir: str | Path) -> list[Section]:
    """The sections for the run whose record is under `<output_dir>/forgetwatch/` (its figures at every evaluation so
    far: the base evaluation, written when training starts, is enough)."""

    record = load_record(output_dir)
    rows = [r["metrics"] for r in record.read_metrics()]
    if not rows:
        raise RecordError(f"{record.root / 'metrics.jsonl'} holds no evaluation yet: the keys a workspace shows "
                               "come from the run's figures; start the run (its base evaluation is enough) and try again")
    tables = [name for name, path in (("flips", "flips.jsonl"), ("at_risk_probes", "at_risk.jsonl"))
              if (record.root / path).is_file() and (record.root / path).stat().st_size > 0]
    return sections_of_rows(rows, budget=(record.root / "budget.json").is_file(), tables=tables)


def _workspaces():
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError as e:
        raise ImportError(f"the W&B workspace template needs wandb-workspaces: {INSTALL}") from e
    return ws, wr


def build_workspace(sections: list[Section], entity: str, project: str, name: str = DEFAULT_NAME) -> Any:
    """A `wandb_workspaces.workspaces.Workspace` of `sections` (not saved: `.save()` needs a logged-in W&B), its line
    plots on the trainer's step axis (`train/global_step`, the axis forgetwatch logs on).

    Example:
        >>> build_workspace(sections_of_record("outputs/sft"), "me", "sft").save()  # doctest: +SKIP
    """
    ws, wr = _workspaces()

    def panel(p: Panel):
        if p.table:
            return wr.WeavePanelSummaryTable(table_name=p.keys[0])
        return wr.LinePlot(title=p.title, x=STEP_KEY, y=list(p.keys))

    return ws.Workspace(
        entity=entity, project=project, name=name,
        sections=[ws.Section(name=s.name, panels=[panel(p) for p in s.panels], is_open=s.is_open, pinned=s.pinned)
                  for s in sections],
        settings=ws.WorkspaceSettings(x_axis=STEP_KEY),
    )


def describe(sections: list[Section], entity: str, project: str, name: str = DEFAULT_NAME) -> dict[str, Any]:
    """What `save_workspace` would save, as plain JSON-able data (for `--dry-run` / `--json`)."""
    return {"entity": entity, "project": project, "name": name, "x_axis": STEP_KEY,
            "sections": [{**asdict(s), "panels": [{**asdict(p), "keys": list(p.keys)} for p in s.panels]} for s in sections]}


def save_workspace(sections: list[Section], entity: str, project: str, name: str = DEFAULT_NAME) -> str:
    """Build and save the workspace to W&B (network, a logged-in W&B); returns its URL."""
    workspace = build_workspace(sections, entity, project, name).save()
    return workspace.url


def save_for_run(run: Any, output_dir: str | Path, name: str = DEFAULT_NAME) -> str | None:
    """At train start (`forgetwatch_wandb_workspace`): save the workspace for the live W&B `run`'s project, from the
    record's evaluations so far (the base). Offline or disabled W&B: skipped with one log line. Never raises: a
    failure (no wandb-workspaces, no login, no network) is a warning and training goes on. Returns the URL, or None."""
    try:
        if getattr(run, "disabled", False) or getattr(run, "offline", False):
            logger.info("forgetwatch: W&B is offline, so no workspace is saved; when online, run `forgetwatch "
                        "wandb-workspace --entity E --project P --run %s`", output_dir)
            return None
        url = save_workspace(sections_of_record(output_dir), run.entity, run.project, name)
        logger.info("forgetwatch: saved the W&B workspace %r: %s", name, url)
        return url
    except Exception as e:  # a workspace is a convenience: it must never end a training run
        logger.warning("forgetwatch: could not save the W&B workspace (%s: %s); training goes on. Make it later with "
                       "`forgetwatch wandb-workspace --entity E --project P --run %s`", type(e).__name__, e, output_dir)
        return None
