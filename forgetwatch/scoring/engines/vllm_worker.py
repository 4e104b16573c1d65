"""Runs inside vLLM's worker processes (`worker_extension_cls`): loads another checkpoint's weights into the model
vLLM is running, so one vLLM scores every checkpoint of a run (`forgetwatch.scoring.engines.vllm.VLLMEngine.load`).

vLLM's `reload_weights(weights_path=...)` does the loading: on the CPU backend (and with quantized kernels) the weights
vLLM runs are repacked at start-up, and only its reload writes a checkpoint into them (the model's own `load_weights`
is refused: "Attempted to load weight ([576, 1536]) into parameter ([0])"). But a tied `lm_head` (SmolLM2, Llama 3.2
1B/3B and Qwen2.5's small models tie it to the embedding) has no tensor of its own in the checkpoint, so the reload
does not process it again: on the CPU its matrix multiply keeps the old weights packed for oneDNN, and the scores mix
two checkpoints (option scores 0.77 nats off on SmolLM2). Its processing is run again on the new weights.

Imported only by vLLM's workers; vLLM is imported inside the method.
"""

from __future__ import annotations

__all__ = ["WeightLoader"]


class WeightLoader:
    """Mixed into vLLM's worker class (vLLM refuses a method name its worker already has: ours start `forgetwatch_`)."""

    def forgetwatch_load_weights(self, path: str) -> None:
        """Load the weights in directory `path` (a checkpoint of the running model) into it."""
        self.reload_weights(weights_path=path, is_checkpoint_format=True)  # type: ignore[attr-defined]  (the worker's)
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        method = getattr(head, "quant_method", None)
        if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and method is not None:
            method.process_weights_after_loading(head)  # on the CPU: pack the new weights (elsewhere: nothing to do)
