from farm_test_triton_backends.common import backend_class

BetaBackend = backend_class("farmtest_beta")
