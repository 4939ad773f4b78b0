from farm_test_triton_backends.common import driver_class

BetaDriver = driver_class("farmtest_beta")
