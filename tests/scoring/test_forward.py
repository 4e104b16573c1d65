"""forgetwatch.scoring.forward: the KV cache and `logits_to_keep` found by behaviour on every supported transformers version.

These run on whichever transformers is installed (the locked, oldest and newest sets in CI): a release that renames
the cache argument again must fail here, not turn the prefix cache off in silence.
"""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from conftest import build_model

from forgetwatch import _warnings
from forgetwatch.scoring import forward
from forgetwatch.scoring.forward import PrefixCache, cache_of, logits_to_keep_kwargs


@pytest.fixture(autouse=True)
def fresh_warnings():
    _warnings._warned.clear()
    forward._refuses_logits_to_keep.clear()
    yield
    _warnings._warned.clear()
    forward._refuses_logits_to_keep.clear()


def prefix_ids(n: int = 24) -> list[int]:
    return list(range(5, 5 + n))


@torch.inference_mode()
def test_the_prefix_cache_works_on_this_transformers(tokenizer, caplog):
    """The cache is taken back, under the name this version's forward reads, and gives the logits of the full forward."""
    model = build_model(tokenizer).eval()
    prefix = prefix_ids()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        built = PrefixCache.build(model, prefix, torch.device("cpu"))
    assert built is not None, (
        f"the KV prefix cache is off on transformers {transformers.__version__}: {caplog.text}")
    assert not caplog.records
    assert built.length == len(prefix) and built.name in forward.CACHE_NAMES
    rest = torch.tensor([[40, 41, 42], [50, 51, 52]])
    full = model(input_ids=torch.cat([torch.tensor([prefix] * 2), rest], dim=1)).logits[:, -3:]
    P = len(prefix)
    cached = model(input_ids=rest, position_ids=torch.arange(P, P + 3).expand(2, 3),
                   attention_mask=torch.ones(2, P + 3, dtype=torch.long), **built.for_batch(2)).logits
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-4)
    assert built.cache.get_seq_length() == P  # for_batch hands out copies: the prefix is untouched


@torch.inference_mode()
def test_a_forward_that_ignores_the_cache_is_said_once_and_scoring_falls_back(tokenizer, caplog):
    model = build_model(tokenizer).eval()
    inner = model.forward

    def forgetful(input_ids=None, **kwargs):  # takes any cache name through **kwargs and drops it
        for name in forward.CACHE_NAMES:
            kwargs.pop(name, None)
        kwargs.pop("attention_mask", None)
        kwargs.pop("position_ids", None)
        return inner(input_ids=input_ids, **kwargs)

    model.forward = forgetful
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert PrefixCache.build(model, prefix_ids(), torch.device("cpu")) is None
        assert PrefixCache.build(model, prefix_ids(), torch.device("cpu")) is None
    [record] = caplog.records
    assert "read back no KV cache" in record.message and f"transformers {transformers.__version__}" in record.message


@torch.inference_mode()
def test_a_model_that_returns_no_cache_is_said_once(tokenizer, caplog):
    model = build_model(tokenizer).eval()
    inner = model.forward

    def cacheless(*args, **kwargs):
        out = inner(*args, **kwargs)
        for name in forward.CACHE_NAMES:
            if name in out:
                out[name] = None
        return out

    model.forward = cacheless
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert PrefixCache.build(model, prefix_ids(), torch.device("cpu")) is None
    assert "returned no KV cache" in caplog.text


@torch.inference_mode()
def test_cache_of_reads_the_field_of_this_version(tokenizer):
    from transformers.cache_utils import Cache

    out = build_model(tokenizer).eval()(input_ids=torch.tensor([prefix_ids(4)]), use_cache=True)
    assert isinstance(cache_of(out), Cache) and cache_of(out).get_seq_length() == 4
    assert cache_of({"logits": None}) is None


