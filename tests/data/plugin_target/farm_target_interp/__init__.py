"""A target defined outside the farm, the way a team bringing up a new chip plugs one in.

This one runs Triton kernels through the interpreter on the host (real semantics, no device
to pin), so the suite can run the whole flow on it without the chip.
"""

from farm.targets.base import Target

TARGET = Target(
    name="interp",
    torch_device="cpu",
    visible_env=None,
    flush_bytes=0,
    interpret=True,
    child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""},
)
