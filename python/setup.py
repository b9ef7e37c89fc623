"""Builds hdk's Python package: the torch extension ``hdk._C`` and the pure-Python modules.

Install into an environment that already has torch (the build needs torch's headers, so build
isolation must be off)::

    pip install --no-build-isolation ./python          # or: pip install --no-build-isolation .

Two ways to get libhdk into the extension:

* default: hdk's C++ sources (every ``src/**/*.cpp`` outside ``src/**/cuda/``) are compiled into
  the extension, so the install is self-contained and needs only a C++17 compiler. This build
  has hdk's CPU backend only.
* ``HDK_PREBUILT_LIB=/path/to/libhdk.so`` (or ``libhdk.a``; a relative path is taken from the
  directory pip was started in): only the binding sources
  (``python/csrc/*.cpp``) are compiled and the given library is linked, e.g. a CUDA build made
  with CMake. A shared library is copied next to the extension (found through
  ``$ORIGIN``); a static one links ``CUDA::cudart`` through torch's CUDA extension settings.

Other environment variables: ``HDK_PYTHON_CUDA=0|1`` (compile the binding with torch's CUDA
headers; default: when torch has CUDA and ``CUDA_HOME`` is found), ``MAX_JOBS`` (parallel
compile jobs, default: all cores), ``HDK_BUILD_BASE`` (build directory, default
``<repo>/build-python/<mode>``), ``HDK_SOURCE_DIR`` (the repository, default: this file's
parent's parent).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError as error:  # pragma: no cover - only reached without torch
    sys.exit(
        "hdk: building the Python package needs torch installed in this environment "
        f"({error}); install torch first, then run pip with --no-build-isolation"
    )

PYTHON_DIR = Path(__file__).resolve().parent
REPO = Path(os.environ.get("HDK_SOURCE_DIR", PYTHON_DIR.parent)).resolve()


def prebuilt_library():
    """HDK_PREBUILT_LIB as an absolute path, or None when unset.

    A relative path is taken from the directory pip (or setup.py) was started in. pip runs this
    file from the project directory (python/, or a temporary copy of it), so the working
    directory here is not the user's; the shell's $PWD, which child processes inherit, still is.
    The working directory is the second choice, for a caller that changed it without $PWD.
    """
    value = os.environ.get("HDK_PREBUILT_LIB", "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    invoked_from = Path(os.environ.get("PWD", os.getcwd()))
    bases = [Path("/")] if path.is_absolute() else [invoked_from, Path.cwd()]
    tried = []
    for base in bases:
        candidate = (base / path).resolve()
        if candidate.is_file():
            return candidate
        if candidate not in tried:
            tried.append(candidate)
    sys.exit(
        f"hdk: HDK_PREBUILT_LIB={value} names no file (tried {', '.join(map(str, tried))}; a "
        "relative path is taken from the directory pip was started in)"
    )


PREBUILT_LIB = prebuilt_library()


def read_version():
    header = (REPO / "include" / "hdk" / "version.h").read_text()
    parts = [
        re.search(rf"#define HDK_VERSION_{name} (\d+)", header).group(1)
        for name in ("MAJOR", "MINOR", "PATCH")
    ]
    return ".".join(parts)


def binding_sources():
    # Every binding file is picked up, so a new python/csrc/<area>_ops.cpp needs no edit here.
    return sorted(str(path) for path in (PYTHON_DIR / "csrc").glob("*.cpp"))


def hdk_sources():
    src = REPO / "src"
    return sorted(
        str(path) for path in src.rglob("*.cpp") if "cuda" not in path.relative_to(src).parts
    )


def want_cuda():
    setting = os.environ.get("HDK_PYTHON_CUDA", "auto").strip().lower()
    if setting in ("0", "off", "no", "false"):
        return False
    available = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if setting in ("1", "on", "yes", "true"):
        if not available:
            sys.exit(
                "hdk: HDK_PYTHON_CUDA=1 but torch has no CUDA "
                f"(torch.version.cuda={torch.version.cuda}) or CUDA_HOME was not found"
            )
        return True
    return available


def torch_at_least(major, minor):
    found = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(found.group(1)), int(found.group(2))) >= (major, minor)


def shared_library_name(path):
    """The SONAME the linker records for `path`: the file name the extension will look for."""
    try:
        dynamic = subprocess.run(
            ["readelf", "-d", str(path)], capture_output=True, text=True, check=True
        ).stdout
        found = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dynamic)
        if found:
            return found.group(1)
    except (OSError, subprocess.CalledProcessError):
        pass
    return Path(path).name


def extension():
    with_cuda = want_cuda()
    sources = binding_sources()
    include_dirs = [str(REPO / "include"), str(PYTHON_DIR / "csrc")]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    cxx_flags = ["-O2", "-g0", "-Wall", "-Wno-unused-parameter", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    # torch < 2 defaults extensions to C++14; hdk's headers need C++17. Newer torch picks a
    # standard at least that new on its own, and a fixed flag could undercut it.
    if not torch_at_least(2, 0):
        cxx_flags.append("-std=c++17")
    if with_cuda:
        cxx_flags.append("-DHDK_PYTHON_WITH_CUDA")
    extra_objects, link_args = [], []

    if PREBUILT_LIB:
        extra_objects.append(str(PREBUILT_LIB))
        if PREBUILT_LIB.suffix != ".a":
            link_args.append("-Wl,-rpath,$ORIGIN")
    else:
        sources += hdk_sources()
        include_dirs.append(str(REPO / "src"))
        link_args.append("-pthread")

    make = cpp_extension.CUDAExtension if with_cuda else cpp_extension.CppExtension
    return make(
        name="hdk._C",
        sources=sources,
        include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx_flags},
        extra_objects=extra_objects,
        extra_link_args=link_args,
    )


class BuildExtension(cpp_extension.BuildExtension):
    """torch's builder, plus: a prebuilt shared libhdk is copied next to the extension."""

    def run(self):
        super().run()
        target_dir = Path(self.get_ext_fullpath("hdk._C")).parent
        # A copy left by an earlier build against another library must not ship in this one.
        for stale in target_dir.glob("libhdk.so*"):
            stale.unlink()
        if not PREBUILT_LIB or PREBUILT_LIB.suffix == ".a":
            return
        target_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PREBUILT_LIB, target_dir / shared_library_name(PREBUILT_LIB))


def build_base():
    if os.environ.get("HDK_BUILD_BASE"):
        return os.environ["HDK_BUILD_BASE"]
    return str(REPO / "build-python" / ("prebuilt" if PREBUILT_LIB else "default"))


os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
# setuptools wants package paths relative to the directory it runs in (this one, or the
# repository root when the root's setup.py delegates here).
package_root = os.path.relpath(PYTHON_DIR, os.getcwd())

setup(
    name="hdk",
    version=read_version(),
    description="Hybrid Decode Kernels: GDN decode for PyTorch serving engines",
    python_requires=">=3.8",
    package_dir={"": package_root},
    packages=["hdk", "hdk.compat", "hdk.bench", "hdk.dsv4", "hdk.integrations"],
    package_data={"hdk": ["libhdk.so*"]},
    ext_modules=[extension()],
    cmdclass={
        "build_ext": BuildExtension.with_options(use_ninja=cpp_extension.is_ninja_available())
    },
    options={"build": {"build_base": build_base()}},
    zip_safe=False,
)
