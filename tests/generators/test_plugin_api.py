"""The generator interface's earlier names keep working: a plug-in generator written against them
(docs/howto/generator.md before the renames) runs unchanged, a subclass of a built-in one too."""

from pathlib import Path

from farm.generators.base import Context, Proposal, initial_candidates_of, no_initial_reason_of
from farm.generators.tune import TuneGenerator

TASK = '"""Doubles x."""\nclass Model:\n    pass\n'
KERNEL_TASK = Path(__file__).resolve().parents[2] / "tasks" / "vllm_triton" / "log_softmax_kernel.py"


def test_a_generator_reading_ctx_task_source_gets_the_task_code():
    ctx = Context(task_code=TASK, op="x", source="s", target="cpu")
    assert ctx.task_source == ctx.task_code == TASK
    assert ctx.task_doc == "Doubles x."


class ExtraTune(TuneGenerator):
    """A plug-in that extends a built-in generator through the earlier name."""

    def seeds(self, ctx):
        return super().seeds(ctx) + [Proposal("# extra", self.name, "extra")]

    def no_seed_reason(self, ctx):
        return "extra: " + super().no_seed_reason(ctx)


def test_a_subclass_of_a_built_in_generator_overriding_seeds_is_asked_through_it():
    ctx = Context(task_code=KERNEL_TASK.read_text(), op="x", source="s", target="cpu")
    tune = initial_candidates_of(TuneGenerator(), ctx)
    assert TuneGenerator().seeds(ctx) == tune  # the earlier name answers as the new one
    assert initial_candidates_of(ExtraTune(), ctx) == tune + [Proposal("# extra", "tune", "extra")]
    plain = Context(task_code=TASK, op="x", source="s", target="cpu")
    assert no_initial_reason_of(ExtraTune(), plain) == "extra: " + TuneGenerator().no_initial_reason(plain)
