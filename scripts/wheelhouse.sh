#!/usr/bin/env bash
# `make wheelhouse`: the wheels that the bare GPU image lacks for the native and TRL backends
# (docs/backends.md, "The bare GPU image"), for that image's platform (CPython 3.12, manylinux
# x86-64), into one folder, one version of each, at most MAX_MIB together. The device tool
# carries the folder (`carry: [".wheelhouse"]`, 64 MiB per call) and `gpu_smoke.sh
# --bare-image` installs it with `pip install --no-index --target`.
#
# pydantic, trl and datasets take their pins from constraints.txt; the packages they need that
# the image lacks (or holds at a version nobody has read) are pinned below, at the versions
# .venv runs the tests with. The project itself is no wheel: the device runs in a copy of the
# working tree and gpu_smoke.sh puts the tree on PYTHONPATH.
#
# Checks before it ends (exit 1 otherwise): every requirement of every wheel is either another
# wheel of the folder, at a version it accepts, or one of IMAGE_HAS (the image's packages that
# these wheels use, from the device's KINDS.md); the folder holds at most MAX_MIB.
# Usage:  bash scripts/wheelhouse.sh [DIR]      (DIR: .wheelhouse; emptied first)
# Env:    PYTHON (python3, with pip), MAX_MIB (60)
set -euo pipefail

PYTHON=${PYTHON:-python3}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${1:-$REPO/.wheelhouse}
MAX_MIB=${MAX_MIB:-60}
# BEGIN SETTINGS (read by tests/test_gpu_smoke_script.py)
WHEELS=(
  pydantic trl datasets  # pinned by constraints.txt
  pydantic-core==2.50.5  # pydantic 2.14.4 requires exactly this one
  annotated-types==0.8.0 typing-inspection==0.4.5  # pydantic's; not in the image
  typing-extensions==4.16.0  # pydantic needs >= 4.16; the image's version is unread
  dill==0.4.1 multiprocess==0.70.19  # datasets'; not in the image
  fsspec==2026.9.0  # datasets needs <= 2026.9.0; the image's version is unread
)
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
IMAGE_HAS="accelerate transformers huggingface-hub numpy pandas pyarrow filelock tqdm
  xxhash packaging pyyaml psutil jinja2"
# END SETTINGS

rm -rf "$DIR"
mkdir -p "$DIR"
echo "== downloading ${#WHEELS[@]} wheels into $DIR"
"$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -c "$REPO/constraints.txt" \
  -d "$DIR" "${WHEELS[@]}"

"$PYTHON" - "$DIR" "$MAX_MIB" "$IMAGE_HAS" <<'EOF'
import sys, zipfile
from email.parser import Parser
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a python with pip alone: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

folder, max_mib, image = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split()
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64",
       "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}
metas = {}
for wheel in sorted(folder.glob("*.whl")):
    with zipfile.ZipFile(wheel) as z:
        [name] = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(z.read(name).decode())
    metas[canonicalize_name(meta["Name"])] = (meta["Version"], meta.get_all("Requires-Dist") or [])
problems, from_image = [], set()
for dist, (_, requires) in metas.items():
    for text in requires:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(env):
            continue  # an extra, or another platform's
        name = canonicalize_name(req.name)
        if name in metas:
            version = metas[name][0]
            if not req.specifier.contains(version, prereleases=True):
                problems.append(f"{dist} needs {req}, the folder holds {name} {version}")
        elif name in {canonicalize_name(n) for n in image}:
            from_image.add(name)
        else:
            problems.append(f"{dist} needs {req}: neither in the folder nor in IMAGE_HAS")
size = sum(w.stat().st_size for w in folder.glob("*.whl"))
if size > max_mib * 2**20:
    problems.append(f"the wheels take {size / 2**20:.1f} MiB, over {max_mib:g} MiB")
for dist, (version, _) in sorted(metas.items()):
    print(f"   {dist} {version}")
print(f"   from the image: {' '.join(sorted(from_image))}")
if problems:
    sys.exit("wheelhouse: " + "; ".join(problems))
print(f"== {len(metas)} wheels, {size / 2**20:.1f} MiB (limit {max_mib:g} MiB) in {folder}")
EOF
