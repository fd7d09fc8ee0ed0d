"""One module per algorithm; each registers its implementations with `@registry.register`.

`registry.load()` imports every module here, so adding an algorithm is adding a file.
"""
