#!/usr/bin/env python3
"""Compiles the DeepSeek-V4 peers hdk is compared against from the sources that
scripts/peers/dsv4.sh unpacked: FlashMLA's SM90 sparse FP8 decode (the MODEL1 instantiations,
the decoding scheduler, the combine kernel and its `sparse_decode_fwd` binding; nothing else of
FlashMLA) and DeepGEMM's torch extension (its JIT runtime compiles the kernels on first use). No
setuptools, no ninja: the compiler commands run here, in parallel, with torch's include paths and
ABI flags. Called by dsv4.sh (see its header); run it directly only to debug a build.

  dsv4_build.py objects  --src SRC --out DIR     FlashMLA's kernel objects (nvcc only, no torch)
  dsv4_build.py flashmla --src SRC --prefix P    flash_mla package into P/site (objects from
                                                 --objects DIR when given and usable)
  dsv4_build.py deepgemm --src SRC --prefix P    deep_gemm package into P/site
  dsv4_build.py all      --src SRC --prefix P    both at once

SRC is the unpacked payload (flashmla/, deepgemm/, cutlass-flashmla/, cutlass-deepgemm/, fmt/).
"""

import argparse
import concurrent.futures
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

# What flash_mla_with_kvcache needs for the sparse FP8 MODEL1 decode on sm_90a (FlashMLA's
# setup.py lists these among 26 sources; the others are dense decode, prefill and SM100).
FLASHMLA_KERNELS = (
    "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu",
    "csrc/smxx/decode/combine/combine.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h64.cu",
    "csrc/sm90/decode/sparse_fp8/instantiations/model1_persistent_h128.cu",
)

# FlashMLA's nvcc flags (setup.py) without -lineinfo / --source-in-ptx (debug info only) and for
# sm_90a alone; FLASH_MLA_DISABLE_FP16 drops the fp16 combine, which the bf16 decode never uses.
NVCC_FLAGS = (
    "-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16 "
    "-Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ "
    "-U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr "
    "--expt-extended-lambda --use_fast_math "
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills "
    "-gencode=arch=compute_90a,code=sm_90a -Xcompiler=-fPIC"
).split()

# The binding: FlashMLA's csrc/api/api.cpp registers five entry points; this one registers the
# sparse decode only, so none of the dense / prefill / SM100 kernels is needed.
FLASHMLA_API = r"""// Written by hdk's scripts/peers/dsv4_build.py: FlashMLA's binding (csrc/api/api.cpp) with
// only the sparse decode entry point that flash_mla.flash_mla_with_kvcache calls.
#include <pybind11/pybind11.h>

#include "sparse_decode.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlashMLA, sparse decode only (built by hdk's scripts/peers/dsv4.sh)";
  m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}
"""

# sparse_decode.h dispatches to kernels this build leaves out (DeepSeek-V3.2's 656-byte layout
# on SM90, every SM100 kernel): they are defined here to raise instead.
FLASHMLA_STUBS = r"""// Written by hdk's scripts/peers/dsv4_build.py: the kernels FlashMLA's sparse_decode.h can
// dispatch to that this build leaves out; each raises (a RuntimeError in Python).
#include <stdexcept>

#include "params.h"
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"

namespace {
[[noreturn]] void left_out(const char* what) {
  throw std::runtime_error(std::string("FlashMLA as built by hdk's scripts/peers/dsv4.sh has no ") +
                           what + " (only the SM90 MODEL1 sparse decode)");
}
}  // namespace

namespace sm90::decode::sparse_fp8 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 64>(const SparseAttnDecodeParams&) {
  left_out("DeepSeek-V3.2 (656-byte) sparse decode");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32, 128>(const SparseAttnDecodeParams&) {
  left_out("DeepSeek-V3.2 (656-byte) sparse decode");
}
}  // namespace sm90::decode::sparse_fp8

namespace sm100::decode::head64 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams&) {
  left_out("SM100 sparse decode");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams&) {
  left_out("SM100 sparse decode");
}
}  // namespace sm100::decode::head64

namespace sm100::fwd_for_small_topk::head128 {
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseFwdArgT<SparseAttnFwdMode::DecodeWithSplitKV>&) {
  left_out("SM100 head-128 sparse decode");
}
}  // namespace sm100::fwd_for_small_topk::head128
"""


