# Shared set-up for scripts/run and scripts/test (sourced, not run).
#
# setup_venv SPEC: create .venv with python3 (3.11+) if it is missing, and install the
# project editable from SPEC (".", ".[dev]") unless this pyproject.toml was already
# installed with that SPEC. Puts .venv/bin first on PATH.

setup_venv() {
    local spec=$1
    local python=${PYTHON:-python3}
    if [[ ! -x .venv/bin/python ]]; then
        if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "cleanerd needs Python 3.11 or newer as '$python' (set PYTHON=...)" >&2
            return 1
        fi
        echo "+ $python -m venv .venv"
        "$python" -m venv .venv
    fi
    # Reinstall only when pyproject.toml (dependencies, entry points) or SPEC changed.
    local stamp
    stamp=".venv/.installed-$(cat pyproject.toml - <<<"$spec" | sha256sum | cut -c1-16)"
    if [[ ! -f $stamp ]]; then
        echo "+ pip install -e '$spec'"
        .venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
        touch "$stamp"
    fi
    export PATH="$PWD/.venv/bin:$PATH"
}
