"""Build hook: ship the repository's kernels/ inside the wheel, as convbench/_kernels/.

The CUDA sources live at the top level (one place, read by NVRTC, the emulator and humans);
`convbench.kernels.kernel_dir` reads them from there in an editable install and from
convbench/_kernels/ in an installed wheel. Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads kernels/ in place
            return
        target = Path(self.build_lib) / "convbench" / "_kernels"
        self.mkpath(str(target))
        for source in sorted(Path("kernels").glob("*.cu*")):
            self.copy_file(str(source), str(target / source.name))


setup(cmdclass={"build_py": BuildPyWithKernels})
