"""PEP 517 / PEP 660 build backend for the wsync Python package.

Every hook is setuptools.build_meta's when that setuptools can build wheels: setuptools 70.1
and later carry bdist_wheel themselves, older ones need the `wheel` package. Without either —
an offline `pip install --no-build-isolation ./python` with an older setuptools, as on machines
that cannot reach PyPI — wheels (and editable wheels) are built here with the standard library:
the package is pure Python, so a wheel is a zip of wsync/ plus its metadata.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import sysconfig
import zipfile
from pathlib import Path

from setuptools import build_meta as _setuptools


def _setuptools_builds_wheels() -> bool:
    try:
        import setuptools.command.bdist_wheel  # noqa: F401  (setuptools >= 70.1)
        return True
    except ImportError:
        pass
    try:
        import wheel.bdist_wheel  # noqa: F401
        return True
    except ImportError:
        return False


ROOT = Path(__file__).resolve().parent.parent   # python/
PACKAGE = "wsync"

get_requires_for_build_sdist = _setuptools.get_requires_for_build_sdist
build_sdist = _setuptools.build_sdist

if _setuptools_builds_wheels():
    get_requires_for_build_wheel = _setuptools.get_requires_for_build_wheel
    prepare_metadata_for_build_wheel = _setuptools.prepare_metadata_for_build_wheel
    build_wheel = _setuptools.build_wheel
    if hasattr(_setuptools, "build_editable"):
        get_requires_for_build_editable = _setuptools.get_requires_for_build_editable
        prepare_metadata_for_build_editable = _setuptools.prepare_metadata_for_build_editable
        build_editable = _setuptools.build_editable
else:
    def get_requires_for_build_wheel(config_settings=None):
        return []

    def get_requires_for_build_editable(config_settings=None):
        return []

    def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
        return _build(wheel_directory, editable=False)

    def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
        return _build(wheel_directory, editable=True)


def _project() -> dict:
    try:
        import tomllib
    except ImportError:   # Python < 3.11
        try:
            import tomli as tomllib
        except ImportError:
            raise RuntimeError("building wsync without the `wheel` package needs Python 3.11 "
                               "(tomllib) or tomli; or install wheel, or setuptools >= 70.1")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _metadata(project: dict) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}",
             f"Version: {project['version']}"]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    for c in project.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for d in project.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    body = ""
    readme = project.get("readme")
    if isinstance(readme, str) and (ROOT / readme).is_file():
        lines.append("Description-Content-Type: text/markdown")
        body = "\n" + (ROOT / readme).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n" + body


def _files() -> list:
    """(path in the wheel, bytes) of the package: its .py files and a bundled libwsync."""
    out = []
    pkg = ROOT / PACKAGE
    for p in sorted(pkg.rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(ROOT).as_posix()
        if p.suffix == ".py" or p.name.startswith("libwsync.so"):
            out.append((rel, p.read_bytes()))
    return out


def _build(wheel_directory: str, editable: bool) -> str:
    project = _project()
    name, version = project["name"], project["version"]
    if editable:
        files = [(f"__editable__.{name}-{version}.pth", (str(ROOT) + "\n").encode())]
        binary = False
    else:
        files = _files()
        binary = any("libwsync.so" in f for f, _ in files)
    tag = "py3-none-" + (sysconfig.get_platform().replace("-", "_").replace(".", "_")
                         if binary else "any")
    dist_info = f"{name}-{version}.dist-info"
    wheel_meta = ("Wheel-Version: 1.0\nGenerator: wsync_build\n"
                  f"Root-Is-Purelib: {'false' if binary else 'true'}\nTag: {tag}\n")
    files += [(f"{dist_info}/METADATA", _metadata(project).encode()),
              (f"{dist_info}/WHEEL", wheel_meta.encode()),
              (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode())]
    record = io.StringIO()
    for path, data in files:
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(data)}\n")
    record.write(f"{dist_info}/RECORD,,\n")
    files.append((f"{dist_info}/RECORD", record.getvalue().encode()))
    filename = f"{name}-{version}-{tag}.whl"
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w",
                         zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if path.endswith((".so",)) or ".so." in path
                                  else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return filename
