"""bench/gpu_sampler.py: nvidia-smi samples parsed and averaged per GPU in use over a time window."""
from datetime import datetime

from bench.gpu_sampler import GpuSampler, mean_utilization, parse_samples


def _line(t: float, gpu: int, util: int, mem: int) -> str:
    stamp = datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {gpu}, {util}, {mem}"


def test_samples_are_parsed_and_averaged_over_the_window_for_gpus_in_use():
    t = 1_800_000_000.0
    lines = [_line(t + i, 0, 10 * i, 30_000) for i in range(6)]  # GPU 0 busy, 0..50 %
    lines += [_line(t + i, 1, 0, 2) for i in range(6)]  # GPU 1 holds nothing: not in use
    lines += ["Failed to read some value", _line(t + 2, 0, 90, 30_000)[:12]]  # noise and a cut-off line
    samples = parse_samples("\n".join(lines))
    assert len(samples) == 12
    assert abs(samples[3][0] - (t + 3)) < 1e-3 and samples[3][1:] == (0, 30.0, 30_000.0)
    assert mean_utilization(samples, t + 1.5, t + 4.5) == {0: 30.0}  # samples 2, 3, 4
    assert mean_utilization(samples, t + 10, t + 20) == {}
    assert mean_utilization(samples, t, t + 5, min_memory_mib=0) == {0: 25.0, 1: 0.0}


def test_sampler_without_nvidia_smi_reports_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    sampler = GpuSampler(tmp_path / "s.csv").start()
    assert not sampler.active and sampler.mean_utilization(0, 1e12) == {}
    sampler.stop()
