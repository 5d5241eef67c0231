#!/usr/bin/env bash
# `cmake --install` of the Python package (component python) into a
# temporary prefix: the package lands in PREFIX/TETHER_PYTHON_INSTALL_DIR,
# imports from there alone (not from the build tree), and for the default
# prefix /usr/local that directory is one Debian's python3 searches.
#   Environment: TETHER_BUILD_DIR, PYTHON, CMAKE, INSTALL_DIR (relative)
set -euo pipefail
build=${TETHER_BUILD_DIR:?} python=${PYTHON:?} rel=${INSTALL_DIR:?}
cmake=${CMAKE:-cmake}
prefix=$(mktemp -d /tmp/tether-pyinstall-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
"$cmake" --install "$build" --component python --prefix "$prefix" > /dev/null
site="$prefix/$rel"
for f in __init__.py errors.py torch.py worker.py; do
  [[ -f "$site/tether/$f" ]] || { echo "FAIL: $site/tether/$f not installed" >&2; exit 1; }
done
ls "$site"/tether/_tether*.so > /dev/null || { echo "FAIL: no _tether module in $site/tether" >&2; exit 1; }
cd /
env -u PYTHONPATH PYTHONPATH="$site" PYTHONDONTWRITEBYTECODE=1 "$python" - "$site" <<'PY'
import sys
site = sys.argv[1]
import tether, tether.torch, tether.worker  # noqa: E401
assert tether.__file__.startswith(site), tether.__file__
assert tether._tether.__file__.startswith(site), tether._tether.__file__
assert issubclass(tether.StalePushError, tether.Error)
print("imported from", tether.__file__)
PY
env -u PYTHONPATH "$python" - "/usr/local/$rel" <<'PY'
import site, sys
want = sys.argv[1]
assert want in site.getsitepackages(), (want, site.getsitepackages())
print("the default prefix installs into", want, "which python3 searches")
PY
echo "PASS"
