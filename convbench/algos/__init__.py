"""One module per algorithm family (`winograd` holds every tile size; a `<family>_kernels`
module its CUDA kernels; `_aten` and `_lowering` the helpers they share); each registers its
implementations with `@registry.register`.

`registry.load()` imports every module here, so adding an algorithm family is adding a file.
"""
