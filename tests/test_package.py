"""The public surface: a pinned `__all__`, lazy heavy imports, and the console script."""

import subprocess
import sys

import forgetwatch


def test_all_is_pinned():
    assert sorted(forgetwatch.__all__) == [
        "BaseCache", "CacheMismatchError", "ForgetWatchArguments", "ForgetWatchCallback", "ForgettingMetrics", "Probe",
        "ProbeFormatError", "ProbeResults", "ProbeSet", "ScoringConfig", "compute_metrics", "compute_report",
        "load_record", "make_cache_key", "score_probes",
    ]
    for name in forgetwatch.__all__:
        assert getattr(forgetwatch, name) is not None


def test_import_is_light():
    # torch, transformers, trl and wandb load only when the callback or scoring is used
    code = "import sys, forgetwatch; print(sorted(m for m in ('torch', 'transformers', 'trl', 'wandb') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_unknown_attribute_raises():
    try:
        forgetwatch.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
