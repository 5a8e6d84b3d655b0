# Shared by the Python test scripts (tests/cli_python.sh, tests/cli_pip_install.sh): source it with the build
# folder in $bin and the modules the script needs in $PY_NEEDS (an import list). It exits 77 (skipped) in the
# sanitizer build, whose ASan libk3 cannot be loaded by a python not started with the ASan runtime (the main
# build runs these tests), and without python3 or those modules; otherwise it sets py to the python3 to use.
if grep -q '^K3_SANITIZE:BOOL=ON' "$bin/CMakeCache.txt" 2>/dev/null; then
    echo "SKIPPED: the sanitizer build's libk3.so cannot be loaded by python (the main build runs this test)"
    exit 77
fi
py=$(command -v python3 || true)
if [ -z "$py" ] || ! "$py" -c "import $PY_NEEDS" 2>/dev/null; then
    echo "SKIPPED: python3 with $PY_NEEDS is needed (.ci/run installs them)"
    exit 77
fi
