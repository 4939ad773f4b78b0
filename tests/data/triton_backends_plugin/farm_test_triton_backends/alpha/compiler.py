from farm_test_triton_backends.common import backend_class

AlphaBackend = backend_class("farmtest_alpha")
