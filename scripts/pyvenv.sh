# Sourced by scripts that run Python tools (lint-infra.sh, schemathesis.sh):
#   ensure_venv DIR PACKAGE==VERSION...
# Makes the project-local virtualenv DIR with exactly these pinned packages, from PyPI on
# first use (or when the pins change: a stamp file names their checksum), and reuses it
# afterwards. Debian's python3 ships venv separately: it is installed when missing.
ensure_venv() {
    local venv=$1
    shift
    local stamp
    stamp="$venv/.installed-$(printf '%s\n' "$@" | cksum | cut -d' ' -f1)"
    [ -f "$stamp" ] && return 0
    echo "-- installing $* into $venv"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        if command -v apt-get >/dev/null; then
            apt-get update -qq >/dev/null && apt-get install -y -qq python3-venv >/dev/null
        fi
        rm -rf "$venv"
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
    touch "$stamp"
}
