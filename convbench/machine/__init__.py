"""The machine a run stands on: thread pools, worker processes, contention and steal, NVML."""
