from farm_test_triton_backends.common import driver_class

AlphaDriver = driver_class("farmtest_alpha")
