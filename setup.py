"""Optional compiled speed-ups (`src/eventspark/speedups`): Cython modules built when the machine
has a C compiler. Without one (or without Cython) the install goes on and eventspark runs its
pure-Python steps, which stay the reference the compiled ones are tested against."""

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MODULES = ["flatten", "rows", "copytext", "arenas"]


class OptionalBuildExt(build_ext):
    """Builds each speed-up if it can; a missing or failing compiler is a warning, not an error."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # no compiler (FileNotFoundError), a failed compile (CompileError)
            print(f"warning: {ext.name} not built ({exc}): the pure-Python steps run instead", file=sys.stderr)


def extensions() -> list[Extension]:
    try:
        from Cython.Build import cythonize
    except ImportError:  # pyproject's build requirements bring it; a build without them gets none
        print("warning: Cython is missing: the speed-ups are not built", file=sys.stderr)
        return []
    modules = [Extension(f"eventspark.speedups._{name}", [f"src/eventspark/speedups/_{name}.pyx"]) for name in MODULES]
    directives = {"language_level": "3", "boundscheck": False, "wraparound": False}
    built = cythonize(modules, compiler_directives=directives, quiet=True)
    for ext in built:
        # cythonize's Extensions drop `optional`, and without it an in-place build (`pip install
        # -e .`, `build_ext --inplace`) fails copying a module the compiler could not build.
        ext.optional = True
    return built


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
