"""Starting the job's own local Ray: one retry with a longer start-up window, then one line that says what to do.
Ray itself is replaced here by a stand-in whose init fails as a busy machine's does; the real start, and the reaper
that stops a killed driver's Ray, are tested in tests/test_job_ray.py."""
from types import SimpleNamespace

import pytest

from pipeline import local_ray
from pipeline.local_ray import RayStartError, start_local

BUSY = "The current node timed out during startup. This could happen because some of the raylet failed to startup"


def fake_ray(failures: int):
    calls = []

    def init(**kwargs):
        calls.append(kwargs)
        if len(calls) <= failures:
            raise Exception(BUSY + "\nor the GCS has become overloaded.")

    return SimpleNamespace(init=init, shutdown=lambda: None), calls


@pytest.fixture
def no_pause(monkeypatch):
    from ray._private import ray_constants

    monkeypatch.setattr(local_ray, "START_PAUSE_S", 0.0)
    monkeypatch.setattr(ray_constants, "NUM_REDIS_GET_RETRIES", ray_constants.NUM_REDIS_GET_RETRIES)  # restored after
    return ray_constants


def test_a_start_that_times_out_is_tried_once_more_with_a_longer_window(no_pause):
    before = no_pause.NUM_REDIS_GET_RETRIES
    ray, calls = fake_ray(failures=1)
    start_local(ray, num_cpus=2)
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0]["num_cpus"] == 2
    assert no_pause.NUM_REDIS_GET_RETRIES == 2 * before


def test_a_second_failure_is_one_line_that_says_what_to_do(no_pause):
    ray, calls = fake_ray(failures=2)
    with pytest.raises(RayStartError) as e:
        start_local(ray, num_cpus=2)
    message = str(e.value)
    assert len(calls) == 2 and "\n" not in message
    assert "did not start (2 tries; last: The current node timed out during startup" in message
    assert "--num-cpus" in message and "--ray-address" in message
