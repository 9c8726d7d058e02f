"""Package layout that pyproject.toml cannot express: ``examples/`` ships as ``simlib.examples``.

Everything else (metadata, dependencies, the ``simlib`` console script) is in pyproject.toml.
The examples are installed inside the package so that ``simlib run NAME`` works after a
plain (non-editable) ``pip install .``; in a clone they stay runnable as
``python examples/NAME.py``.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["simlib", "simlib.*"]), "simlib.examples",
              "simlib.examples.data"],
    package_dir={"simlib.examples": "examples", "simlib.examples.data": "examples/data"},
    package_data={"simlib": ["native/*.cc"], "simlib.particles._native": ["*.cc"],
                  "simlib._linalg": ["native/*.cc"],
                  "simlib.examples.data": ["*.csv"]},
)
