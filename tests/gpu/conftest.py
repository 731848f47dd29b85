"""Every test in tests/gpu needs a GPU; the fixtures most of them share."""

import numpy as np
import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(scope="module")
def device():
    from inferno.cuda.device import Device

    return Device.open()


@pytest.fixture
def rng():
    return np.random.default_rng()  # fresh inputs every run
