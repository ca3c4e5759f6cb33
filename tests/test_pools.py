"""Actor pool sizing follows the cluster: one engine per GPU, rasterizers in the CPUs left, never more CPU
requested than the cluster has (which would deadlock Ray Data without an error)."""
import pytest

from pipeline.config import ConfigError, load_config
from pipeline.job import INPUT_CPU_RESERVE, size_pools


def cfg(**over):
    base = {"input": {"uris": ["x"]}}
    base.update(over)
    return load_config(None, base)


@pytest.mark.parametrize("cpus,gpus,engines,gpu_each", [(128, 8, 8, 1), (16, 1, 1, 1), (2, 0, 1, 0), (32, 2, 2, 1)])
def test_one_engine_per_gpu_and_cpu_budget_respected(cpus, gpus, engines, gpu_each):
    p = size_pools(cfg(), cpus, gpus)
    assert (p.engines, p.gpus_per_engine) == (engines, gpu_each)
    total = p.engines * p.engine_cpus + p.raster_max * p.raster_cpus + INPUT_CPU_RESERVE
    assert total <= cpus + 1e-9
    assert p.raster_max >= 1


def test_eight_gpus_get_enough_rasterizers():
    p = size_pools(cfg(), 128, 8)
    assert p.raster_max >= 100  # ~40 pages/s/core vs a few pages/s per GPU: no GPU waits on rendering


def test_impossible_requests_fail_with_a_fix():
    with pytest.raises(ConfigError, match=r"^--device \(model.device\) is cuda but Ray sees no GPUs: use --device cpu"):
        size_pools(cfg(model={"device": "cuda"}), 16, 0)
    with pytest.raises(ConfigError, match=r"^--num-engines \(parse.num_actors\) is 4 .*one engine per GPU"):
        size_pools(cfg(parse={"num_actors": 4}), 64, 2)
    with pytest.raises(ConfigError, match="parse.cpus_per_actor.*lower --num-engines"):
        size_pools(cfg(parse={"cpus_per_actor": 2.0}), 2, 0)
    p = size_pools(cfg(model={"device": "cpu"}), 16, 8)  # a CPU run on a GPU cluster uses no GPU
    assert p.gpus_per_engine == 0 and p.engines == 1
