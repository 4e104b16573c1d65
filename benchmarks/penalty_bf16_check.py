"""Under bf16 mixed precision at learning rate 0 (the model stays the base): does the 1→0 penalty pull at the base?
RESULTS §17. On the GPU when there is one, else the CPU. With an older penalty.py as argument, that one too:

    git show c80388f:forgetwatch/penalty.py > /tmp/penalty_old.py   # (forgetwatch/remedies/penalty.py since issue 42)
    python benchmarks/penalty_bf16_check.py /tmp/penalty_old.py
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import build_model, build_tokenizer, penalty_pool  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

import forgetwatch.remedies.penalty as new  # noqa: E402
from forgetwatch.remedies import add_loss_term  # noqa: E402

versions = [("new", new)]
if len(sys.argv) > 1:  # an older penalty.py: its relative imports pointed at forgetwatch/, where the remedies were then
    source = Path(sys.argv[1]).read_text()
    for name in ("anchor", "mixing", "distill"):
        source = source.replace(
            f"from .{name} import", f"from forgetwatch.remedies.{name.replace('distill', 'base_outputs')} import"
        )
    old = type(sys)("forgetwatch.penalty_old")
    old.__package__ = "forgetwatch"
    exec(compile(source, sys.argv[1], "exec"), old.__dict__)
    versions.insert(0, ("old", old))


rows = [
    {"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": f"The answer is {i + 1}."}]}
    for i in range(16)
]
for name, mod in versions:
    tok = build_tokenizer()
    model = build_model(tok)
    p = mod.MarginPenalty(penalty_pool(), beta=1.0, ratio=1.0, tokenizer=tok, strategy="uniform", floor=50.0)
    import torch

    args = SFTConfig(
        output_dir=f"/tmp/pen-{name}",
        bf16=True,
        use_cpu=not torch.cuda.is_available(),
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        max_length=64,
    )
    t = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok, callbacks=[p])
    add_loss_term(t, p)
    t.train()
    hinges = [h["penalty_hinge"] for h in t.state.log_history if "penalty_hinge" in h]
    active = [h["penalty_active"] for h in t.state.log_history if "penalty_active" in h]
    print(f"{name}: device {next(t.model.parameters()).device}, bf16 {args.bf16}, right at base "
          f"{int(np.isfinite(p.base_margin).sum())} of {len(p.items)}, hinge per step {hinges}, active {active}", flush=True)
