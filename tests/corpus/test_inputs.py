"""Seeded draws of a task's inputs from several threads of one process (ops searched at once on
one device, --ops-per-device): each thread gets what a draw alone gets."""

from __future__ import annotations

import threading
import time

import torch

from farm.corpus import tasks as taskfiles
from farm.corpus.inputs import draw_inputs, draw_seeded
from farm.runtime.tensors import to_device


def task_file(tmp_path, name: str, get_inputs_body: str):
    """A task whose Model sums its inputs, with the given body of get_inputs()."""
    path = tmp_path / f"{name}.py"
    path.write_text("import time\nimport torch\nimport torch.nn as nn\n\n\n"
                    "class Model(nn.Module):\n    def forward(self, *xs):\n        return sum(x.sum() for x in xs)\n\n\n"
                    "def get_inputs():\n" + get_inputs_body + "\n\ndef get_init_inputs():\n    return []\n")
    return taskfiles.load_task(taskfiles.ref_from_file(path, "local"), "bench")


# get_inputs() lets other threads run between its draws, as a slow allocation or a big draw does
SLOW_DRAW = """    xs = []
    for _ in range(6):
        xs.append(torch.randn(16))
        time.sleep(0.002)
    return xs
"""
# AKG's block-table files pass a tensor of another input's address
POINTERS = """    table = torch.randint(0, 100, (4, 8), dtype=torch.int32)
    return [table, torch.tensor([table.data_ptr()], dtype=torch.uint64)]
"""


def test_threads_drawing_seeded_inputs_at_once_each_get_their_seeds_values(tmp_path):
    task = task_file(tmp_path, "slow_draw", SLOW_DRAW)
    alone = {seed: draw_seeded(task, seed) for seed in range(4)}
    errors, mismatches = [], []

    def worker(seed: int) -> None:
        try:
            for _ in range(5):
                got = draw_inputs(task, seed)  # raises TaskError when a pair of draws differs
                if not all(torch.equal(a, b) for a, b in zip(got, alone[seed])):
                    mismatches.append(seed)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not mismatches, (errors[:1], mismatches)


def test_an_address_passed_as_an_input_is_drawn_as_the_same_token_every_time(tmp_path):
    from farm.runtime import pointers

    task = task_file(tmp_path, "block_table_ptrs", POINTERS)
    first, second = draw_inputs(task, 0), draw_inputs(task, 0)  # raised "nondeterministic" before
    assert torch.equal(first[1], second[1]) and int(first[1][0]) >> 48 == pointers.TAG
    assert to_device(first, "cpu")[1].tolist() == [first[0].data_ptr()]


def test_a_thread_building_a_seeded_model_never_moves_another_threads_draw(tmp_path):
    """Export checks ops side by side in threads: one builds its truth's Model under seed 0 while
    another draws a task's inputs. Seeding and building used torch's global generator outside
    the draws' turn, so a draw was re-seeded half-way and the task called nondeterministic."""
    from farm.runtime.tensors import own_generator

    task = task_file(tmp_path, "slow_draw", SLOW_DRAW)
    alone = draw_seeded(task, 3)
    stop, errors = threading.Event(), []

    def builder() -> None:
        while not stop.is_set():
            with own_generator(0):  # as farm.export.envelope builds a truth
                torch.nn.Linear(32, 32)
                time.sleep(0.001)

    thread = threading.Thread(target=builder)
    thread.start()
    try:
        for _ in range(20):
            got = draw_inputs(task, 3)
            if not all(torch.equal(a, b) for a, b in zip(got, alone)):
                errors.append("moved")
    except Exception as exc:  # noqa: BLE001 - collected for the assertion
        errors.append(exc)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors[:1]
