"""`pip install --no-build-isolation .`: builds the Python module with the
project's CMake (no network: Debian's cmake, ninja, pybind11 and numpy) and
packages it with its own libsimpler and the examples' kernels."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve() / "cmake"
        subprocess.check_call([
            "cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DSIMPLER_BUILD_TESTS=OFF", "-DSIMPLER_BUILD_BENCH=OFF", f"-DPython3_EXECUTABLE={sys.executable}"
        ])
        subprocess.check_call(["cmake", "--build", str(build), "--target", "simpler_python", "-j",
                               os.environ.get("SIMPLER_JOBS", "2")])
        package = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        package.mkdir(parents=True, exist_ok=True)
        # The module, the package's Python files and the examples' Python versions (simpler.examples).
        shutil.copytree(build / "python" / "simpler", package, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
        # The module's RPATH starts with $ORIGIN: it loads the libsimpler beside it.
        lib = build / "libsimpler.so.0"
        shutil.copy2(lib.resolve(), package / lib.name)
        (package / "kernels").mkdir(exist_ok=True)
        for k in (build / "kernels").glob("*.so"):
            shutil.copy2(k, package / "kernels" / k.name)


setup(
    name="simpler",
    version="0.1.0",
    description="simpler: a hierarchical task runtime for tile accelerators (Python API)",
    packages=["simpler", "simpler.examples"],
    package_dir={"": "python"},
    package_data={"simpler": ["*.pyi", "py.typed"]},
    ext_modules=[Extension("simpler._simpler", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
    zip_safe=False,
)
