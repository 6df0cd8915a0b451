"""Kernel builds can never hang a model load: a killed build leaves nothing that a later load waits on, builds of
one library by several processes at once all end with a working library, a build past the time bound gives up in
one line on stderr and the engine falls back, and the cache is keyed by the source's text.

The library under test is a one-function C++ file: building it through torch's extension builder costs a second of
compiling after torch's import, and most tests replace that builder by a direct `c++` call (a tenth of a second)
or by a sleeper, since what they check (the lock, the private folders, the bound, the key) is ours.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from dynasd import cli
from dynasd.kernels import build_command, compile
from dynasd.kernels.compile import build_kernel, compiled_op, library_path

NAME = "dynasd_kernel_test"
TINY_SOURCE = 'extern "C" int dynasd_kernel_test_answer() { return %d; }\n'
COMPILE_PY = Path(compile.__file__)
KERNEL_HEADERS = sorted(COMPILE_PY.parent.glob("*.h"))
# Child processes load compile.py by its path: importing the package would import torch and transformers (5-20 s on
# a busy machine), and the build logic needs neither.
CHILD_PRELUDE = f"""
import ctypes, importlib.util, sys, time
from pathlib import Path
spec = importlib.util.spec_from_file_location("dynasd.kernels.compile", {str(COMPILE_PY)!r})
compile = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compile)
"""
needs_compiler = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler here")
# A build that never finishes by itself; it writes its pid into the build folder (its working directory).
SLEEPER = "import os, time; open('builder.pid', 'w').write(str(os.getpid())); time.sleep(120)"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DYNASD_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DYNASD_KERNEL_BUILD_TIMEOUT", raising=False)
    monkeypatch.delenv("DYNASD_COMPILE", raising=False)
    return tmp_path / "cache"


def checkout(tmp_path: Path, folder: str, answer: int = 42) -> Path:
    source = tmp_path / folder / "tiny.cpp"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text(TINY_SOURCE % answer)
    return source


def answer_of(library: Path) -> int:
    return ctypes.CDLL(str(library)).dynasd_kernel_test_answer()


def direct_compile(name, source, folder, deadline, flags=None):
    return ["c++", "-shared", "-fPIC", "-o", str(Path(folder) / f"{name}.so"), str(source)]


def sleeper(name, source, folder, deadline, flags=None):
    return [sys.executable, "-c", SLEEPER]


def build_folders(cache: Path) -> list[Path]:
    return list(cache.glob("*.build-*"))


def child(code: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD_PRELUDE + code], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent that never reaps (a container's first process may not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.05)
    return value


@contextlib.contextmanager
def slow_build_in_another_process(cache: Path, source: Path):
    """Another process that has taken the build lock and started a build that does not end; yields (its pid, the
    builder's pid) once the builder runs, and kills both at the end."""
    loader = child(f"compile.builder_command = lambda *args: [sys.executable, '-c', {SLEEPER!r}]\n"
                   f"compile.build_kernel({NAME!r}, Path({str(source)!r}))", {"DYNASD_KERNEL_CACHE": str(cache)})
    builder_pid = None
    try:
        pid_file = wait_for(lambda: next((p for p in cache.glob("*.build-*/builder.pid") if p.read_text()), None),
                            60, "the other process starts its build")
        builder_pid = int(pid_file.read_text())
        yield loader.pid, builder_pid
    finally:
        loader.kill()
        loader.communicate()
        if builder_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(builder_pid, signal.SIGKILL)


@needs_compiler
def test_a_load_after_a_build_killed_mid_way_goes_on_at_once(cache, tmp_path, monkeypatch):
    """(a) The lock of a killed process is dropped with it: the next load builds at once (well within a minute),
    removing the dead build's private folder."""
    source = checkout(tmp_path, "checkout")
    with slow_build_in_another_process(cache, source) as (loader_pid, _):
        os.kill(loader_pid, signal.SIGKILL)
        wait_for(lambda: ended(loader_pid), 10, "the killed process ends")
        assert build_folders(cache), "the killed build left its folder behind"
        monkeypatch.setattr(compile, "builder_command", direct_compile)
        monkeypatch.setenv("DYNASD_KERNEL_BUILD_TIMEOUT", "60")  # a lock that stayed would fail the test, not hang it
        start = time.monotonic()
        op = compiled_op(NAME, source, lambda: answer_of(library_path(NAME, source)))
        elapsed = time.monotonic() - start
    assert op == 42
    assert elapsed < 60
    assert build_folders(cache) == []


def test_a_build_ends_with_the_process_that_asked_for_it(cache, tmp_path):
    """A killed loader's build does not run on for nobody: torch's builder stops within seconds, before it has
    built anything."""
    source = checkout(tmp_path, "checkout")
    loader = child(f"compile.build_kernel({NAME!r}, Path({str(source)!r}))", {"DYNASD_KERNEL_CACHE": str(cache)})
    try:
        lock = library_path(NAME, source).with_suffix(".lock")
        owners = wait_for(lambda: lock.exists() and lock.read_text().split(), 60, "the build starts")
        while len(owners) < 2:  # loader pid, then builder pid
            owners = wait_for(lambda: lock.read_text().split(), 10, "the builder starts")
        builder_pid = int(owners[1])
    finally:
        loader.kill()
        loader.communicate()
    wait_for(lambda: ended(builder_pid), 15, "the builder ends with its loader")
    assert not list(cache.glob(f"*.build-*/{NAME}.so")), "the builder went on to the end"


@needs_compiler
def test_two_checkouts_loading_at_once_into_an_empty_cache_both_get_a_working_library(cache, tmp_path):
    """(b) Two processes, two checkouts of the same source text, one empty cache: one builds (torch's real
    builder), the other waits for it and loads its library; neither corrupts the other. A `lock` file left in
    torch's own extension folder by its old scheme does not matter."""
    torch_extensions = tmp_path / "torch_extensions"
    (torch_extensions / NAME).mkdir(parents=True)
    (torch_extensions / NAME / "lock").touch()
    env = {"DYNASD_KERNEL_CACHE": str(cache), "TORCH_EXTENSIONS_DIR": str(torch_extensions),
           "DYNASD_KERNEL_BUILD_TIMEOUT": "180"}
    code = ("library = compile.build_kernel({name!r}, Path({source!r}))\n"
            "print(library.built, library.path, ctypes.CDLL(str(library.path)).dynasd_kernel_test_answer())")
    loaders = [child(code.format(name=NAME, source=str(checkout(tmp_path, folder))), env)
               for folder in ("checkout-a", "checkout-b")]
    results = []
    try:
        for loader in loaders:
            out, err = loader.communicate(timeout=240)
            assert loader.returncode == 0, err
            results.append(out.split())
    finally:
        for loader in loaders:
            loader.kill()
    assert sorted(built for built, _, _ in results) == ["False", "True"]
    assert [answer for _, _, answer in results] == ["42", "42"]
    assert {path for _, path, _ in results} == {str(p) for p in cache.glob("*.so")}  # one library, whole
    assert build_folders(cache) == []


def test_a_build_past_the_bound_is_killed_and_falls_back_in_one_line(cache, tmp_path, monkeypatch, capfd):
    """(c) A build that does not finish within DYNASD_KERNEL_BUILD_TIMEOUT is killed; the load says so in exactly
    one line on stderr (no warning) and returns no op, so the caller keeps torch's products."""
    monkeypatch.setenv("DYNASD_KERNEL_BUILD_TIMEOUT", "1")
    pid_file = tmp_path / "builder.pid"
    write_pid = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    monkeypatch.setattr(compile, "builder_command", lambda *args: [sys.executable, "-c", write_pid])
    source = checkout(tmp_path, "checkout")
    start = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert compiled_op(NAME, source, lambda: "op") is None
    elapsed = time.monotonic() - start
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "not built within 1 s" in err, err
    assert caught == []
    assert elapsed < 1 + compile.STOP_GRACE_S + 5
    assert ended(int(pid_file.read_text()))
    assert build_folders(cache) == [] and not library_path(NAME, source).exists()


def test_waiting_past_the_bound_for_another_build_falls_back_in_one_line_naming_it(cache, tmp_path, monkeypatch,
                                                                                  capfd):
    """(c) A load that cannot take the build lock within the bound gives up in one line that names the process
    holding it."""
    source = checkout(tmp_path, "checkout")
    with slow_build_in_another_process(cache, source) as (loader_pid, _):
        monkeypatch.setenv("DYNASD_KERNEL_BUILD_TIMEOUT", "1")
        start = time.monotonic()
        assert compiled_op(NAME, source, lambda: "op") is None
        elapsed = time.monotonic() - start
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and f"process {loader_pid} holds its lock" in err, err
    assert elapsed < 5


@needs_compiler
def test_the_cache_is_keyed_by_the_source_text(cache, tmp_path, monkeypatch):
    """(d) The same text at another path is found built; a changed text builds anew, beside the older library
    (another checkout may still load that one)."""
    monkeypatch.setattr(compile, "builder_command", direct_compile)
    first = build_kernel(NAME, checkout(tmp_path, "checkout-a"))
    same_text = build_kernel(NAME, checkout(tmp_path, "checkout-b"))
    changed = build_kernel(NAME, checkout(tmp_path, "checkout-a", answer=43))
    assert first.built and not same_text.built and same_text.path == first.path
    assert changed.built and changed.path != first.path
    assert (answer_of(first.path), answer_of(changed.path)) == (42, 43)


@needs_compiler
def test_a_compiler_error_warns_with_the_compilers_first_error(cache, tmp_path, monkeypatch):
    """A build that fails falls back with a warning that says why (the compiler's first error) and publishes
    nothing."""
    monkeypatch.setattr(compile, "builder_command", direct_compile)
    source = checkout(tmp_path, "checkout")
    source.write_text("int broken( {\n")
    with pytest.warns(UserWarning, match=r"not available \(the build failed: .*error:"):
        assert compiled_op(NAME, source, lambda: "op") is None
    assert build_folders(cache) == [] and not library_path(NAME, source).exists()


def test_build_kernels_prints_one_line_per_kernel(cache, monkeypatch, capsys):
    """`dynasd build-kernels`: built, then already built; a kernel that cannot be built says why, and setup goes
    on (exit 0)."""
    monkeypatch.setattr(compile, "builder_command", lambda name, *args: ["touch", f"{name}.so"])
    kernels = list(build_command.engine_kernels())
    assert cli.main(["build-kernels", "--all"]) == 0
    assert cli.main(["build-kernels", "--all"]) == 0
    monkeypatch.setattr(compile, "builder_command", lambda *args: ["false"])
    monkeypatch.setenv("DYNASD_KERNEL_CACHE", str(cache / "empty"))
    assert cli.main(["build-kernels", "--all"]) == 0
    monkeypatch.setenv("DYNASD_COMPILE", "0")
    assert cli.main(["build-kernels", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == kernels * 4
    states = [line.split(": ", 1)[1] for line in lines]
    assert all(state.startswith("built in ") for state in states[:2])
    assert all(state.startswith("already built") for state in states[2:4])
    variant = compile.kernel_variant() or compile.VARIANTS[-1]  # the block kernel's line alone names VNNI, where used
    assert [("with VNNI" in state) for state in states[2:4]] == \
        [name == "dynasd_block_linear" and compile.multiplies_with_vnni(variant) for name in kernels]
    assert all(state.startswith("unavailable (the build failed") for state in states[4:6])
    assert states[6:] == ["unavailable (DYNASD_COMPILE=0)"] * 2
    monkeypatch.delenv("DYNASD_COMPILE")
    monkeypatch.setattr(build_command, "kernel_variant", lambda: None)
    assert cli.main(["build-kernels"]) == 0, "a CPU whose loads never ask for them builds nothing"
    assert [line.split(": ", 1)[1] for line in capsys.readouterr().out.splitlines()] == \
        ["not needed on this CPU (neither AVX-512 nor AVX2: the engine uses torch's products)"] * 2


def test_each_variant_is_a_library_of_its_own():
    """Two variants of one source never share a file, nor a library name (the dynamic loader would take the
    second for the first), and each is compiled for its own instruction set."""
    source = build_command.engine_kernels()["dynasd_block_linear"]
    paths = {variant: library_path("dynasd_block_linear", source, variant) for variant in compile.VARIANTS}
    assert len(set(paths.values())) == len(paths)
    assert all(path.name.startswith(f"dynasd_block_linear_{variant}-") for variant, path in paths.items())
    assert "-march=x86-64-v3" in compile.build_flags("avx2") and "-march=native" in compile.build_flags("avx512")


@needs_compiler
@pytest.mark.slow(seconds=20)
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the kernels are x86 code")
@pytest.mark.parametrize("header", [path.name for path in KERNEL_HEADERS])
def test_every_kernel_header_compiles_when_included_first(header):
    """A header includes what it needs and opens its own namespace: alone at the top of a file it compiles, for
    the AVX2 variant (syntax only: nothing is written)."""
    command = ["c++", "-std=c++20", "-fsyntax-only", *compile.build_flags("avx2"), f"-I{KERNEL_HEADERS[0].parent}",
               *(f"-I{path}" for path in include_paths()), f"-I{sysconfig.get_paths()['include']}", "-x", "c++", "-"]
    result = subprocess.run(command, input=f'#include "{header}"\n', capture_output=True, text=True)
    assert result.returncode == 0, next((line for line in result.stderr.splitlines() if "error" in line),
                                        result.stderr[-500:])
