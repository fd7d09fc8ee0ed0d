"""Scripts run by hand, not imported by the library: `convert_convset` builds convbench's shipped
data from public sources (`python -m convbench.tools.convert_convset PICKLE`); `phases_bench`
times each CPU algorithm's phases before and after a change (`make phases`)."""
