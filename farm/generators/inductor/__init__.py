"""The inductor generator: Triton seeds from torch.compile of a task's Reference.

capture runs torch.compile in a child pinned to the target and collects the Triton kernels
inductor writes; generator turns them into plain @triton.jit candidates.
"""
