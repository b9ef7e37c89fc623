"""``pip install --no-build-isolation .`` from the repository root builds the Python package in
python/ (the torch extension hdk._C and the hdk modules); python/setup.py has the details."""

import os
import runpy

runpy.run_path(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "setup.py"),
    run_name="__main__",
)