REGISTERS = re.compile(r"Used \d+ registers")
NO_SPILL = re.compile(r"0 bytes spill stores, 0 bytes spill loads")


def log(message):
    print(f"dsv4_build: {message}", flush=True)


def cuda_home():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parents[1]
    return Path("/usr/local/cuda")


def run(command, cwd=None, quiet=False):
    """Runs one compiler command; returns (seconds, output). Raises with the output on failure."""
    start = time.time()
    result = subprocess.run(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seconds = time.time() - start
    if result.returncode != 0:
        raise RuntimeError(
            f"command failed ({result.returncode}): {shlex.join(map(str, command))}\n"
            f"{result.stdout[-20000:]}"
        )
    if not quiet:  # ptxas's register counts, any spill, any warning
        lines = result.stdout.splitlines()
        registers = sorted({m.group(0) for m in map(REGISTERS.search, lines) if m})
        summary = [", ".join(registers)] if registers else []
        summary += [line for line in lines if "spill" in line and not NO_SPILL.search(line)]
        summary += [line for line in lines if "warning" in line.lower()]
        for line in summary[:8]:
            print(f"    {line.strip()}", flush=True)
    return seconds, result.stdout


def run_all(commands, jobs):
    """commands: list of (label, argv). Runs them `jobs` at a time; prints each one's time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run, argv): label for label, argv in commands}
        for future in concurrent.futures.as_completed(futures):
            seconds, _ = future.result()
            log(f"  {futures[future]}: {seconds:.1f} s")


def flashmla_includes(src):
    fm, cut = src / "flashmla", src / "cutlass-flashmla"
    return [
        fm / "csrc",
        fm / "csrc" / "kerutils" / "include",
        fm / "csrc" / "sm90",
        cut / "include",
        cut / "tools" / "util" / "include",
    ]


def kernel_commands(src, out_dir, nvcc):
    """(label, argv, object path) of each FlashMLA kernel source."""
    includes = [f"-I{path}" for path in flashmla_includes(src)]
    commands = []
    for source in FLASHMLA_KERNELS:
        target = out_dir / (Path(source).stem + ".o")
        argv = [str(nvcc), *NVCC_FLAGS, *includes, "-c", str(src / "flashmla" / source)]
        commands.append((Path(source).name, argv + ["-o", str(target)], target))
    return commands


def objects_stamp(src, nvcc):
    """What the kernel objects depend on: nvcc's release, the flags, the sources' pins."""
    output = subprocess.run([str(nvcc), "--version"], stdout=subprocess.PIPE, text=True).stdout
    release = re.search(r"release (\d+\.\d+)", output)  # e.g. 13.0: objects of one release link
    pins = (src / "PINS").read_text() if (src / "PINS").is_file() else ""
    text = "\n".join([release.group(1) if release else output, " ".join(NVCC_FLAGS), pins])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_objects(src, out_dir, jobs):
    nvcc = cuda_home() / "bin" / "nvcc"
    out_dir.mkdir(parents=True, exist_ok=True)
    commands = kernel_commands(src, out_dir, nvcc)
    log(f"FlashMLA kernels: {len(commands)} files on {jobs} jobs with {nvcc}")
    start = time.time()
    run_all([(label, argv) for label, argv, _ in commands], jobs)
    (out_dir / "STAMP").write_text(objects_stamp(src, nvcc) + "\n")
    log(f"FlashMLA kernel objects in {out_dir}: {time.time() - start:.1f} s")


# ---- torch-dependent parts (the GPU machine) -------------------------------------------------


def torch_flags():
    """(compile flags, link flags, extension suffix) for a torch extension, as
    torch.utils.cpp_extension would use them, without its build machinery."""
    import torch
    from torch.utils import cpp_extension as ce

    try:
        includes = ce.include_paths(device_type="cuda")
    except TypeError:  # torch before 2.6
        includes = ce.include_paths(cuda=True)
    try:
        libraries = ce.library_paths(device_type="cuda")
    except TypeError:
        libraries = ce.library_paths(cuda=True)
    home = cuda_home()
    flags = ["-fPIC", "-O3", "-DNDEBUG", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    flags += [f"-isystem{path}" for path in includes]
    flags += [f"-isystem{sysconfig.get_paths()['include']}", f"-isystem{home / 'include'}"]
    abi = []  # what torch passes to an extension's compiler (the pybind11 part is [] since 2.10)
    for name in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        helper = getattr(ce, name, None)
        if helper is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "PyBind11 ABI handling is internal" (2.10+)
                abi += list(helper())
    if not any("_GLIBCXX_USE_CXX11_ABI" in flag for flag in abi):
        abi.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    flags += abi
    link = ["-shared"] + [f"-L{path}" for path in libraries]
    link += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-lc10_cuda", "-ltorch_cuda"]
    link += [f"-L{home / 'lib64'}", "-lcudart", f"-Wl,-rpath,{home / 'lib64'}"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return flags, link, suffix


def cxx():
    return os.environ.get("CXX", "c++")


def build_flashmla(src, prefix, objects, jobs):
    start = time.time()
    build = prefix / "build" / "flashmla"
    package = prefix / "site" / "flash_mla"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    flags, link, suffix = torch_flags()
    includes = [f"-I{path}" for path in flashmla_includes(src)]
    includes.insert(1, f"-I{src / 'flashmla' / 'csrc' / 'api'}")
    (build / "hdk_flashmla_api.cpp").write_text(FLASHMLA_API)
    (build / "hdk_flashmla_stubs.cpp").write_text(FLASHMLA_STUBS)
    host = [cxx(), "-std=c++20", "-Wno-deprecated-declarations", *flags, *includes]
    host += ["-DTORCH_EXTENSION_NAME=cuda", "-DFLASH_MLA_DISABLE_FP16"]
    commands = [
        (name, host + ["-c", str(build / name), "-o", str(build / (Path(name).stem + ".o"))])
        for name in ("hdk_flashmla_api.cpp", "hdk_flashmla_stubs.cpp")
    ]
    linked = [build / "hdk_flashmla_api.o", build / "hdk_flashmla_stubs.o"]
    nvcc = cuda_home() / "bin" / "nvcc"
    kernels = kernel_commands(src, build, nvcc)
    stamp = objects_stamp(src, nvcc)
    usable = (
        objects is not None
        and (objects / "STAMP").is_file()
        and (objects / "STAMP").read_text().strip() == stamp
        and all((objects / target.name).is_file() for _, _, target in kernels)
    )
    if usable:
        log(f"FlashMLA: kernel objects from {objects} (same nvcc, flags and pins)")
        linked += [objects / target.name for _, _, target in kernels]
    else:
        if objects is not None:
            log(f"FlashMLA: the objects in {objects} do not match this nvcc/flags; compiling them")
        commands += [(label, argv) for label, argv, _ in kernels]
        linked += [target for _, _, target in kernels]
    log(f"FlashMLA: {len(commands)} compiles on {jobs} jobs")
    run_all(commands, jobs)
    package.mkdir(parents=True, exist_ok=True)
    for path in (src / "flashmla" / "flash_mla").glob("*.py"):
        shutil.copy2(path, package / path.name)
    target = package / f"cuda{suffix}"
    try:
        seconds, _ = run([cxx(), *map(str, linked), *link, "-o", str(target)], quiet=True)
    except RuntimeError:
        if not usable:
            raise
        log("FlashMLA: linking the carried kernel objects failed; compiling them here")
        run_all([(label, argv) for label, argv, _ in kernels], jobs)
        linked = linked[:2] + [target_ for _, _, target_ in kernels]
        seconds, _ = run([cxx(), *map(str, linked), *link, "-o", str(target)], quiet=True)
    log(f"FlashMLA: linked {target} ({target.stat().st_size / 2**20:.1f} MiB)")
    log(f"FlashMLA build: {time.time() - start:.1f} s")


def build_deepgemm(src, prefix, jobs):
    start = time.time()
    dg = src / "deepgemm"
    build = prefix / "build" / "deepgemm"
    package = prefix / "site" / "deep_gemm"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    flags, link, suffix = torch_flags()
    home = cuda_home()
    includes = [
        home / "include",
        home / "include" / "cccl",
        dg / "deep_gemm" / "include",
        src / "cutlass-deepgemm" / "include",
        src / "fmt" / "include",
    ]
    # DeepGEMM's setup.py: -std=c++17, -Wno-psabi; the libraries cudart and nvrtc (the driver API
    # is opened at run time with dlopen).
    argv = [cxx(), "-std=c++17", "-Wno-psabi", "-Wno-deprecated-declarations", *flags]
    argv += [f"-I{path}" for path in includes] + ["-DTORCH_EXTENSION_NAME=_C"]
    obj = build / "python_api.o"
    log("DeepGEMM: compiling csrc/python_api.cpp (one translation unit)")
    run_all(
        [("python_api.cpp", argv + ["-c", str(dg / "csrc" / "python_api.cpp"), "-o", str(obj)])], 1
    )
    # The package: DeepGEMM's python files, its kernel headers with CUTLASS's cute/ and cutlass/
    # beside them (what its setup.py copies into deep_gemm/include for the JIT), the extension.
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(dg / "deep_gemm", package)
    for name in ("cute", "cutlass"):
        shutil.copytree(src / "cutlass-deepgemm" / "include" / name, package / "include" / name)
    target = package / f"_C{suffix}"
    # The first DeepGEMM call of every process (get_num_sms: DeviceRuntime's constructor,
    # csrc/jit/device_runtime.hpp:45) calls cublasLtCreate, which setup.py never links: its
    # cuBLASLt symbols were left unversioned and undefined, bound at load time to whatever the
    # process holds. Link cuBLASLt and NVRTC by soname, and look for them (and cudart) first in
    # the CUDA libraries torch's wheel loads (site-packages/nvidia/cu*/lib), then CUDA_HOME, so
    # the process holds one copy of each, torch's.
    import torch

    wheel_libs = sorted(Path(torch.__file__).resolve().parent.parent.glob("nvidia/cu*/lib"))
    runpath = [f"-Wl,-rpath,{path}" for path in wheel_libs]
    run([cxx(), str(obj), *runpath, *link, "-lnvrtc", "-lcublasLt", "-o", str(target)], quiet=True)
    log(f"DeepGEMM: linked {target} ({target.stat().st_size / 2**20:.1f} MiB)")
    log(f"DeepGEMM build: {time.time() - start:.1f} s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["objects", "flashmla", "deepgemm", "all"])
    parser.add_argument("--src", type=Path, required=True, help="the unpacked payload")
    parser.add_argument("--out", type=Path, help="objects: where the kernel objects go")
    parser.add_argument("--prefix", type=Path, help="flashmla/deepgemm/all: the install root")
    parser.add_argument("--objects", type=Path, help="prebuilt FlashMLA kernel objects, if any")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    args = parser.parse_args(argv)
    src = args.src.resolve()
    if args.what == "objects":
        if args.out is None:
            parser.error("objects needs --out")
        build_objects(src, args.out.resolve(), args.jobs)
        return 0
    if args.prefix is None:
        parser.error(f"{args.what} needs --prefix")
    prefix = args.prefix.resolve()
    objects = args.objects.resolve() if args.objects else None
    if args.what == "flashmla":
        build_flashmla(src, prefix, objects, args.jobs)
    elif args.what == "deepgemm":
        build_deepgemm(src, prefix, args.jobs)
    else:
        # DeepGEMM is one long translation unit: it gets one core, FlashMLA the rest.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            jobs = [
                pool.submit(build_flashmla, src, prefix, objects, max(1, args.jobs - 1)),
                pool.submit(build_deepgemm, src, prefix, 1),
            ]
            for job in jobs:
                job.result()
    return 0


if __name__ == "__main__":
    sys.exit(main())
