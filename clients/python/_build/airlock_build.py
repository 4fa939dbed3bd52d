"""The PEP 517 build backend of `airlock-client`: writes the wheel (and the
sdist) of the one pure-Python package `airlock_client`, from the standard
library alone, so `pip install clients/python` needs no network."""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "airlock_client"
# The fixed timestamp of every archive member: the same tree builds the
# same bytes.
EPOCH = (1980, 1, 1, 0, 0, 0)


def _project():
    """The [project] table's plain `key = "value"` entries."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M)
    if table is None:
        raise RuntimeError("pyproject.toml has no [project] table")
    return dict(re.findall(r'^([a-z-]+)\s*=\s*"([^"\n]*)"\s*$', table.group(1), re.M))


def _metadata():
    p = _project()
    with open(os.path.join(ROOT, p["readme"]), encoding="utf-8") as f:
        readme = f.read()
    head = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p['description']}",
        f"Requires-Python: {p['requires-python']}",
        f"License: {p['license']}",
        "Classifier: Typing :: Typed",
        "Description-Content-Type: text/markdown",
    ]
    return p, "\n".join(head) + "\n\n" + readme


def _dist(p):
    return f"{p['name'].replace('-', '_')}-{p['version']}"


def _sources():
    base = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if os.path.isfile(path) and (name.endswith(".py") or name == "py.typed"):
            yield f"{PACKAGE}/{name}", path


def _write(zf, records, arcname, data):
    info = zipfile.ZipInfo(arcname, EPOCH)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    records.append(f"{arcname},sha256={digest},{len(data)}")


def _wheel(wheel_directory, files):
    p, metadata = _metadata()
    dist = _dist(p)
    name = f"{dist}-py3-none-any.whl"
    info = f"{dist}.dist-info"
    records = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as zf:
        for arcname, data in files:
            _write(zf, records, arcname, data)
        _write(zf, records, f"{info}/METADATA", metadata.encode())
        wheel = "Wheel-Version: 1.0\nGenerator: airlock_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        _write(zf, records, f"{info}/WHEEL", wheel.encode())
        records.append(f"{info}/RECORD,,")
        zf.writestr(zipfile.ZipInfo(f"{info}/RECORD", EPOCH), "\n".join(records) + "\n")
    return name


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, [(arc, _read(path)) for arc, path in _sources()])


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source tree itself on sys.path.
    return _wheel(wheel_directory, [(f"{PACKAGE}.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p, metadata = _metadata()
    dist = _dist(p)
    name = f"{dist}.tar.gz"
    members = [("pyproject.toml", "pyproject.toml"), (p["readme"], p["readme"]), ("_build/airlock_build.py", "_build/airlock_build.py")]
    members += [(arc, os.path.relpath(path, ROOT)) for arc, path in _sources()]
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as tf:
        for arc, rel in members + [("PKG-INFO", None)]:
            data = metadata.encode() if rel is None else _read(os.path.join(ROOT, rel))
            info = tarfile.TarInfo(f"{dist}/{arc}")
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tf.addfile(info, io.BytesIO(data))
    return name
