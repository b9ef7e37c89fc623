"""python/setup.py as pip runs it: from the project directory, with the user's $PWD inherited."""

import os
import subprocess
import sys
from pathlib import Path

SETUP = Path(__file__).resolve().parents[1] / "setup.py"


def run_setup(tmp_path, prebuilt_lib):
    # pip starts setup.py in python/ (or a copy of it); the shell's $PWD is where the user was.
    user_dir = tmp_path / "user"
    user_dir.mkdir(exist_ok=True)
    env = dict(os.environ, PWD=str(user_dir), HDK_PREBUILT_LIB=prebuilt_lib)
    env["HDK_BUILD_BASE"] = str(tmp_path / "build")
    return subprocess.run(
        [sys.executable, str(SETUP), "--version"],
        cwd=SETUP.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_prebuilt_lib_relative_to_the_directory_pip_was_started_in(tmp_path):
    library = tmp_path / "user" / "build" / "src" / "libhdk.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    result = run_setup(tmp_path, "build/src/libhdk.so")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].count(".") == 2  # the version, e.g. 0.1.0


def test_prebuilt_lib_that_is_missing_names_the_path_tried(tmp_path):
    result = run_setup(tmp_path, "build/src/libhdk.so")
    assert result.returncode != 0
    assert "HDK_PREBUILT_LIB=build/src/libhdk.so" in result.stderr
    assert str(tmp_path / "user" / "build" / "src" / "libhdk.so") in result.stderr
