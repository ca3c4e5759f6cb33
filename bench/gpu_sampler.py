"""GPU load sampled by `nvidia-smi` in the background, for benchmarks that measure idle GPU time from outside the
process that uses the GPUs (Ray actors): `utilization.gpu` is the share of each sample period in which a kernel ran.

    sampler = GpuSampler(path).start()     # no-op where nvidia-smi is missing (CPU machines)
    ...; sampler.mean_utilization(t0, t1)   # {gpu index: mean % over [t0, t1] (time.time() seconds)}
    sampler.stop()
"""
from __future__ import annotations

import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

QUERY = "timestamp,index,utilization.gpu,memory.used"


def parse_samples(text: str) -> list[tuple[float, int, float, float]]:
    """nvidia-smi `--format=csv,noheader,nounits` lines -> (unix time, gpu index, utilization %, memory MiB);
    lines that do not parse (a driver message, a cut-off last line) are skipped."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        try:  # nvidia-smi prints local time, as time.time() is read on the same machine
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((ts, int(parts[1]), float(parts[2]), float(parts[3])))
        except ValueError:
            continue
    return out


def mean_utilization(samples, t0: float, t1: float, min_memory_mib: float = 1024) -> dict[int, float]:
    """Mean utilization % per GPU over the samples with t0 <= time <= t1, for the GPUs in use then (holding at
    least min_memory_mib at some sample): an unused GPU of the host is left out, not averaged in as idle."""
    acc: dict[int, list[float]] = {}
    peak: dict[int, float] = {}
    for ts, gpu, util, mem in samples:
        if t0 <= ts <= t1:
            acc.setdefault(gpu, []).append(util)
            peak[gpu] = max(peak.get(gpu, 0.0), mem)
    return {gpu: sum(v) / len(v) for gpu, v in sorted(acc.items()) if peak[gpu] >= min_memory_mib}


class GpuSampler:
    def __init__(self, path: str | Path, period_ms: int = 500):
        self.path, self.period_ms, self._proc = Path(path), period_ms, None

    def start(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self._proc = subprocess.Popen([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                           f"--loop-ms={self.period_ms}", f"--filename={self.path}"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    @property
    def active(self) -> bool:
        return self._proc is not None

    def mean_utilization(self, t0: float, t1: float) -> dict[int, float]:
        if not self.active or not self.path.is_file():
            return {}
        time.sleep(2 * self.period_ms / 1e3)  # let the samples up to t1 reach the file
        return mean_utilization(parse_samples(self.path.read_text()), t0, t1)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._proc = None
