# Sourced by setup.sh and setup_vllm.sh: `install VENV ARGS...` and `uninstall VENV NAMES...`,
# with uv where it can be had, pip otherwise (ASYNCRL_INSTALLER=pip: pip throughout).
# Why uv: pip unpacks and byte-compiles on one core, and set-up was CI's long pole; uv
# downloads, unpacks and compiles in parallel (benchmarks/RESULTS.md, 2026-11-27).
# Why byte-compile at all: where PYTHONDONTWRITEBYTECODE is set (this machine kind sets it)
# Python never writes .pyc itself, and without them every process compiled torch and vLLM again
# (the tests at under half their pace). ASYNCRL_COMPILE=0 compiles nothing: `make test` sets it
# and lets its processes write the .pyc of what they import instead, a fraction of what is
# installed.
# uv reads none of pip's configuration, so pip's sources (find-links, index urls, constraint,
# certificate, timeout) are handed to it, with pip's rule for a name several indexes hold: the
# best version anywhere, not the first index's. A uv on PATH is used as it is; otherwise uv is
# pip-installed into the venv being set up (2 s).

# pip's warning for every name a local index folder lacks; keeps the pip log readable
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# pip's configuration (files and PIP_* variables, as `pip config list` shows them) as uv flags
uv_sources=()
read_pip_sources() {
    local line key value item index="" env_index=""
    while IFS= read -r line; do
        key="${line%%=*}"
        local section="${key%%.*}"
        key="${key##*.}"
        value="${line#*=}"
        value="${value#\'}"
        value="${value%\'}"
        case "$key" in
        find-links | extra-index-url | constraint)
            for item in $value; do
                [[ " ${uv_sources[*]} " == *" $item "* ]] || uv_sources+=("--$key" "$item")
            done
            ;;
        index-url) # one index: PIP_INDEX_URL over the files, as pip has it
            if [ "$section" = ":env:" ]; then env_index="$value"; else index="$value"; fi ;;
        cert) export SSL_CERT_FILE="${SSL_CERT_FILE:-$value}" ;;
        timeout | default-timeout) export UV_HTTP_TIMEOUT="${UV_HTTP_TIMEOUT:-$value}" ;;
        esac
    done < <("$1/bin/python" -m pip config list 2>/dev/null)
    index="${env_index:-$index}"
    if [ -n "$index" ]; then uv_sources+=(--index-url "$index"); fi
}

# sets `uv` to a uv binary, or returns 1 where pip must do
uv=""
find_uv() {
    [ "${ASYNCRL_INSTALLER:-uv}" = pip ] && return 1
    [ -n "$uv" ] && return 0
    read_pip_sources "$1"
    if command -v uv >/dev/null 2>&1; then
        uv="$(command -v uv)"
    elif quiet "$1/bin/python" -m pip install --quiet "uv>=0.9"; then
        uv="$1/bin/uv"
    else
        echo "uv could not be installed; installing with pip" >&2
        return 1
    fi
}

install() {
    local venv="$1"
    shift
    local compile=(--compile-bytecode)
    [ "${ASYNCRL_COMPILE:-1}" = 0 ] && compile=()
    if find_uv "$venv"; then
        "$uv" pip install --quiet --python "$venv/bin/python" "${compile[@]}" \
            --index-strategy unsafe-best-match "${uv_sources[@]}" "$@" && return 0
        # a registry uv cannot reach, or a source pip's settings describe that uv reads
        # otherwise: pip has the last word, and an error that is real shows again below
        echo "uv failed (above); installing with pip" >&2
    fi
    if [ "${ASYNCRL_COMPILE:-1}" = 0 ]; then
        quiet "$venv/bin/python" -m pip install --quiet --no-compile "$@"
    else
        quiet "$venv/bin/python" -m pip install --quiet "$@"
    fi
}

# sets `torch_args` to the pip arguments that bring torch VERSION's build for this machine:
# PyTorch's CPU index where there is no NVIDIA GPU and pip's sources hold no CPU build, none
# otherwise (scripts/torch_source.py says why, and ASYNCRL_TORCH_INDEX overrides it)
torch_args=()
torch_sources() {
    local arguments
    arguments="$("$1/bin/python" scripts/torch_source.py "$2")"
    torch_args=()
    if [ -n "$arguments" ]; then mapfile -t torch_args <<<"$arguments"; fi
}

uninstall() {
    local venv="$1"
    shift
    if find_uv "$venv"; then
        "$uv" pip uninstall --quiet --python "$venv/bin/python" "$@"
    else
        "$venv/bin/python" -m pip uninstall --quiet -y "$@"
    fi
}
