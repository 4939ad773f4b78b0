"""What the chip's child imports before first use (Target.runtime_module): a real chip's
torch extension registers its device here (torch_npu registers 'npu')."""

LOADED = True
