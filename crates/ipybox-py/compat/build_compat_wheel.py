"""Builds the `ipybox` compatibility wheel: a distribution named `ipybox` (version 0.9.2+rs.<ipybox-rs
version>) with no files of its own that requires exactly this ipybox-rs. Installed beside an
application that requires `ipybox` (freeact: `ipybox>=0.8.0`), it meets that requirement with
ipybox-rs, for pip as for uv, so Python ipybox is not pulled in (docs/python.md):

    python crates/ipybox-py/compat/build_compat_wheel.py target/wheels
    pip install freeact==0.9.1 target/wheels/ipybox_rs-*.whl target/wheels/ipybox-0.9.2+rs*.whl

Prints the wheel's path. Standard library only.
"""

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

ANCHOR = "0.9.2"  # the Python ipybox release ipybox-rs is a drop-in for


def rs_version() -> str:
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    return re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)


def main(out_dir: str) -> None:
    rs = rs_version()
    version = f"{ANCHOR}+rs.{rs}"
    dist = f"ipybox-{version}.dist-info"
    files = {
        f"{dist}/METADATA": (
            "Metadata-Version: 2.1\n"
            "Name: ipybox\n"
            f"Version: {version}\n"
            f"Summary: Compatibility distribution: meets a requirement on ipybox with ipybox-rs {rs} "
            f"(the Rust implementation, a drop-in for ipybox {ANCHOR}); it has no files of its own\n"
            "License: Apache-2.0\n"
            "Requires-Python: >=3.11\n"
            f"Requires-Dist: ipybox-rs=={rs}\n"
        ),
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: ipybox-rs build_compat_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = "\n".join(record) + "\n"
    out = Path(out_dir) / f"ipybox-{version}-py3-none-any.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, text)
    print(out.resolve())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/wheels")
