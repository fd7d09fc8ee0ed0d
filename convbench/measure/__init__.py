"""Measuring: the float64 check, timing, memory, operation counts, the runner and the environment."""
