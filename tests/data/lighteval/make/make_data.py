"""Write local jsonl datasets: MC with variable #choices, and a tiny generative QA set."""
import json
mc = [
 ("What is the capital of France?", ["Paris", "London"], 0),
 ("Two plus two equals?", ["three", "four", "five", "six"], 1),
 ("What color is the sky?", ["blue", "red", "green"], 0),
 ("Is water wet?", ["yes", "no"], 0),
 ("Which is a number?", ["cat", "mat", "seven", "sky"], 2),
 ("Water boils at?", ["one hundred degrees", "ten degrees"], 0),
 ("Which is a color?", ["yellow", "four", "Paris", "mat"], 0),
 ("Where did the cat sit?", ["on the mat", "in the sky", "in Paris"], 0),
 ("Is the sky green?", ["true", "false"], 1),
 ("Which comes after three?", ["one", "two", "four", "ten"], 2),
]
with open("/tmp/lighteval-probe/data/mc/test.jsonl", "w") as f:
    for i, (q, c, g) in enumerate(mc):
        f.write(json.dumps({"qid": f"mc-{i:03d}", "question": q, "choices": c, "answer": g}) + "\n")
gen = [("The capital of France is", "Paris"), ("Two plus two equals", "four"), ("The sky is", "blue"),
       ("The cat sat on the", "mat"), ("One two three", "four"), ("Red green blue", "yellow"),
       ("Water boils at one hundred", "degrees"), ("Nine comes before", "ten")]
with open("/tmp/lighteval-probe/data/gen/test.jsonl", "w") as f:
    for i, (q, a) in enumerate(gen):
        f.write(json.dumps({"qid": f"gen-{i:03d}", "prompt": q, "answer": a}) + "\n")
print("ok")
