# Shared by the CLI test scripts (tests/cli_*.sh): source it after setting NAME; it sets K3 (the binary given as
# $1), a temporary folder T (removed on exit), pass/fail counters and the checks below; end with `finish`.
K3=${1:?usage: bash tests/$NAME.sh path/to/k3}
T=$(mktemp -d "${TMPDIR:-/tmp}/k3_$NAME.XXXXXX")
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
# expect CODE DESCRIPTION -- command...   (stdout of the command goes to $T/out, stderr to $T/err)
expect() {
    local want=$1 what=$2
    shift 3
    "$@" >"$T/out" 2>"$T/err"
    local got=$?
    if [ "$got" = "$want" ]; then ok; else bad "$what: exit $got, want $want ($(head -c 300 "$T/err"))"; fi
}
contains() { # FILE TEXT DESCRIPTION
    if grep -aqF -- "$2" "$1"; then ok; else bad "$3: '$2' not in $(head -c 400 "$1")"; fi
}
# The nvcc to use: on PATH, else the toolkit's default place; prints nothing when there is none.
nvcc_path() {
    command -v nvcc && return 0
    if [ -x /usr/local/cuda/bin/nvcc ]; then echo /usr/local/cuda/bin/nvcc; fi
    return 0
}
# The closing line ctest's log and CI read; fails when anything failed or nothing was checked.
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" = 0 ] && [ "$pass" -gt 0 ]
}
