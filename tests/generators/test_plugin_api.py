"""The generator interface's earlier names keep working: a plug-in generator written against them
(docs/howto/generator.md before the renames) runs unchanged."""

from farm.generators.base import Context

TASK = '"""Doubles x."""\nclass Model:\n    pass\n'


def test_a_generator_reading_ctx_task_source_gets_the_task_code():
    ctx = Context(task_code=TASK, op="x", source="s", target="cpu")
    assert ctx.task_source == ctx.task_code == TASK
    assert ctx.task_doc == "Doubles x."
