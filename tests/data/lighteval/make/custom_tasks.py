"""forgetwatch probe: local-jsonl custom tasks for lighteval 0.13 (offline)."""
from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc

DATA = "/tmp/lighteval-probe/data"


def mc_prompt(line, task_name: str = None):
    return Doc(
        task_name=task_name,
        query=f"Question: {line['question']}\nAnswer:",
        choices=[f" {c}" for c in line["choices"]],
        gold_index=int(line["answer"]),
        specific={"qid": line["qid"]},  # our own stable id (lighteval overwrites Doc.id with the row index)
    )


def gen_prompt(line, task_name: str = None):
    return Doc(
        task_name=task_name,
        query=line["prompt"],
        choices=[f" {line['answer']}"],
        gold_index=0,
        specific={"qid": line["qid"]},
    )


probe_mc = LightevalTaskConfig(
    name="probe_mc",
    prompt_function=mc_prompt,
    hf_repo=f"{DATA}/mc",
    hf_subset="default",
    hf_avail_splits=["test"],
    evaluation_splits=["test"],
    few_shots_split=None,
    few_shots_select=None,
    metrics=[Metrics.loglikelihood_acc],
    generation_size=-1,
    stop_sequence=None,
    version=0,
)

probe_gen = LightevalTaskConfig(
    name="probe_gen",
    prompt_function=gen_prompt,
    hf_repo=f"{DATA}/gen",
    hf_subset="default",
    hf_avail_splits=["test"],
    evaluation_splits=["test"],
    few_shots_split=None,
    few_shots_select=None,
    metrics=[Metrics.exact_match],
    generation_size=5,
    stop_sequence=["\n"],
    version=0,
)

TASKS_TABLE = [probe_mc, probe_gen]
