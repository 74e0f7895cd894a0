"""The PEP 517 build backend of the `rlvr` package, standard library only.

Why our own: `pip install ./python` builds in an isolated environment and installs the build
backend's requirements into it first, from the network. A backend that needs nothing
(`requires = []`) makes the install work offline, in any environment (Python 3.12 venvs have no
setuptools), with no `--no-build-isolation`. The package is pure Python in one directory, so a
wheel is a zip of `src/rlvr` plus the metadata files of the wheel format (PEP 427, PEP 376's
RECORD); `pip install -e ./python` gets a wheel holding a `.pth` file that names `src` (PEP 660).
"""

import base64
import hashlib
import io
import os
import tarfile
import tomllib
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "rlvr"
TAG = "py3-none-any"
# Fixed timestamps: the same tree builds the same wheel, byte for byte.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)["project"]


def _metadata(project):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"Requires-Python: {project['requires-python']}",
        f"License: {project['license']['text']}",
    ]
    lines += [f"Requires-Dist: {requirement}" for requirement in project.get("dependencies", [])]
    for extra, requirements in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {requirement}; extra == "{extra}"' for requirement in requirements]
    lines.append("Description-Content-Type: text/markdown")
    with open(os.path.join(HERE, project["readme"]), encoding="utf-8") as file:
        readme = file.read()
    return "\n".join(lines) + "\n\n" + readme


def _package_files():
    """(path in the wheel, path on disk) of every file of the package, sorted."""
    root = os.path.join(HERE, "src", PACKAGE)
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for name in files:
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(directory, name)
            found.append((os.path.relpath(path, os.path.join(HERE, "src")).replace(os.sep, "/"), path))
    return sorted(found)


def _dist_info(project):
    return f"{project['name']}-{project['version']}.dist-info"


def _dist_info_files(project):
    """The .dist-info files but RECORD, as (name, bytes)."""
    info = _dist_info(project)
    wheel = f"Wheel-Version: 1.0\nGenerator: rlvr_build\nRoot-Is-Purelib: true\nTag: {TAG}\n"
    return [
        (f"{info}/METADATA", _metadata(project).encode()),
        (f"{info}/WHEEL", wheel.encode()),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]


def _write_wheel(wheel_directory, entries):
    """Writes the wheel of `entries` ((name, bytes)) with its RECORD; returns its file name."""
    project = _project()
    name = f"{project['name']}-{project['version']}-{TAG}.whl"
    entries = entries + _dist_info_files(project)
    record_name = f"{_dist_info(project)}/RECORD"
    record = io.StringIO()
    for path, content in entries:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record.write(f"{path},sha256={digest},{len(content)}\n")
    record.write(f"{record_name},,\n")
    entries.append((record_name, record.getvalue().encode()))
    target = os.path.join(wheel_directory, name)
    with zipfile.ZipFile(target + ".part", "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, content in entries:
            info = zipfile.ZipInfo(path, ZIP_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, content)
    os.replace(target + ".part", target)
    return name


def _read(path):
    with open(path, "rb") as file:
        return file.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    project = _project()
    for name, content in _dist_info_files(project):
        path = os.path.join(metadata_directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(content)
    return _dist_info(project)


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, [(name, _read(path)) for name, path in _package_files()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # The .pth line puts the checkout's src/ on sys.path: edits show at the next import.
    pth = (os.path.join(HERE, "src") + "\n").encode()
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", pth)])


def build_sdist(sdist_directory, config_settings=None):
    project = _project()
    base = f"{project['name']}-{project['version']}"
    name = f"{base}.tar.gz"
    files = [("pyproject.toml", os.path.join(HERE, "pyproject.toml")),
             (project["readme"], os.path.join(HERE, project["readme"])),
             ("build_backend/rlvr_build.py", os.path.abspath(__file__))]
    files += [("src/" + name_in_wheel, path) for name_in_wheel, path in _package_files()]
    target = os.path.join(sdist_directory, name)
    with tarfile.open(target + ".part", "w:gz", format=tarfile.PAX_FORMAT) as sdist:
        pkg_info = _metadata(project).encode()
        for path, content in [("PKG-INFO", pkg_info)] + [(p, _read(d)) for p, d in files]:
            info = tarfile.TarInfo(f"{base}/{path}")
            info.size, info.mode, info.mtime = len(content), 0o644, 0
            sdist.addfile(info, io.BytesIO(content))
    os.replace(target + ".part", target)
    return name
