"""The training-step studies, side by side on one `Workload` (docs/pages/design.md §1, layer 7):
`trainstep` (a whole step three ways), `memprofile` (its memory by layer), `memplan` (memory
strategies against batch and speed), `scale` (data-parallel). None imports another."""
