"""Scripts that build convbench's shipped data from public sources (run by hand, not imported by
the library): `python -m convbench.tools.convert_convset PICKLE`."""