def test_logits_to_keep_is_offered_where_the_forward_may_take_it(tokenizer, caplog):
    model = build_model(tokenizer).eval()
    assert logits_to_keep_kwargs(model, 3) == {"logits_to_keep": 3}
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prefix_ids(8)]), logits_to_keep=3).logits
    assert logits.shape[1] == 3, f"transformers {transformers.__version__} ignored `logits_to_keep`"

    class Plain(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            return input_ids

    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert logits_to_keep_kwargs(Plain(), 3) == {}
        assert logits_to_keep_kwargs(Plain(), 3) == {}
    assert len(caplog.records) == 1 and "takes no `logits_to_keep`" in caplog.records[0].message


def test_ignored_logits_to_keep_is_said(tokenizer, caplog):
    model = build_model(tokenizer).eval()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        forward.check_logits_kept(model, torch.zeros(2, 7, 11), {"logits_to_keep": 3})
        forward.check_logits_kept(model, torch.zeros(2, 3, 11), {"logits_to_keep": 3})
    assert len(caplog.records) == 1 and "ignored `logits_to_keep`" in caplog.text


def test_a_forward_that_refuses_logits_to_keep_through_kwargs_is_called_again_without(tokenizer, caplog):
    """Bloom before transformers 5 takes **deprecated_arguments and raises on any it does not know."""
    model = build_model(tokenizer).eval()
    inner = model.forward

    def strict(input_ids=None, **deprecated_arguments):
        if "logits_to_keep" in deprecated_arguments:
            raise ValueError(f"Got unexpected arguments: {deprecated_arguments}")
        return inner(input_ids=input_ids, **deprecated_arguments)

    model.forward = strict
    ids = torch.tensor([prefix_ids(8)])
    with caplog.at_level(logging.WARNING, logger="forgetwatch"), torch.inference_mode():
        kwargs = {"input_ids": ids, **logits_to_keep_kwargs(model, 3)}
        assert "logits_to_keep" in kwargs  # offered: the forward takes **kwargs
        assert forward.call(model, kwargs).logits.shape[1] == 8  # refused, called again with every position
        assert logits_to_keep_kwargs(model, 3) == {}  # not offered again to this class
    assert len(caplog.records) == 1 and "takes no `logits_to_keep`" in caplog.text

    def grows_then_refuses(input_ids=None, **kwargs):  # refuses only after its cache was extended: no second try
        kwargs["cache"].update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), 0)
        raise ValueError("Got unexpected arguments: logits_to_keep")

    from transformers import DynamicCache

    model.forward = grows_then_refuses
    with pytest.raises(ValueError, match="logits_to_keep"):
        forward.call(model, {"input_ids": ids, "cache": DynamicCache(), "logits_to_keep": 3})

    def broken(input_ids=None, **kwargs):
        raise ValueError("a shape error of the model's own")

    model.forward = broken
    with pytest.raises(ValueError, match="of the model's own"):  # any other error is the caller's to see
        forward.call(model, {"input_ids": ids, "logits_to_keep": 3})


@torch.inference_mode()
def test_a_kwargs_wrapper_around_a_forward_that_names_one_cache_argument(tokenizer, caplog):
    """PEFT's forward takes **kwargs; a model under it that names only `past_key_values` refuses `cache`."""
    import inspect

    model = build_model(tokenizer).eval()
    inner = model.forward
    real = "cache" if "cache" in inspect.signature(inner).parameters else "past_key_values"

    def strict(input_ids=None, attention_mask=None, position_ids=None, use_cache=None, past_key_values=None):
        return inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache,
                     **{real: past_key_values})

    model.forward = lambda *args, **kwargs: strict(*args, **kwargs)
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        built = PrefixCache.build(model, prefix_ids(), torch.device("cpu"))
    assert built is not None and built.name == "past_key_values" and not caplog.records
    assert PrefixCache.build(model, prefix_ids(1), torch.device("cpu")) is None  # nothing to share


def accelerate_style(model, dtype):
    """What accelerate's `prepare_model` does under mixed precision: the forward wrapped in autocast on the instance."""
    model._original_forward = model.forward
    model.forward = torch.autocast("cpu", dtype=dtype)(model.forward)
    return model


@pytest.mark.parametrize("weights", [torch.float32, torch.bfloat16])
def test_wrapped_autocast_reads_the_autocast_inside_the_forward(tokenizer, weights, caplog):
    cpu = torch.device("cpu")
    assert forward.wrapped_autocast(build_model(tokenizer).to(weights), cpu) is None  # not wrapped: nothing to read
    model = accelerate_style(build_model(tokenizer, dropout=0.1).to(weights).train(), torch.bfloat16)
    rng = torch.get_rng_state()
    assert forward.wrapped_autocast(model, cpu) == "bfloat16"  # also when the weights are bf16 themselves
    assert model.training and torch.equal(rng, torch.get_rng_state())  # train mode and the RNG as they were

    def broken(*args, **kwargs):
        raise RuntimeError("needs pixel_values")

    model.forward = broken
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert forward.wrapped_autocast(model, cpu) is None
    assert "taken from the training arguments" in caplog.text
