"""The CUDA kernels' side: reading kernels/*.cu, compiling and launching them, the compile gate, the emulator."""
