# Shared set-up for scripts/run and scripts/test (sourced, not run).
#
# setup_venv SPEC: create .venv with python3 (3.11+) if it is missing, and install the
# project editable from SPEC (".", ".[dev]") unless this pyproject.toml was already
# installed with that SPEC; byte-compiles the package. Puts .venv/bin first on PATH.

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
    # Byte-compile the package as pip does for an install: an editable install is not,
    # and where PYTHONDONTWRITEBYTECODE is set (this project's machines set it) every
    # command would compile its modules again, 0.15 s of a one-shot command. Only stale
    # files are rewritten.
    .venv/bin/python -m compileall -q -j 0 cleanerd >/dev/null
    export PATH="$PWD/.venv/bin:$PATH"
}

# setup_system_packages CMD=PACKAGE...: install the Debian packages whose commands are
# missing (the servers and tools the integration tests drive for real). Needs root and
# apt-get; elsewhere it says what is missing and the tests that need it skip (outside CI).
setup_system_packages() {
    local missing=() pair
    for pair in "$@"; do
        command -v "${pair%%=*}" >/dev/null 2>&1 || [[ -x /usr/sbin/${pair%%=*} ]] ||
            missing+=("${pair#*=}")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "missing system packages (tests that need them skip): ${missing[*]}" >&2
        return 0
    fi
    echo "+ apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
