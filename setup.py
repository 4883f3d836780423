"""Optional compiled speed-ups (`src/eventspark/speedups`): Cython modules built when a C compiler
is present. `Extension(optional=True)`: a machine without one installs and runs the pure-Python
steps, which stay the reference the compiled ones are tested against (docs/performance.md)."""

from Cython.Build import cythonize
from setuptools import Extension, setup

MODULES = ["flatten", "rows", "copytext"]

setup(
    ext_modules=cythonize(
        [
            Extension(f"eventspark.speedups._{name}", [f"src/eventspark/speedups/_{name}.pyx"], optional=True)
            for name in MODULES
        ],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    ),
)
