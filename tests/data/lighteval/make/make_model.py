"""Build a tiny random Llama model + byte-level BPE tokenizer offline, plus a perturbed copy."""
import os, torch
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast, LlamaConfig, LlamaForCausalLM

out = "/tmp/lighteval-probe/models"
texts = ["The capital of France is Paris.", "Two plus two equals four.", "Water boils at one hundred degrees.",
         "Question: What color is the sky? Answer: blue", "The cat sat on the mat.", "Red green blue yellow",
         "A B C D answer yes no true false", "one two three four five six seven eight nine ten"] * 5
tok = Tokenizer(models.BPE(unk_token=None))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<pad>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(texts, trainer)
hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                 pad_token="<pad>", model_max_length=512)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(hf_tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                  eos_token_id=hf_tok.eos_token_id, bos_token_id=hf_tok.bos_token_id, pad_token_id=hf_tok.pad_token_id)
model = LlamaForCausalLM(cfg)
for name, noise in [("tiny-llama", 0.0), ("tiny-llama-perturbed", 0.05)]:
    m = LlamaForCausalLM(cfg); m.load_state_dict(model.state_dict())
    if noise:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn(p.shape, generator=g) * noise)
    d = os.path.join(out, name)
    m.save_pretrained(d); hf_tok.save_pretrained(d)
    print("saved", d, sum(p.numel() for p in m.parameters()))
