"""A Triton backend that compiles nothing: enough for Triton to discover it and call it active."""

from triton.backends.compiler import BaseBackend, GPUTarget
from triton.backends.driver import DriverBase


def backend_class(name: str) -> type:
    class Backend(BaseBackend):
        @staticmethod
        def supports_target(target: GPUTarget):
            return target.backend == name

        def hash(self) -> str:
            return name

        def parse_options(self, options: dict) -> object:
            return options

        def add_stages(self, stages: dict, options: object, language=None) -> None:
            pass

        def load_dialects(self, context):
            pass

        def get_module_map(self):
            return {}

    Backend.__name__ = f"{name}_Backend"
    return Backend


def driver_class(name: str) -> type:
    class Driver(DriverBase):
        @classmethod
        def is_active(cls):
            return True  # always: that is the point of the test

        def map_python_to_cpp_type(self, ty: str) -> str:
            return ty

        def get_current_target(self):
            return GPUTarget(name, 0, 32)

        def get_active_torch_device(self):
            import torch

            return torch.device("cpu")

        def get_benchmarker(self):
            raise NotImplementedError

    Driver.__name__ = f"{name}_Driver"
    return Driver
